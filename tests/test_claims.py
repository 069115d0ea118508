"""The card's rules (mechlingo.card.rules): four verdicts on hand-made tests, Holm over
the card, the frozen-rules hash."""

from __future__ import annotations

import pytest

from mechlingo.card.rules import (
    CLAIMS,
    HOLDS,
    INCONCLUSIVE,
    NOT_HOLDS,
    NOT_TESTABLE,
    RULES_HASH,
    Claim,
    finalize,
    make_row,
    rules_hash,
)
from mechlingo.card.statistics import Test, paired_test, pool_controls
from mechlingo.kernels.significance import Interval

UP = Claim("up", "p", "x", "", "", "s", "f")
DOWN = Claim("down", "p", "x", "", "", "s", "f", direction=-1, threshold=0.1)
NULL = Claim("null", "p", "x", "", "", "s", "f", kind="null", margin=0.05)
REL = Claim("rel", "p", "x", "", "", "s", "f", threshold=0.35)


def T(est, lo, hi, p=0.001, n=40):  # noqa: N802
    return Test(Interval(est, lo, hi, n), p, 0.1, n, "hand")


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
        (NULL, T(0.1, 0.02, 0.2), None, NOT_HOLDS),  # a rise
        (NULL, T(-0.1, -0.2, -0.02, p=1e-4), None, HOLDS),  # a fall is not a rise
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
    rows = [make_row(UP, T(0.2, 0.05, 0.35, p=0.02)) for _ in range(3)]
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
