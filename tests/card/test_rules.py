"""The card's rules (mechlingo.card.rules): the verdicts on hand-made tests, the families'
adjustments (Holm in a primary family, Benjamini-Hochberg for the rest), the frozen-rules hash."""

from __future__ import annotations

import pytest

from mechlingo.card.claims import row_family
from mechlingo.card.clustered_tests import Test, paired_test
from mechlingo.card.population import pool_controls, population_test
from mechlingo.card.rules import (
    CLAIMS,
    FLOOR,
    HOLDS,
    INCONCLUSIVE,
    NOT_HOLDS,
    NOT_TESTABLE,
    PRIMARY,
    RULES,
    RULES_HASH,
    Claim,
    finalize,
    make_row,
    rules_hash,
)
from mechlingo.kernels.significance import Interval

UP = Claim("up", "p", "x", "", "", "s", "f")
DOWN = Claim("down", "p", "x", "", "", "s", "f", direction=-1, threshold=0.1)
NULL = Claim("null", "p", "x", "", "", "s", "f", kind="null", margin=0.05)
REL = Claim("rel", "p", "x", "", "", "s", "f", threshold=0.35)


def T(est, lo, hi, p=0.001, n=40):  # noqa: N802
    return Test(Interval(est, lo, hi, n), p, 0.1, n, "hand")


PRIMARY_UP = Claim("pup", "p", "x", "", "", "s", "f", family="primary")
PRIMARY_NULL = Claim("pnull", "p", "x", "", "", "s", "f", kind="null", margin=0.05,
                     family="primary")  # fmt: skip


def _family(claim, tests):
    """finalize over a family of rows of ``claim`` (one per effect test)."""
    return finalize([make_row(claim, t) for t in tests])


@pytest.mark.parametrize(
    "claim,effect,vs,want",
    [
        (UP, T(0.2, 0.05, 0.35), None, HOLDS),
        (UP, T(0.2, 0.05, 0.35, p=0.06), None, INCONCLUSIVE),  # interval, but p >= 0.05
        (UP, T(0.2, -0.01, 0.35, p=0.04), None, INCONCLUSIVE),  # straddles 0
        (UP, T(-0.2, -0.35, -0.05), None, NOT_HOLDS),  # the other side of 0
        (UP, T(0.2, 0.05, 0.35), T(0.15, 0.02, 0.3), HOLDS),  # beyond its control
        (UP, T(0.2, 0.05, 0.35), T(0.0, -0.1, 0.1, p=1.0), INCONCLUSIVE),  # equal to control
        (UP, T(0.2, 0.05, 0.35), T(-0.2, -0.3, -0.1), NOT_HOLDS),  # below its control
        (DOWN, T(0.05, 0.02, 0.09), None, HOLDS),  # below 0.1
        (DOWN, T(0.05, 0.02, 0.11), None, INCONCLUSIVE),
        (DOWN, T(0.2, 0.12, 0.3), None, NOT_HOLDS),
        (NULL, T(0.01, -0.03, 0.04, p=0.001), None, HOLDS),  # short of +0.05, equivalence p
        (NULL, T(0.01, -0.05, 0.07, p=0.3), None, INCONCLUSIVE),  # reaches the margin
        (NULL, T(0.1, 0.06, 0.2), None, NOT_HOLDS),  # a rise beyond the margin
        (NULL, T(0.1, 0.02, 0.2), None, INCONCLUSIVE),  # a rise that reaches into the margin
        (NULL, T(-0.1, -0.2, -0.06), None, NOT_HOLDS),  # equivalence: a fall is an effect too
        (REL, T(0.5, 0.36, 0.7), None, HOLDS),
        (REL, T(0.5, 0.30, 0.7, p=0.2), None, INCONCLUSIVE),  # > 0 but not surely > 35%
        (REL, T(0.1, 0.0, 0.3), None, NOT_HOLDS),  # surely below 35%
    ],
)
def test_verdict_rules(claim, effect, vs, want):
    row = make_row(claim, effect, vs_control=vs)
    (row,) = finalize([row])  # one row: Holm leaves its p as it is
    assert row["verdict"] == want, row["reason"]
    assert row["p_adjusted"] == row["p"]
    if want == HOLDS:
        assert f"adjusted p = {row['p_adjusted']:.3g}" in row["reason"]


def test_three_fixed_of_24_does_not_hold():
    """Exact McNemar p = 0.25: not `holds`, whatever the bootstrap interval says."""
    t = paired_test([0] * 24, [1] * 3 + [0] * 21)
    (row,) = finalize([make_row(UP, t)])
    assert row["p"] == pytest.approx(0.25) and row["verdict"] == INCONCLUSIVE
    assert "minimum detectable effect" in row["reason"] and row["mde"] > 0.125


def test_an_effect_equal_to_its_control_does_not_hold():
    base = [0] * 30 + [1] * 10
    new = [1] * 20 + [0] * 10 + [1] * 10  # +20 fixed
    ctl = pool_controls([new, new])  # the control does exactly as well
    eff = paired_test(base, new)
    (row,) = finalize([make_row(UP, eff, paired_test(base, ctl),
                                vs_control=paired_test(ctl, new))])  # fmt: skip
    assert eff.p < 1e-4 and row["verdict"] != HOLDS
    assert row["p"] == 1.0  # the larger of the effect's and the effect - control p


def test_holm_over_the_card_changes_a_verdict():
    rows = [make_row(PRIMARY_UP, T(0.2, 0.05, 0.35, p=0.02)) for _ in range(3)]
    assert all(r["verdict"] == HOLDS for r in rows)  # each alone, raw p 0.02
    done = finalize(rows + [make_row(UP, None, untestable="no headroom")])
    assert [r["p_adjusted"] for r in done[:3]] == pytest.approx([0.06] * 3)
    assert {r["verdict"] for r in done[:3]} == {INCONCLUSIVE}
    assert done[3]["verdict"] == NOT_TESTABLE and done[3]["reason"] == "no headroom"
    assert done[3]["p"] is None and done[3]["p_adjusted"] is None


def test_no_interval_is_not_testable_with_its_reason():
    (row,) = finalize([make_row(UP, T(0.1, None, None, n=1))])
    assert row["verdict"] == NOT_TESTABLE and "fewer than two" in row["reason"]


def test_rules_hash_is_frozen_and_sees_a_threshold():
    assert RULES_HASH == rules_hash(CLAIMS) and len(RULES_HASH) == 16
    moved = [Claim(c.id, c.paper, c.text, c.paper_number, c.measure, c.stage, c.figure,
                   c.kind, c.direction, c.threshold + 0.01, c.control_threshold, c.margin)
             for c in CLAIMS]  # fmt: skip
    assert rules_hash(moved) != RULES_HASH
    assert all(c.margin is not None for c in CLAIMS if c.kind == "null")
    fam = [Claim(c.id, c.paper, c.text, c.paper_number, c.measure, c.stage, c.figure, c.kind,
                 c.direction, c.threshold, c.control_threshold, c.margin, family="secondary")
           for c in CLAIMS]  # fmt: skip
    assert rules_hash(fam) != RULES_HASH  # the families are part of the frozen rules


def test_mirror_images_get_mirror_verdicts_at_the_adjusted_level():
    """+x and -x with the same p in families of the same size: "holds" and "does not hold"
    at the same adjusted level; a refutation that holds at 95% alone does not survive Holm."""
    other = [T(0.0, -0.3, 0.3, p=0.9)] * 2
    up = _family(PRIMARY_UP, [T(0.2, 0.1, 0.3, p=0.001)] + other)[0]
    down = _family(PRIMARY_UP, [T(-0.2, -0.3, -0.1, p=0.001)] + other)[0]
    assert (up["verdict"], down["verdict"]) == (HOLDS, NOT_HOLDS)
    assert up["p_deciding_adjusted"] == down["p_deciding_adjusted"] == pytest.approx(0.003)
    # each side's own p: the claim's side for +x; for -x the claim's side is 1 (its
    # two-sided p counts only on the side where its estimate lies)
    assert (up["p_adjusted"], down["p_adjusted"]) == (pytest.approx(0.003), 1.0)
    # each verdict at its side's level: the claim side's for +x, the other side's for -x
    assert up["adjustment"]["level"] == pytest.approx(1 - 0.05 / 3)
    assert down["adjustment"]["level_against"] == pytest.approx(1 - 0.05 / 3)
    weak = T(-0.1, -0.19, -0.01, p=0.03)  # below 0 at 95%, p = 0.03
    (alone,) = finalize([make_row(PRIMARY_UP, weak)])
    assert alone["verdict"] == NOT_HOLDS
    fam = _family(PRIMARY_UP, [weak, *other])
    assert fam[0]["verdict"] == INCONCLUSIVE  # 98.3% interval reaches 0; 3 x 0.03 > 0.05
    # the interval at the level of the side its estimate lies on (the other side: 98.3%), the
    # MDE of the claimed effect at the claim side's level, the one its reason states
    assert fam[0]["value_adjusted"]["hi"] > 0
    assert fam[0]["value_adjusted"]["confidence"] == pytest.approx(1 - 0.05 / 3)
    assert fam[0]["adjustment"]["multiplier"] == 1.0  # its claim-side p, 1, is the largest
    assert fam[0]["mde"] == pytest.approx(0.1)  # the test's MDE at 95%
    assert f"minimum detectable effect {fam[0]['mde']:.3f}" in fam[0]["reason"]
    mirror = _family(PRIMARY_UP, [T(0.1, 0.01, 0.19, p=0.03), *other])
    assert mirror[0]["verdict"] == INCONCLUSIVE


def test_equivalence_inside_the_margin_holds():
    """+0.015 [0.010, 0.021] with margin 0.05 is "holds" (inside), not "does not hold"."""
    t = Test(Interval(0.015, 0.010, 0.021, 40), 1e-6, 0.008, 40, "hand",
             {"se": 0.0027, "df": 39, "interval": "t"})  # fmt: skip
    (row,) = finalize([make_row(PRIMARY_NULL, t)])
    assert row["verdict"] == HOLDS and row["p"] < 1e-10
    beyond = Test(Interval(0.09, 0.07, 0.11, 40), 1e-9, 0.01, 40, "hand",
                  {"se": 0.01, "df": 39, "interval": "t"})  # fmt: skip
    (row,) = finalize([make_row(PRIMARY_NULL, beyond)])
    assert row["verdict"] == NOT_HOLDS and row["p"] == pytest.approx(1.0, abs=1e-3)
    edge = Test(Interval(0.04, 0.0, 0.08, 40), 0.05, 0.05, 40, "hand",
                {"se": 0.02, "df": 39, "interval": "t"})  # fmt: skip
    (row,) = finalize([make_row(PRIMARY_NULL, edge)])
    assert row["verdict"] == INCONCLUSIVE


def test_floor_and_missing_control_never_hold():
    strong = T(0.5, 0.4, 0.6, p=1e-6)
    (row,) = finalize([make_row(PRIMARY_UP, strong, floor="orig, task and every random draw "
                                "score 0 of 40")])  # fmt: skip
    assert row["verdict"] == FLOOR and "0 of 40" in row["reason"] and row["p"] is None
    (row,) = finalize([make_row(PRIMARY_UP, strong, missing_control="no mismatched-fact layers")])
    assert row["verdict"] == INCONCLUSIVE and "control is missing" in row["reason"]


def test_one_random_draw_cannot_support_holds():
    base, new = [0] * 30 + [1] * 10, [1] * 40
    draw = [0] * 30 + [1] * 10
    vs = population_test(new, [draw], list(range(40)), base=base)
    (row,) = finalize([make_row(PRIMARY_UP, paired_test(base, new), vs_control=vs)])
    assert vs.p == 0.5 and row["verdict"] == INCONCLUSIVE and "at least 0.5" in row["reason"]
    draws = [draw] * 19  # 19 draws that all do worse: rank p = 1/20, reported beside the t p
    vs = population_test(new, draws, list(range(40)), base=base)
    (row,) = finalize([make_row(PRIMARY_UP, paired_test(base, new), vs_control=vs)])
    assert vs.extra["p_rank"] == pytest.approx(0.05) and vs.p < 1e-6
    assert row["verdict"] == HOLDS  # the t test of effect - population mean decides


def test_a_permutation_floor_above_the_adjusted_level_names_the_draws_needed():
    """Against 20 draws by rank alone the floor is 1/21 = 0.048: below 0.05 alone, above it in
    a family of two rows where it has the smaller deciding p (Holm multiplier 2: 0.095), where the reason says
    that floor(2 / 0.05) = 40 draws are the fewest that could decide the row."""
    from mechlingo.card.stages.experts import rank_test

    strong = T(15.0, 7.0, 32.0, p=1e-4)
    vs = rank_test(15.0, [4.0, 3.0, 5.0] * 6 + [4.0, 2.0], exact=True)
    assert vs.p == pytest.approx(1 / 21) and vs.extra["p_floor"] == pytest.approx(1 / 21)
    (alone,) = finalize([make_row(PRIMARY_UP, strong, vs_control=vs)])
    assert alone["verdict"] == HOLDS and alone["p_adjusted"] == pytest.approx(1 / 21)
    two = finalize([make_row(PRIMARY_UP, strong, vs_control=vs),
                    make_row(PRIMARY_UP, T(0.2, -0.1, 0.5, p=0.3))])  # fmt: skip
    assert two[0]["verdict"] == INCONCLUSIVE
    assert two[0]["p_adjusted"] == pytest.approx(2 / 21)
    assert "at least 0.0476 (0.0952 adjusted)" in two[0]["reason"]
    assert "undecidable at this budget: needs 40 draws" in two[0]["reason"]
    # beside a row with a smaller p (0.01), Holm's step-down rejects both: 0.01 * 2 and 1/21
    both = finalize([make_row(PRIMARY_UP, strong, vs_control=vs),
                     make_row(PRIMARY_UP, T(0.2, 0.1, 0.3, p=0.01))])  # fmt: skip
    assert [r["verdict"] for r in both] == [HOLDS, HOLDS]
    assert both[0]["adjustment"]["multiplier"] == pytest.approx(1.0)


def test_secondary_rows_do_not_change_primary_verdicts():
    prim = [make_row(PRIMARY_UP, T(0.2, 0.05, 0.35, p=p)) for p in (0.004, 0.01, 0.02)]
    alone = finalize(prim)
    sec = [make_row(UP, T(0.1, 0.0, 0.2, p=p)) for p in (0.001, 0.3, 0.04, 0.5, 0.01) * 4]
    both = finalize(sec[:10] + prim + sec[10:])
    got = [r for r in both if r["family"] == "primary"]
    assert [r["verdict"] for r in got] == [r["verdict"] for r in alone]
    assert [r["p_adjusted"] for r in got] == [r["p_adjusted"] for r in alone]
    assert all("Holm over the 3 primary rows" in r["adjustment"]["method"] for r in got)
    assert all("exploratory" in r["adjustment"]["method"] for r in both if r["family"] ==
               "secondary")  # fmt: skip


def test_the_papers_primary_families():
    # the headline claims ("independent of languages and datasets", "up to 2x") are primary;
    # random_neurons, retrieval_improves' control, is not
    assert PRIMARY == {
        "lu2025": ("latent_english", "recall_failures", "task_vector", "diff_vector",
                   "lowest_language", "independent_relations", "independent_languages"),
        "sundar2025": ("experts_exist", "experts_disjoint", "clamp_steers", "clamp_closer",
                       "retrieval_improves", "retrieval_gain_max"),
    }  # fmt: skip
    assert "latent_english_logit" not in {c.id for c in CLAIMS}  # one measurement, one row
    low = next(c for c in CLAIMS if c.id == "lowest_language")
    assert row_family(low, "headroom rule, relative") == "primary"
    assert row_family(low, "literal rule, points") == "secondary"
    assert "headroom" in RULES["families"]


def test_draws_needed_and_the_rank_p_by_hand():
    """A row at Holm multiplier k needs floor(20 k) draws: with m of them the rank p floor
    1 / (m + 1) lies below 0.05 / k (and with one fewer it does not)."""
    from mechlingo.card.population import by_rank, draws_needed, p_text, rank_population_test

    for k in (1, 2, 6, 7):
        m = draws_needed(k)
        assert 1 / (m + 1) < 0.05 / k <= 1 / m + 1e-12
    assert (draws_needed(7), draws_needed(6)) == (140, 120)
    base, new = [0] * 30 + [1] * 10, [1] * 40
    draws = [[0] * 30 + [1] * 10] * 16 + [[1] * 40] * 4  # 4 of 20 draws as good as the effect
    t = rank_population_test(new, draws, list(range(40)), base=base)
    assert t.p == pytest.approx(5 / 21) and t.extra["decides"] == "rank"
    assert t.extra["p_opposite"] == pytest.approx(21 / 21)
    assert by_rank(paired_test(base, new)) == paired_test(base, new)  # no rank p: unchanged
    assert [p_text(x) for x in (0.0123, 3e-15, 0.0)] == ["0.0123", "< 1e-14", "< 1e-12"]


def test_a_relative_zero_by_hand():
    """No item changes on 40 facts with baseline 0.5: the relative gain is 0 with the exact
    no-change bound u = 1 - 0.025^(1/40) over the baseline, a t interval on 39 df."""
    from scipy import stats as sps

    from mechlingo.card.population import no_change_relative

    t = no_change_relative([1, 0] * 20, [f"f{i}" for i in range(40)], null=0.35)
    se = (1 - 0.025 ** (1 / 40)) / sps.norm.ppf(0.975) / 0.5
    assert t.estimate.estimate == 0.0 and t.extra["se"] == pytest.approx(se)
    assert t.estimate.hi == pytest.approx(sps.t.ppf(0.975, 39) * se)
    assert t.p == pytest.approx(2 * sps.t.sf(0.35 / se, 39))
    (row,) = finalize([make_row(REL, t)])
    assert row["verdict"] == NOT_HOLDS
