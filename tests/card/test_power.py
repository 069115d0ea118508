"""The planner's power: simulated through each primary row's own tests and verdict, checked
against a hand computation (statsmodels' power of the t test), against the calibration
harness's own simulation of the same row type, and against the rank p's floor."""

import math
from dataclasses import replace
from functools import partial

import numpy as np
import pytest

from mechlingo.card import calibration as cal
from mechlingo.card.plan import PlanRow, annotate_rows
from mechlingo.card.population import draws_needed
from mechlingo.card.power import (
    Scenario,
    minimum_detectable,
    simulate_power,
    units_for_power,
)
from mechlingo.card.rules import PRIMARY, _label

K_LU, K_SUNDAR = 7.0, 6.0


def test_a_share_row_matches_statsmodels_power_of_the_t_test():
    """recall_failures on independent facts (one 0/1 item each, true share 0.65): the
    verdict's mean_test is a two-sided t test at 0.05 / 7 whose 'holds' needs the interval
    above 0.5, so its power is the t test's (the lower side's share is negligible)."""
    from statsmodels.stats.power import TTestPower

    n, p1 = 100, 0.65
    d = (p1 - 0.5) / math.sqrt(p1 * (1 - p1))
    # holds: the (1 - 0.05/7) interval above 0.5 and the two-sided p below 0.05/7
    want = TTestPower().power(effect_size=d, nobs=n, alpha=0.05 / K_LU, alternative="two-sided")
    sc = Scenario("recall_failures", "share", "facts", n, 1, None, K_LU, True, 0.5)
    got = simulate_power(sc, p1 - 0.5, max_se=0.02)
    assert got["se"] <= 0.02 and got["reps"] >= 400
    assert got["power"] == pytest.approx(want, abs=0.06), (got, want)  # 0.657 vs 0.654
    # the same row with no effect holds at most at its level (within 2 Monte Carlo SEs)
    null = simulate_power(sc, 0.0, max_se=0.02)
    assert null["power"] <= 0.05 / K_LU + 2 * null["se"]


@pytest.mark.parametrize("g,per", [(20, 5), (40, 11)])  # the quick and full budgets' units
def test_planner_agrees_with_the_calibration_harness(g, per):
    """The planner's power of a 0/1 share row (Beta cluster probabilities of the harness's
    ICC) against the harness's own simulation (its Beta(2, 2) spread of +/-0.3 around 0.65)
    at the same design and level: two different simulations of one verdict, within 0.1."""
    design = cal.Design("facts", "balanced", (per,) * g)
    share = next(r for r in cal.ROW_TYPES if r.name == "0/1 share vs 1/2")
    harness = cal.run_row(share, design, 300, ks=(K_LU,), seed=3)[0]["power"][0]
    icc = 0.3**2 * 0.2 / (0.65 * 0.35)  # var(0.3 (2 B - 1)), B ~ Beta(2, 2), over p (1 - p)
    sc = Scenario("recall_failures", "share", "facts", g, per, None, K_LU, True, 0.5, icc=icc)
    planner = simulate_power(sc, 0.15, max_se=0.03)
    assert planner["power"] == pytest.approx(harness, abs=0.1), (planner, harness)


def _facts(g: int, per: int) -> cal.Design:
    return cal.Design("facts", "balanced", (per,) * g)


_DOCS8 = cal.Design("documents", "balanced", (10,) * 8)
_DRAWS20 = cal.Design("draws", "population", (1,) * 20)
_LANGS5 = cal.Design("languages", "pairs", (1,) * 5)
#: Every primary row's kind: (harness row type, its sample drawn as the planner assumes
#: (random draws with no mean gain; a smaller clamp shift), design, planner scenario, the
#: true effect beyond the threshold). ICCs from the harness's spreads: var(h (2B - 1)) =
#: h^2 / 5 over p (1 - p).
PRIMARY_KINDS = {
    "latent_english": ("0/1 share vs 1/2 with its control", None, _facts(24, 5),
                       Scenario("latent_english", "share", "facts", 24, 5, None, K_LU, True,
                                0.5, icc=0.018), 0.15),
    "task_vector": ("effect vs population (100 draws)",
                    partial(cal._population, m=100, null_gain=0.0), _facts(24, 5),
                    Scenario("task_vector", "population", "facts", 24, 5, 100, 5.0, base=0.4,
                             icc=0.052), 0.15),
    "lowest_language": ("relative gain vs population (100 draws)",
                        partial(cal._sim_relative, draw_gain=0.0), _facts(60, 2),
                        Scenario("lowest_language", "relative", "facts", 60, 2, 100, 5.0,
                                 base=0.3, icc=0.021), 0.65),
    "clamp_steers": ("effect vs population (20 draws)",
                     partial(cal._population, m=20, null_gain=0.0), _facts(60, 1),
                     Scenario("clamp_steers", "population", "BOS samples", 60, 1, 20, 1.0,
                              base=0.4, icc=0.052, clustered=False), 0.15),
    "clamp_closer": ("continuous effect vs population (20 draws)",
                     partial(cal._sim_population_docs, shift=0.1), _DOCS8,
                     Scenario("clamp_closer", "population", "documents", 8, 10, 20, 1.0, False,
                              0.0, 1.0, 0.3), 0.1),
    "experts_exist": ("rank vs population (AUROC)", None, _DRAWS20,
                      Scenario("experts_exist", "rank", "draws", 20, 1, 20, 1.0, False,
                               sd=0.03), 0.1),
    "retrieval_gain_max": ("rank vs population (maximum)", None, _DRAWS20,
                           Scenario("retrieval_gain_max", "rank", "draws", 20, 1, 20, 1.0,
                                    False, sd=0.03), 0.1),
    "experts_disjoint": ("overlap (languages as units)", None, _LANGS5,
                         Scenario("experts_disjoint", "overlap", "languages", 5, 1, None, 1.0,
                                  False, sd=0.05), 0.05),
}  # fmt: skip


def _harness_power(name, sim, design, k, reps, seed=11):
    row = next(r for r in cal.ROW_TYPES if r.name == name)
    if sim is not None:
        row = replace(row, simulate=sim)
    outs = cal._outcomes(row, design, reps, True, (k,), np.random.default_rng(seed))[k]
    return sum(o.verdict == "holds" for o in outs) / reps


def test_every_primary_row_kind_is_compared():
    """Each primary claim is one of the compared kinds (the independence rows' held-out
    gain and the retrieval gain are population rows like task_vector and clamp_closer;
    recall_failures is the share row of the test above)."""
    same = {"diff_vector": "task_vector", "independent_relations": "task_vector",
            "independent_languages": "task_vector", "retrieval_improves": "clamp_closer",
            "recall_failures": "latent_english"}  # fmt: skip
    for ids in PRIMARY.values():
        for rid in ids:
            assert same.get(rid, rid) in PRIMARY_KINDS, rid


@pytest.mark.parametrize("rid", list(PRIMARY_KINDS))
def test_planner_agrees_with_the_harness_on_every_primary_row(rid):
    """Planned power (power.simulate_power) against the harness's rate of 'holds' (the row
    type built as its stage builds it) at the same design, truth and Holm multiplier, where
    the power is informative (0.15 to 0.9): within 0.1 (400 samples each: Monte Carlo SEs
    at most 0.025; fixed seeds).
    With too few draws for the rank p (k = 7 against 20 draws) both are exactly 0."""
    name, sim, design, sc, effect = PRIMARY_KINDS[rid]
    harness = _harness_power(name, sim, design, sc.k, 400)
    planner = simulate_power(sc, effect, max_se=0.025, max_reps=400)
    assert 0.15 <= harness <= 0.9, harness
    assert planner["power"] == pytest.approx(harness, abs=0.1), (planner, harness)
    if sc.draws is not None:
        few = replace(sc, draws=20, k=K_LU)
        assert few.draw_limited
        assert simulate_power(few, effect, max_reps=100)["power"] == 0.0
        assert _harness_power(name, sim, design, K_LU, 100) == 0.0


@pytest.mark.parametrize(
    "sc,effect",
    [
        (Scenario("task_vector", "population", "facts", 20, 5, 5, K_LU, base=0.4), 0.3),
        (Scenario("lowest_language", "relative", "facts", 40, 1, 20, K_LU, base=0.3), 1.0),
        (Scenario("clamp_steers", "population", "BOS samples", 24, 1, 20, K_SUNDAR,
                  clustered=False), 0.4),
        (Scenario("experts_exist", "rank", "draws", 20, 1, 20, K_SUNDAR, False, sd=0.03), 0.3),
        (Scenario("independent_relations", "population", "facts", 36, 1, 1, K_LU), 0.3),
    ],
)  # fmt: skip
def test_rows_with_too_few_draws_never_hold(sc, effect):
    """The rank p is at least 1 / (m + 1), so with fewer draws than draws_needed a row
    cannot hold at any effect: the simulation must say 0, even at a huge effect."""
    assert sc.draws < draws_needed(sc.k) and sc.draw_limited
    assert simulate_power(sc, effect)["power"] == 0.0
    assert minimum_detectable(sc) is None and units_for_power(sc, effect) is None


def test_enough_draws_let_a_population_row_hold():
    """With 140 draws (20 x 7) the same row holds often at a large effect: the zero above
    is the draws', not a broken simulation."""
    sc = Scenario("task_vector", "population", "facts", 30, 5, 140, K_LU, base=0.4)
    assert not sc.draw_limited
    assert simulate_power(sc, 0.3, max_se=0.05)["power"] > 0.8


def test_mde_and_units_bracket_the_planned_power():
    """At the simulated MDE the row's power is about 0.8; at the units the planner says
    the planned effect needs, a direct run of the row reaches about 0.8 too."""
    sc = Scenario("experts_disjoint", "overlap", "languages", 8, 1, None, K_SUNDAR, False,
                  sd=0.05)  # fmt: skip
    mde = minimum_detectable(sc, reps=200)
    assert mde is not None and 0 < mde < 0.1
    assert simulate_power(sc, mde)["power"] == pytest.approx(0.8, abs=0.1)
    n = units_for_power(sc, 0.03, reps=150)
    assert n is not None and n > 8
    direct = simulate_power(Scenario(**{**sc.to_json(), "g": n}), 0.03)
    assert direct["power"] == pytest.approx(0.8, abs=0.1), (n, direct)


def _plan_row(rid: str, effect: float) -> PlanRow:
    return PlanRow("lu2025", rid, "facts", effect, "", 20, 5, None, None, 0.3, 0.02, 400,
                   0.2, 80, 1.0)  # fmt: skip


def test_annotate_flags_a_row_whose_mde_exceeds_its_planned_effect():
    from mechlingo.card.plan import Plan

    plan = Plan([_plan_row("latent_english", 0.15), _plan_row("task_vector", 0.05)], {}, 0.0)
    base = {"paper": "lu2025", "family": "primary", "claim": "c", "value": {"x": 1},
            "adjustment": {"multiplier": 7}}  # fmt: skip
    rows = [
        {**base, "id": "latent_english", "mde": 0.25},
        {**base, "id": "task_vector", "mde": 0.01,
         "vs_control": {"extra": {"decides": "rank", "draws": 5}}},
        {**base, "id": "latent_english", "family": "secondary", "mde": 0.9},
    ]  # fmt: skip
    annotate_rows(rows, plan)
    le, tv, sec = rows
    assert le["mde_achieved"] == 0.25 and "0.25 > planned effect 0.15" in le["underpowered"]
    assert le["plan"]["power"] == 0.3 and le["plan"]["reps"] == 400
    assert tv["mde_achieved"] is None and "1/6" in tv["underpowered"]
    assert "plan" not in sec and "underpowered" not in sec
    assert "[underpowered: achieved MDE 0.25" in _label(le)
    rows[0]["mde"] = 0.1
    annotate_rows(rows, plan)
    assert rows[0]["underpowered"] is None and "underpowered" not in _label(rows[0])
    rows[0]["mde"] = math.nan  # too few clusters for an SE: nothing is detectable
    annotate_rows(rows, plan)
    assert rows[0]["mde_achieved"] is None and "no minimum detectable" in rows[0]["underpowered"]


def test_a_loaded_machine_leaves_the_measured_cpu_per_item_alone(tiny, tmp_path):
    """The planner's per-item cost (the embedding pass of the align estimate) is process CPU
    time after an untimed warm-up: three busy processes beside it (more than this machine's
    cores) leave it within 30%, where wall time would grow by the share of a core it loses."""
    import multiprocessing as mp
    import time

    from mechlingo.card import replicate as rep
    from mechlingo.card.stages import CardSettings
    from mechlingo.card.stages.base import Context
    from mechlingo.core.checkpoints import Checkpoints
    from mechlingo.data import parallel_sentences

    cfg = rep.budget_settings("quick")
    par = parallel_sentences(["en", "fr", "es"])

    def cost() -> tuple[float, float]:
        t0 = time.perf_counter()
        ctx = Context(tiny, None, par, CardSettings.of(cfg), Checkpoints(tmp_path, {}))
        c = rep._embed_cost(ctx)["embed"]  # noqa: SLF001
        return c, time.perf_counter() - t0

    quiet = min(cost() for _ in range(3))
    hogs = [mp.get_context("spawn").Process(target=_spin, daemon=True) for _ in range(3)]
    for h in hogs:
        h.start()
    try:
        time.sleep(1.0)
        loaded = min(cost() for _ in range(3))
    finally:
        for h in hogs:
            h.terminate()
            h.join()
    assert quiet[0] > 0 and loaded[0] == pytest.approx(quiet[0], rel=0.3), (quiet, loaded)


def _spin() -> None:
    while True:
        pass
