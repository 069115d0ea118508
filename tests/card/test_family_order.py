"""The order of a card family: Holm's step-down once per side, each row placed by the p of
the side it is judged on.

A row whose effect lies far beyond 0 but whose rank among its 20 draws (p = 1/21) cannot reach
a Holm level used to be ordered by its effect's two-sided p counted as "the other side"; later,
one family over the smaller of both sides still placed a row by its precise-zero p where the
precise zero could not decide it. Either way the rows after it were judged at smaller
multipliers than Holm allows."""

from __future__ import annotations

import numpy as np
import pytest
from statsmodels.stats.multitest import multipletests

from mechlingo.card import claims as C
from mechlingo.card.calibration_family import FAMILY_DESIGNS, family_error, table_markdown
from mechlingo.card.clustered_tests import Test, paired_test
from mechlingo.card.population import rank_population_test
from mechlingo.card.rules import HOLDS, INCONCLUSIVE, NOT_HOLDS, _side_p, finalize, make_row

N = 30
IDS = list(range(N))
NOISE = np.array([1.0, -1.0] * (N // 2)) * np.linspace(0.5, 1.5, N)
BASE = np.zeros(N)


def _undecidable() -> dict:
    """An effect of +0.5 (its own p tiny) that beats each of its 20 draws: rank p 1/21."""
    new = 0.5 + 0.1 * NOISE
    draws = [0.1 + 0.01 * j + 0.1 * NOISE for j in range(20)]
    vs = rank_population_test(new, draws, IDS, base=BASE, direction=1)
    return make_row(C.TASK_VECTOR, paired_test(BASE, new, IDS), vs_control=vs)


def _modest() -> dict:
    """An effect with a two-sided p between 0.025 and 0.05, no control."""
    return make_row(C.TASK_VECTOR, paired_test(BASE, 0.45 + NOISE, IDS))


def test_an_undecidable_row_is_placed_by_its_rank_p() -> None:
    a, b = _undecidable(), _modest()
    assert a["p"] == pytest.approx(1 / 21)
    assert a["p_against"] == 1.0  # the effect's two-sided p lies on the claim's side
    assert 0.025 < b["p"] < 0.05
    out = finalize([a, b])
    # Holm over the two rows' claim-side p-values rejects nothing: 2 * p_b > 0.05
    reject, adj, _, _ = multipletests([a["p"], b["p"]], 0.05, "holm")
    assert not reject.any()
    assert [r["verdict"] for r in out] == [INCONCLUSIVE, INCONCLUSIVE]
    assert out[1]["adjustment"]["multiplier"] == pytest.approx(2.0)
    assert out[1]["adjustment"]["p_decision"] == pytest.approx(adj[1])
    # alone, the modest row holds: only its place in the family makes it inconclusive
    assert finalize([b])[0]["verdict"] == HOLDS


def test_a_two_sided_p_counts_only_on_its_estimates_side() -> None:
    up = paired_test(BASE, 0.45 + NOISE, IDS)  # estimate +0.43, p about 0.037
    down = paired_test(BASE, -0.45 - NOISE, IDS)
    assert _side_p(up, 1, 1, 0.0) == up.p and _side_p(up, -1, 1, 0.0) == 1.0
    assert _side_p(down, 1, 1, 0.0) == 1.0 and _side_p(down, -1, 1, 0.0) == down.p
    # a claim in the negative direction reads the same tests the other way round
    assert _side_p(down, 1, -1, 0.0) == down.p and _side_p(up, -1, -1, 0.0) == up.p
    # against a threshold of 0.5 the estimate +0.43 lies short of it: the other side's p
    assert _side_p(up, -1, 1, 0.5) == up.p and _side_p(up, 1, 1, 0.5) == 1.0


def _gain(effect: float, spread: float = 0.004, draws: int = 0) -> dict:
    """A task-vector row over 40 facts: a gain of ``effect`` (SE about ``spread``), against
    ``draws`` random vectors that each lose about 0.1 (rank p 1 / (draws + 1)), or none."""
    n = 40
    ids = list(range(n))
    noise = np.array([1.0, -1.0] * (n // 2)) * np.linspace(0.5, 1.5, n) * spread * 6
    base = np.full(n, 0.4)
    new = base + effect + noise
    if not draws:
        return make_row(C.TASK_VECTOR, paired_test(base, new, ids))
    pop = [base - 0.1 + 0.0001 * j + noise for j in range(draws)]
    vs = rank_population_test(new, pop, ids, base=base, direction=1)
    return make_row(C.TASK_VECTOR, paired_test(base, new, ids), vs_control=vs)


def test_a_precise_zero_p_that_cannot_decide_does_not_move_the_claim_side() -> None:
    """A row beyond 0 but short of the smallest effect of interest (+0.034: its precise-zero
    p is tiny, yet it lies beyond the threshold, so no precise zero) whose 20 draws cannot
    decide it, beside a row with p 0.0225 and one with p 0.49 (both near or beyond the
    smallest effect of interest): one family over the smaller side placed the first row by
    its precise-zero p and judged the second at multiplier 2, where it held (0.045); Holm
    over the claim-side p-values judges it at 3 (0.0675)."""
    a, b, c = _gain(0.034, draws=20), _gain(0.065, 0.026), _gain(0.02, 0.026)
    assert a["p_against"] < 1e-3 and a["p"] == pytest.approx(1 / 21)
    assert b["p"] == pytest.approx(0.0225) and b["p_against"] > 0.5
    assert c["p"] > 0.4 and c["p_against"] > 0.1
    out = finalize([a, b, c])
    reject, adj, _, _ = multipletests([a["p"], b["p"], c["p"]], 0.05, "holm")
    assert [r["adjustment"]["p_decision"] for r in out] == pytest.approx(list(adj))
    assert out[1]["adjustment"]["multiplier"] == pytest.approx(3.0)
    assert out[1]["verdict"] == INCONCLUSIVE and not reject[1]
    # the other side is its own Holm family: the first row's precise-zero p leads it, yet it
    # cannot decide that row (its interval lies beyond 0): inconclusive, not "does not hold"
    assert out[0]["adjustment"]["multiplier_against"] == pytest.approx(3.0)
    assert out[0]["verdict"] == INCONCLUSIVE
    # its p column shows the side its estimate lies on (the rank p, adjusted 2/21), not the
    # smaller precise-zero p that cannot decide it
    assert out[0]["adjustment"]["deciding_side"] == "claim"
    assert out[0]["p_deciding_adjusted"] == pytest.approx(2 / 21)
    assert out[0]["value_text"].endswith("adjusted p = 0.0952")


def test_a_row_at_the_threshold_beside_precise_zeros_is_judged_at_holms_step() -> None:
    """Six gains at the threshold (false claims): five lie near 0 (precise zeros), one
    lies beyond 0 at 95% by chance (p 0.0225). One family over the smaller side placed
    the five first by their precise-zero p and judged the sixth at multiplier 1, where it
    held: a false "holds". Per side, the sixth leads the claim side at multiplier 6."""
    rows = [_gain(e, draws=200) for e in (0.0, -0.004, 0.003, -0.002, 0.001)]
    rows.append(_gain(0.010, draws=200))
    assert rows[-1]["p"] == pytest.approx(0.0225) and all(r["p_against"] < 1e-6 for r in rows)
    assert finalize(rows[-1:])[0]["verdict"] == HOLDS  # alone it holds: 0.0225 < 0.05
    out = finalize(rows)
    assert [r["verdict"] for r in out[:-1]] == [NOT_HOLDS] * 5  # precise zeros
    assert out[-1]["verdict"] == INCONCLUSIVE
    assert out[-1]["adjustment"]["multiplier"] == pytest.approx(6.0)
    _, adj, _, _ = multipletests([r["p"] for r in rows], 0.05, "holm")
    assert [r["adjustment"]["p_decision"] for r in out] == pytest.approx(list(adj))
    _, adj_o, _, _ = multipletests([r["p_against"] for r in rows], 0.05, "holm")
    assert [r["adjustment"]["p_against_decision"] for r in out] == pytest.approx(list(adj_o))


def test_each_side_is_holm_on_its_own_p() -> None:
    """A simulated family of six rows, each one more random draw: each side's p is the rank
    p or the opposite rank p (never the gain's own tiny p), and finalize's adjusted p-values
    are statsmodels' Holm on each side's."""
    from mechlingo.card.calibration_family import _rows

    rows, _ = _rows(np.random.default_rng(3), FAMILY_DESIGNS[0])
    ranks = [Test.from_json(r["vs_control"]) for r in rows]
    assert [r["p"] for r in rows] == [t.p for t in ranks]
    assert [r["p_against"] for r in rows] == [t.extra["p_opposite"] for t in ranks]
    assert all(min(r["p"], r["p_against"]) > 1 / 101 - 1e-12 for r in rows)
    out = finalize(rows)
    for side, key in (("p", "p_decision"), ("p_against", "p_against_decision")):
        _, adj, _, _ = multipletests([r[side] for r in rows], 0.05, "holm")
        assert [r["adjustment"][key] for r in out] == pytest.approx(list(adj))


def test_family_error_is_within_bounds_on_a_few_samples() -> None:
    res = [family_error(d, 25, seed=1) for d in FAMILY_DESIGNS]
    assert all(r["ok"] for r in res)
    assert res[2]["power"] >= 0.9  # true rows with 200 draws are decided
    assert res[1]["power"] == 0.0  # 20 draws cannot decide a row of a family of 6
    assert res[4]["power"] >= 0.9  # true gains with 200 draws hold beside rows at 0
    text = table_markdown(res)
    assert text.count("\n") == 2 + len(FAMILY_DESIGNS) and "met" in text
