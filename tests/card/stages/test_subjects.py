"""Rows over facts are clustered by subject: facts of several relations on one subject
(``capital/IT``, ``language/IT``) are one cluster, read from a stage's stored ``subjects``
map or, in a result stored without one, from the fact ids by the same rule."""

from __future__ import annotations

import types

import numpy as np
import pytest

from mechlingo.card import claims
from mechlingo.card.clustered_tests import mean_test, paired_test, ratio_test
from mechlingo.card.repair_items import item_clusters, subject_keys, subject_of
from mechlingo.card.rules import finalize
from mechlingo.card.stages import (
    CardSettings,
    budget_settings,
    circuits,
    conversion,
    decoders,
    repair,
    trace,
    transfer,
)

Y, N = True, False

#: Four subjects, each asked in two relations: 8 facts, 4 subjects.
SHARED = [f"{rel}/{s}" for s in ("IT", "FR", "DE", "ES") for rel in ("capital", "language")]
#: Eight subjects, one relation: no subject shared, the fact ids are the clusters.
SINGLE = [f"capital/{s}" for s in ("IT", "FR", "DE", "ES", "PT", "NL", "PL", "SE")]


def _facts(ids):
    """Stand-ins for the stage's facts (what :func:`subject_keys` reads)."""
    return [types.SimpleNamespace(id=i, relation=i.split("/")[0], subject_en=None) for i in ids]


def _repair(ids, stored=True):
    """A stored repair result on ``ids`` in es and fr: the task vector fixes both facts of
    IT and FR in both languages (8 of 16 items) and the Spanish ES capital; the vector's
    gain follows the subject, so facts of one subject are not independent."""
    task = [Y] * 4 + [N] * 3 + [Y]  # in SHARED order: IT, IT, FR, FR, DE, DE, ES, ES
    out = {
        "orig": {"en": [Y] * 8, "es": [N] * 8, "fr": [N] * 8},
        "task": {"en": [Y] * 8, "es": task, "fr": [Y] * 4 + [N] * 4},
        "diff": {"en": [Y] * 8, "es": [N] * 7 + [Y], "fr": [N] * 8},
        "both": {"en": [Y] * 8, "es": task, "fr": [Y] * 4 + [N] * 4},
        "random_s0": {"en": [Y] * 8, "es": [Y] + [N] * 7, "fr": [N] * 8},
        "random_s1": {"en": [Y] * 8, "es": [N] * 8, "fr": [N] * 7 + [Y]},
    }  # fmt: skip
    lowest = {"languages": ["es"], "literal_languages": ["fr"], "p_threshold": 0.1,
              "rule": "headroom rule", "literal_rule": "literal rule"}  # fmt: skip
    d = {"summary": {"selected": "both", "dev_effect": "chosen", "config": {}}, "outcomes": out,
         "ids": dict.fromkeys(out["orig"], list(ids)), "lowest": lowest,
         "n_ids": {"build": 1, "dev": 1, "test": 8}}  # fmt: skip
    if stored:
        d["subjects"] = subject_keys(_facts(ids))
    return d


def _pooled(d, cond):
    return [float(x) for lg in ("es", "fr") for x in d["outcomes"][cond][lg]]


def _rows(d):
    return {(r["id"], r.get("variant")): r for r in finalize(repair.rows_repair(d))}


def test_subject_keys_and_the_ids_rule_agree():
    assert subject_of("capital/IT") == "IT" and subject_of("klar/a/b") == "a/b"
    assert subject_of("IT") == "IT"  # an id without "/" is its own key
    assert subject_keys(_facts(SHARED)) == {i: subject_of(i) for i in SHARED}
    assert subject_keys(_facts(SINGLE)) == {}
    assert item_clusters(SHARED * 2) == [subject_of(i) for i in SHARED * 2]
    assert item_clusters(SINGLE) == SINGLE and item_clusters(SHARED, {}) == SHARED
    # a stored map whose facts share subjects, on a row whose facts do not: the same clusters
    assert item_clusters(SHARED[::2], subject_keys(_facts(SHARED))) == SHARED[::2]


def test_a_vector_row_is_clustered_by_subject_with_the_direct_tests_interval():
    """Hand case: 8 facts on 4 subjects; the task vector's row has 4 clusters (8 before) and
    the interval of ``paired_test`` called with the subjects as clusters, which is wider
    than the fact-clustered one."""
    d = _repair(SHARED)
    task = _rows(d)[("task_vector", None)]
    base, new = _pooled(d, "orig"), _pooled(d, "task")
    subjects = [subject_of(i) for i in SHARED] * 2
    by_subject, by_fact = paired_test(base, new, subjects), paired_test(base, new, SHARED * 2)
    assert task["value"]["n_clusters"] == 4 and by_fact.n_clusters == 8
    assert task["value"]["estimate"] == by_subject.estimate.to_json()
    assert task["value"]["estimate"]["estimate"] == pytest.approx(9 / 16)
    lo_s, hi_s = by_subject.estimate.lo, by_subject.estimate.hi
    lo_f, hi_f = by_fact.estimate.lo, by_fact.estimate.hi
    assert hi_s - lo_s > (hi_f - lo_f) * 1.1  # the dependence the fact clusters ignore
    assert "clustered by subject (4 subjects of 8 facts)" in task["details"]
    # every row over these facts: the random population, the lowest language, both vs single
    rows = _rows(d)
    assert rows[("random_vector", None)]["value"]["n_clusters"] == 4
    assert rows[("lowest_language", "headroom rule, points")]["value"]["n_clusters"] == 4
    extra = {r["id"]: r for r in repair.rows_repair_extra({**d, "items": _items(d)})}
    assert extra["both_beat_single"]["value"]["n_clusters"] == 4
    assert extra["english_gap"]["value"]["n_clusters"] == 4


def _items(d):
    """The per-item records of ``d``'s outcomes (as ``item_records`` stores them)."""
    return {c: [{"id": i, "lang": lg, "correct": v}
                for lg in sorted(per) for i, v in zip(d["ids"][lg], per[lg], strict=True)]
            for c, per in d["outcomes"].items()}  # fmt: skip


def test_a_result_stored_without_subjects_gives_the_same_rows():
    """The fallback: the subject from each fact id by the same rule (a result stored before
    the stages stored ``subjects``, or a stage that stores none)."""
    with_map, without = _rows(_repair(SHARED)), _rows(_repair(SHARED, stored=False))
    assert with_map == without


def test_no_shared_subject_keeps_the_fact_clusters_and_numbers():
    """One relation: the rows are the fact-clustered ones, number for number, and say so."""
    d = _repair(SINGLE)
    task = _rows(d)[("task_vector", None)]
    want = paired_test(_pooled(d, "orig"), _pooled(d, "task"), SINGLE * 2)
    assert task["value"] == _rows({**d, "subjects": {}})[("task_vector", None)]["value"]
    assert task["value"]["estimate"] == want.estimate.to_json() and want.n_clusters == 8
    assert task["value"]["p"] == want.p and "subject" not in task["details"]


def test_trace_and_transfer_rows_cluster_by_subject():
    """The trace records (no stored map: from the ids) and the transfer cells (the stored
    map) of facts sharing subjects."""
    recs = [{"id": i, "lang": lg, "class": "recall_failure" if k % 3 else "translation_failure",
             "correct": False, "answer": "x", "answer_en": "y", "first_en_layer": -1,
             "first_answer_layer": -1} for lg in ("es", "fr") for k, i in enumerate(SHARED)]  # fmt: skip
    _, rf = trace.rows_trace({"records": recs})
    ids = [r["id"] for r in recs]
    want = mean_test([float(r["class"] == "recall_failure") for r in recs],
                     [subject_of(i) for i in ids], null=0.5)  # fmt: skip
    assert rf["value"]["n_clusters"] == 4 and rf["value"]["estimate"] == want.estimate.to_json()
    assert "clustered by subject (4 subjects of 8 facts)" in rf["details"]
    o = [0] * 8
    cells = [{"row": "all_but_es", "col": "es", "items": {"ids": SHARED, "orig": o,
              "steered": [1] * 5 + [0] * 3, "control": o}}]  # fmt: skip
    data = {"cells": cells, "subjects": subject_keys(_facts(SHARED))}
    gain, _ = transfer.rows_transfer(claims.INDEPENDENT_LANGUAGES, data)
    assert gain["value"]["n_clusters"] == 4 and "clustered by subject" in gain["details"]


def test_the_external_rows_keep_the_benchmark_fact_ids():
    """A benchmark's ids number its rows within a relation (``P17/0``, ``P36/0``): the key
    after the relation names no subject, so the external rows stay clustered by fact id."""
    from mechlingo.card.stages import external

    ids = [f"{rel}/{k}" for k in range(4) for rel in ("P17", "P36")]

    def recs(right):
        return [{"id": i, "lang": lg, "correct": r} for lg in ("es", "fr")
                for i, r in zip(ids, right, strict=True)]  # fmt: skip

    items = {"orig": recs([N] * 8), "task": recs([Y] * 5 + [N] * 3), "diff": recs([N] * 8),
             "both": recs([Y] * 4 + [N] * 4), "random_s0": recs([N] * 7 + [Y])}  # fmt: skip
    rows = external.rows_external({"items": items, "metric": "klar"})
    assert [r["value"]["n_clusters"] for r in rows if r["value"]] == [8, 8, 8]
    # a row number names no subject: the ids rule keeps each fact its own cluster too
    assert item_clusters([i for lg in ("es", "fr") for i in ids]) == ids * 2


def test_a_row_number_is_no_subject():
    """Benchmark ids number rows within a relation (``P17/0``, ``P36/0``): facts with the same
    row number in two relations are unrelated, so a row number never joins them; the stored
    map uses the English subject instead, where the benchmark gives one."""
    ids = [f"{rel}/{k}" for k in range(3) for rel in ("P17", "P36")]
    assert [subject_of(i) for i in ids] == ids
    assert item_clusters(ids * 2) == ids * 2  # derived from the ids: each fact its own
    named = [types.SimpleNamespace(id=i, relation=i.split("/")[0],
                                   subject_en=["France", "Kenya", "Japan"][int(i[-1])])
             for i in ids]  # fmt: skip
    keys = subject_keys(named)
    assert keys == {i: ["France", "Kenya", "Japan"][int(i[-1])] for i in ids}
    assert len(set(item_clusters(ids, keys))) == 3
    unnamed = [types.SimpleNamespace(id=i, relation=i.split("/")[0], subject_en="") for i in ids]
    assert subject_keys(unnamed) == {}  # no subject known: no two facts are joined


# --------------------------------------------------------------------------------------
# A benchmark folder's ids: the trace, conversion, circuits and decoders rows
# --------------------------------------------------------------------------------------

#: Benchmark ids (a row number within a relation) and each fact's English subject: 8 facts
#: on 4 subjects, joined across row numbers (``P17/0`` and ``P36/2`` are both France).
BENCH = {"P17/0": "France", "P17/1": "Kenya", "P17/2": "Japan", "P17/3": "Peru",
         "P36/0": "Kenya", "P36/1": "Peru", "P36/2": "France", "P36/3": "Japan"}  # fmt: skip
#: English first (the latent order, the decoders' order) by subject, in each language but a
#: fact's own noise: France and Kenya mostly, Japan and Peru seldom.
LEAN = {"France": 1.0, "Kenya": 1.0, "Japan": 0.0, "Peru": 0.0}


def _bench_facts(langs=("en",)):
    return [types.SimpleNamespace(id=i, relation=i.split("/")[0], subject_en=s, lang=lg)
            for lg in langs for i, s in BENCH.items()]  # fmt: skip


def _bench_map():
    keys = subject_keys(_bench_facts())
    assert keys == BENCH  # the English subject: the row number names none
    return keys


def _en_first(i, lg):
    """1 where English comes first: the subject's lean, flipped for one fact in fr."""
    v = LEAN[BENCH[i]]
    return 1.0 - v if (lg, i) == ("fr", "P36/3") else v


def _by(ids):
    return [BENCH[i] for i in ids]


def _same(value, test, n):
    """The stored row's value is ``test`` (by subject), on ``n`` clusters."""
    assert value["n_clusters"] == n == test.n_clusters
    assert value["estimate"] == test.estimate.to_json() and value["p"] == test.p


def test_trace_rows_on_benchmark_ids_cluster_by_the_stored_subjects():
    """Hand case: ``P17/k`` and ``P36/k`` on 4 English subjects, es and fr. Both trace rows
    have 4 clusters and the interval of the direct test on the subjects, wider than the
    fact-clustered one; a result stored without ``subjects`` (an older checkpoint) keeps
    the fact ids (8 clusters)."""
    recs = []
    for lg in ("es", "fr"):
        for k, i in enumerate(BENCH):
            e = _en_first(i, lg)
            recs.append({"id": i, "lang": lg, "correct": False, "answer": "x", "answer_en": "y",
                         "class": "recall_failure" if e else "translation_failure",
                         "first_en_layer": 2 if e else 6, "first_answer_layer": 4,
                         "first_mismatch_en_layer": 3 if k % 3 else 5})  # fmt: skip
    ids = [r["id"] for r in recs]
    order = [_en_first(r["id"], r["lang"]) for r in recs]
    ctl = [float(r["first_mismatch_en_layer"] < 4) for r in recs]
    null = claims.LATENT_ENGLISH.null_value
    le, rf = trace.rows_trace({"records": recs, "subjects": _bench_map()})
    want = mean_test(order, _by(ids), null=null)
    _same(le["value"], want, 4)
    _same(le["vs_control"], paired_test(ctl, order, _by(ids)), 4)
    _same(rf["value"], mean_test(order, _by(ids), null=0.5), 4)
    assert "clustered by subject (4 subjects of 8 facts)" in rf["details"]
    by_fact = mean_test(order, ids, null=null).estimate
    assert want.estimate.hi - want.estimate.lo > (by_fact.hi - by_fact.lo) * 1.1
    old_le, old_rf = trace.rows_trace({"records": recs})  # stored before the map
    _same(old_le["value"], mean_test(order, ids, null=null), 8)
    assert old_rf["value"]["n_clusters"] == 8 and "clustered by fact" in old_rf["details"]


def test_conversion_rows_on_benchmark_ids_cluster_by_the_stored_subjects():
    """The restored log-probability per prompt (es and fr, the subject's effect plus a
    fact's): the row, its control and the control comparison on the 4 subjects."""
    langs = {}
    for lg in ("es", "fr"):
        band = [1.0 + 2.0 * _en_first(i, lg) + 0.1 * k for k, i in enumerate(BENCH)]
        ctl = [0.2 * (k % 2) for k in range(len(BENCH))]
        langs[lg] = {"band": [5, 6], "ids": list(BENCH), "band_effect": band,
                     "control_effect": ctl}  # fmt: skip
    ids = list(BENCH) * 2
    band = langs["es"]["band_effect"] + langs["fr"]["band_effect"]
    ctl = langs["es"]["control_effect"] + langs["fr"]["control_effect"]
    (row,) = conversion.rows_conversion({"langs": langs, "subjects": _bench_map()})
    _same(row["value"], mean_test(band, _by(ids)), 4)
    _same(row["control"], mean_test(ctl, _by(ids)), 4)
    _same(row["vs_control"], paired_test(ctl, band, _by(ids)), 4)
    assert "clustered by subject (4 subjects of 8 facts)" in row["details"]
    (old,) = conversion.rows_conversion({"langs": langs})
    _same(old["value"], mean_test(band, ids), 8)


def test_circuits_rows_on_benchmark_ids_cluster_by_the_stored_subjects():
    """The English circuit's faithfulness on fr's test pairs (a ratio of sums): the row's
    interval is the ratio test's on the 4 subjects."""
    ids = list(BENCH)
    den = np.array([4.0, 6.0, 8.0, 5.0, 7.0, 9.0, 6.0, 4.0])
    corr = -den - 1.0
    eng = corr + den * np.array([0.5 + 0.4 * _en_first(i, "fr") for i in ids])
    brief = {"n": 8, "n_edges": 50, "faithfulness": {"faithfulness": 0.8}, "n_scored": 3515}
    d = {"test": {"ids": ids, "clean": (corr + den).tolist(), "corrupted": corr.tolist(),
                  "english": eng.tolist(), "own": eng.tolist()},
         "dev_en": brief, "dev": brief, "jaccard": 0.4, "null": [0.01] * 99}  # fmt: skip
    [row] = circuits.rows_circuits({"langs": {"fr": d}, "subjects": _bench_map()})
    thr = claims.SAME_MECHANISM.threshold
    _same(row["value"], ratio_test(eng - corr, den, _by(ids), null=thr), 4)
    assert "clustered by subject (4 subjects of 8 facts)" in row["details"]
    [old] = circuits.rows_circuits({"langs": {"fr": d}})
    _same(old["value"], ratio_test(eng - corr, den, ids, null=thr), 8)


def test_decoder_rows_on_benchmark_ids_cluster_by_the_stored_subjects():
    items = [{"id": i, "lang": lg, "en_first": bool(_en_first(i, lg))}
             for lg in ("es", "fr") for i in BENCH]  # fmt: skip
    en_first = [float(x["en_first"]) for x in items]
    ids = [x["id"] for x in items]
    data = {"decoders": {"patchscope": {"items": items}}, "subjects": _bench_map()}
    rows = {r["id"]: r for r in decoders.rows_decoders(data)}
    row = rows["latent_english_patchscope"]
    _same(row["value"], mean_test(en_first, _by(ids), null=0.5), 4)
    assert "clustered by subject (4 subjects of 8 facts)" in row["details"]
    old = {r["id"]: r for r in decoders.rows_decoders({"decoders": data["decoders"]})}
    _same(old["latent_english_patchscope"]["value"], mean_test(en_first, ids, null=0.5), 8)


def test_the_four_stages_store_the_subjects_of_their_facts(monkeypatch):
    """Each stage's result carries ``subject_keys`` of the facts it read (no model: the
    measurements are stubbed or find nothing to measure)."""
    import pandas as pd

    facts = _bench_facts(("en", "fr"))
    cfg = CardSettings.of(budget_settings("quick", {}))
    fake = types.SimpleNamespace(
        records=[], counts=dict, lens=types.SimpleNamespace(latent_curves=pd.DataFrame),
        n_layers=4, max_rank=10, mid_layers=[1, 2],
    )  # fmt: skip
    monkeypatch.setattr(trace, "trace_recall", lambda *a, **k: fake)
    monkeypatch.setattr(decoders, "card_decoders", list)
    monkeypatch.setattr(circuits, "_parts", lambda model, facts, settings: {
        lg: {"dev": ([], []), "test": ([], [])} for lg in ("en", *cfg.budget.circuits.langs)})  # fmt: skip
    model = types.SimpleNamespace(cfg=types.SimpleNamespace(n_layers=4))
    got = {
        "trace": trace.stage_trace(model, facts, cfg, progress=False),
        "conversion": conversion.stage_conversion(
            model, facts, {"records": [], "n_layers": 4}, cfg
        ),  # fmt: skip
        "circuits": circuits.stage_circuits(model, facts, cfg),
        "decoders": decoders.stage_decoders(model, facts, None, cfg, progress=False),
    }
    for name, data in got.items():
        assert data["subjects"] == BENCH, name
