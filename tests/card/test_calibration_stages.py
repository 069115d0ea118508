"""The calibration harness judges each row type the way the card does: the same simulated
sample, handed to the harness's judge and (as the stage's stored data) to the stage's own
row builder, gives the same tests (the p of the effect and of the effect against its
control) and the same verdict. A harness that called another test than the stage (e.g. the t
test against the population mean where the stage ranks the effect among the draws) fails."""

from __future__ import annotations

import numpy as np
import pytest

from mechlingo.card import calibration as cal
from mechlingo.card.clustered_tests import Test
from mechlingo.card.rules import verdict
from mechlingo.card.stages.align import rows_align
from mechlingo.card.stages.conversion import rows_conversion
from mechlingo.card.stages.repair_controls import rows_repair
from mechlingo.card.stages.trace import rows_trace


def _row(name: str) -> cal.RowType:
    return next(r for r in cal.ROW_TYPES if r.name == name)


def _samples(name: str, design: int, truth: bool, n: int = 6, seed: int = 5) -> list:
    row = _row(name)
    return row.simulate(np.random.default_rng(seed), row.designs[design], n, truth)


def _same(judged: cal.Judged, row: dict) -> None:
    """The stage's row and the harness's judged sample: equal effect p, effect-vs-control p
    and verdict (each alone, level 0.05)."""
    eff = None if row["value"] is None else Test.from_json(row["value"])
    vs = None if row.get("vs_control") is None else Test.from_json(row["vs_control"])
    assert (eff is None) == (judged.effect is None)
    if eff is not None:
        assert eff.p == pytest.approx(judged.effect.p, rel=1e-12, abs=0)
        assert eff.estimate.estimate == pytest.approx(judged.effect.estimate.estimate)
    assert (vs is None) == (judged.vs is None)
    if vs is not None:
        assert vs.p == pytest.approx(judged.vs.p, rel=1e-12, abs=0), (vs.method, judged.vs.method)
        assert vs.extra.get("decides") == judged.vs.extra.get("decides")
    assert judged.outcome(1.0).verdict == row["verdict"]
    assert verdict(judged.claim, eff, vs, 1.0)[0] == row["verdict"]


def _repair_data(base, effect, draws, ids, cond: str) -> dict:
    """The repair stage's stored data with one language: ``cond`` (and the other vectors)
    at ``effect``, the random population ``random_s<i>`` (every condition's)."""
    out = {c: {"fr": list(map(float, effect))} for c in ("task", "diff", "both")}
    out["orig"] = {"fr": list(map(float, base))}
    for i, d in enumerate(draws):
        out[f"random_s{i}"] = {"fr": list(map(float, d))}
    return {"summary": {"selected": cond, "dev_effect": 0.1, "config": {}}, "n_ids": [1, 1, 1],
            "outcomes": out, "ids": {"fr": [str(x) for x in ids]},
            "lowest": {"languages": ["fr"], "literal_languages": ["fr"], "rule": "headroom",
                       "literal_rule": "literal"}}  # fmt: skip


@pytest.mark.parametrize("truth", [False, True])
@pytest.mark.parametrize("name,design", [("effect vs population (20 draws)", 3),
                                         ("effect vs population (100 draws)", 0)])  # fmt: skip
def test_population_rows_are_judged_as_the_repair_stage_judges_them(name, design, truth):
    """task_vector: the stage ranks the effect among its draws (rank_population_test); so
    must the harness (before, it used the t test against the population mean)."""
    row = _row(name)
    for s in _samples(name, design, truth):
        base, new, draws = s["arrays"]
        card = rows_repair(_repair_data(base, new, draws, s["ids"], "task"))
        task = next(r for r in card if r["id"] == "task_vector")
        _same(row.judge(s), task)
        assert task["vs_control"]["extra"]["decides"] == "rank"


@pytest.mark.parametrize("truth", [False, True])
def test_the_relative_row_is_judged_as_the_repair_stage_judges_it(truth):
    row = _row("relative gain vs population (100 draws)")
    for s in _samples(row.name, 2, truth):
        base, new, draws = s["arrays"]
        card = rows_repair(_repair_data(base, new, draws, s["ids"], "both"))
        rel = next(r for r in card if r.get("variant") == "headroom rule, relative")
        _same(row.judge(s), rel)


def test_the_equivalence_row_is_judged_as_the_repair_stage_judges_it():
    row = _row("equivalence")
    for s in _samples(row.name, 3, False) + _samples(row.name, 3, True):
        base, new, draws = s["arrays"]
        card = rows_repair(_repair_data(base, new, draws, s["ids"], "task"))
        _same(row.judge(s), next(r for r in card if r["id"] == "random_vector"))


def _trace_data(real, ctl, ids) -> dict:
    """Trace records whose English answer comes first exactly where ``real`` is 1 (the
    mismatched fact's where ``ctl`` is 1), the L answer at layer 5 on every query; the
    failures' classes follow ``real`` too (recall failure where it is 1)."""
    recs = [{"lang": "fr", "id": str(i), "answer": "a", "answer_en": "b",
             "first_en_layer": 2 if r else -1, "first_answer_layer": 5,
             "first_mismatch_en_layer": 2 if c else -1, "correct": False,
             "class": "recall_failure" if r else "translation_failure"}
            for r, c, i in zip(real, ctl, ids, strict=True)]  # fmt: skip
    return {"records": recs}


@pytest.mark.parametrize("truth", [False, True])
def test_the_share_rows_are_judged_as_the_trace_stage_judges_them(truth):
    """latent_english with its control (paired_test of the mismatched fact's English
    answer) and recall_failures without one, as rows_trace builds them."""
    with_ctl = _row("0/1 share vs 1/2 with its control")
    for s in _samples(with_ctl.name, 1, truth):
        real, ctl = s["arrays"]
        le, rf = rows_trace(_trace_data(real, ctl, s["ids"]))
        _same(with_ctl.judge(s), le)
        _same(_row("0/1 share vs 1/2").judge({**s, "arrays": [real]}), rf)


@pytest.mark.parametrize("truth", [False, True])
def test_the_continuous_mean_is_judged_as_the_conversion_stage_judges_it(truth):
    row = _row("continuous mean")
    for s in _samples(row.name, 2, truth):
        band, ctl = s["arrays"]
        data = {"langs": {"fr": {"band": [8, 12], "band_effect": list(band),
                                 "control_effect": list(ctl), "ids": list(s["ids"])}}}  # fmt: skip
        _same(row.judge(s), rows_conversion(data)[0])


@pytest.mark.parametrize("truth", [False, True])
def test_the_continuous_population_row_is_judged_as_the_align_stage_judges_it(truth):
    row = _row("continuous effect vs population (20 draws)")
    for s in _samples(row.name, 2, truth):
        pre, post, draws = s["arrays"]
        per = {"pre": pre, "post": post, **{f"random_s{i}": d for i, d in enumerate(draws)}}
        per = {k: {"between_languages": list(v), "retrieval": list(v)} for k, v in per.items()}
        dist = {a: {"ratio": 1.0, "between_languages": 0.5} for a in ("pre", "post", "control")}
        data = {"per_sentence": per, "distance": dist, "layer": 3, "k": 10,
                "docs": [str(x) for x in s["ids"]]}  # fmt: skip
        closer = next(r for r in rows_align(data) if r["id"] == "clamp_closer")
        _same(row.judge(s), closer)


def test_every_row_type_names_the_stage_it_mirrors():
    """Each row type names the stage functions that build the rows it stands for (each one
    exists) and the card's claims it stands for (each one, or its pattern, is a claim)."""
    import fnmatch
    import importlib
    import re

    from mechlingo.card.claims import CLAIMS

    ids = [c.id for c in CLAIMS]
    for r in cal.ROW_TYPES:
        funcs = re.findall(r"([a-z_]+)\.([a-z_]+)", r.stage)
        assert funcs, r.name
        for mod, fn in funcs:
            assert callable(getattr(importlib.import_module(f"mechlingo.card.stages.{mod}"), fn))
        if r.claim == "as above" or r.name == "bootstrap mean":
            continue
        for word in re.findall(r"[a-z_*/]+_[a-z_*/]+", r.claim):
            pats = [word] if "/" not in word else [word.split("/")[0] + "*"]
            assert any(fnmatch.filter(ids, p) for p in pats), (r.name, word)
