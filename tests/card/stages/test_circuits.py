"""The circuits stage ("the same mechanism as English"): its measurement on the tiny model,
its rows from hand-made results, and a simulation of its verdict procedure (the ratio's
clustered interval and the rule's error rate at the threshold) through the stage's own code."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mechlingo.card.claims import SAME_MECHANISM_SHARE
from mechlingo.card.rules import HOLDS, INCONCLUSIVE, NOT_HOLDS, NOT_TESTABLE, finalize
from mechlingo.card.stages import QUICK, CardSettings, budget_settings
from mechlingo.card.stages import circuits as S
from mechlingo.core.errors import InputError
from mechlingo.data import load_facts


def test_the_stage_measures_every_language_on_the_tiny_model(tiny, monkeypatch):
    # the tiny random model answers nothing: every fact counts as answered, to measure
    monkeypatch.setattr(S, "_correct_first", lambda model, facts, n, cfg: list(facts)[:n])
    cfg = budget_settings("quick", {"circuits": {"langs": ["fr"], "dev_per_lang": 4,
                                                 "test_per_lang": 5, "steps": 1, "draws": 19}})  # fmt: skip
    facts = load_facts(langs=["en", "fr"], relations="capital", templates="natural")
    data = json.loads(
        json.dumps(S.stage_circuits(tiny, facts, CardSettings.of(cfg)))
    )  # stored as JSON
    d = data["langs"]["fr"]
    assert "untestable" not in d, d
    t = d["test"]
    n = len(t["ids"])
    assert 3 <= n <= 5 and all(len(t[k]) == n for k in ("clean", "corrupted", "english", "own"))
    # the test ids are test-split fr facts, never dev ones
    dev_ids = {f.id for f in facts if f.lang == "fr"} - set(t["ids"])
    assert set(t["ids"]) <= {f.id for f in facts if f.lang == "fr"} and dev_ids
    assert d["dev_en"]["n_edges"] in (*S.SIZES, d["dev_en"]["n_scored"])
    assert len(d["null"]) == 19 and 0 <= d["jaccard"] <= 1
    [row] = S.rows_circuits(data)
    assert row["id"] == "same_mechanism" and row["lang"] == "fr" and row["family"] == "secondary"
    clean, corr, eng = (np.asarray(t[k]) for k in ("clean", "corrupted", "english"))
    if row["verdict"] != NOT_TESTABLE:  # the hand ratio of sums
        hand = (eng - corr).sum() / (clean - corr).sum()
        assert row["value"]["estimate"]["estimate"] == pytest.approx(hand, rel=1e-9)


def _data(faith: float, noise: float, jaccard: float, null: float, *, g: int = 12, seed: int = 0):
    """A stored result of one language by hand: ``g`` facts, clean - corrupted between 4 and
    12 nats, the English circuit keeping ``faith`` of it plus fact-level noise."""
    rng = np.random.default_rng(seed)
    den = rng.uniform(4, 12, g)
    corr = -den - 1.0
    eng = corr + faith * den + noise * rng.standard_normal(g) * den
    brief = {"n": 8, "n_edges": 50, "faithfulness": {"faithfulness": 0.8}, "n_scored": 3515}
    return {"langs": {"fr": {
        "test": {"ids": [f"f{i}" for i in range(g)], "clean": (corr + den).tolist(),
                 "corrupted": corr.tolist(), "english": eng.tolist(), "own": eng.tolist()},
        "dev_en": brief, "dev": brief, "jaccard": jaccard, "null": [null] * 999}}}  # fmt: skip


@pytest.mark.parametrize(
    ("faith", "noise", "jaccard", "null", "verdict"),
    [
        (0.9, 0.02, 0.4, 0.01, HOLDS),  # faithful on fr, overlapping far beyond random
        (0.1, 0.02, 0.4, 0.01, NOT_HOLDS),  # the English circuit carries little of fr
        (0.9, 0.02, 0.01, 0.01, INCONCLUSIVE),  # faithful, but no more overlap than random
        (0.55, 0.4, 0.4, 0.01, INCONCLUSIVE),  # too noisy to tell
    ],
)
def test_rows_from_hand_cases(faith, noise, jaccard, null, verdict):
    [row] = finalize(S.rows_circuits(_data(faith, noise, jaccard, null)))
    assert row["verdict"] == verdict, row["reason"]
    assert row["rule"]["threshold"] == SAME_MECHANISM_SHARE
    if verdict == HOLDS:
        assert row["vs_control"]["p"] == pytest.approx(1 / 1000)  # the rank p's floor
    if verdict == INCONCLUSIVE and noise > 0.1:
        assert "minimum detectable effect" in row["reason"]


def test_untestable_languages_and_the_rank_test():
    data = {"langs": {"ja": {"untestable": "2 correctly answered test facts (fewer than 3)"}}}
    [row] = S.rows_circuits(data)
    assert row["verdict"] == NOT_TESTABLE and "ja" in row["reason"]
    t = S.jaccard_rank_test(0.3, [0.1, 0.3, 0.5, 0.0])
    assert t.p == pytest.approx(3 / 5) and t.extra["p_opposite"] == pytest.approx(4 / 5)
    assert t.estimate.estimate == pytest.approx(0.3 - 0.225)
    with pytest.raises(InputError, match="random draw"):
        S.jaccard_rank_test(0.3, [])


def test_the_budget_is_checked_and_the_quick_one_is_small():
    assert QUICK.circuits.langs == ("fr", "es") and QUICK.circuits.target == 0.8
    with pytest.raises(InputError, match="circuits.langs"):
        budget_settings("quick", {"circuits": {"langs": ["en", "fr"]}})
    with pytest.raises(InputError, match="circuits.dev_per_lang"):
        budget_settings("quick", {"circuits": {"dev_per_lang": 2}})


def test_simulated_verdicts_are_calibrated_at_the_threshold():
    """Through rows_circuits and finalize: with the true faithfulness at the threshold the
    row holds in at most about 2.5% of 400 simulated cards (a one-sided error at 0.05
    two-sided), its 95% interval covers the true ratio in 92-98% of them, and at a true
    faithfulness of 0.8 it holds in most."""
    rates, cover = {}, 0
    for faith in (SAME_MECHANISM_SHARE, 0.8):
        got = []
        for seed in range(400):
            [row] = finalize(S.rows_circuits(_data(faith, 0.25, 0.4, 0.01, seed=seed)))
            got.append(row["verdict"])
            if faith == SAME_MECHANISM_SHARE:
                est = row["value"]["estimate"]
                cover += est["lo"] <= faith <= est["hi"]
        rates[faith] = got.count(HOLDS) / len(got)
    assert rates[SAME_MECHANISM_SHARE] <= 0.025 + 2 * (0.025 * 0.975 / 400) ** 0.5
    assert 0.92 <= cover / 400 <= 0.98
    assert rates[0.8] > 0.6


def test_correct_facts_are_found_in_order_within_a_bounded_scan(monkeypatch):
    from types import SimpleNamespace

    facts = [SimpleNamespace(id=f"f{i:02d}") for i in range(40)]
    scored: list[str] = []

    def fake(model, chunk, **kw):
        scored.extend(f.id for f in chunk)
        return SimpleNamespace(records=[{"id": f.id, "correct": int(f.id[1:]) % 3 == 0}
                                        for f in chunk])  # fmt: skip

    monkeypatch.setattr(S, "evaluate_facts", fake)
    cfg = CardSettings.of(budget_settings("quick", {"circuits": {"max_new_tokens": 4}}))
    got = S._correct_first(None, facts, 4, cfg)
    assert [f.id for f in got] == ["f00", "f03", "f06", "f09"] and len(scored) == 12
    calls: list[int] = []

    def none(model, chunk, **kw):
        calls.append(len(chunk))
        return SimpleNamespace(records=[{"id": f.id, "correct": False} for f in chunk])

    monkeypatch.setattr(S, "evaluate_facts", none)
    assert S._correct_first(None, facts, 4, cfg) == []
    assert sum(calls) == S.SCAN * 4  # none correct: a bounded scan, not all 40 facts


def test_a_part_in_expectation_scores_what_the_selection_scores():
    # the 1-in-3 case above: chunks of 4 until 4 are found, 12 facts scored
    assert S.expected_part(4, 40, 1 / 3) == S.PartCost(4.0, (4, 4, 4))
    # a full test part of 45 facts at 0.4: 24 (9.6 found), then the 21 left (18 found)
    assert S.expected_part(24, 45, 0.4) == S.PartCost(pytest.approx(18.0), (24, 21))
    # a rarely answered language: the scan stops at SCAN x 16 = 64 facts, 4.8 found
    got = S.expected_part(16, 82, 0.075)
    assert got.chunks == (16, 16, 16, 16) and got.found == pytest.approx(4.8)
    # every fact answered (or no rate known): one chunk, every fact asked for
    assert S.expected_part(8, None, 1.0) == S.PartCost(8.0, (8,))


def test_the_cost_counts_the_facts_the_stage_will_use():
    cfg = CardSettings.of(budget_settings("quick"))  # fr, es; 8 dev and 12 test; 3 steps
    assert cfg.batch() >= 12  # every chunk is one batch
    pools = {"en": {"dev": 82}, "fr": {"dev": 82, "test": 45}, "es": {"dev": 82, "test": 45}}
    sizes = {"processes": 1, "circuits": {"pools": pools,
                                          "rates": {"en": 1.0, "fr": 0.5, "es": 0.25}}}  # fmt: skip
    unit = {"rank": 0.1}
    # by hand: en dev one chunk of 8; fr dev 8 + 8, fr test 12 + 12 (12 found); es dev
    # 4 chunks of 8 (8 found), es test 12 + 12 + 12 + 9 (11.25 found): 125 facts scored,
    # 24 dev facts, 23.25 test pairs
    hand = (24 * S.PER_DEV_FACT + 125 * S.PER_SELECTED_FACT + 23.25 * S.PER_TEST_FACT) * 0.1
    assert S.cost(cfg, sizes, unit) == pytest.approx(hand)
    # es at 0.05: 1.6 dev facts and 2.25 test pairs, under MIN_PAIRS: only its scan counts
    low = {**sizes, "circuits": {"pools": pools, "rates": {"en": 1.0, "fr": 0.5, "es": 0.05}}}
    hand = (16 * S.PER_DEV_FACT + 125 * S.PER_SELECTED_FACT + 12 * S.PER_TEST_FACT) * 0.1
    assert S.cost(cfg, low, unit) == pytest.approx(hand)
    # under two processes each chunk (one batch) and each test pair run whole: all but the
    # shared dev facts double
    two = S.cost(cfg, {**sizes, "processes": 2}, unit)
    assert two == pytest.approx(2 * S.cost(cfg, sizes, unit) - 24 * S.PER_DEV_FACT * 0.1)
    # no rates: every fact asked for found in one chunk (the budget as asked)
    asked = (24 * S.PER_DEV_FACT + 48 * S.PER_SELECTED_FACT + 24 * S.PER_TEST_FACT) * 0.1
    assert S.cost(cfg, {"processes": 1}, unit) == pytest.approx(asked)


def test_the_planner_knows_the_pools_and_rates_before_the_stage():
    from mechlingo.data import template_info

    cfg = CardSettings.of(budget_settings("full"))
    info = template_info()
    got = S.plan_sizes(None, cfg, info["source"]["model"])
    # the bundled capital facts split 54 / 28 / 45 per language: dev = build + dev
    assert got["pools"]["en"] == {"dev": 82, "test": 45} and got["pools"]["ja"]["test"] == 45
    caps = info["templates"]["capital"]
    assert got["rates"] == {lg: caps[lg]["accuracy"] for lg in ("en", "fr", "de", "es", "ja")}
    # the stems' accuracy says nothing of another model: no rate
    assert S.plan_sizes(None, cfg, "another/model")["rates"] == {}
    # the user's facts: the metric stage's greedy dev accuracy on them, per language
    facts = load_facts(langs=["en", "fr", "de", "es", "ja"], relations=["capital"])
    counts = {"generate": {"en": [9, 10], "fr": [3, 12], "ru": [1, 4]}}
    mine = S.plan_sizes(facts, cfg, "another/model", {"counts": counts})
    assert mine["rates"] == {"en": 0.9, "fr": 0.25} and "dev split" in mine["rate_source"]
    assert mine["pools"]["fr"]["test"] > 0
