"""The card's rows (the row builders of mechlingo.card.stages) and the lowest-language rules
(mechlingo.analyses.recall.dev_grid.lowest_language_rule) on hand-made stage results."""

from __future__ import annotations

import math
import types

import numpy as np
import pytest
import torch
from scipy import stats as sps

from mechlingo.analyses.recall.dev_grid import lowest_language_dev, lowest_language_rule
from mechlingo.card import claims
from mechlingo.card.clustered_tests import Test, paired_test
from mechlingo.card.rules import (
    FLOOR,
    HOLDS,
    INCONCLUSIVE,
    NOT_HOLDS,
    NOT_TESTABLE,
    RETAINED_SHARE,
    finalize,
)
from mechlingo.card.stages import align, experts, repair, trace, transfer
from mechlingo.kernels.significance import wilson

Y, N = True, False


def _pairs(n, zero_right, few_right):
    """``n`` paired dev items: the first ``zero_right`` right zero-shot, ``few_right`` few-shot."""
    return [i < zero_right for i in range(n)], [i < few_right for i in range(n)]


# --------------------------------------------------------------------------------------
# One literal and one headroom rule, ties pooled
# --------------------------------------------------------------------------------------


def test_es_fr_ru_the_two_rules_and_the_tie():
    """The quick card's disagreement: es and fr tie on dev zero-shot among the languages
    with headroom (the old protocol rule took the lower few-shot, the old card rule the
    higher: fr and es), while the plain lowest language is ru, which has no headroom."""
    table = {
        "en": _pairs(10, 8, 9),
        "es": _pairs(10, 1, 8),  # headroom (7 fixed, p = 0.016)
        "fr": _pairs(10, 1, 6),  # headroom (5 fixed, p = 0.0625), same zero-shot as es
        "ru": _pairs(10, 0, 0),  # the lowest, no headroom
        "ja": _pairs(10, 3, 3),
    }
    zero = {lg: z for lg, (z, _) in table.items()}
    few = {lg: f for lg, (_, f) in table.items()}
    out = lowest_language_rule(zero, few)
    assert out["languages"] == ["es", "fr"]  # both, pooled: no tie-break decides
    assert out["literal_languages"] == ["ru"] and out["literal"] == "ru"
    assert out["language"] == "fr"  # the display pick only (lower few-shot)
    assert out["excluded"] == ["ja", "ru"] and "en" not in out["excluded"]
    assert out["tests"]["es"]["p"] == pytest.approx(sps.binomtest(7, 7).pvalue)
    # a literal tie keeps every tied language; the Wilson-dict form agrees on the pick
    zero["ja"] = [N] * 10
    tied = lowest_language_rule(zero, few)
    assert tied["literal_languages"] == ["ja", "ru"]
    w = {lg: wilson(sum(z), len(z)).to_json() for lg, z in zero.items()}
    wf = {lg: wilson(sum(f), len(f)).to_json() for lg, f in few.items()}
    assert lowest_language_dev(w, wf) == tied["literal"]
    none = lowest_language_rule({"en": [Y], "fr": [N] * 3}, {"en": [Y], "fr": [Y] * 3})
    assert none["languages"] == [] and none["language"] is None  # 3 fixed: p = 0.25


# --------------------------------------------------------------------------------------
# Repair rows
# --------------------------------------------------------------------------------------


def _repair_data():
    """10 facts in es, fr, ru (the same ids in each language), two random seeds."""
    ids = [f"capital/{i}" for i in range(10)]
    out = {
        "orig": {"en": [Y] * 10, "es": [Y] * 2 + [N] * 8, "fr": [Y] * 2 + [N] * 8, "ru": [N] * 10},
        "task": {"en": [Y] * 10, "es": [Y] * 9 + [N], "fr": [Y] * 8 + [N] * 2, "ru": [Y] * 6 + [N] * 4},
        "diff": {"en": [Y] * 10, "es": [Y] * 2 + [N] * 8, "fr": [Y] * 2 + [N] * 8, "ru": [N] * 10},
        "both": {"en": [Y] * 10, "es": [Y] * 10, "fr": [Y] * 9 + [N], "ru": [Y] * 7 + [N] * 3},
        "random_s0": {"en": [Y] * 10, "es": [Y] * 2 + [N] * 8, "fr": [Y] * 3 + [N] * 7, "ru": [N] * 10},
        "random_s1": {"en": [Y] * 10, "es": [Y] * 2 + [N] * 8, "fr": [Y] * 2 + [N] * 8, "ru": [N] * 10},
    }  # fmt: skip
    lowest = {"languages": ["es", "fr"], "literal_languages": ["ru"], "p_threshold": 0.1,
              "rule": "headroom rule", "literal_rule": "literal rule"}  # fmt: skip
    summary = {"selected": "both", "dev_effect": "chosen", "config": {}}
    return {"summary": summary, "outcomes": out, "ids": dict.fromkeys(out["orig"], ids),
            "lowest": lowest, "n_ids": {"build": 1, "dev": 1, "test": 10}}  # fmt: skip


def test_repair_rows_cluster_by_fact_and_pool_the_seeds():
    rows = {(r["id"], r.get("variant")): r for r in finalize(repair.rows_repair(_repair_data()))}
    rnd = rows[("random_vector", None)]
    assert rnd["value"]["estimate"]["n"] == 30  # items, not items x seeds
    assert rnd["value"]["n_clusters"] == 10  # one fact in three languages is one unit
    assert rnd["value"]["estimate"]["estimate"] == pytest.approx(
        0.5 / 30
    )  # one item, half the seeds
    task = rows[("task_vector", None)]
    base = [float(x) for lg in ("es", "fr", "ru") for x in _repair_data()["outcomes"]["orig"][lg]]
    new = [float(x) for lg in ("es", "fr", "ru") for x in _repair_data()["outcomes"]["task"][lg]]
    ids = _repair_data()["ids"]["es"] * 3
    want = paired_test(base, new, ids)
    assert task["value"]["estimate"] == want.estimate.to_json()
    assert task["vs_control"]["estimate"]["estimate"] == pytest.approx(
        want.estimate.estimate - 0.5 / 30
    )
    # two random draws: the effect's rank among them gives p = 1/3 at best, and the rank p
    # is the verdict's (one definition of beating a control); the t p is kept beside it
    assert task["vs_control"]["extra"]["p_rank"] == pytest.approx(1 / 3)
    assert task["vs_control"]["p"] == pytest.approx(1 / 3)
    assert task["vs_control"]["extra"]["p_t"] < 0.05 and task["vs_control"]["extra"]["draws"] == 2
    assert task["verdict"] == INCONCLUSIVE and "undecidable at this budget: needs" in task["reason"]
    assert task["outcome"] == "accuracy"  # no gold shares stored: 0/1 correctness
    assert rows[("diff_vector", None)]["verdict"] != HOLDS  # no change at all
    # the lowest language: literal ru (baseline 0: the relative reading is untestable, with
    # its reason, and the points reading is judged), headroom es+fr pooled (20 items)
    rel = rows[("lowest_language", "literal rule, relative")]
    assert rel["verdict"] == NOT_TESTABLE and "is 0 (0 of 10)" in rel["reason"]
    pts = rows[("lowest_language", "literal rule, points")]
    assert pts["value"]["estimate"]["estimate"] == pytest.approx(0.7)
    assert pts["verdict"] in (HOLDS, INCONCLUSIVE) and pts["p"] is not None
    head = rows[("lowest_language", "headroom rule, relative")]
    assert head["value"]["estimate"]["n"] == 20 and head["langs"] == ["es", "fr"]
    assert head["value"]["estimate"]["estimate"] == pytest.approx(19 / 4 - 1)
    assert head["family"] == "primary" and pts["family"] == "secondary"
    assert all(math.isfinite(head["value"]["estimate"][k]) for k in ("lo", "hi"))


def test_a_population_of_99_draws_lets_the_task_vector_hold():
    d = _repair_data()
    for i in range(2, 99):  # 99 draws, none as good as the task vector: p = 1/100
        d["outcomes"][f"random_s{i}"] = d["outcomes"]["random_s1"]
    rows = {(r["id"], r.get("variant")): r for r in finalize(repair.rows_repair(d))}
    task = rows[("task_vector", None)]
    assert task["vs_control"]["extra"]["p_rank"] == pytest.approx(0.01)
    assert task["verdict"] == HOLDS
    assert task["adjustment"]["method"].startswith("Holm over the")


def test_repair_rows_at_the_floor():
    d = _repair_data()
    d["outcomes"] = {c: {lg: [N] * 10 for lg in v} for c, v in d["outcomes"].items()}
    rows = finalize(repair.rows_repair(d))
    assert {r["verdict"] for r in rows if r["id"] in ("task_vector", "random_vector")} == {FLOOR}
    assert all(r["verdict"] != HOLDS for r in rows)


def test_no_headroom_is_not_testable_with_its_reason():
    d = _repair_data()
    d["lowest"]["languages"] = []
    rows = [r for r in repair.rows_repair(d) if r.get("variant", "").startswith("headroom")]
    assert [r["verdict"] for r in rows] == [NOT_TESTABLE] * 2
    assert all("no headroom" in r["reason"] for r in rows)


# --------------------------------------------------------------------------------------
# Independence rows
# --------------------------------------------------------------------------------------


def _cell(row, col, orig, steered, control, ids=None):
    ids = ids or [f"{col}/{i}" for i in range(len(orig))]
    return {"row": row, "col": col, "items": {"ids": ids, "orig": orig, "steered": steered,
                                               "control": control}}  # fmt: skip


def test_independence_pooled_gain_and_retained_share():
    o = [0] * 12
    cells = [
        _cell("all", "a", o, [1] * 8 + [0] * 4, o),
        _cell("all_but_a", "a", o, [1] * 6 + [0] * 6, o),
        _cell("all", "b", o, [1] * 10 + [0] * 2, o),
        _cell("all_but_b", "b", o, [1] * 4 + [0] * 8, [1] + [0] * 11),
    ]
    gain, share = finalize(transfer.rows_transfer(claims.INDEPENDENT_RELATIONS, {"cells": cells}))
    assert gain["variant"] == "held-out gain" and gain["value"]["estimate"]["n"] == 24
    assert gain["value"]["estimate"]["estimate"] == pytest.approx(10 / 24)
    assert gain["vs_control"]["estimate"]["estimate"] == pytest.approx(9 / 24)
    # one random vector per cell: a population of one draw, judged by rank, never decides
    assert gain["vs_control"]["extra"]["draws"] == 1 and gain["vs_control"]["p"] == 0.5
    assert gain["verdict"] == INCONCLUSIVE and "at least 0.5" in gain["reason"]
    assert gain["family"] == "primary" and share["family"] == "secondary"
    assert share["value"]["estimate"]["estimate"] == pytest.approx(10 / 18)  # (6+4) / (8+10)
    assert share["rule"]["threshold"] == RETAINED_SHARE
    assert share["verdict"] == INCONCLUSIVE  # 0.56 of the gain kept: not surely above 0.5
    flat = [_cell("all", "a", o, o, o), _cell("all_but_a", "a", o, [1] * 5 + [0] * 7, o)]
    _, none = transfer.rows_transfer(claims.INDEPENDENT_RELATIONS, {"cells": flat})
    assert none["verdict"] == NOT_TESTABLE and "no gain to retain" in none["reason"]
    empty = transfer.rows_transfer(
        claims.INDEPENDENT_LANGUAGES, {"cells": [_cell("all", "a", o, o, o)]}
    )
    assert [r["verdict"] for r in empty] == [NOT_TESTABLE] * 2


# --------------------------------------------------------------------------------------
# Experts, overlap, clamp, alignment
# --------------------------------------------------------------------------------------


def test_overlap_treats_languages_as_the_units():
    rng = np.random.default_rng(0)
    m = rng.uniform(0.0, 0.1, (6, 6))
    m = (m + m.T) / 2
    m[2, :] = m[:, 2] = 0.3  # one language shares a lot with every other
    np.fill_diagonal(m, 1.0)
    t = experts.overlap_test(m, 0.10)
    iu = np.triu_indices(6, 1)
    assert t.estimate.estimate == pytest.approx(m[iu].mean())
    loo = [np.delete(np.delete(m, i, 0), i, 1)[np.triu_indices(5, 1)].mean() for i in range(6)]
    se = math.sqrt(5 / 6 * sum((x - np.mean(loo)) ** 2 for x in loo))
    assert t.extra["se"] == pytest.approx(se)
    assert t.estimate.hi - t.estimate.estimate == pytest.approx(sps.t.ppf(0.975, 5) * se)
    # 15 pairs x k = 100 slots as independent trials would claim a far narrower interval
    naive = wilson(round(m[iu].sum() * 100), 15 * 100)
    assert t.estimate.hi - t.estimate.lo > 3 * (naive.hi - naive.lo)


def test_auroc_tests_cluster_by_sentence():
    gen = torch.Generator().manual_seed(0)
    n_sent, langs = 12, 3
    lang_ids = torch.arange(langs).repeat_interleave(n_sent)
    pooled = torch.randn(langs * n_sent, 20, generator=gen)
    pooled[lang_ids == 1, :5] += 3.0  # features 0-4 fire on language 1
    stats = types.SimpleNamespace(lang_ids=lang_ids, pooled=pooled, lang_index=lambda lg: 1)
    out = experts.auroc_tests(stats, "x", torch.arange(5), [torch.arange(10, 15)], 100, 0)
    e, r, v = (Test.from_json(out[k]) for k in ("experts", "random", "vs_random"))
    assert out["n_clusters"] == n_sent and out["n_pos"] == n_sent and out["n"] == 36
    assert e.estimate.estimate > 0.95 and e.p == pytest.approx(1 / 1000)  # every permutation below
    assert r.p > 0.01 and r.estimate.lo < 0.5 < r.estimate.hi
    assert v.estimate.lo > 0 and e.estimate.lo <= e.estimate.estimate <= e.estimate.hi


OVERLAP = [[1.0, 0.01, 0.02, 0.015], [0.01, 1.0, 0.03, 0.02], [0.02, 0.03, 1.0, 0.01],
           [0.015, 0.02, 0.01, 1.0]]  # fmt: skip


def _experts_data(k=50, draws=1):
    test = Test.from_json(paired_test([0] * 10, [1] * 10).to_json()).to_json()
    bos = {"none": [0] * 16, "experts": [1] * 12 + [0] * 4}
    curve = [{"arm": a, "k": 0 if a == "none" else k, "bos_hits": h,
              "target_rate_bos": sum(h) / 16} for a, h in bos.items()]  # fmt: skip
    curve += [{"arm": "random", "k": k, "bos_hits": [0] * 15 + [1], "target_rate_bos": 1 / 16,
               "draw": i} for i in range(draws)]  # fmt: skip
    return {
        "target": "es", "measure_curve": curve, "measure_seed": 1,
        "choice_papers": {"k": k, "ppl_budget": 2.0}, "choice_strict": {"k": None},
        "auroc": {"experts": test, "random": test, "vs_random": test, "k": k, "n": 40,
                  "n_pos": 4, "n_clusters": 4, "k_rule": "the papers' rule"},
        "overlap": {"k": k, "matrix": OVERLAP, "chance": 0.01},
    }  # fmt: skip


def test_clamp_row_uses_the_measurement_samples():
    rows = {r["id"]: r for r in finalize(experts.rows_experts(_experts_data()))}
    st = rows["clamp_steers"]
    assert st["value"]["extra"]["fixed"] == 12 and st["value"]["p"] == pytest.approx(2 * 0.5**12)
    assert st["vs_control"]["estimate"]["estimate"] == pytest.approx(11 / 16)
    assert st["verdict"] == INCONCLUSIVE and "fresh BOS samples" in st["details"]
    assert st["vs_control"]["extra"]["p_floor"] == 0.5  # one random draw
    many = {r["id"]: r for r in finalize(experts.rows_experts(_experts_data(draws=99)))}
    assert many["clamp_steers"]["vs_control"]["extra"]["p_rank"] == pytest.approx(0.01)
    assert many["clamp_steers"]["verdict"] == HOLDS
    d = _experts_data()
    d["auroc"]["random_draws"] = [0.5] * 98 + [1.0]  # 99 random sets, one ties the experts
    (ex,) = [r for r in experts.rows_experts(d) if r["id"] == "experts_exist"]
    assert ex["vs_control"]["extra"]["p_rank"] == pytest.approx(2 / 100)
    assert ex["vs_control"]["estimate"]["estimate"] == pytest.approx(1.0 - (49 + 1) / 99)
    dis = rows["experts_disjoint"]
    excess = np.mean([0.01, 0.02, 0.015, 0.03, 0.02, 0.01]) - 0.01  # over chance k/N = 0.01
    assert dis["value"]["estimate"]["estimate"] == pytest.approx(excess)
    assert dis["verdict"] == HOLDS and dis["p"] > 0
    assert dis["control"]["estimate"]["estimate"] == pytest.approx(0.01)
    # the pair sharing 0.03 of 50 (2 neurons) of N = 5000: exact hypergeometric p
    assert min(dis["control"]["extra"]["pair_p"]) == pytest.approx(
        sps.hypergeom.sf(1, 5000, 50, 50)
    )
    d = _experts_data()
    d["choice_papers"]["k"], d["measure_curve"] = None, []
    (st,) = [r for r in experts.rows_experts(d) if r["id"] == "clamp_steers"]
    assert st["verdict"] == NOT_TESTABLE and "chose no k" in st["reason"]


def test_clamp_row_against_a_population_of_five_random_clamps():
    d = _experts_data()
    d["measure_curve"] = d["measure_curve"][:2] + [
        {"arm": "random", "k": 50, "bos_hits": [1] * i + [0] * (16 - i),
         "target_rate_bos": i / 16, "control_seed": i} for i in range(5)]  # fmt: skip
    (st,) = [r for r in experts.rows_experts(d) if r["id"] == "clamp_steers"]
    # the control: the population's mean gain over no clamp, (0 + 1 + 2 + 3 + 4) / 5 / 16
    assert st["control"]["estimate"]["estimate"] == pytest.approx(2 / 16)
    # effect - control against the population: 12/16 - 2/16; above all 5 draws: p = 1/6
    vs = st["vs_control"]
    assert vs["estimate"]["estimate"] == pytest.approx(10 / 16)
    assert vs["extra"]["p_rank"] == pytest.approx(1 / 6) and vs["extra"]["draws"] == 5
    assert vs["extra"]["p_floor"] == pytest.approx(1 / 6)
    assert "5 random-neuron clamp(s) at k = 50" in st["details"]
    assert "exact permutation p among them 0.167 (floor 1/6)" in st["details"]
    assert "random population's mean 0.12" in st["details"]
    # one draw ties the clamp: the rank p counts it
    d["measure_curve"][-1]["bos_hits"] = [1] * 12 + [0] * 4
    (st,) = [r for r in experts.rows_experts(d) if r["id"] == "clamp_steers"]
    assert st["vs_control"]["extra"]["p_rank"] == pytest.approx(2 / 6)


def test_align_rows_by_hand():
    pre = {"retrieval": [0.2, 0.3, 0.1, 0.4, 0.2, 0.3], "between_languages": [0.7] * 6}
    post = {
        "retrieval": [0.6, 0.7, 0.5, 0.9, 0.6, 0.8],
        "between_languages": [0.3, 0.35, 0.32, 0.3, 0.31, 0.4],
    }
    ctl = {
        "retrieval": [0.2, 0.31, 0.1, 0.4, 0.21, 0.3],
        "between_languages": [0.7, 0.69, 0.71, 0.7, 0.7, 0.7],
    }
    data = {"per_sentence": {"pre": pre, "post": post, "control": ctl}, "layer": 5, "k": 50,
            "distance": {a: {"ratio": 1.0, "between_languages": 0.5} for a in ("pre", "post", "control")}}  # fmt: skip
    closer, ret, null = finalize(align.rows_align(data))
    assert closer["value"]["estimate"]["estimate"] == pytest.approx(
        np.mean(post["between_languages"]) - 0.7
    )
    assert closer["value"]["p"] == pytest.approx(2 / 64)  # 6 sentences, all closer: exact 2 / 2^6
    assert ret["vs_control"]["p"] == pytest.approx(0.5)  # one random draw: the floor
    assert ret["vs_control"]["extra"]["p_floor"] == 0.5 and ret["verdict"] == INCONCLUSIVE
    assert null["rule"]["kind"] == "null" and null["value"]["extra"]["null"] == 0.0
    assert ret["value"]["n_clusters"] == 6  # no documents given: every sentence a unit
    data["docs"] = ["d0", "d0", "d1", "d1", "d2", "d2"]
    data["per_sentence_controls"] = [ctl] * 3
    _, ret3, _ = finalize(align.rows_align(data))
    assert ret3["value"]["n_clusters"] == 3 and ret3["vs_control"]["extra"]["draws"] == 3
    assert ret3["vs_control"]["extra"]["p_rank"] == pytest.approx(0.25)
    assert {closer["verdict"], ret["verdict"]} <= {HOLDS, INCONCLUSIVE}  # Holm over 3 rows
    assert null["verdict"] in (HOLDS, INCONCLUSIVE) and null["verdict"] != NOT_HOLDS


def test_trace_rows_by_hand():
    def rec(lang, e, a, cls="correct", correct=True, ans="Roma", en="Rome", fid=None):
        return {"id": fid or f"x/{e}{a}{cls}", "lang": lang, "answer": ans, "answer_en": en,
                "correct": correct, "class": cls, "first_en_layer": e, "first_answer_layer": a}  # fmt: skip

    records = [
        rec("fr", 5, 9), rec("fr", 6, -1), rec("fr", -1, 8),  # en first, en only, L only
        rec("fr", 7, 7),  # a tie: no order
        rec("fr", 3, 9, ans="Rome"),  # same word: skipped
        rec("en", 2, 9),  # English prompts are not counted
        rec("fr", -1, -1, "recall_failure", False, fid="r1"),
        rec("fr", -1, -1, "recall_failure", False, fid="r2"),
        rec("fr", 4, -1, "translation_failure", False), rec("fr", -1, -1, "other", False),
    ]  # fmt: skip
    r1, r2 = finalize(trace.rows_trace({"records": records}))
    # strictly ordered, distinct words: (5,9) en, (6,-1) en, (-1,8) L, translation (4,-1) en
    assert r1["value"]["estimate"]["n"] == 4
    assert r1["value"]["estimate"]["estimate"] == pytest.approx(3 / 4)
    assert r1["value"]["p"] == pytest.approx(sps.binomtest(3, 4).pvalue)
    assert r2["value"]["estimate"]["n"] == 3 and r2["value"]["p"] == pytest.approx(1.0)
    assert r1["rule"]["missing_control"] and r1["vs_control"] is None
    # with the mismatched-fact control: another fact's English answer, same decoder
    for r, m in zip(records, [8, -1, -1, 7, 3, 2, -1, -1, 5, -1], strict=True):
        r["first_mismatch_en_layer"] = m
    r1, _ = finalize(trace.rows_trace({"records": records}))
    # the control on the symmetric set (English, mismatched English or L decodable): (5,9|8),
    # (6,-1|-1), (-1,8|-1), the tie (7,7|7), (4,-1|5): English first 3 of 5, mismatched 2 of 5
    assert r1["control"]["estimate"]["estimate"] == pytest.approx(2 / 5)
    assert r1["vs_control"]["estimate"]["estimate"] == pytest.approx(3 / 5 - 2 / 5)
    assert r1["value"]["estimate"]["estimate"] == pytest.approx(3 / 4)  # the share itself
    assert not r1["rule"]["missing_control"]
    assert r1["verdict"] == r2["verdict"] == INCONCLUSIVE  # n too small: not "does not hold"
