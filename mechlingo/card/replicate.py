"""``replicate``: the papers' claims checked on one model, in one call.

:func:`replicate` runs the analyses behind every claim of :data:`mechlingo.card.rules.CLAIMS`
through their Python APIs, in stages:

* ``trace`` (:func:`mechlingo.analyses.recall.trace.trace_recall`: greedy answers and the logit
  lens of every query): the latent-English and the recall-failure claims;
* ``repair`` (:func:`mechlingo.analyses.recall.steering.build_steering_vectors` on the build
  split, then :func:`mechlingo.analyses.recall.steer_eval.run_steer_eval`, the call of ``steer
  eval``: the dev search, and test with norm-matched random controls; the budget's settings
  as :func:`mechlingo.card.lu.repair_settings`): the two vectors, the lowest language (the
  headroom rule, :func:`mechlingo.card.rules.headroom_lowest_language`, beside the literal
  :func:`mechlingo.analyses.recall.dev_grid.lowest_language_dev`) and the random vector;
* ``transfer_relation`` and ``transfer_lang``
  (:func:`mechlingo.analyses.recall.transfer.transfer_matrix`): independence of relations and languages;
* ``experts`` (:func:`mechlingo.analyses.experts.find_experts`, :func:`~mechlingo.analyses.experts.k_curve`
  and the k rules, held-out AUROC, overlap): the expert claims and the clamp of the k that
  the papers' rule picks (target-language rate against the target's perplexity; the stricter
  rule that also bounds every other language is reported beside it);
* ``align`` (:func:`mechlingo.analyses.experts.align.compare_alignment` with that clamp and its
  random-neuron control): distances and retrieval.

Each stage's result is stored (JSON, atomically) in a work folder under a key made of the
model's fingerprint, the data and the settings (:class:`mechlingo.core.stages.Stages`): a rerun
reuses finished stages, and a stopped run resumes after the last finished one. A stage that
fails becomes the rows of its claims, each carrying the error; the other stages still run.
The rows are computed from the stored results only, so a resumed run gives the same card as
an uninterrupted one.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from mechlingo.activations.distributed import dist_info
from mechlingo.analyses.experts import collect_neuron_stats, find_experts, k_curve
from mechlingo.analyses.experts.align import compare_alignment, embed_parallel, per_sentence
from mechlingo.analyses.recall import steer_eval, steering, transfer
from mechlingo.analyses.recall.settings import ScoringOptions, SplitSettings
from mechlingo.analyses.recall.trace import trace_recall
from mechlingo.card import lu, repair_items, sundar
from mechlingo.card.metric_rule import METRIC_RULE, decide_metric, dev_accuracies
from mechlingo.card.plan import Plan, plan_card
from mechlingo.card.rows import (
    rows_align,
    rows_experts,
    rows_repair,
    rows_trace,
    rows_transfer,
)
from mechlingo.card.rules import (
    CLAIMS,
    LU,
    RULES_HASH,
    SUNDAR,
    ClaimsCard,
    error_row,
    finalize,
)
from mechlingo.core.describe import model_info
from mechlingo.core.errors import InputError
from mechlingo.core.stages import Stages
from mechlingo.core.types import Model
from mechlingo.core.version import __version__
from mechlingo.data import LANGS, Fact, load_facts
from mechlingo.data.natural_parallel import split_by_documents
from mechlingo.data.splits import take_per_lang
from mechlingo.interventions import load_intervention

__all__ = [
    "BUDGETS",
    "BUDGETS_HASH",
    "PAPERS",
    "STAGES",
    "budget_settings",
    "claim_rows",
    "replicate",
]

#: Bumped when a stage computes something different: old stored results are not reused.
#: 3: the metric stage, gold share and lenient outcomes, random populations, documents;
#: 2: fact ids per outcome, per-item transfer outcomes, the clamp measured on
#: fresh samples, AUROC tests at the clamp's k, per-sentence alignment values.
STAGE_VERSION = 3
#: The seed of the BOS samples that measure the chosen clamp (seed 0 chose k).
MEASURE_SEED = 1

PAPERS = {LU: ("trace", "repair", "transfer_relation", "transfer_lang", "decoders",
               "conversion", "external"),
          SUNDAR: ("experts", "align")}  # fmt: skip
#: ``replicate(metric=...)``: how the Lu stages score facts (see ``docs/replicate.md``).
METRICS = ("generate", "rank", "klar")
STAGES = (*PAPERS[LU], *PAPERS[SUNDAR])

_QUICK: dict[str, Any] = {
    "lu_langs": ["en", "fr", "es", "ru", "ja", "hi"], "max_ids_per_lang": 128,
    "trace": {"limit": 24, "max_new_tokens": 8, "max_rank": 10},
    "repair": {
        "split": [0.4, 0.2, 0.4], "dev_per_lang": 10, "test_per_lang": 24, "k_shot": 3,
        "translation_shots": 2, "layer_fractions": [0.5, 0.67],
        "alphas": [0.13, 0.28], "top_k": 2, "screen_ids": 4, "seeds": [0, 1, 2, 3, 4],
        "max_new_tokens": 6,
    },
    "transfer": {"relations": ["capital", "currency", "language"], "limit": 24,
                 "langs": ["en", "fr", "es", "ru"], "max_new_tokens": 6,
                 "matrix": {"cells": "diagonal", "build_ids": 6, "dev_ids": 4,
                            "test_ids": 8, "screen_ids": 2, "layer_fractions": [0.55],
                            "alphas": [0.28, 0.6]}},
    "experts": {"target": "es", "n_find": 32, "n_heldout": 4, "ks": [50, 500],
                "samples": 16, "new_tokens": 12, "max_tokens": 24, "n_eval": 32,
                "ppl_budget": 2.0, "n_boot": 200, "eval_per_doc": 4, "random_sets": 5},
    "candidates": 4, "decoders": {"per_lang": 6, "tuned_lens": None},
    "conversion": {"langs": ["fr", "ru", "ja"], "n_prompts": 6}, "external": {"per_lang": 24},
}  # fmt: skip
_FULL: dict[str, Any] = {
    "lu_langs": list(LANGS), "max_ids_per_lang": 256,
    "trace": {"limit": 60, "max_new_tokens": 8, "max_rank": 10},
    "repair": {
        "split": [0.4, 0.2, 0.4], "dev_per_lang": 16, "test_per_lang": 40, "k_shot": 3,
        "translation_shots": 2, "layer_fractions": [0.33, 0.5, 0.67, 0.83],
        "alphas": [0.13, 0.28], "top_k": 2, "screen_ids": 6, "seeds": list(range(20)),
        "max_new_tokens": 6,
    },
    "transfer": {"relations": ["capital", "currency", "language"], "limit": 40,
                 "langs": ["en", "fr", "es", "ru", "ja", "hi"], "max_new_tokens": 6,
                 "matrix": {"cells": "diagonal", "build_ids": 12, "dev_ids": 8,
                            "test_ids": 12, "screen_ids": 3, "layer_fractions": [0.35, 0.55],
                            "alphas": [0.28, 0.6]}},
    "experts": {"target": "es", "n_find": 60, "n_heldout": 6, "ks": [50, 200, 500, 2000],
                "samples": 24, "new_tokens": 16, "max_tokens": 24, "n_eval": 60,
                "ppl_budget": 2.0, "n_boot": 500, "eval_per_doc": 5, "random_sets": 20},
    "candidates": 4, "decoders": {"per_lang": 12, "tuned_lens": None},
    "conversion": {"langs": ["fr", "es", "ru", "ja", "hi"], "n_prompts": 8}, "external": {"per_lang": 40},
}  # fmt: skip
#: The settings of each budget (see ``docs/replicate.md`` for the measured run times).
BUDGETS: dict[str, dict[str, Any]] = {"quick": _QUICK, "full": _FULL}
#: sha256 (16 hex digits) of :data:`BUDGETS`, written into ``claims.json`` beside the rules'
#: hash: a change of either after a card was seen is logged in ``docs/replicate.md``.
BUDGETS_HASH = hashlib.sha256(json.dumps(BUDGETS, sort_keys=True).encode()).hexdigest()[:16]


def budget_settings(budget: str, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The settings of ``budget`` (``quick`` or ``full``) with ``overrides`` merged in (one
    level deep per section: ``{"experts": {"ks": [3, 5]}}`` changes only ``ks``)."""
    if budget not in BUDGETS:
        raise InputError(f"budget must be one of {sorted(BUDGETS)}, got {budget!r}")
    cfg = copy.deepcopy(BUDGETS[budget])
    for k, v in (overrides or {}).items():
        if isinstance(v, Mapping) and isinstance(cfg.get(k), dict):
            cfg[k].update(v)
        else:
            cfg[k] = v
    cfg["budget"] = budget
    return cfg


# --------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------


def _hash(obj: Any) -> str:
    text = json.dumps(obj, sort_keys=True, ensure_ascii=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def weights_fingerprint(model: Model) -> str:
    """A short hash of every parameter's name, shape and a strided sample of its values: two
    models that share an unembedding (tied embeddings, a fine-tune of the blocks) still differ.
    """
    h = hashlib.sha256()
    named = getattr(model, "named_parameters", None)
    for name, p in named() if callable(named) else []:
        flat = p.detach().reshape(-1)
        sample = flat[:: max(1, flat.numel() // 256)][:256].float().cpu().contiguous()
        h.update(f"{name}{tuple(p.shape)}".encode())
        h.update(sample.numpy().tobytes())
    return h.hexdigest()[:16]


def _facts_hash(facts: Sequence[Fact] | None) -> str | None:
    return None if facts is None else _hash([dataclasses.asdict(f) for f in facts])


def _lu_facts(facts: Sequence[Fact] | None, cfg: Mapping[str, Any], section: str) -> list[Fact]:
    """The facts of one Lu stage: the user's (every language and relation, at most
    ``limit`` ids per relation when the section has one) or the bundled natural stems, with
    BMLAMA-style candidates under ``metric = "rank"``; the trace reads the repair test items."""
    if section == "trace":  # the tracer reads the repair stage's test items (their classes)
        return lu.repair_split(_lu_facts(facts, cfg, "repair"), cfg)[2]
    sec = cfg.get(section, {})
    if facts is not None:
        return lu.prepare_facts(cap_facts(take_per_lang(list(facts), sec.get("limit")), cfg), cfg)
    langs = sec.get("langs") or cfg["lu_langs"]
    rels = sec.get("relations") or ["capital"]
    loaded = load_facts(langs=langs, relations=rels, limit=sec.get("limit"), templates="natural")
    return lu.prepare_facts(loaded, cfg)


def cap_facts(facts: Sequence[Fact], cfg: Mapping[str, Any]) -> list[Fact]:
    """At most ``max_ids_per_lang`` fact ids per language, shared evenly by the relations
    (each relation keeps ``max(4, cap // relations)`` ids, the same in every language,
    :func:`~mechlingo.data.splits.take_per_lang`): a user's facts file of many relations
    costs the card what the bundled one does. ``None`` keeps all."""
    cap = cfg.get("max_ids_per_lang")
    facts = list(facts)
    if cap is None or not facts:
        return facts
    n_rel = len({f.relation for f in facts})
    return take_per_lang(facts, max(4, int(cap) // n_rel))


# --------------------------------------------------------------------------------------
# Stages (each returns a JSON-able result)
# --------------------------------------------------------------------------------------

_TRACE_FIELDS = ("id", "lang", "relation", "answer", "answer_en", "correct", "class",
                 "first_en_layer", "first_answer_layer", "first_mismatch_en_layer",
                 "gold_rank")  # fmt: skip


def _stage_trace(model: Model, facts: list[Fact], cfg: Mapping[str, Any], progress: bool) -> dict:
    t = cfg["trace"]
    metric = "rank" if lu.metric_of(cfg) == "rank" else "generate"
    tr = trace_recall(
        model, facts, max_rank=t["max_rank"], max_new_tokens=t["max_new_tokens"],
        batch_size=cfg.get("batch_size", 16), progress=progress, metric=metric,
    )  # fmt: skip
    curves = tr.lens.latent_curves()
    return {
        "records": [{k: r[k] for k in _TRACE_FIELDS} for r in tr.records],
        "counts": tr.counts(),
        "latent_curves": curves.to_dict("records"),
        "n_layers": tr.n_layers,
        "max_rank": tr.max_rank,
        "mid_layers": tr.mid_layers,
        "metric": metric,
        "mismatch_rule": "another fact's English answer: the next id of the same relation",
    }


def _stage_repair(model: Model, facts: list[Fact], cfg: Mapping[str, Any], progress: bool) -> dict:
    """``steer build`` + ``steer eval`` on the repair facts: the vectors built on the build
    split with the budget's build settings, then
    :func:`mechlingo.analyses.recall.steer_eval.run_steer_eval` (the call of ``steer eval``)
    with its split, dev grid and scoring (:func:`mechlingo.card.lu.repair_settings`)."""
    r = cfg["repair"]
    build, dev, test = lu.repair_split(facts, cfg)
    if not (build and dev and test):
        raise InputError(
            "a split of the repair facts is empty (build, dev or test)",
            fix="give more facts (a larger budget or more ids per relation)",
        )
    build_settings, grid, scoring = lu.repair_settings(cfg, int(model.cfg.n_layers), progress)
    vectors = steering.build_steering_vectors(model, build, build_settings, progress=progress)
    split = SplitSettings(tuple(r["split"]), "", r["dev_per_lang"], r["test_per_lang"])
    run = steer_eval.run_steer_eval(
        model, facts, vectors, split=split, grid=grid, scoring=scoring, seeds=r["seeds"]
    )
    res, sw = run.test, run.search
    if sw is None:  # a dev search runs whenever no config is fixed
        raise RuntimeError("the repair stage ran no dev search")
    sweep = sw.to_json()
    per = repair_items.condition_outcomes(res.results, facts)
    n_ids = {k: len({f.id for f in v}) for k, v in (("build", build), ("dev", dev), ("test", test))}
    return {
        "summary": res.summary(),
        "sweep": {k: v for k, v in sweep.items() if k != "rows"},
        "sweep_rows": [x for x in sweep["rows"] if x["stage"] == "dev"],
        "lowest": sw.lowest_rule,
        **per,
        "random_draws": len(r["seeds"]),
        "p_floor": 1 / (len(r["seeds"]) + 1),
        "subjects": repair_items.subject_keys(facts),
        "items": repair_items.item_records(res.results),
        "n_ids": n_ids,
    }


def _stage_transfer(
    model: Model,
    facts: list[Fact],
    cfg: Mapping[str, Any],
    by: str,
    progress: bool,
    built: dict[str, Any],
) -> dict:
    """The transfer matrix (:func:`mechlingo.analyses.recall.transfer.transfer_matrix`).

    ``built`` carries the build statistics from one matrix to the other within a run (the
    same facts and split give the same statistics, so the second matrix does not rebuild
    them); a resumed run that has only one of the two rebuilds."""
    t = cfg["transfer"]
    tm = transfer.transfer_matrix(
        model,
        facts,
        by=by,
        matrix=lu.matrix_settings(t.get("matrix", {}), int(model.cfg.n_layers)),
        scoring=ScoringOptions(
            metric=lu.metric_of(cfg),
            max_new_tokens=t["max_new_tokens"],
            batch_size=cfg.get("batch_size", 64),
            progress=progress,
        ),
        stats=built.get("stats"),
    )
    built["stats"] = tm.stats
    out = tm.to_json()
    out = json.loads(out) if isinstance(out, str) else out
    cells = list(out.get("cells", tm.cells))
    return {"by": by, "matrix": {k: v for k, v in out.items() if k != "cells"}, "cells": cells,
            "subjects": repair_items.subject_keys(facts)}  # fmt: skip


def _overlap(res: Any, k: int) -> dict[str, Any]:
    """The languages' pairwise overlap matrix of the top-``k`` expert sets (the row judges it
    with the languages as units, :func:`mechlingo.card.rows.overlap_test`)."""
    ov = res.overlap(k).cpu()
    return {"k": k, "langs": res.langs, "matrix": ov.tolist(), "chance": k / res.stats.n_features}


def _stage_experts(
    model: Model, texts: dict, cfg: Mapping[str, Any], progress: bool, tmp: Path
) -> dict:
    """The experts, k chosen on the held-out lines' perplexity and BOS samples of seed 0,
    and everything that judges the chosen clamp measured elsewhere: its steering on fresh BOS
    samples (seed 1) with perplexity on evaluation lines, the AUROC at its k on the
    evaluation lines, the overlap at its k (the smallest k when the rule chose none)."""
    e = cfg["experts"]
    target = e["target"]
    if target not in texts["find"]:
        raise InputError(f"the experts' target {target!r} has no parallel sentences",
                         fix=f"give <{target}>.txt or another target")  # fmt: skip
    res = find_experts(model, texts["find"], max_tokens=e["max_tokens"],
                       batch_size=cfg.get("batch_size", 16), progress=progress)  # fmt: skip
    n_feat = res.stats.n_features
    ks = sorted({k for k in e["ks"] if 2 * k <= n_feat}) or [max(1, n_feat // 4)]
    kw = {"n_samples": e["samples"], "max_new_tokens": e["new_tokens"],
          "max_tokens": e["max_tokens"], "progress": progress}  # fmt: skip
    curve = k_curve(model, res, target, ks, texts["heldout"], seed=0, **kw)
    papers = curve.choose(e["ppl_budget"], "none")
    strict = curve.choose(e["ppl_budget"], "geomean")
    k = papers["k"] if papers["k"] is not None else ks[0]
    measure = []
    if papers["k"] is not None:
        lines = {lg: v[: max(2, e["n_heldout"])] for lg, v in texts["eval"].items()}
        measure = k_curve(model, res, target, [k], lines, seed=MEASURE_SEED, **kw).records()
    draws = max(1, int(e.get("random_sets", 1)))
    if papers["k"] is not None:
        res.clamp(target, k).save(tmp / "clamp", model)
        for i in range(draws):  # draw 0 is also the paired control
            res.random_clamp(target, k, seed=i, layer_matched=True).save(
                tmp / ("control" if i == 0 else f"control_s{i}"), model)  # fmt: skip
    ev = collect_neuron_stats(model, texts["eval"], max_tokens=e["max_tokens"],
                              batch_size=cfg.get("batch_size", 16), progress=progress)  # fmt: skip
    top = res.top(target, k)
    rnd = [res.random_features(target, k, seed=i, layer_matched=True) for i in range(draws)]
    auroc = sundar.auroc_tests(ev, target, top, rnd, e["n_boot"], 0, texts["docs"]["eval"])
    auroc["k_rule"] = "the papers' rule" if papers["k"] is not None else "none chosen: smallest k"
    return {
        "target": target, "ks": ks, "n_features": n_feat, "langs": res.langs,
        "curve": curve.records(), "tests": curve.tests(), "measure_curve": measure,
        "measure_seed": MEASURE_SEED, "choice_papers": papers, "choice_strict": strict,
        "auroc": auroc, "overlap": _overlap(res, k), "summary": res.summary(k),
    }  # fmt: skip


def _stage_align(
    model: Model, texts: dict, cfg: Mapping[str, Any], experts_dir: Path, progress: bool
) -> dict:
    if not (experts_dir / "clamp").is_dir():
        return {"untestable": "the papers' k rule chose no k (none within the perplexity "
                "budget), so there is no clamp to align with"}  # fmt: skip
    iv = load_intervention(experts_dir / "clamp", model)
    ctl = load_intervention(experts_dir / "control", model)
    e = cfg["experts"]
    comp = compare_alignment(
        model, texts["eval"], iv, control=ctl, layers="all", target=e["target"],
        batch_size=cfg.get("batch_size", 16), max_tokens=e["max_tokens"], progress=progress,
    )  # fmt: skip
    summary = comp.summary()
    summary["intervals"] = comp.intervals()
    summary["k"] = iv.meta.get("build", {}).get("k") if hasattr(iv, "meta") else None
    per: dict[str, dict[str, list[float]]] = {}

    def values(emb: Any) -> dict[str, list[float]]:
        vals = per_sentence(emb.emb[emb.layer_slot(None)], comp.langs, target=e["target"],
                            centre=comp.centre)  # fmt: skip
        return {m: vals[m].cpu().tolist() for m in ("retrieval", "between_languages")}

    for arm in comp.arms():
        per[arm] = values({"pre": comp.pre, "post": comp.post, "control": comp.control}[arm])
    per.update(_random_arms(model, texts["eval"], experts_dir, cfg, values, progress))
    if "control" in per:
        per["random_s0"] = per["control"]
    summary["per_sentence"] = per
    summary["random_draws"] = sum(k.startswith("random_s") for k in per)
    summary["p_floor"] = 1 / (summary["random_draws"] + 1)
    docs = texts.get("docs", {}).get("eval")
    summary["details"] = sundar.align_details(comp, docs)
    summary["docs"] = summary["details"]["docs"]
    return summary


def _random_arms(model: Model, texts: Mapping[str, Sequence[str]], experts_dir: Path,
                 cfg: Mapping[str, Any], values: Callable[[Any], dict[str, list[float]]],
                 progress: bool) -> dict[str, dict[str, list[float]]]:  # fmt: skip
    """``{"random_s<i>": per-sentence values}`` of the random-neuron population beyond draw 0
    (the experts stage saved ``control_s<i>``): one embedding pass each, no shared state."""
    e, out = cfg["experts"], {}
    for i in range(1, int(e.get("random_sets", 1))):
        folder = experts_dir / f"control_s{i}"
        if not folder.is_dir():
            break
        emb = embed_parallel(model, texts, intervention=load_intervention(folder, model),
                             layers="all", batch_size=cfg.get("batch_size", 16),
                             max_tokens=e["max_tokens"], progress=progress)  # fmt: skip
        out[f"random_s{i}"] = values(emb)
    return out


# --------------------------------------------------------------------------------------
# Rows: from stored stage results to verdicts (mechlingo.card.rows)
# --------------------------------------------------------------------------------------


def _rows_repair_all(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    rows = rows_repair(data)
    lu.attach_logprob(rows, data)
    return rows


#: ``(stage, row builder)``; a builder that fails turns its stage's rows not yet built into
#: error rows (the other builders of the stage keep theirs).
_ROWS: tuple[tuple[str, Callable[[Mapping[str, Any]], list[dict[str, Any]]]], ...] = (
    ("trace", rows_trace),
    ("repair", _rows_repair_all),
    ("repair", lu.rows_repair_extra),
    ("transfer_relation", lambda d: rows_transfer("independent_relations", d)),
    ("transfer_lang", lambda d: rows_transfer("independent_languages", d)),
    ("decoders", lu.rows_decoders),
    ("conversion", lu.rows_conversion),
    ("external", lu.rows_external),
    ("experts", rows_experts),
    ("align", rows_align),
    ("align", sundar.rows_align_extra),
)


def claim_rows(stages: Mapping[str, Any], papers: Sequence[str]) -> list[dict[str, Any]]:
    """Every claim's rows of ``papers`` from the stages' stored results (``{"error": ...}``
    for a failed stage), in the order of :data:`~mechlingo.card.rules.CLAIMS` (a claim
    judged in several readings has one row per reading, each with its ``variant``), after
    :func:`~mechlingo.card.rules.finalize` (each family adjusted, then the verdicts). A
    row builder that fails on a result also becomes an error row."""
    built: dict[str, list[dict[str, Any]]] = {}
    for name, fn in _ROWS:
        data = stages.get(name)
        if data is None or "error" in data:
            continue
        try:
            for row in fn(data):
                built.setdefault(row["id"], []).append(row)
        except Exception as err:  # a result this code cannot read: the rows say so
            for c in CLAIMS:
                if c.stage == name and c.id not in built:
                    built[c.id] = [error_row(c, f"reading the {name} result: {err!r}")]
    rows = []
    for c in CLAIMS:
        if c.paper not in papers:
            continue
        if c.id in built:
            rows += built[c.id]
        else:
            err = (stages.get(c.stage) or {}).get("error", "the stage did not run")
            rows.append(error_row(c, err))
    return finalize(rows)


# --------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------


def _papers(paper: str) -> list[str]:
    if paper == "all":
        return [LU, SUNDAR]
    if paper not in PAPERS:
        raise InputError(f"paper must be one of {[*PAPERS, 'all']}, got {paper!r}")
    return [paper]


def _stage_fns(
    model: Model,
    facts: Sequence[Fact] | None,
    parallel: Mapping[str, Sequence[str]] | None,
    cfg: Mapping[str, Any],
    stages: Stages,
    progress: bool,
    external: tuple[Sequence[Fact], str] | None = None,
    documents: Sequence[str] | None = None,
) -> dict[str, tuple[Callable[..., Any], bool]]:
    """``{stage: (fn, takes a folder)}``; the data of each stage is loaded when it runs."""
    texts: dict[str, Any] = {}
    built: dict[str, Any] = {}

    def par() -> dict:
        if not texts:
            texts.update(sundar.parallel_parts(parallel, cfg, documents))
        return texts

    extra = lu.stage_fns(model, lambda s: _lu_facts(facts, cfg, s), par, cfg, stages,
                              external, progress)  # fmt: skip

    return {
        "trace": (lambda: _stage_trace(model, _lu_facts(facts, cfg, "trace"), cfg, progress),
                  False),
        "repair": (lambda: {**_stage_repair(model, _lu_facts(facts, cfg, "repair"), cfg,
                                            progress), **lu.trace_classes(stages)}, False),
        "transfer_relation": (lambda: _stage_transfer(
            model, _lu_facts(facts, cfg, "transfer"), cfg, "relation", progress, built), False),
        "transfer_lang": (lambda: _stage_transfer(
            model, _lu_facts(facts, cfg, "transfer"), cfg, "lang", progress, built), False),
        "experts": (lambda tmp: _stage_experts(model, par(), cfg, progress, tmp), True),
        "align": (lambda: _stage_align(model, par(), cfg, stages.path("experts"), progress),
                  False),
        **extra,
    }  # fmt: skip


def _run_stage(stages: Stages, name: str, fn: Callable[..., Any], folder: bool) -> tuple:
    """``(result or {"error": ...}, {"seconds", "cpu_seconds"}, cached)``; only ``Exception`` is caught (Ctrl-C
    and SIGTERM stop the run; finished stages stay stored)."""
    cached = stages.done(name)
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        data = stages.run(name, fn, folder=folder)
    except Exception as err:
        tb = traceback.format_exception_only(type(err), err)[-1].strip()
        data = {"error": tb}
    secs = {"seconds": round(time.perf_counter() - t0, 1),
            "cpu_seconds": round(time.process_time() - c0, 1)}  # fmt: skip
    return data, secs, cached


def replicate(
    model: Model,
    *,
    paper: str = "all",
    budget: str = "quick",
    facts: Sequence[Fact] | None = None,
    parallel: Mapping[str, Sequence[str]] | None = None,
    work: str | Path | None = None,
    settings: Mapping[str, Any] | None = None,
    progress: bool = False,
    fresh: bool = False,
    agree: Callable[[bool], bool] | None = None,
    metric: str | None = None,
    external: Sequence[Fact] | None = None,
    external_metric: str = "rank",
    documents: Sequence[str] | None = None,
    plan: bool = False,
) -> ClaimsCard | Plan:
    """Check the papers' claims on ``model``: one row per claim with the paper's number,
    mechlingo's number (n, 95% interval), a verdict by a fixed rule and the figure.

    Args:
        model: a TransformerLens model.
        paper: ``"lu2025"``, ``"sundar2025"`` or ``"all"``.
        budget: ``"quick"`` (about 10 minutes on the embedded model on 2 CPU cores) or
            ``"full"`` (about 45); the sample sizes of :data:`BUDGETS`.
        facts: the facts of the Lu stages (default: the bundled natural stems).
        parallel: ``{lang: [sentence, ...]}`` line-aligned, for the Sundar stages (default:
            the bundled parallel sentences).
        work: the work folder where finished stages are kept (a rerun with the same model,
            data and settings reuses them; a stopped run resumes). ``None``: a temporary
            folder, removed at the end.
        settings: overrides of the budget's settings (:func:`budget_settings`).
        progress: show a progress bar over the stages and each analysis's own bars.
        fresh: remove the stored stages of this key first (start over).
        agree: under torchrun, how the ranks agree that a stage is finished everywhere
            (:func:`mechlingo.cli.work.all_ranks_have`); each rank then keeps its own stages.
        metric: how the Lu stages score facts: ``None`` (the default): the metric rule
            decides on dev before any test item is scored
            (:mod:`mechlingo.card.metric_rule`: greedy generation above its floor, candidate
            ranking otherwise); ``"generate"``, ``"rank"`` (P@1 of candidate ranking;
            bundled facts get BMLAMA-style candidates) or ``"klar"`` override the rule, and
            the card says so (``claims.json["metric_decision"]``).
        external: a benchmark's facts for the external-transfer rows (vectors and settings
            chosen on the bundled data, applied unchanged), scored with ``external_metric``.
        documents: the document id of every ``parallel`` line (the split never cuts a
            document; alignment rows resample documents).
        plan: only plan (:func:`mechlingo.card.plan.plan_card`): score the dev split, print
            and return the :class:`~mechlingo.card.plan.Plan` (the data and draws each
            primary row needs, the CPU time); no test item is scored. A normal run prints the
            plan's time estimate before it starts and stores the plan in the card.

    Returns:
        A :class:`ReplicationCard` (``plan=False``) or a :class:`~mechlingo.card.plan.Plan`.
    """
    papers = _papers(paper)
    if metric is not None and metric not in METRICS:
        raise InputError(f"metric must be one of {list(METRICS)}, got {metric!r}")
    cfg = budget_settings(budget, {**dict(settings or {}), "metric": metric or "rule"})
    key = {
        "model": {**model_info(model), "weights_fingerprint": weights_fingerprint(model)},
        "data": {"facts": _facts_hash(facts), "parallel": None if parallel is None else
                 _hash([parallel, documents]),
                 "external": None if external is None else [_facts_hash(external),
                                                            external_metric]},
        "settings": cfg, "stage_version": STAGE_VERSION,
    }  # fmt: skip
    tmp = None if work is not None else tempfile.mkdtemp(prefix="mechlingo-replicate-")
    if agree is not None:
        key["rank"] = [dist_info().rank, dist_info().world_size]
    stages = Stages(work if work is not None else tmp, key, agree=agree)  # type: ignore[arg-type]
    if fresh:
        stages.clear()
    try:
        results: dict[str, Any] = {}
        timing: dict[str, Any] = {}
        decision = None
        if LU in papers:
            results["metric"], timing["metric"], decision = _decide(
                model, stages, facts, cfg, metric)  # fmt: skip
        cost = {}
        if SUNDAR in papers:
            cost = stages.run("embed_cost", lambda: _embed_cost(model, parallel, documents, cfg))
        if "metric" in results:  # measured seconds: the plan's, not a result (they vary)
            results["metric"] = dict(results["metric"])
            cost = {**results["metric"].pop("seconds_per_item", {}), **cost}
        the_plan = plan_card(cfg, papers, results.get("metric"),
                             _data_available(facts, parallel, documents, cfg, papers), cost)  # fmt: skip
        if plan:
            print(the_plan)
            return the_plan
        print(f"replicate: the planner's estimate for this card: {the_plan.card_minutes:.1f} "
              "CPU-minutes (see the plan in claims.json)")  # fmt: skip
        ext = None if external is None else (list(external), external_metric)
        fns = _stage_fns(model, facts, parallel, cfg, stages, progress, ext, documents)
        names = [s for p in papers for s in PAPERS[p]]
        bar = tqdm(names, desc="replicate", disable=not progress, unit="stage")
        for name in bar:
            bar.set_postfix_str(name)
            fn, folder = fns[name]
            results[name], secs, cached = _run_stage(stages, name, fn, folder)
            timing[name] = {**secs, "cached": cached, "error": results[name].get("error")}
        rows = claim_rows(results, papers)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    meta = {"model": key["model"]["model_name"], "budget": budget, "papers": papers,
            "rules_hash": RULES_HASH, "budgets_hash": BUDGETS_HASH,
            "mechlingo": __version__, "settings": cfg, "stages": timing,
            "work": None if work is None else str(stages.folder),
            "metric_rule": METRIC_RULE, "metric_decision": decision,
            "plan": the_plan.to_json()}  # fmt: skip
    return ReplicationCard(rows, results, meta)


class ReplicationCard(ClaimsCard):
    """A :class:`~mechlingo.card.rules.ClaimsCard` whose ``claims.json`` also opens with the
    metric rule, its decision (with its inputs) and the power plan (from ``meta``)."""

    def to_json(self) -> dict[str, Any]:
        """``claims.json``: the metric rule and decision, the plan, then the card's JSON."""
        top = {k: self.meta[k] for k in ("metric_rule", "metric_decision", "plan")
               if self.meta.get(k) is not None}  # fmt: skip
        return {**top, **super().to_json()}


def _decide(model: Model, stages: Stages, facts: Sequence[Fact] | None, cfg: dict[str, Any],
            given: str | None) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:  # fmt: skip
    """The metric stage (dev scored both ways, stored like any stage) and the rule's decision;
    ``cfg["metric"]`` becomes the card's metric."""

    def run() -> dict[str, Any]:
        dev = _dev_facts(facts, cfg)
        out = dev_accuracies(model, dev, max_new_tokens=cfg["repair"]["max_new_tokens"],
                             batch_size=cfg.get("batch_size", 16))  # fmt: skip
        out["n_dev_ids"] = len({f.id for f in dev})
        return out

    data, secs, cached = _run_stage(stages, "metric", run, False)
    secs = {**secs, "cached": cached, "error": data.get("error")}
    if "error" in data:  # the rule cannot run: only a given metric lets the card go on
        if given is None:
            raise InputError(f"the metric rule's dev scoring failed: {data['error']}",
                             fix="pass --metric to choose the metric yourself")  # fmt: skip
        decision = {"metric": given, "ruled": None, "overridden": True, "given": given,
                    "why": f"the rule could not run ({data['error']}): the given metric"}  # fmt: skip
        cfg["metric"] = given
        return data, secs, decision
    decision = decide_metric(data, given)
    cfg["metric"] = decision["metric"]
    return data, secs, decision


def _data_available(facts: Sequence[Fact] | None, parallel: Mapping[str, Sequence[str]] | None,
                    documents: Sequence[str] | None, cfg: Mapping[str, Any],
                    papers: Sequence[str]) -> dict[str, Any]:  # fmt: skip
    """The sizes the planner compares with what a row needs: test and dev fact ids per
    language (the fewest of the non-English languages, before the budget's caps), the
    documents left for evaluation after the finding and held-out lines, the languages."""
    out: dict[str, Any] = {}
    if LU in papers:
        all_facts = _lu_facts(facts, {**cfg, "metric": "generate"}, "repair")
        r = cfg["repair"]
        uncapped = {**cfg, "repair": {**r, "dev_per_lang": None, "test_per_lang": None}}
        _, dev, test = lu.repair_split(all_facts, uncapped)
        for name, part in (("dev_ids", dev), ("test_ids", test)):
            per: dict[str, set[str]] = {}
            for f in part:
                per.setdefault(f.lang, set()).add(f.id)
            out[name] = min((len(v) for lg, v in per.items() if lg != "en"), default=0)
    if SUNDAR in papers:
        texts, docs = (sundar.bundled_texts() if parallel is None
                       else (dict(parallel), documents))  # fmt: skip
        n = len(next(iter(texts.values()), []))
        docs = list(docs) if docs is not None and len(docs) == n else [str(i) for i in range(n)]
        e = cfg["experts"]
        try:
            parts = split_by_documents(docs, [e["n_find"], e["n_heldout"], n],
                                       [None, None, e.get("eval_per_doc")])  # fmt: skip
            out["eval_docs"] = len({docs[i] for i in parts[2]})
        except InputError:
            out["eval_docs"] = 0
        out["langs"] = len(texts)
    return out


def _embed_cost(model: Model, parallel: Mapping[str, Sequence[str]] | None,
                documents: Sequence[str] | None, cfg: Mapping[str, Any]) -> dict[str, float]:  # fmt: skip
    """``{"embed": CPU seconds per sentence and language}`` of one embedding pass over the
    first 8 evaluation lines (no intervention): the planner's per-item cost of alignment."""
    texts = sundar.parallel_parts(parallel, cfg, documents)["eval"]
    lines = {lg: v[:8] for lg, v in texts.items()}
    c0 = time.process_time()
    embed_parallel(model, lines, layers="all", batch_size=cfg.get("batch_size", 16),
                   max_tokens=cfg["experts"]["max_tokens"])  # fmt: skip
    n = sum(len(v) for v in lines.values())
    return {"embed": round((time.process_time() - c0) / max(1, n), 4)}


def _dev_facts(facts: Sequence[Fact] | None, cfg: Mapping[str, Any]) -> list[Fact]:
    """The repair stage's dev split with candidates (the split ignores them)."""
    return lu.repair_split(_lu_facts(facts, {**cfg, "metric": "rank"}, "repair"), cfg)[1]
