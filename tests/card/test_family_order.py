"""The order of a card family: each row placed by a p that decides it (Holm's step-down).

A row whose effect lies far beyond 0 but whose rank among its 20 draws (p = 1/21) cannot reach
a Holm level used to be ordered by its effect's two-sided p counted as "the other side", so the
rows after it were judged at smaller multipliers than Holm allows."""

from __future__ import annotations

import numpy as np
import pytest
from statsmodels.stats.multitest import multipletests

from mechlingo.card import claims as C
from mechlingo.card.calibration_family import FAMILY_DESIGNS, family_error, table_markdown
from mechlingo.card.clustered_tests import Test, paired_test
from mechlingo.card.population import rank_population_test
from mechlingo.card.rules import HOLDS, INCONCLUSIVE, _decision_p, _side_p, finalize, make_row

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
    assert _decision_p(a) == pytest.approx(1 / 21)
    out = finalize([a, b])
    # Holm over the two rows' deciding p-values rejects nothing: 2 * p_b > 0.05
    reject, adj, _, _ = multipletests([_decision_p(a), _decision_p(b)], 0.05, "holm")
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


def test_the_family_order_is_holm_on_the_deciding_p() -> None:
    """A simulated family of six rows, each one more random draw: its p is the smaller of its
    rank p and the opposite rank p (never the gain's own tiny p), and finalize's adjusted
    p-values are statsmodels' Holm on those."""
    from mechlingo.card.calibration_family import _rows

    rows, _ = _rows(np.random.default_rng(3), FAMILY_DESIGNS[0])
    dec = [_decision_p(r) for r in rows]
    ranks = [Test.from_json(r["vs_control"]) for r in rows]
    assert dec == [min(t.p, t.extra["p_opposite"]) for t in ranks]
    assert all(d > 1 / 101 - 1e-12 for d in dec)
    out = finalize(rows)
    _, adj, _, _ = multipletests(dec, 0.05, "holm")
    assert [r["adjustment"]["p_decision"] for r in out] == pytest.approx(list(adj))


def test_family_error_is_within_bounds_on_a_few_samples() -> None:
    res = [family_error(d, 25, seed=1) for d in FAMILY_DESIGNS]
    assert all(r["ok"] for r in res)
    assert res[2]["power"] >= 0.9  # true rows with 200 draws are decided
    assert res[1]["power"] == 0.0  # 20 draws cannot decide a row of a family of 6
    text = table_markdown(res)
    assert text.count("\n") == 2 + len(FAMILY_DESIGNS) and "met" in text
