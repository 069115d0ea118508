"""``replicate``: the papers' claims checked on one model, in one call.

:func:`replicate` runs the analyses behind every claim of :data:`mechlingo.analyses.claims.CLAIMS`
through their Python APIs, in stages:

* ``trace`` (:func:`mechlingo.analyses.trace.trace_recall`: greedy answers and the logit
  lens of every query): the latent-English and the recall-failure claims;
* ``repair`` (:func:`mechlingo.analyses.repair.build_repair_vectors` on the build split,
  :func:`mechlingo.analyses.protocol.choose_on_dev` on dev, :func:`mechlingo.analyses.protocol.evaluate_test`
  on test with norm-matched random controls): the two vectors, the lowest language (the
  headroom rule, :func:`mechlingo.analyses.claims.headroom_lowest_language`, beside the literal
  :func:`mechlingo.analyses.protocol.lowest_language_dev`) and the random vector;
* ``transfer_relation`` and ``transfer_lang``
  (``mechlingo.analyses.transfer.transfer_matrix``): independence of relations and languages;
* ``experts`` (:func:`mechlingo.analyses.experts.find_experts`, :func:`~mechlingo.analyses.experts.k_curve`
  and the k rules, held-out AUROC, overlap): the expert claims and the clamp of the k that
  the papers' rule picks (target-language rate against the target's perplexity; the stricter
  rule that also bounds every other language is reported beside it);
* ``align`` (:func:`mechlingo.analyses.align.compare_alignment` with that clamp and its
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
import importlib
import json
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from mechlingo.analyses import card_lu, card_sundar, protocol, repair
from mechlingo.analyses.align import compare_alignment
from mechlingo.analyses.claims import (
    CLAIMS,
    LU,
    SUNDAR,
    Claim,
    ClaimsCard,
    error_row,
    finalize,
    headroom_lowest_language,
    make_row,
)
from mechlingo.analyses.evaluate import normalize
from mechlingo.analyses.experts import collect_neuron_stats, find_experts, k_curve
from mechlingo.analyses.trace import trace_recall
from mechlingo.core.describe import model_info
from mechlingo.core.errors import InputError
from mechlingo.core.stages import Stages
from mechlingo.core.types import Model
from mechlingo.core.version import __version__
from mechlingo.data import LANGS, Fact, load_facts
from mechlingo.data.splits import split_facts, take_per_lang
from mechlingo.interventions import load_intervention
from mechlingo.kernels.ranking import auroc_and_average_precision
from mechlingo.kernels.significance import Interval, paired_gain, wilson

__all__ = ["BUDGETS", "PAPERS", "STAGES", "budget_settings", "replicate"]

#: Bumped when a stage computes something different: old stored results are not reused.
STAGE_VERSION = 1

PAPERS = {LU: ("trace", "repair", "transfer_relation", "transfer_lang", "decoders",
               "conversion", "external"),
          SUNDAR: ("experts", "align")}  # fmt: skip
#: ``replicate(metric=...)``: how the Lu stages score facts (see ``docs/replicate.md``).
METRICS = ("generate", "rank", "klar")
STAGES = (*PAPERS[LU], *PAPERS[SUNDAR])

_QUICK: dict[str, Any] = {
    "lu_langs": ["en", "fr", "es", "ru", "ja", "hi"],
    "trace": {"limit": 24, "max_new_tokens": 8, "max_rank": 10},
    "repair": {
        "split": [0.4, 0.2, 0.4], "dev_per_lang": 10, "test_per_lang": 24, "k_shot": 3,
        "translation_shots": 2, "layer_fractions": [0.5, 0.67],
        "alphas": [0.13, 0.28], "top_k": 2, "screen_ids": 4, "seeds": [0],
        "max_new_tokens": 6,
    },
    "transfer": {"relations": ["capital", "currency", "language"], "limit": 24,
                 "langs": ["en", "fr", "es", "ru"], "max_new_tokens": 6,
                 "matrix": {"cells": "diagonal", "build_ids": 6, "dev_ids": 4,
                            "test_ids": 8, "screen_ids": 2, "layer_fractions": [0.55],
                            "alphas": [0.28, 0.6]}},
    "experts": {"target": "es", "n_find": 32, "n_heldout": 4, "ks": [50, 500],
                "samples": 16, "new_tokens": 12, "max_tokens": 24, "n_eval": 32,
                "ppl_budget": 2.0, "n_boot": 200, "eval_per_doc": 4},
    "candidates": 4, "decoders": {"per_lang": 6, "tuned_lens": None},
    "conversion": {"langs": ["fr", "ru", "ja"], "n_prompts": 6}, "external": {"per_lang": 24},
}  # fmt: skip
_FULL: dict[str, Any] = {
    "lu_langs": list(LANGS),
    "trace": {"limit": 60, "max_new_tokens": 8, "max_rank": 10},
    "repair": {
        "split": [0.4, 0.2, 0.4], "dev_per_lang": 16, "test_per_lang": 40, "k_shot": 3,
        "translation_shots": 2, "layer_fractions": [0.33, 0.5, 0.67, 0.83],
        "alphas": [0.13, 0.28], "top_k": 2, "screen_ids": 6, "seeds": [0, 1, 2],
        "max_new_tokens": 6,
    },
    "transfer": {"relations": ["capital", "currency", "language"], "limit": 40,
                 "langs": ["en", "fr", "es", "ru", "ja", "hi"], "max_new_tokens": 6,
                 "matrix": {"cells": "diagonal", "build_ids": 12, "dev_ids": 8,
                            "test_ids": 12, "screen_ids": 3, "layer_fractions": [0.35, 0.55],
                            "alphas": [0.28, 0.6]}},
    "experts": {"target": "es", "n_find": 60, "n_heldout": 6, "ks": [50, 200, 500, 2000],
                "samples": 24, "new_tokens": 16, "max_tokens": 24, "n_eval": 60,
                "ppl_budget": 2.0, "n_boot": 500, "eval_per_doc": 5},
    "candidates": 4, "decoders": {"per_lang": 12, "tuned_lens": None},
    "conversion": {"langs": ["fr", "es", "ru", "ja", "hi"], "n_prompts": 8}, "external": {"per_lang": 40},
}  # fmt: skip
#: The settings of each budget (see ``docs/replicate.md`` for the measured run times).
BUDGETS: dict[str, dict[str, Any]] = {"quick": _QUICK, "full": _FULL}


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
        return card_lu.repair_split(_lu_facts(facts, cfg, "repair"), cfg)[2]
    sec = cfg.get(section, {})
    if facts is not None:
        return card_lu.prepare_facts(take_per_lang(list(facts), sec.get("limit")), cfg)
    langs = sec.get("langs") or cfg["lu_langs"]
    rels = sec.get("relations") or ["capital"]
    loaded = load_facts(langs=langs, relations=rels, limit=sec.get("limit"), templates="natural")
    return card_lu.prepare_facts(loaded, cfg)


# --------------------------------------------------------------------------------------
# Stages (each returns a JSON-able result)
# --------------------------------------------------------------------------------------

_TRACE_FIELDS = ("id", "lang", "answer", "answer_en", "correct", "class",
                 "first_en_layer", "first_answer_layer")  # fmt: skip


def _stage_trace(model: Model, facts: list[Fact], cfg: Mapping[str, Any], progress: bool) -> dict:
    t = cfg["trace"]
    tr = trace_recall(
        model, facts, max_rank=t["max_rank"], max_new_tokens=t["max_new_tokens"],
        batch_size=cfg.get("batch_size", 16), progress=progress,
    )  # fmt: skip
    curves = tr.lens.latent_curves()
    return {
        "records": [{k: r[k] for k in _TRACE_FIELDS} for r in tr.records],
        "counts": tr.counts(),
        "latent_curves": curves.to_dict("records"),
        "n_layers": tr.n_layers,
        "max_rank": tr.max_rank,
        "mid_layers": tr.mid_layers,
    }


def _layers(fractions: Sequence[float] | None, n_layers: int) -> list[int] | None:
    if fractions is None:
        return None
    return sorted({min(n_layers - 1, max(0, round(f * n_layers))) for f in fractions})


def _by_lang(res: Any) -> dict[str, list[bool]]:
    """Per language, correctness in id order."""
    out: dict[str, list[bool]] = {}
    for r in sorted(res.records, key=lambda r: (r["lang"], r["id"])):
        out.setdefault(r["lang"], []).append(bool(r["correct"]))
    return out


def _paired_headroom(hr: Mapping[str, Any]) -> dict[str, tuple[list[bool], list[bool]]]:
    """Dev zero- and few-shot outcomes per language, paired by fact id (the few-shot items
    are those with enough demonstrations)."""
    zero = {(r["id"], r["lang"]): bool(r["correct"]) for r in hr["results"]["zero_shot"].records}
    out: dict[str, tuple[list[bool], list[bool]]] = {}
    for r in sorted(hr["results"]["k_shot"].records, key=lambda r: (r["lang"], r["id"])):
        z, f = out.setdefault(r["lang"], ([], []))
        z.append(zero[(r["id"], r["lang"])])
        f.append(bool(r["correct"]))
    return out


def _stage_repair(model: Model, facts: list[Fact], cfg: Mapping[str, Any], progress: bool) -> dict:
    r = cfg["repair"]
    splits = split_facts(facts, r["split"])
    build = splits["build"]
    dev = take_per_lang(splits["dev"], r["dev_per_lang"])
    test = take_per_lang(splits["test"], r["test_per_lang"])
    if not (build and dev and test):
        raise InputError("a split of the repair facts is empty (build, dev or test)",
                         fix="give more facts (a larger budget or more ids per relation)")  # fmt: skip
    kw = {"max_new_tokens": r["max_new_tokens"], "batch_size": cfg.get("batch_size", 64),
          "progress": progress, "metric": card_lu.metric_of(cfg)}  # fmt: skip
    vectors = repair.build_repair_vectors(
        model, build, k_shot=r["k_shot"], translation_shots=r["translation_shots"],
        batch_size=cfg.get("batch_size", 16), progress=progress,
    )  # fmt: skip
    layers = _layers(r["layer_fractions"], int(model.cfg.n_layers))
    sw = protocol.choose_on_dev(
        model, vectors, dev, pool=build, k_shot=r["k_shot"], test_ids=test,
        task_layers=layers, diff_layers=layers, task_alphas=r["alphas"], diff_alphas=r["alphas"],
        top_k=r["top_k"], screen_ids=r["screen_ids"], **kw,
    )  # fmt: skip
    rule = headroom_lowest_language(_paired_headroom(sw.headroom))
    res = protocol.evaluate_test(
        model, vectors, sw.choice, test, lowest_language=rule["lang"] or sw.lowest_language,
        pool=build, k_shot=r["k_shot"], seeds=r["seeds"], **kw,
    )  # fmt: skip
    sweep = sw.to_dict()
    return {
        "summary": res.summary(),
        "sweep": {k: v for k, v in sweep.items() if k != "rows"},
        "sweep_rows": [x for x in sweep["rows"] if x["stage"] == "dev"],
        "lowest": {"headroom_rule": rule, "literal": sw.lowest_language,
                   "literal_rule": "protocol.lowest_language_dev: the non-English language "
                   "with the lowest dev zero-shot accuracy (ties: lower few-shot)"},
        "outcomes": {c: _by_lang(er) for c, er in res.results.items()},
        "items": card_lu.item_records(res.results),
        "n_ids": {k: len({f.id for f in v}) for k, v in (("build", build), ("dev", dev),
                                                          ("test", test))},
    }  # fmt: skip


def _stage_transfer(
    model: Model,
    facts: list[Fact],
    cfg: Mapping[str, Any],
    by: str,
    progress: bool,
    built: dict[str, Any],
) -> dict:
    """The transfer matrix (``mechlingo.analyses.transfer``, loaded when the stage runs).

    ``built`` carries the build statistics from one matrix to the other within a run (the
    same facts and split give the same statistics, so the second matrix does not rebuild
    them); a resumed run that has only one of the two rebuilds."""
    mod = importlib.import_module("mechlingo.analyses.transfer")
    t = cfg["transfer"]
    m = dict(t.get("matrix", {}))
    if "layer_fractions" in m:
        m["layers"] = _layers(m.pop("layer_fractions"), int(model.cfg.n_layers))
    tm = mod.transfer_matrix(
        model, facts, by=by, seed=0, progress=progress, max_new_tokens=t["max_new_tokens"],
        batch_size=cfg.get("batch_size", 64), stats=built.get("stats"),
        metric=card_lu.metric_of(cfg), **m,
    )  # fmt: skip
    built["stats"] = tm.stats
    out = tm.to_json()
    out = json.loads(out) if isinstance(out, str) else out
    return {"by": by, "matrix": out, "cells": list(out.get("cells", tm.cells))}


def _heldout_auroc(
    pooled: torch.Tensor, labels: torch.Tensor, feats: torch.Tensor, n_boot: int, seed: int
) -> dict[str, Any]:
    """Median AUROC over ``feats`` on held-out sentences, with a percentile bootstrap 95%
    interval over sentences (resampled within each class, so both stay present)."""
    x = pooled[:, feats.to(pooled.device)].float().cpu()
    y = labels.bool().cpu()
    est = float(auroc_and_average_precision(x, y)[0].median())
    gen = torch.Generator().manual_seed(seed)
    pos, neg = y.nonzero().flatten(), (~y).nonzero().flatten()
    vals = []
    for _ in range(n_boot):
        idx = torch.cat([pos[torch.randint(len(pos), (len(pos),), generator=gen)],
                         neg[torch.randint(len(neg), (len(neg),), generator=gen)]])  # fmt: skip
        vals.append(float(auroc_and_average_precision(x[idx], y[idx])[0].median()))
    q = torch.tensor(vals).quantile(torch.tensor([0.025, 0.975]))
    return {"estimate": est, "lo": float(q[0]), "hi": float(q[1]), "n": int(len(y)),
            "n_pos": int(len(pos)), "k": int(len(feats))}  # fmt: skip


def _random_features(n: int, exclude: torch.Tensor, k: int, seed: int) -> torch.Tensor:
    mask = torch.ones(n, dtype=torch.bool)
    mask[exclude.cpu()] = False
    pool = mask.nonzero().flatten()
    return pool[torch.randperm(len(pool), generator=torch.Generator().manual_seed(seed))[:k]]


def _overlap(res: Any, k: int) -> dict[str, Any]:
    ov = res.overlap(k).cpu()
    n = ov.shape[0]
    iu = torch.triu_indices(n, n, 1)
    shared = int(round(float((ov[iu[0], iu[1]] * k).sum())))
    return {"k": k, "langs": res.langs, "matrix": ov.tolist(),
            "wilson": wilson(shared, iu.shape[1] * k), "chance": k / res.stats.n_features}  # fmt: skip


def _stage_experts(
    model: Model, texts: dict, cfg: Mapping[str, Any], progress: bool, tmp: Path
) -> dict:
    e = cfg["experts"]
    target = e["target"]
    if target not in texts["find"]:
        raise InputError(f"the experts' target {target!r} has no parallel sentences",
                         fix=f"give <{target}>.txt or another target")  # fmt: skip
    res = find_experts(model, texts["find"], max_tokens=e["max_tokens"],
                       batch_size=cfg.get("batch_size", 16), progress=progress)  # fmt: skip
    n_feat = res.stats.n_features
    ks = sorted({k for k in e["ks"] if 2 * k <= n_feat}) or [max(1, n_feat // 4)]
    curve = k_curve(model, res, target, ks, texts["heldout"], n_samples=e["samples"],
                    max_new_tokens=e["new_tokens"], seed=0, max_tokens=e["max_tokens"],
                    progress=progress)  # fmt: skip
    papers = curve.choose(e["ppl_budget"], "none")
    strict = curve.choose(e["ppl_budget"], "geomean")
    ev = collect_neuron_stats(model, texts["eval"], max_tokens=e["max_tokens"],
                              batch_size=cfg.get("batch_size", 16), progress=progress)  # fmt: skip
    labels = ev.lang_ids == ev.lang_index(target)
    top = res.top(target, ks[0])
    auroc = _heldout_auroc(ev.pooled, labels, top, e["n_boot"], 0)
    rnd = _random_features(n_feat, top, ks[0], seed=0)
    auroc_rnd = _heldout_auroc(ev.pooled, labels, rnd, e["n_boot"], 0)
    if papers["k"] is not None:
        res.clamp(target, papers["k"]).save(tmp / "clamp", model)
        res.random_clamp(target, papers["k"], seed=0).save(tmp / "control", model)
    return {
        "target": target, "ks": ks, "n_features": n_feat, "langs": res.langs,
        "curve": curve.records(), "tests": curve.tests(),
        "choice_papers": papers, "choice_strict": strict,
        "auroc": auroc, "auroc_random": auroc_rnd, "overlap": _overlap(res, ks[0]),
        "summary": res.summary(ks[0]),
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
    summary["details"] = card_sundar.align_details(comp, texts.get("docs", {}).get("eval"))
    return summary


# --------------------------------------------------------------------------------------
# Rows: from stored stage results to verdicts (pure; tested on hand-made numbers)
# --------------------------------------------------------------------------------------


def _rows_trace(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    recs = [r for r in data["records"] if r["lang"] != "en"]
    order = []
    for r in recs:
        if r["answer_en"] and normalize(r["answer_en"]) == normalize(r["answer"]):
            continue  # the English and the L answer are the same word: no order to see
        e, a = r["first_en_layer"], r["first_answer_layer"]
        if (e >= 0 or a >= 0) and e != a:
            order.append(e >= 0 and (a < 0 or e < a))
    w = wilson(sum(order), len(order))
    c1 = _claim("latent_english")
    row1 = make_row(
        c1, _iv(w, "p"),
        untestable=None if order else "no non-English query whose English or L answer "
        "becomes decodable (rank <= max_rank) with distinct words",
        details=f"{sum(order)} of {len(order)} queries: English first",
    )  # fmt: skip
    cls = [r["class"] for r in recs]
    rf, tf = cls.count("recall_failure"), cls.count("translation_failure")
    errors = sum(not r["correct"] for r in recs)
    c2 = _claim("recall_failures")
    row2 = make_row(
        c2, _iv(wilson(rf, rf + tf), "p"),
        untestable=None if rf + tf else "no recall or translation failures among the "
        "non-English queries",
        details=f"of {errors} non-English errors: {rf} recall failures, {tf} translation "
        f"failures, {errors - rf - tf} other (wrong language or L-only)",
    )  # fmt: skip
    return [row1, row2]


def _iv(d: Mapping[str, Any] | None, est: str = "gain", n: str = "n") -> Interval | None:
    """An :class:`Interval` from a result dict (``gain``/``p``/``mean``/``estimate``, ``lo``,
    ``hi``, ``n``); ``None`` when absent."""
    if not d:
        return None
    return Interval(d.get(est), d.get("lo"), d.get("hi"), int(d.get(n) or 0))


def _non_english(outcomes: Mapping[str, Sequence[bool]]) -> list[bool]:
    return [x for lg in sorted(outcomes) if lg != "en" for x in outcomes[lg]]


def _best_control(gains: Sequence[Mapping[str, Any] | None], est: str = "gain") -> Interval | None:
    """The random control most in favour of an effect (the highest lower bound): a claim
    holds only if no seed shows the effect."""
    ivs = [_iv(g, est) for g in gains if g]
    ivs = [i for i in ivs if i is not None and i.defined]
    return max(ivs, key=lambda i: i.lo) if ivs else None  # type: ignore[arg-type,return-value]


def _relative(g: Mapping[str, Any]) -> dict[str, Any]:
    return {"gain": g.get("relative"), "lo": g.get("relative_lo"),
            "hi": g.get("relative_hi"), "n": g.get("n")}  # fmt: skip


def _rows_repair(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    s, out = data["summary"], data["outcomes"]
    seeds = [c for c in out if c.startswith("random_s")]
    base = _non_english(out["orig"])
    ctl = _best_control([paired_gain(base, _non_english(out[c])) for c in seeds])
    note = (f"selected on dev: {s['selected']} ({s['dev_effect']}); config {s['config']}; "
            f"ids build/dev/test {data['n_ids']}")  # fmt: skip
    rows = []
    for cid, cond in (("task_vector", "task"), ("diff_vector", "diff")):
        g = paired_gain(base, _non_english(out[cond]))
        rows.append(make_row(_claim(cid), _iv(g), ctl, details=note))
    rows.append(_row_lowest(data, seeds))
    pooled = paired_gain(base * len(seeds), [x for c in seeds for x in _non_english(out[c])])
    rows.append(make_row(_claim("random_vector"), _iv(pooled),
                         details=f"{len(seeds)} seeds pooled"))  # fmt: skip
    return rows


def _row_lowest(data: Mapping[str, Any], seeds: Sequence[str]) -> dict[str, Any]:
    out, low = data["outcomes"], data["lowest"]
    lang, literal = low["headroom_rule"]["lang"], low["literal"]

    def rel(lg: str | None, cond: str) -> dict[str, Any] | None:
        if lg is None or lg not in out["orig"]:
            return None
        return paired_gain(out["orig"][lg], out[cond][lg])

    lit = rel(literal, "both")
    lit_text = "n/a" if lit is None or lit["relative"] is None else (_iv(_relative(lit)).format(2))  # type: ignore[union-attr]
    details = (f"headroom rule ({low['headroom_rule']['rule']}): {lang}; literal rule "
               f"({low['literal_rule']}): {literal}, relative gain of both {lit_text}")  # fmt: skip
    claim = _claim("lowest_language")
    if lang is None:
        return make_row(
            claim,
            None,
            untestable="no headroom: no non-English language's dev "
            "few-shot accuracy beats zero-shot (McNemar p < 0.1)",
            details=details,
        )
    g = rel(lang, "both")
    if g is None or g["relative"] is None:
        if g is not None:
            details += f"; absolute gain of both in {lang}: {_iv(g).format()}"  # type: ignore[union-attr]
        return make_row(
            claim,
            None,
            untestable=f"the test accuracy of {lang} without "
            "intervention is 0: a relative gain is undefined",
            details=details,
        )
    ctl = _best_control([_relative(rel(lang, c) or {}) for c in seeds])
    return make_row(claim, _iv(_relative(g)), ctl, details=details,
                    extra={"lang": lang, "literal_lang": literal})  # fmt: skip


def _rows_transfer(cid: str, data: Mapping[str, Any]) -> list[dict[str, Any]]:
    cells = [c for c in data["cells"] if str(c.get("row", "")).startswith("all_but_")]
    cells = [c for c in cells if (c.get("gain") or {}).get("estimate") is not None]
    claim = _claim(cid)
    if not cells:
        return [
            make_row(
                claim,
                None,
                untestable="the transfer matrix has no held-out "
                "(all_but_R) cell with a gain (too few relations or languages)",
            )
        ]
    cells.sort(key=lambda c: c["gain"]["estimate"])
    mid = cells[(len(cells) - 1) // 2]
    eff = _iv({**mid["gain"], "n": mid.get("n")}, "estimate")
    ctl = _best_control([{**c["control_gain"], "n": c.get("n")} for c in cells
                         if isinstance(c.get("control_gain"), Mapping)], "estimate")  # fmt: skip
    per = "; ".join(f"{c['col']}: {_iv({**c['gain'], 'n': c.get('n')}, 'estimate').format(2)}"  # type: ignore[union-attr]
                    for c in cells)  # fmt: skip
    return [make_row(claim, eff, ctl, details=f"median of {len(cells)} held-out cells ({per})")]


def _rows_experts(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    a = data["auroc"]
    rows = [make_row(_claim("experts_exist"), _iv(a, "estimate"),
                     _iv(data["auroc_random"], "estimate"),
                     details=f"top {a['k']} {data['target']} experts; {a['n_pos']} of "
                     f"{a['n']} held-out sentences in {data['target']}")]  # fmt: skip
    ov = data["overlap"]
    rows.append(make_row(_claim("experts_disjoint"), _iv(ov["wilson"], "p"),
                         details=f"k = {ov['k']}; chance {ov['chance']:.4f}"))  # fmt: skip
    rows.append(_row_steers(data))
    return rows


def _row_steers(data: Mapping[str, Any]) -> dict[str, Any]:
    papers, strict = data["choice_papers"], data["choice_strict"]
    details = (f"papers' rule (target rate; target perplexity <= {papers['ppl_budget']:g}x): "
               f"k = {papers['k']}; stricter rule (also the geometric mean of the other "
               f"languages' perplexity ratios): k = {strict['k']}")  # fmt: skip
    k = papers["k"]
    claim = _claim("clamp_steers")
    if k is None:
        return make_row(
            claim,
            None,
            details=details,
            untestable="the papers' rule chose no k "
            "(no k keeps the target's perplexity within the budget)",
        )
    rows = data["curve"]
    none = next(r for r in rows if r["arm"] == "none")
    exp = next(r for r in rows if r["arm"] == "experts" and r["k"] == k)
    rnd = next((r for r in rows if r["arm"] == "random" and r["k"] == k), None)
    eff = _iv(paired_gain(none["bos_hits"], exp["bos_hits"]))
    ctl = None if rnd is None else _iv(paired_gain(none["bos_hits"], rnd["bos_hits"]))
    details += (f"; target rate {none['target_rate_bos']:.2f} -> {exp['target_rate_bos']:.2f} "
                f"(random {rnd['target_rate_bos'] if rnd else float('nan'):.2f})")  # fmt: skip
    return make_row(claim, eff, ctl, details=details, extra={"k": k, "k_strict": strict["k"]})


def _rows_align(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    ids = ("clamp_closer", "retrieval_improves", "random_neurons")
    if "untestable" in data:
        return [make_row(_claim(c), None, untestable=data["untestable"]) for c in ids]
    g, d = data["intervals"]["gains"], data["distance"]
    m = data["intervals"]["metrics"]["retrieval"]
    ratio = " -> ".join(f"{d[a]['ratio']:.3f}" for a in ("pre", "post", "control") if a in d)
    dist = " -> ".join(f"{d[a]['between_languages']:.3f}" for a in ("pre", "post", "control"))
    ret = ", ".join(f"{a} {m[a]['mean']:.3f}" for a in ("pre", "post", "control") if a in m)
    at = f"k = {data.get('k')}, layer {data['layer']}"
    return [
        make_row(_claim("clamp_closer"), _iv(g["between_languages"]["post_vs_pre"]),
                 _iv(g["between_languages"]["control_vs_pre"]),
                 details=f"{at}; between languages pre -> post -> control {dist}; "
                 f"same/different-sentence ratio {ratio}"),
        make_row(_claim("retrieval_improves"), _iv(g["retrieval"]["post_vs_pre"]),
                 _iv(g["retrieval"]["control_vs_pre"]), details=f"{at}; top-1 {ret}"),
        make_row(_claim("random_neurons"), _iv(g["retrieval"]["control_vs_pre"]),
                 details=f"{at}; top-1 {ret}"),
    ]  # fmt: skip


def _claim(cid: str) -> Claim:
    return next(c for c in CLAIMS if c.id == cid)


def _rows_repair_all(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    rows = _rows_repair(data)
    card_lu.attach_logprob(rows, data)
    return rows


#: ``(stage, row builder)``; a builder that fails turns its stage's not yet built rows into
#: error rows (the other builders of the stage keep theirs).
_ROWS: tuple[tuple[str, Callable[[Mapping[str, Any]], list[dict[str, Any]]]], ...] = (
    ("trace", _rows_trace),
    ("repair", _rows_repair_all),
    ("repair", card_lu.rows_repair_extra),
    ("transfer_relation", lambda d: _rows_transfer("independent_relations", d)),
    ("transfer_lang", lambda d: _rows_transfer("independent_languages", d)),
    ("decoders", card_lu.rows_decoders),
    ("conversion", card_lu.rows_conversion),
    ("external", card_lu.rows_external),
    ("experts", _rows_experts),
    ("align", _rows_align),
    ("align", card_sundar.rows_align_extra),
)


def claim_rows(stages: Mapping[str, Any], papers: Sequence[str]) -> list[dict[str, Any]]:
    """Every claim's row of ``papers`` from the stages' stored results (``{"error": ...}``
    for a failed stage), in the order of :data:`~mechlingo.analyses.claims.CLAIMS`. A row
    builder that fails on a result also becomes an error row."""
    built: dict[str, dict[str, Any]] = {}
    for name, fn in _ROWS:
        data = stages.get(name)
        if data is None or "error" in data:
            continue
        try:
            for row in fn(data):
                built[row["id"]] = row
        except Exception as err:  # a result this code cannot read: the rows say so
            for c in CLAIMS:
                if c.stage == name and c.id not in built:
                    built[c.id] = error_row(c, f"reading the {name} result: {err!r}")
    rows = []
    for c in CLAIMS:
        if c.paper not in papers:
            continue
        data = stages.get(c.stage)
        if c.id in built:
            rows.append(built[c.id])
        else:
            err = (data or {}).get("error", "the stage did not run")
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
            texts.update(card_sundar.parallel_parts(parallel, cfg, documents))
        return texts

    extra = card_lu.stage_fns(model, lambda s: _lu_facts(facts, cfg, s), par, cfg, stages,
                              external, progress)  # fmt: skip

    return {
        "trace": (lambda: _stage_trace(model, _lu_facts(facts, cfg, "trace"), cfg, progress),
                  False),
        "repair": (lambda: {**_stage_repair(model, _lu_facts(facts, cfg, "repair"), cfg,
                                            progress), **card_lu.trace_classes(stages)}, False),
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
    metric: str = "generate",
    external: Sequence[Fact] | None = None,
    external_metric: str = "rank",
    documents: Sequence[str] | None = None,
) -> ClaimsCard:
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
        metric: how the Lu stages score facts: ``"generate"`` (greedy generation, the eval
            rule), ``"rank"`` (P@1 of candidate ranking; bundled facts get BMLAMA-style
            candidates) or ``"klar"`` (see ``docs/replicate.md``).
        external: a benchmark's facts for the external-transfer rows (vectors and settings
            chosen on the bundled data, applied unchanged), scored with ``external_metric``.
        documents: the document id of every ``parallel`` line (the split never cuts a
            document; alignment rows resample documents).

    Returns:
        A :class:`~mechlingo.analyses.claims.ClaimsCard`.
    """
    papers = _papers(paper)
    if metric not in METRICS:
        raise InputError(f"metric must be one of {list(METRICS)}, got {metric!r}")
    cfg = budget_settings(budget, {**dict(settings or {}), "metric": metric})
    key = {
        "model": {**model_info(model), "weights_fingerprint": weights_fingerprint(model)},
        "data": {"facts": _facts_hash(facts), "parallel": None if parallel is None else
                 _hash([parallel, documents]),
                 "external": None if external is None else [_facts_hash(external),
                                                            external_metric]},
        "settings": cfg, "stage_version": STAGE_VERSION,
    }  # fmt: skip
    tmp = None if work is not None else tempfile.mkdtemp(prefix="mechlingo-replicate-")
    stages = Stages(work if work is not None else tmp, key)  # type: ignore[arg-type]
    try:
        ext = None if external is None else (list(external), external_metric)
        fns = _stage_fns(model, facts, parallel, cfg, stages, progress, ext, documents)
        names = [s for p in papers for s in PAPERS[p]]
        results: dict[str, Any] = {}
        timing: dict[str, Any] = {}
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
            "mechlingo": __version__, "settings": cfg, "stages": timing,
            "work": None if work is None else str(stages.folder)}  # fmt: skip
    return ClaimsCard(rows, results, meta)
