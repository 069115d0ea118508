"""The align stage: the expert clamp's effect on the embedding space (distances and retrieval
between languages, :func:`mechlingo.analyses.experts.align.compare_alignment`) against the
random-neuron population, with per-sentence values and each sentence's document; its rows:
the clamp brings languages closer, retrieval improves, random neurons do not help, and the
further readings (centred distances, the size of the gain, distance predicts retrieval)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from mechlingo.analyses.experts.align import compare_alignment, embed_parallel, per_sentence
from mechlingo.card import claims as C
from mechlingo.card.claims import SUNDAR
from mechlingo.card.clustered_tests import cluster_bootstrap, paired_test
from mechlingo.card.population import by_rank, population_gain_test, rank_population_test
from mechlingo.card.rules import make_row
from mechlingo.card.stages.base import (
    Context,
    ReportLike,
    Stage,
    failed,
    heading,
)
from mechlingo.card.stages.experts import ExpertsBudget, draw_index, rank_test
from mechlingo.core.types import Model
from mechlingo.interventions import load_intervention
from mechlingo.viz.align import retrieval_per_layer_figure
from mechlingo.viz.experts import interval_bars_figure

if TYPE_CHECKING:
    from mechlingo.card.stages import CardSettings


def stage_align(
    model: Model, texts: dict, settings: CardSettings, experts_dir: Path, progress: bool
) -> dict:
    if not (experts_dir / "clamp").is_dir():
        return {"untestable": "the papers' k rule chose no k (none within the perplexity "
                "budget), so there is no clamp to align with"}  # fmt: skip
    iv = load_intervention(experts_dir / "clamp", model)
    ctl = load_intervention(experts_dir / "control", model)
    e = settings.budget.experts
    comp = compare_alignment(
        model, texts["eval"], iv, control=ctl, layers="all", target=e.target,
        batch_size=settings.batch(), max_tokens=e.max_tokens, progress=progress,
    )  # fmt: skip
    summary = comp.summary()
    summary["intervals"] = comp.intervals()
    summary["k"] = iv.meta.get("build", {}).get("k") if hasattr(iv, "meta") else None
    per: dict[str, dict[str, list[float]]] = {}

    def values(emb: Any) -> dict[str, list[float]]:
        vals = per_sentence(emb.emb[emb.layer_slot(None)], comp.langs, target=e.target,
                            centre=comp.centre)  # fmt: skip
        return {m: vals[m].cpu().tolist() for m in ("retrieval", "between_languages")}

    for arm in comp.arms():
        per[arm] = values({"pre": comp.pre, "post": comp.post, "control": comp.control}[arm])
    extra = _random_arms(model, texts["eval"], experts_dir, settings, values, progress)
    per.update({k: v for k, (v, _) in extra.items()})
    if "control" in per:
        per["random_s0"] = per["control"]
    summary["per_sentence"] = per
    summary["random_draws"] = sum(k.startswith("random_s") for k in per)
    summary["p_floor"] = 1 / (summary["random_draws"] + 1)
    docs = texts.get("docs", {}).get("eval")
    summary["details"] = align_details(comp, docs)
    if "control" in summary["details"]:  # the population, draw 0 first (the paired control)
        summary["details"]["controls"] = [summary["details"]["control"],
                                          *(d for _, d in extra.values())]  # fmt: skip
    summary["docs"] = summary["details"]["docs"]
    return summary


def _random_arms(model: Model, texts: Mapping[str, Sequence[str]], experts_dir: Path,
                 settings: CardSettings, values: Callable[[Any], dict[str, list[float]]],
                 progress: bool) -> dict[str, tuple[dict[str, list[float]], dict[str, Any]]]:  # fmt: skip
    """``{"random_s<i>": (per-sentence values, sentence_values at the last layer)}`` of the
    random-neuron population beyond draw 0 (the experts stage saved ``control_s<i>``): one
    embedding pass each, no shared state; the second item is what the further alignment
    rows compare the clamp with (:func:`align_details`' arms)."""
    e, out = settings.budget.experts, {}
    for i in range(1, int(e.random_sets)):
        folder = experts_dir / f"control_s{i}"
        if not folder.is_dir():
            break
        emb = embed_parallel(model, texts, intervention=load_intervention(folder, model),
                             layers="all", batch_size=settings.batch(),
                             max_tokens=e.max_tokens, progress=progress)  # fmt: skip
        out[f"random_s{i}"] = (values(emb), sentence_values(emb.emb[emb.layer_slot(None)].cpu()))
    return out


def rows_align(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Distances and retrieval, pre vs post vs the random clamp, paired per sentence."""
    ids = (C.CLAMP_CLOSER, C.RETRIEVAL_IMPROVES, C.RANDOM_NEURONS)
    if "untestable" in data:
        return [make_row(c, None, untestable=data["untestable"]) for c in ids]
    v, d = data["per_sentence"], data["distance"]
    ratio = " -> ".join(f"{d[a]['ratio']:.3f}" for a in ("pre", "post", "control") if a in d)
    dist = " -> ".join(f"{d[a]['between_languages']:.3f}" for a in ("pre", "post", "control"))
    at = f"k = {data.get('k')}, layer {data['layer']}; {len(v['pre']['retrieval'])} sentences"
    bl, rt = {a: v[a]["between_languages"] for a in v}, {a: v[a]["retrieval"] for a in v}
    ret = ", ".join(f"{a} {np.mean(rt[a]):.3f}" for a in ("pre", "post", "control") if a in rt)
    docs = _documents(data, len(v["pre"]["retrieval"]))
    at += f", {len(set(docs))} documents" if docs is not None else ", no documents: sentences"
    # the random clamp as a population: ``controls`` (one per draw) or the one ``control``
    drawn = [v[k] for k in sorted(v, key=draw_index) if k.startswith("random_s")]
    ctl = list(data.get("per_sentence_controls") or drawn or [v["control"]])
    dbl, drt = [c["between_languages"] for c in ctl], [c["retrieval"] for c in ctl]
    at += f"; {len(ctl)} random-neuron draw(s) (permutation p floor 1/{len(ctl) + 1})"
    closer, null = C.CLAMP_CLOSER, C.RANDOM_NEURONS
    ret_c = C.RETRIEVAL_IMPROVES
    return [
        make_row(closer, paired_test(bl["pre"], bl["post"], docs),
                 population_gain_test(bl["pre"], dbl, docs),
                 vs_control=rank_population_test(bl["post"], dbl, docs, base=bl["pre"],
                                            direction=closer.direction),
                 details=f"{at}; between languages pre -> post -> control {dist}; "
                 f"same/different-sentence ratio {ratio}"),
        make_row(ret_c, paired_test(rt["pre"], rt["post"], docs),
                 population_gain_test(rt["pre"], drt, docs),
                 vs_control=rank_population_test(rt["post"], drt, docs, base=rt["pre"],
                                            direction=ret_c.direction),
                 details=f"{at}; top-1 {ret}"),
        make_row(null, population_gain_test(rt["pre"], drt, docs, null=null.null_value),
                 details=f"{at}; top-1 {ret}"),
    ]  # fmt: skip


def _documents(data: Mapping[str, Any], n: int) -> list[str] | None:
    """Each evaluation sentence's document (the align stage's ``docs``, or its details'),
    when there is one per sentence; ``None``: every sentence its own unit."""
    docs = data.get("docs") or (data.get("details") or {}).get("docs")
    return list(map(str, docs)) if docs is not None and len(docs) == n else None


ARMS = ("pre", "post", "control")


def sentence_values(emb: Float[Tensor, "lang n d"]) -> dict[str, Any]:
    """Per ordered pair ``a != b`` and sentence ``i``: ``hits`` (sentence ``i`` of ``a``
    retrieves its translation among ``b``'s, raw cosine), ``dist`` (``1 - cos`` of the two
    translations, raw) and, per sentence, ``ratio_centred``: the mean over pairs of the
    same-sentence distance over the mean distance to the other sentences of ``b``, after
    subtracting the mean embedding of all languages and sentences."""
    n_a, n, _ = emb.shape
    x = torch.nn.functional.normalize(emb.double(), dim=-1)
    sims = torch.einsum("ain,bjn->abij", x, x)
    hits = sims.argmax(-1) == torch.arange(n)
    same = torch.diagonal(sims, dim1=-2, dim2=-1)  # [a, b, i]
    c = emb.double() - emb.double().mean(dim=(0, 1), keepdim=True)
    xc = torch.nn.functional.normalize(c, dim=-1)
    dc = 1 - torch.einsum("ain,bjn->abij", xc, xc)
    same_c = torch.diagonal(dc, dim1=-2, dim2=-1)
    other_c = (dc.sum(-1) - same_c) / max(n - 1, 1)
    off = ~torch.eye(n_a, dtype=torch.bool)
    ratio = (same_c / other_c.clamp_min(1e-12))[off].mean(0)
    return {"hits": hits[off].double().tolist(), "dist": (1 - same)[off].tolist(),
            "ratio_centred": ratio.tolist()}  # fmt: skip


def align_details(comp: Any, docs: Sequence[str] | None, layer: int | None = None) -> dict:
    """:func:`sentence_values` of every arm of an
    :class:`~mechlingo.analyses.experts.align.AlignmentComparison` at ``layer`` (default its last),
    with the pairs' names and each sentence's document (``None``: each its own)."""
    langs = comp.langs
    out: dict[str, Any] = {"pairs": [f"{a}->{b}" for a in langs for b in langs if a != b]}
    n = None
    for arm in comp.arms():
        emb = comp._arm(arm)[0]
        x = emb.emb[emb.layer_slot(layer)]
        n = int(x.shape[1])
        out[arm] = sentence_values(x.cpu())
    out["docs"] = (
        list(docs) if docs is not None and len(docs) == n else [str(i) for i in range(n or 0)]
    )
    return out


def _matrix(d: Mapping[str, Any], key: str) -> np.ndarray:
    """``[sentence, arm * pair]`` of ``key`` for the arms present (pre, post, control)."""
    return np.concatenate([np.asarray(d[a][key], dtype=float).T for a in ARMS if a in d], axis=1)


def _pair_ratio(m: np.ndarray, n_pairs: int, arm: int) -> np.ndarray:
    pre = m[:, :n_pairs].mean(0)
    new = m[:, arm * n_pairs : (arm + 1) * n_pairs].mean(0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(pre > 0, new / np.where(pre > 0, pre, 1), np.nan)


def _row_closer(d: Mapping[str, Any]) -> dict[str, Any]:
    claim = C.CLAMP_CLOSER_CENTRED
    docs = d["docs"]
    pre, post = d["pre"]["ratio_centred"], d["post"]["ratio_centred"]
    ctl = d.get("control", {}).get("ratio_centred")
    eff = paired_test(pre, post, docs)
    draws = [
        a["ratio_centred"] for a in d.get("controls") or ([] if ctl is None else [d["control"]])
    ]
    if d.get("controls"):  # the population's gain, with the between-draw variance
        c = population_gain_test(pre, draws, docs)
    else:  # a stored align result without the population: its one control draw
        c = None if ctl is None else paired_test(pre, ctl, docs)
    vs = None if not draws else rank_population_test(post, draws, docs, base=pre,
                                                     direction=claim.direction)  # fmt: skip
    txt = " -> ".join(f"{np.mean(v):.3f}" for v in (pre, post, ctl) if v is not None)
    return make_row(claim, eff, control=c, vs_control=vs,
                    details=f"centred same/different-sentence ratio pre -> post -> control "
                    f"{txt}; {len(set(docs))} documents; {len(draws)} random-neuron draw(s)")  # fmt: skip


def _row_ratio(d: Mapping[str, Any], which: str) -> dict[str, Any]:
    """``which``: ``max`` (largest per-pair ratio) or ``median`` (median relative gain)."""
    claim = C.RETRIEVAL_GAIN_MAX if which == "max" else C.RETRIEVAL_GAIN_MEDIAN
    m, p = _matrix(d, "hits"), len(d["pairs"])
    has_ctl = "control" in d

    def stat(arm: int) -> Any:
        def f(rows: np.ndarray) -> float:
            r = _pair_ratio(rows, p, arm)
            if not np.isfinite(r).any():
                return float("nan")
            return float(np.nanmax(r)) if which == "max" else float(np.nanmedian(r) - 1)

        return f

    null = claim.threshold if which == "max" else 0.0
    eff = cluster_bootstrap(m, d["docs"], stat(1), null=null, method=f"{which} over pairs")
    if eff.estimate.estimate is None:
        return make_row(claim, None, untestable="no language pair retrieves any sentence "
                        "before the clamp (every per-pair ratio is undefined)")  # fmt: skip
    ctl = vs = None
    if has_ctl:
        ctl = cluster_bootstrap(m, d["docs"], stat(2), null=null, method=f"{which}, random clamp")
        if which == "max":  # the clamp's maximum against the random clamps' own maxima
            vs = by_rank(rank_test(eff.estimate.estimate, _draw_maxima(d, p), exact=True))
        else:
            vs = cluster_bootstrap(m, d["docs"], lambda r: stat(1)(r) - stat(2)(r),
                                   method=f"{which}: clamp - random clamp")  # fmt: skip
    best = int(np.nanargmax(_pair_ratio(m, p, 1)))
    det = (f"pair {d['pairs'][best]} at {_pair_ratio(m, p, 1)[best]:.2f}x" if which == "max"
           else f"median over {p} pairs")  # fmt: skip
    return make_row(claim, eff, control=ctl, vs_control=vs, details=det + " (top-1 ratio "
                    "post / pre; pairs with no pre hit left out)")  # fmt: skip


def _draw_maxima(d: Mapping[str, Any], n_pairs: int) -> list[float]:
    """The largest per-pair top-1 ratio over pre of each random-clamp draw (``controls``: one
    arm dict per draw; else the one ``control`` arm)."""
    pre = np.asarray(d["pre"]["hits"], dtype=float).mean(1)
    out = []
    for arm in d.get("controls") or [d["control"]]:
        new = np.asarray(arm["hits"], dtype=float).mean(1)[:n_pairs]
        r = np.where(pre > 0, new / np.where(pre > 0, pre, 1), np.nan)
        out.append(float(np.nanmax(r)) if np.isfinite(r).any() else float("nan"))
    return out


def _row_predicts(d: Mapping[str, Any]) -> dict[str, Any]:
    claim = C.DISTANCE_PREDICTS_RETRIEVAL
    hits, dist, p = _matrix(d, "hits"), _matrix(d, "dist"), len(d["pairs"])
    both = np.concatenate([hits[:, : 2 * p], dist[:, : 2 * p]], axis=1)

    def rho(rows: np.ndarray) -> float:
        from scipy import stats as sps

        dh = rows[:, p : 2 * p].mean(0) - rows[:, :p].mean(0)
        dd = rows[:, 3 * p : 4 * p].mean(0) - rows[:, 2 * p : 3 * p].mean(0)
        if np.ptp(dh) == 0 or np.ptp(dd) == 0:
            return float("nan")
        return float(sps.spearmanr(dd, dh).statistic)

    t = cluster_bootstrap(both, d["docs"], rho, method="Spearman over language pairs of "
                          "change in distance vs change in top-1", n_resamples=500)  # fmt: skip
    if t.estimate.estimate is None:
        return make_row(claim, None, untestable="the clamp changes no pair's top-1 or distance")
    return make_row(claim, t, details=f"{p} ordered pairs; {len(set(d['docs']))} documents "
                    "resampled")  # fmt: skip


def rows_align_extra(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The further alignment rows from the align stage's ``details``."""
    ids = (C.CLAMP_CLOSER_CENTRED, C.RETRIEVAL_GAIN_MAX, C.RETRIEVAL_GAIN_MEDIAN,
           C.DISTANCE_PREDICTS_RETRIEVAL)  # fmt: skip
    if "untestable" in data:
        return [make_row(c, None, untestable=data["untestable"]) for c in ids]
    d = data.get("details")
    if not d or "post" not in d:
        return [make_row(c, None, untestable="the align result has no "
                         "per-sentence details (an old stage result)") for c in ids]  # fmt: skip
    return [_row_closer(d), _row_ratio(d, "max"), _row_ratio(d, "median"), _row_predicts(d)]


def run(ctx: Context) -> dict[str, Any]:
    """The align stage's result (the clamp and its controls come from the experts stage)."""
    return stage_align(
        ctx.model, ctx.texts(), ctx.settings, ctx.checkpoints.path("experts"), ctx.progress
    )


def report(rep: ReportLike, results: Mapping[str, Any]) -> None:
    """Per-sentence means before and after the clamp, and retrieval per layer."""
    data = results.get("align")
    heading(rep, "fig-align", "Alignment before and after the clamp, and the control")
    if data is None or failed(rep, data, "align"):
        return
    if "untestable" in data:
        rep.add_text(data["untestable"], note=True)
        return
    rep.add_figure(
        interval_bars_figure(data["intervals"]["measures"], "Per-sentence means (bootstrap 95% CI)")
    )
    rep.add_figure(retrieval_per_layer_figure(data["retrieval_mean_per_layer"]))


#: Measured CPU seconds of the align stage over its embedding passes x the measured seconds.
ALIGN_FACTOR = 1.09


def cost(settings: CardSettings, sizes: Mapping[str, Any], unit: Mapping[str, float]) -> float:
    """CPU seconds: the evaluation lines of every language embedded before and after the
    clamp and under each random draw (an upper bound: no clamp chosen, no alignment)."""
    e = settings.budget.experts
    arms = 2 + int(e.random_sets)
    return (
        ALIGN_FACTOR * int(e.n_eval) * int(sizes.get("langs", 12)) * arms * unit.get("embed", 0.0)
    )


STAGE = Stage(
    name="align",
    paper=SUNDAR,
    needs=("experts",),
    run=run,
    rows=(rows_align, rows_align_extra),
    report=report,
    section="experts",
    budget=ExpertsBudget,
    cost=cost,
)
