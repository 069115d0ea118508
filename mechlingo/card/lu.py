"""The claims card's Lu et al. stages and rows beyond the first eight (issue 33).

:mod:`mechlingo.card.replicate` registers these; each stage returns JSON with per-item
outcomes *and their cluster ids* (the fact id: one fact in several languages is one cluster),
and each ``rows_*`` function reads only stored JSON, so a resumed card equals a fresh one.

* **metric** (:func:`prepare_facts`, :func:`item_records`): under ``rank`` the bundled facts
  get BMLAMA-style candidates (:func:`mechlingo.data.candidates.with_candidates`) and every
  accuracy is P@1; each item also stores the gold candidate's log-share (``log p(gold)`` among
  the candidates, from the mean token log-probabilities of the filled sentences), whose paired
  gain has power where P@1 sits near a floor.
* **baseline gap**, **consistency**, **own failure class**, **both beat the better one**:
  rows of the repair stage's test items (:func:`rows_repair_extra`).
* **decoders** (:func:`stage_decoders`): the latent-English order (English answer decodable at an
  earlier lens entry than the prompt-language answer) under the logit lens (the trace's), a
  tuned lens when one is given, and the patchscope.
* **conversion** (:func:`stage_conversion`): corrupted-subject patching of ``mlp_out`` and
  ``attn_out`` at the last token, at the layers of the tracer's "conversion to L" band against
  the same number of random sites outside it.
* **external** (:func:`stage_external`): the vectors and the configuration chosen on the bundled
  data, applied unchanged to a benchmark's facts, scored by the benchmark's own metric.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from mechlingo.analyses.decoders.lens import lens_facts
from mechlingo.analyses.decoders.registry import BUILTIN_DECODERS
from mechlingo.analyses.decoders.tuned_lens import load_tuned_lens
from mechlingo.analyses.recall import dev_grid, steer_eval, steering
from mechlingo.analyses.recall.patching import patch_activations
from mechlingo.analyses.recall.patching.metrics import fact_metrics
from mechlingo.analyses.recall.settings import (
    BuildSettings,
    DevGrid,
    MatrixSettings,
    ScoringOptions,
)
from mechlingo.analyses.recall.steering import SteeringConfig
from mechlingo.card.repair_items import (
    condition_outcomes,
    gold_share,
    item_records,
    lenient_match,
    subject_keys,
)
from mechlingo.card.rules import Claim, claim_by_id, make_row
from mechlingo.card.statistics import (
    Test,
    cluster_bootstrap,
    group_difference_test,
    mean_test,
    paired_test,
    pool_controls,
    population_gain_test,
    population_test,
)
from mechlingo.core.errors import InputError
from mechlingo.core.sites import layers_at
from mechlingo.core.stages import Stages
from mechlingo.core.types import Model
from mechlingo.data import Fact
from mechlingo.data.candidates import with_candidates
from mechlingo.data.splits import split_facts, take_per_lang
from mechlingo.scoring.scorers import rankc_fact

__all__ = [
    "DECODERS",
    "condition_outcomes",
    "gold_share",
    "lenient_match",
    "subject_keys",
    "item_records",
    "matrix_settings",
    "repair_settings",
    "prepare_facts",
    "repair_split",
    "rows_conversion",
    "rows_decoders",
    "rows_external",
    "rows_repair_extra",
    "stage_conversion",
    "stage_decoders",
    "stage_external",
]

DECODERS = BUILTIN_DECODERS  # the decoders the card's claims name


def metric_of(cfg: Mapping[str, Any]) -> str:
    """The card's metric (``generate``, ``rank`` or ``klar``)."""
    return str(cfg.get("metric", "generate"))


def repair_settings(
    cfg: Mapping[str, Any], n_layers: int, progress: bool = False
) -> tuple[BuildSettings, DevGrid, ScoringOptions]:
    """The repair stage's settings from a budget (:data:`mechlingo.card.replicate.BUDGETS`,
    section ``repair``) for a model of ``n_layers``: how the vectors are built, the dev grid
    (the budget's ``layer_fractions`` as layers,
    :func:`~mechlingo.core.sites.layers_at`, for both vectors) and how items
    are scored; what a budget leaves out takes the settings classes' defaults."""
    r = cfg["repair"]
    build = BuildSettings(
        k_shot=r["k_shot"],
        translation_shots=r["translation_shots"],
        batch_size=cfg.get("batch_size", BuildSettings.batch_size),
    )
    fractions = r.get("layer_fractions")
    layers = None if fractions is None else tuple(layers_at(fractions, n_layers))
    grid = DevGrid(
        task_layers=layers,
        diff_layers=layers,
        task_alphas=tuple(r["alphas"]),
        diff_alphas=tuple(r["alphas"]),
        top_k=r["top_k"],
        screen_ids=r["screen_ids"],
    )
    scoring = ScoringOptions(
        metric=metric_of(cfg),
        max_new_tokens=r["max_new_tokens"],
        batch_size=cfg.get("batch_size", ScoringOptions.batch_size),
        progress=progress,
    )
    return build, grid, scoring


def matrix_settings(m: Mapping[str, Any], n_layers: int) -> MatrixSettings:
    """A budget's ``transfer.matrix`` section as
    :class:`~mechlingo.analyses.recall.settings.MatrixSettings` (``layer_fractions`` as
    layers, :func:`~mechlingo.core.sites.layers_at`)."""
    d = dict(m)
    fractions = d.pop("layer_fractions", None)
    if fractions is not None:
        d["layers"] = tuple(layers_at(fractions, n_layers))
    if "alphas" in d:
        d["alphas"] = tuple(d["alphas"])
    known = {f.name for f in dataclasses.fields(MatrixSettings)}
    if set(d) - known:
        raise InputError(
            f"transfer.matrix: unknown setting(s) {sorted(set(d) - known)}",
            fix=f"use {sorted(known | {'layer_fractions'})}",
        )
    return MatrixSettings(**d)


def prepare_facts(facts: list[Fact], cfg: Mapping[str, Any]) -> list[Fact]:
    """Under ``rank``, facts without candidates get ``cfg["candidates"]`` (default 4) of them."""
    if metric_of(cfg) != "rank" or all(f.candidates for f in facts):
        return facts
    return with_candidates(facts, int(cfg.get("candidates", 4)))


def repair_split(facts: list[Fact], cfg: Mapping[str, Any]) -> tuple[list, list, list]:
    """``(build, dev, test)`` of the repair stage (the same hash split and per-language caps)."""
    r = cfg["repair"]
    splits = split_facts(facts, r["split"])
    dev = take_per_lang(splits["dev"], r["dev_per_lang"])
    return splits["build"], dev, take_per_lang(splits["test"], r["test_per_lang"])


# --------------------------------------------------------------------------------------
# Rows of the repair stage's items
# --------------------------------------------------------------------------------------


def _claim(cid: str) -> Claim:
    return claim_by_id(cid)


def _paired(items: Mapping[str, list[dict]], a: str, b: str, key: str = "correct",
            non_english: bool = True, langs: list | None = None,
            ) -> tuple[list[float], list[float], list[str]]:  # fmt: skip
    """Values of ``key`` of conditions ``a`` and ``b`` on their common items, with fact ids
    (and each item's language appended to ``langs`` when given)."""
    ib = {(r["id"], r["lang"]): r for r in items[b]}
    base, new, ids = [], [], []
    for r in items[a]:
        other = ib.get((r["id"], r["lang"]))
        if other is None or (non_english and r["lang"] == "en"):
            continue
        if r.get(key) is None or other.get(key) is None:
            continue
        base.append(float(r[key]))
        new.append(float(other[key]))
        ids.append(r["id"])
        if langs is not None:
            langs.append(r["lang"])
    return base, new, ids


def logprob_gain(items: Mapping[str, list[dict]], cond: str,
                 langs: Sequence[str] | None = None) -> Test | None:  # fmt: skip
    """The paired, fact-clustered gain of the gold log-share of ``cond`` over ``orig`` on the
    non-English items (only those of ``langs`` when given); rank only (``None`` otherwise).
    Random conditions are pooled over seeds first."""
    if not items.get("orig") or items["orig"][0].get("logshare") is None:
        return None
    if langs is not None:
        keep = set(langs)
        items = {c: [r for r in v if r["lang"] in keep] for c, v in items.items()}
        if not items["orig"]:
            return None
    if cond == "random":
        seeds = [c for c in items if c.startswith("random_s")]
        runs = [_paired(items, "orig", s, "logshare") for s in seeds]
        if not runs:
            return None
        base, _, ids = runs[0]
        return paired_test(base, pool_controls([r[1] for r in runs]), ids)
    if cond not in items:
        return None
    base, new, ids = _paired(items, "orig", cond, "logshare")
    return paired_test(base, new, ids) if base else None


def _row_gap(items: Mapping[str, list[dict]]) -> dict[str, Any]:
    """English minus each other language on the same facts (test, no intervention)."""
    en = {r["id"]: float(r["correct"]) for r in items["orig"] if r["lang"] == "en"}
    pairs = [(float(r["correct"]), en[r["id"]], r["id"]) for r in items["orig"]
             if r["lang"] != "en" and r["id"] in en]  # fmt: skip
    claim = _claim("english_gap")
    if not pairs:
        return make_row(claim, None, untestable="no test fact in English and another language")
    base, new, ids = (list(x) for x in zip(*pairs, strict=True))
    t = paired_test(base, new, ids)
    return make_row(claim, t, details=f"English accuracy {np.mean(new):.3f} vs the others' "
                    f"{np.mean(base):.3f} on the same {len(set(ids))} facts")  # fmt: skip


def _consistency_values(items: Mapping[str, list[dict]], cond: str) -> tuple[dict, str]:
    """Per (fact, language) consistency with English under ``cond``: RankC of the two
    rankings (rank), else agreement terms for CLC (``(both right, either right)``)."""
    recs = items[cond]
    en = {r["id"]: r for r in recs if r["lang"] == "en"}
    out: dict[tuple[str, str], Any] = {}
    ranked = bool(recs) and recs[0].get("ranking") is not None
    for r in recs:
        e = en.get(r["id"])
        if r["lang"] == "en" or e is None:
            continue
        if ranked:
            if len(r["ranking"]) == len(e["ranking"]):
                out[(r["id"], r["lang"])] = rankc_fact(e["ranking"], r["ranking"])
        else:
            out[(r["id"], r["lang"])] = (float(r["correct"] and e["correct"]),
                                         float(r["correct"] or e["correct"]))  # fmt: skip
    return out, "RankC" if ranked else "CLC"


def _clc(m: np.ndarray) -> float:
    """CLC of ``[item, (both right, either right)]`` rows: a ratio of sums."""
    s = m.sum(0)
    return float(s[0] / max(s[1], 1e-12))


def _clc_null(m: np.ndarray, arm: int) -> float:
    """The CLC that independent correctness gives at the rows' per-language accuracies
    (columns 4 + 2 arm: the L item right, 5 + 2 arm: English right, 8: the language code):
    sum of p_L p_en over the sum of p_L + p_en - p_L p_en."""
    num = den = 0.0
    for lg in np.unique(m[:, 8]):
        sub = m[m[:, 8] == lg]
        pl, pe = float(sub[:, 4 + 2 * arm].mean()), float(sub[:, 5 + 2 * arm].mean())
        num += len(sub) * pl * pe
        den += len(sub) * (pl + pe - pl * pe)
    return num / den if den > 0 else 0.0


def clc_excess(m: np.ndarray) -> float:
    """The CLC gain (post - pre) minus the gain that the accuracies alone give (a null model
    of independent correctness at the observed per-language accuracies before and after)."""
    return _clc(m[:, 2:4]) - _clc(m[:, :2]) - (_clc_null(m, 1) - _clc_null(m, 0))


def _clc_table(items: Mapping[str, list[dict]], both: str, keys: Sequence[tuple]) -> np.ndarray:
    """``[item, 9]``: (both right, either right) before and after, the L item and English
    right before and after, and the language's code, for the (fact, language) ``keys``."""

    def right(cond: str) -> dict[tuple[str, str], float]:
        return {(r["id"], r["lang"]): float(r["correct"]) for r in items[cond]}

    pre, post = right("orig"), right(both)
    codes = {lg: i for i, lg in enumerate(sorted({k[1] for k in keys}))}
    rows = []
    for fid, lg in keys:
        a, b, ea, eb = pre[(fid, lg)], post[(fid, lg)], pre[(fid, "en")], post[(fid, "en")]
        rows.append([a * ea, max(a, ea), b * eb, max(b, eb), a, ea, b, eb, codes[lg]])
    return np.array(rows, dtype=float)


def _row_consistency(items: Mapping[str, list[dict]], both: str) -> dict[str, Any]:
    claim = _claim("consistency")
    pre, name = _consistency_values(items, "orig")
    post, _ = _consistency_values(items, both)
    keys = sorted(set(pre) & set(post))
    if not keys:
        return make_row(claim, None, untestable="no test fact scored in English and another "
                        "language under both conditions")  # fmt: skip
    ids = [k[0] for k in keys]
    if name == "RankC":
        t = paired_test([pre[k] for k in keys], [post[k] for k in keys], ids)
        txt = f"RankC with English {np.mean([pre[k] for k in keys]):.3f} -> " \
              f"{np.mean([post[k] for k in keys]):.3f}"  # fmt: skip
    else:
        a = _clc_table(items, both, keys)
        t = cluster_bootstrap(a, ids, clc_excess, method="CLC (Jaccard with English) after "
                              "minus before, minus the change accuracy alone gives")  # fmt: skip
        txt = (f"CLC (Jaccard of the right answers with English's) change "
               f"{_clc(a[:, 2:4]) - _clc(a[:, :2]):+.3f}, of which accuracy "
               f"alone (independent answers) {_clc_null(a, 1) - _clc_null(a, 0):+.3f}")  # fmt: skip
    return make_row(claim, t, details=f"{name}: {txt}; 'both' vs no intervention on "
                    f"{len(set(ids))} test facts", extra={"consistency": name})  # fmt: skip


def _row_own_failure(items: Mapping[str, list[dict]], classes: Mapping[str, str] | None,
                     cid: str, cond: str, rival: str, own: str,
                     other: str) -> dict[str, Any]:  # fmt: skip
    """A difference in differences: ``cond``'s gain minus the ``rival`` vector's gain on the
    ``own`` failure class, minus the same on the ``other`` class (classes from the tracer on
    the unsteered model, test items; CR2 by fact). A class that every vector fixes alike
    (the fixable items) shows no difference."""
    claim = _claim(cid)
    if not classes:
        return make_row(claim, None, untestable="no tracer classes of the test items (the "
                        "trace stage did not run on them)")  # fmt: skip
    langs: list[str] = []
    base, new, ids = _paired(items, "orig", cond, langs=langs)
    _, rv, rid = _paired(items, "orig", rival)
    if rid != ids:
        return make_row(claim, None, untestable=f"'{cond}' and '{rival}' are not scored on the "
                        "same test items")  # fmt: skip
    groups = [classes.get(f"{i}|{lg}") for i, lg in zip(ids, langs, strict=True)]
    n_own, n_other = groups.count(own), groups.count(other)
    if n_own < 2 or n_other < 2:
        return make_row(claim, None, untestable=f"too few test items of each class ({own}: "
                        f"{n_own}, {other}: {n_other}; at least 2 each)")  # fmt: skip
    diff = [a - b for a, b in zip(new, rv, strict=True)]  # cond's gain minus the rival's
    t = group_difference_test(diff, groups, ids, own, other)

    def gain(x: Sequence[float], cls: str) -> float:
        return float(np.mean([b - a for a, b, c in zip(base, x, groups, strict=True) if c == cls]))

    return make_row(claim, t, details=f"gain on {n_own} {own} items: {cond} "
                    f"{gain(new, own):+.3f}, {rival} {gain(rv, own):+.3f}; on {n_other} {other} "
                    f"items: {cond} {gain(new, other):+.3f}, {rival} {gain(rv, other):+.3f}; "
                    "difference in differences, clustered by fact")  # fmt: skip


def _row_both_better(items: Mapping[str, list[dict]], best_single: str | None,
                     both: str) -> dict[str, Any]:  # fmt: skip
    claim = _claim("both_beat_single")
    single = best_single if best_single in ("task", "diff") else "task"
    base, new, ids = _paired(items, single, both)
    if not base:
        return make_row(claim, None, untestable="no test items")
    t = paired_test(base, new, ids)
    lp = None
    if items["orig"] and items["orig"][0].get("logshare") is not None:
        b2, n2, i2 = _paired(items, single, both, "logshare")
        lp = paired_test(b2, n2, i2)
    return make_row(claim, t, details=f"'{both}' vs the better single vector on dev "
                    f"('{single}')", extra=_lp_extra(lp))  # fmt: skip


def _lp_extra(t: Test | None) -> dict[str, Any]:
    return {} if t is None else {"logprob_gain": t.to_json()}


def rows_repair_extra(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The new rows of the repair stage (baseline gap, consistency, own failure classes,
    both vs the better one) from its stored ``items`` (and ``classes``)."""
    items = data.get("items")
    if not items:
        raise InputError("the repair result has no per-item records (an old stage result)")
    both = "both_pair" if "both_pair" in items else "both"
    classes = data.get("classes")
    sweep = data.get("sweep") or {}
    return [
        _row_gap(items),
        _row_consistency(items, both),
        _row_own_failure(items, classes, "task_repairs_recall", "task", "diff",
                         "recall_failure", "translation_failure"),
        _row_both_better(items, sweep.get("best_single"), both),
    ]  # fmt: skip


def attach_logprob(rows: list[dict[str, Any]], data: Mapping[str, Any]) -> None:
    """Under ``rank``, add the gold log-share gain (``logprob_gain``) to the accuracy rows of
    the repair stage in place: task, diff, random, and both in the lowest language's rows
    (their ``langs``)."""
    items = data.get("items") or {}
    both = "both_pair" if "both_pair" in items else "both"
    for row in rows:
        cond = {"task_vector": "task", "diff_vector": "diff", "random_vector": "random",
                "lowest_language": both}.get(row.get("id", ""))  # fmt: skip
        langs = row.get("langs") if row.get("id") == "lowest_language" else None
        if row.get("id") == "lowest_language" and not langs:
            continue
        t = logprob_gain(items, cond, langs) if cond else None
        if t is not None:
            row["logprob_gain"] = t.to_json()
            row["details"] = (row.get("details") or "") + (
                f"; gold log-share gain {t.estimate.format(3, signed=True)}"
            )


# --------------------------------------------------------------------------------------
# Decoders
# --------------------------------------------------------------------------------------


def _order(first_en: torch.Tensor, first_l: torch.Tensor, facts: Sequence[Fact]) -> list[dict]:
    """Per non-English prompt whose English and L answers differ and one of which becomes
    decodable: whether the English one does so at an earlier entry."""
    out = []
    for i, f in enumerate(facts):
        if f.lang == "en" or (f.answer_en or f.answer).strip().casefold() == \
                f.answer.strip().casefold():  # fmt: skip
            continue
        e, a = int(first_en[i]), int(first_l[i])
        if (e >= 0 or a >= 0) and e != a:
            out.append({"id": f.id, "lang": f.lang, "en_first": bool(e >= 0 and (a < 0 or e < a))})
    return out


#: Why the tuned-lens row is not testable without a lens (measured on the embedded model).
NO_TUNED_LENS = (
    "no tuned lens given: one trained within the card's CPU budget is no decoder (on the "
    "embedded model 2 steps took 22 s and raised the mean KL to the output from 38.6 to 39.7 "
    "nats); train one with `mechlingo tuned-lens --out DIR` and pass the settings "
    '{"decoders": {"tuned_lens": "DIR"}}'
)


def stage_decoders(model: Model, facts: list[Fact], trace: Mapping[str, Any] | None,
                   cfg: Mapping[str, Any], progress: bool) -> dict[str, Any]:  # fmt: skip
    """The latent-English order under each decoder on the repair test items: the logit lens
    from the trace stage's records (the same items), the patchscope and a given tuned lens
    (``decoders.tuned_lens``, a saved lens folder) on at most ``decoders.per_lang`` ids per
    language (the patchscope costs about 1.5 s per prompt on the embedded model)."""
    d = cfg.get("decoders", {})
    max_rank = int(cfg["trace"]["max_rank"])
    by_id = {(f.id, f.lang): f for f in facts}
    out: dict[str, Any] = {"max_rank": max_rank, "decoders": {}}
    if trace is not None:
        recs = [r for r in trace["records"] if (r["id"], r["lang"]) in by_id]
        fs = [by_id[(r["id"], r["lang"])] for r in recs]
        first_en = torch.tensor([r["first_en_layer"] for r in recs])
        first_l = torch.tensor([r["first_answer_layer"] for r in recs])
        out["decoders"]["logit"] = {"items": _order(first_en, first_l, fs), "source": "trace"}
    else:
        out["decoders"]["logit"] = {"untestable": "the trace stage did not finish"}
    sub = take_per_lang([f for f in facts if f.lang != "en"], d.get("per_lang"))
    for name in DECODERS[1:]:
        dec: Any = name
        if name == "tuned":
            if not d.get("tuned_lens"):
                out["decoders"][name] = {"untestable": NO_TUNED_LENS}
                continue
            dec = load_tuned_lens(d["tuned_lens"], model)
        res = lens_facts(model, sub, decoder=dec, batch_size=cfg.get("batch_size", 16),
                         progress=progress)  # fmt: skip
        first_en = res.first_layer_within("en", max_rank, before_last=True)
        first_l = res.first_layer_within("answer", max_rank)
        out["decoders"][name] = {"items": _order(first_en, first_l, sub), "n_prompts": len(sub)}
    return out


def rows_decoders(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One latent-English row per decoder: the share of ordered prompts where English comes
    first, clustered by fact, against 0.5."""
    rows = []
    for name in DECODERS[1:]:  # the logit lens is latent_english's own measurement: no row
        claim = _claim(f"latent_english_{name}")
        d = data["decoders"].get(name) or {"untestable": "the decoder did not run"}
        if "untestable" in d:
            rows.append(make_row(claim, None, untestable=d["untestable"]))
            continue
        items = d["items"]
        if not items:
            rows.append(make_row(claim, None, untestable="no prompt where the English or the L "
                                 "answer becomes decodable with distinct words"))  # fmt: skip
            continue
        t = mean_test([float(x["en_first"]) for x in items], [x["id"] for x in items], null=0.5)
        per = {}
        for x in items:
            per.setdefault(x["lang"], []).append(x["en_first"])
        txt = ", ".join(f"{lg} {sum(v)}/{len(v)}" for lg, v in sorted(per.items()))
        rows.append(
            make_row(
                claim,
                t,
                details=f"English first per language: {txt}",
                extra={"per_lang": {lg: [sum(v), len(v)] for lg, v in per.items()}},
            )
        )
    return rows


# --------------------------------------------------------------------------------------
# The conversion step, patched
# --------------------------------------------------------------------------------------


def conversion_band(trace: Mapping[str, Any], lang: str) -> list[int] | None:
    """The layers (blocks) of the tracer's "conversion to L" band: from the median first lens
    entry where the L answer is decodable, minus one, to the last block (as
    :func:`mechlingo.analyses.recall.trace.pipeline_stages`); ``None`` when no L answer is."""
    firsts = [r["first_answer_layer"] for r in trace["records"]
              if r["lang"] == lang and r["first_answer_layer"] >= 0]  # fmt: skip
    if not firsts:
        return None
    n = int(trace["n_layers"])
    start = max(0, int(round(float(np.median(firsts)))) - 1)
    return list(range(min(start, n - 1), n))


def _pairs(facts: list[Fact], trace: Mapping[str, Any], lang: str, n: int) -> tuple[list, list]:
    """Up to ``n`` clean facts of ``lang`` (correct ones first) and a corrupted partner each."""
    ok = {r["id"] for r in trace["records"] if r["lang"] == lang and r["correct"]}
    pool = sorted((f for f in facts if f.lang == lang), key=lambda f: (f.id not in ok, f.id))
    clean = pool[:n]
    corrupt = []
    for k, f in enumerate(clean):
        others = [g for g in pool if g.answer != f.answer and g.id != f.id]
        corrupt.append(others[(7 * k) % len(others)] if others else None)
    keep = [i for i, c in enumerate(corrupt) if c is not None]
    return [clean[i] for i in keep], [corrupt[i] for i in keep]


def stage_conversion(model: Model, facts: list[Fact], trace: Mapping[str, Any],
                     cfg: Mapping[str, Any]) -> dict[str, Any]:  # fmt: skip
    """Per language, per clean prompt: the restored log-probability of the L answer
    (patched - corrupted, nats) averaged over the band's ``mlp_out``/``attn_out`` sites at the
    last token, and over as many random sites outside the band (seeded)."""
    c = cfg.get("conversion", {})
    n_layers = int(model.cfg.n_layers)
    sites = ["mlp_out", "attn_out"]
    out: dict[str, Any] = {"sites": sites, "langs": {}}
    rng = random.Random(0)
    for lang in c.get("langs", []):
        band = conversion_band(trace, lang)
        if band is None or len(band) >= n_layers:
            out["langs"][lang] = {"untestable": "no conversion band (no L answer decodable "
                                  "before the output, or the band covers every layer)"}  # fmt: skip
            continue
        clean, corrupt = _pairs(facts, trace, lang, int(c.get("n_prompts", 3)))
        if len(clean) < 2:
            out["langs"][lang] = {"untestable": "fewer than 2 prompt pairs"}
            continue
        res = patch_activations(model, clean, corrupt, sites, positions=[-1],
                                metric=fact_metrics(model, clean), alignment="last")  # fmt: skip
        delta = (res.values[0] - res.corrupted[0]).cpu()  # [cell, example]
        in_band = [i for i, cell in enumerate(res.cells) if cell.layer in band]
        outside = [i for i, cell in enumerate(res.cells) if cell.layer not in band]
        ctl = rng.sample(outside, min(len(in_band), len(outside)))
        out["langs"][lang] = {
            "band": band, "control_cells": [[res.cells[i].site, res.cells[i].layer] for i in ctl],
            "ids": [f.id for f in clean],
            "band_effect": delta[in_band].mean(0).tolist(),
            "control_effect": delta[ctl].mean(0).tolist(),
            "clean_minus_corrupted": (res.clean[0] - res.corrupted[0]).cpu().tolist(),
        }  # fmt: skip
    return out


def rows_conversion(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    claim = _claim("conversion_causal")
    band, ctl, ids, per = [], [], [], []
    for lang, d in sorted(data["langs"].items()):
        if "untestable" in d:
            per.append(f"{lang}: {d['untestable']}")
            continue
        band += d["band_effect"]
        ctl += d["control_effect"]
        ids += [f"{i}" for i in d["ids"]]
        per.append(
            f"{lang}: band {d['band'][0]}-{d['band'][-1]}, "
            f"{np.mean(d['band_effect']):+.2f} vs {np.mean(d['control_effect']):+.2f} nats"
        )
    if len(band) < 2:
        return [make_row(claim, None, untestable="no language with a conversion band and two "
                         "prompt pairs (" + "; ".join(per) + ")")]  # fmt: skip
    eff = mean_test(band, ids)
    c = mean_test(ctl, ids)
    vs = paired_test(ctl, band, ids)
    return [make_row(claim, eff, control=c, vs_control=vs, details="restored log-probability "
                     "of the L answer per site (nats); " + "; ".join(per))]  # fmt: skip


# --------------------------------------------------------------------------------------
# External transfer (a benchmark's facts, the bundled data's vectors)
# --------------------------------------------------------------------------------------


def choice_from(sweep: Mapping[str, Any]) -> dev_grid.Choice:
    """The dev choice stored in the repair stage's ``sweep``."""
    pair = None if sweep.get("pair") is None else SteeringConfig(**sweep["pair"])
    return dev_grid.Choice(SteeringConfig(**sweep["config"]), sweep["selected"],
                           sweep["dev_effect"], sweep["dev_test"], sweep["dev_score"], pair,
                           sweep.get("best_single"))  # fmt: skip


def stage_external(
    model: Model,
    bundled: list[Fact],
    external: list[Fact],
    metric: str,
    repair_data: Mapping[str, Any],
    cfg: Mapping[str, Any],
    progress: bool,
) -> dict[str, Any]:
    """Rebuild the repair vectors on the bundled build split (the same facts and settings give
    the same vectors), take the configuration dev chose, and score ``external`` under every
    condition with the benchmark's ``metric``."""
    r = cfg["repair"]
    build, _, _ = repair_split(bundled, cfg)
    settings, _, scoring = repair_settings(cfg, int(model.cfg.n_layers), progress)
    vectors = steering.build_steering_vectors(model, build, settings, progress=progress)
    facts = take_per_lang(list(external), cfg.get("external", {}).get("per_lang"))
    pool = None
    if metric == "klar":  # KLAR's demonstrations: the benchmark's facts that are not scored
        scored = {f.id for f in facts}
        pool = [f for f in external if f.id not in scored]
        if not pool:
            raise InputError(
                "klar needs demonstrations that are not scored: the benchmark "
                "has no facts beyond external.per_lang ids per language",
                fix="lower external.per_lang in --settings",
            )
    res = steer_eval.evaluate_test(
        model,
        vectors,
        choice_from(repair_data["sweep"]),
        facts,
        lowest_language=None,
        pool=pool,
        seeds=r["seeds"],
        scoring=replace(scoring, metric=metric),
    )
    return {
        "metric": metric,
        "items": item_records(res.results),
        "config": repair_data["sweep"]["config"],
        "n_facts": len(facts),
    }


def rows_external(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    if "untestable" in data:
        return [make_row(_claim(c), None, untestable=data["untestable"])
                for c in ("external_task", "external_diff", "external_both")]  # fmt: skip
    items = data["items"]
    seeds = [c for c in items if c.startswith("random_s")]
    runs = [_paired(items, "orig", s) for s in seeds]
    rows = []
    for cid, cond in (("external_task", "task"), ("external_diff", "diff"),
                      ("external_both", "both")):  # fmt: skip
        base, new, ids = _paired(items, "orig", cond)
        claim = _claim(cid)
        if not base or not runs:
            rows.append(make_row(claim, None, untestable="no benchmark items scored"))
            continue
        draws = [x[1] for x in runs]
        rows.append(make_row(
            claim, paired_test(base, new, ids), control=population_gain_test(base, draws, ids),
            vs_control=population_test(new, draws, ids, base=base, direction=claim.direction),
            details=f"{len(set(ids))} benchmark facts, metric {data['metric']}; vectors and "
            "configuration from the bundled data", extra=_lp_extra(logprob_gain(items, cond)),
        ))  # fmt: skip
    return rows


# --------------------------------------------------------------------------------------
# Registration (called by mechlingo.card.replicate)
# --------------------------------------------------------------------------------------


def trace_classes(stages: Stages) -> dict[str, Any]:
    """``{"classes": {"<id>|<lang>": tracer class}}`` of the finished trace stage (the repair
    test items on the unsteered model), or ``{}`` when it did not finish."""
    if not stages.done("trace"):
        return {}
    recs = stages.load("trace")["records"]
    return {"classes": {f"{r['id']}|{r['lang']}": r["class"] for r in recs}}


def _maybe(stages: Stages, name: str) -> Mapping[str, Any] | None:
    return stages.load(name) if stages.done(name) else None


def _trace(stages: Stages) -> Mapping[str, Any]:
    if not stages.done("trace"):
        raise InputError("the trace stage did not finish: the conversion band comes from it")
    return stages.load("trace")


def stage_fns(
    model: Model,
    lu_facts: Callable[[str], list[Fact]],
    parallel: Callable[[], Mapping[str, Any]],
    cfg: Mapping[str, Any],
    stages: Stages,
    external: tuple[Sequence[Fact], str] | None,
    progress: bool,
) -> dict[str, tuple[Callable[..., Any], bool]]:
    """The new Lu stages of :func:`mechlingo.card.replicate.replicate`: ``decoders``,
    ``conversion`` and ``external`` (``{"untestable": ...}`` without a benchmark)."""

    def ext() -> dict[str, Any]:
        if external is None:
            return {"untestable": "no benchmark given (--facts DIR with a BMLAMA or KLAR "
                    "folder adds these rows)"}  # fmt: skip
        if not stages.done("repair"):
            raise InputError("the repair stage did not finish: its choice is what transfers")
        return stage_external(model, lu_facts("repair"), list(external[0]), external[1],
                              stages.load("repair"), cfg, progress)  # fmt: skip

    return {
        "decoders": (lambda: stage_decoders(model, lu_facts("trace"), _maybe(stages, "trace"),
                                            cfg, progress), False),
        "conversion": (lambda: stage_conversion(model, lu_facts("trace"), _trace(stages), cfg),
                       False),
        "external": (ext, False),
    }  # fmt: skip
