"""The claims card's further Sundar et al. rows, from the align stage's per-sentence details.

The align stage stores, at its layer, per-sentence values of every ordered language pair for
the three arms (``pre``: no intervention, ``post``: the expert clamp, ``control``: the
random-neuron clamp) with each evaluation sentence's document (:func:`align_details`); the
rows here read only that:

* **closer, centred**: the same-sentence / different-sentence distance ratio after centring
  the embeddings (so a shift shared by all sentences cannot pass for alignment), per
  sentence, post - pre, clustered by document, against the random clamp;
* **gain size**: the largest per-pair top-1 ratio post / pre ("up to 2x") against the random
  clamps' own maxima (its rank among them, an exact permutation p), and the median over
  pairs of the relative gain (the paper's "median +32%") against the same statistic of the
  random clamp, with document-clustered bootstrap intervals;
* **distance predicts retrieval**: across language pairs, Spearman's correlation of the
  change in distance with the change in top-1 (expected negative), its interval from
  resampling documents.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import scipy.stats as sps
import torch
from jaxtyping import Float
from torch import Tensor

from mechlingo.analyses.experts.align import drop_empty_lines
from mechlingo.card.rows import rank_test
from mechlingo.card.rules import claim_by_id, make_row
from mechlingo.card.statistics import Test, cluster_bootstrap, mde, paired_test, population_test
from mechlingo.core.errors import InputError
from mechlingo.data import LANGS
from mechlingo.data.natural_parallel import bundled_documents, bundled_parallel, split_by_documents
from mechlingo.kernels.ranking import auroc_and_average_precision
from mechlingo.kernels.significance import Interval

__all__ = [
    "align_details",
    "bundled_texts",
    "parallel_parts",
    "rows_align_extra",
    "sentence_values",
]

ARMS = ("pre", "post", "control")


def bundled_texts() -> tuple[dict[str, list[str]], list[str]]:
    """The bundled parallel lines of every language and their document ids."""
    return bundled_parallel(list(LANGS)), bundled_documents()


def parallel_parts(
    parallel: Mapping[str, Sequence[str]] | None,
    cfg: Mapping[str, Any],
    docs: Sequence[str] | None = None,
) -> dict:
    """The parallel sentences of the Sundar stages, split into the lines that find the
    experts, the held-out lines of the k curve, and the evaluation lines (alignment and the
    held-out AUROC), in this order, never overlapping and never sharing a document
    (:func:`mechlingo.data.natural_parallel.split_by_documents`; the evaluation part takes at
    most ``experts.eval_per_doc`` lines per document, so that it spans more documents). Default: the bundled natural
    NTREX-128 lines with their document ids; a user's ``parallel`` without ``docs``: every
    line its own document. ``"docs"`` holds each part's document ids."""
    e = cfg["experts"]
    if parallel is None:
        parallel, docs = bundled_parallel(list(LANGS)), bundled_documents()
    texts = drop_empty_lines(parallel)
    n = len(next(iter(texts.values()), []))
    if docs is None or len(docs) != n:  # no ids, or empty lines were dropped
        docs = [str(i) for i in range(n)]
    if e["n_find"] < 2:
        raise InputError(f"the experts need at least 2 finding lines, got {e['n_find']}")
    sizes = [e["n_find"], e["n_heldout"], e["n_eval"]]
    parts = split_by_documents(list(docs), sizes, [None, None, e.get("eval_per_doc")])
    if len(parts[2]) < 2:
        raise InputError(
            f"the parallel data has {n} lines; the experts need {sizes[0]} + {sizes[1]} + at "
            "least 2 evaluation lines per language, in separate documents",
            fix="pass more lines with --parallel, or a smaller budget",
        )
    out: dict[str, Any] = {}
    for part, idx in zip(("find", "heldout", "eval"), parts, strict=True):
        out[part] = {lg: [s[i] for i in idx] for lg, s in texts.items()}
    out["docs"] = {part: [docs[i] for i in idx]
                   for part, idx in zip(("find", "heldout", "eval"), parts, strict=True)}  # fmt: skip
    return out


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
    claim = claim_by_id("clamp_closer_centred")
    docs = d["docs"]
    pre, post = d["pre"]["ratio_centred"], d["post"]["ratio_centred"]
    ctl = d.get("control", {}).get("ratio_centred")
    eff = paired_test(pre, post, docs)
    draws = [
        a["ratio_centred"] for a in d.get("controls") or ([] if ctl is None else [d["control"]])
    ]
    c = None if ctl is None else paired_test(pre, ctl, docs)
    vs = None if not draws else population_test(post, draws, docs, base=pre,
                                                direction=claim.direction)  # fmt: skip
    txt = " -> ".join(f"{np.mean(v):.3f}" for v in (pre, post, ctl) if v is not None)
    return make_row(claim, eff, control=c, vs_control=vs,
                    details=f"centred same/different-sentence ratio pre -> post -> control "
                    f"{txt}; {len(set(docs))} documents")  # fmt: skip


def _row_ratio(d: Mapping[str, Any], which: str) -> dict[str, Any]:
    """``which``: ``max`` (largest per-pair ratio) or ``median`` (median relative gain)."""
    cid = "retrieval_gain_max" if which == "max" else "retrieval_gain_median"
    claim = claim_by_id(cid)
    m, p = _matrix(d, "hits"), len(d["pairs"])
    has_ctl = "control" in d

    def stat(arm: int) -> Any:
        def f(rows: np.ndarray) -> float:
            r = _pair_ratio(rows, p, arm)
            if not np.isfinite(r).any():
                return float("nan")
            return float(np.nanmax(r)) if which == "max" else float(np.nanmedian(r) - 1)

        return f

    null = 1.0 if which == "max" else 0.0
    eff = cluster_bootstrap(m, d["docs"], stat(1), null=null, method=f"{which} over pairs")
    if eff.estimate.estimate is None:
        return make_row(claim, None, untestable="no language pair retrieves any sentence "
                        "before the clamp (every per-pair ratio is undefined)")  # fmt: skip
    ctl = vs = None
    if has_ctl:
        ctl = cluster_bootstrap(m, d["docs"], stat(2), null=null, method=f"{which}, random clamp")
        if which == "max":  # the clamp's maximum against the random clamps' own maxima
            vs = rank_test(eff.estimate.estimate, _draw_maxima(d, p))
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
    claim = claim_by_id("distance_predicts_retrieval")
    hits, dist, p = _matrix(d, "hits"), _matrix(d, "dist"), len(d["pairs"])
    both = np.concatenate([hits[:, : 2 * p], dist[:, : 2 * p]], axis=1)

    def rho(rows: np.ndarray) -> float:
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
    """The new Sundar rows from the align stage's ``details``."""
    ids = ("clamp_closer_centred", "retrieval_gain_max", "retrieval_gain_median",
           "distance_predicts_retrieval")  # fmt: skip
    if "untestable" in data:
        return [make_row(claim_by_id(c), None, untestable=data["untestable"]) for c in ids]
    d = data.get("details")
    if not d or "post" not in d:
        return [make_row(claim_by_id(c), None, untestable="the align result has no "
                         "per-sentence details (an old stage result)") for c in ids]  # fmt: skip
    return [_row_closer(d), _row_ratio(d, "max"), _row_ratio(d, "median"), _row_predicts(d)]


# --------------------------------------------------------------------------------------
# The experts' held-out AUROC (the experts stage)
# --------------------------------------------------------------------------------------


def _median_auroc(x: torch.Tensor, y: torch.Tensor) -> float:
    return float(auroc_and_average_precision(x, y)[0].median())


def auroc_tests(
    stats: Any,
    target: str,
    feats: torch.Tensor,
    rnd: Sequence[torch.Tensor],
    n_boot: int,
    seed: int,
    docs: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Median AUROC over ``feats`` (and over each random neuron set of ``rnd``, draw 0 the
    paired control) on held-out sentences, as :class:`~mechlingo.kernels.significance.Test`
    JSON: a cluster bootstrap over documents (every translation of every sentence of a
    document resampled together; ``docs``: each sentence's document, ``None``: each its
    own) for the intervals, and a permutation test of H0 "AUROC = 0.5" that shuffles which
    translation of each sentence carries the target label (999 permutations). The random
    population's medians (``random_population``) give the experts' exact rank p among the
    draws, ``(1 + #{draw >= experts}) / (m + 1)``."""
    y = (stats.lang_ids == stats.lang_index(target)).cpu()
    lang = stats.lang_ids.cpu()
    sent = torch.zeros_like(lang)
    for li in lang.unique():
        rows = (lang == li).nonzero().flatten()
        sent[rows] = torch.arange(len(rows))
    n_sent = int(sent.max()) + 1
    doc_of = (
        list(docs) if docs is not None and len(docs) == n_sent else [str(i) for i in range(n_sent)]
    )
    xe = stats.pooled[:, feats.to(stats.pooled.device)].float().cpu()
    xr = stats.pooled[:, rnd[0].to(stats.pooled.device)].float().cpu()
    est = {"experts": _median_auroc(xe, y), "random": _median_auroc(xr, y)}
    est["vs_random"] = est["experts"] - est["random"]
    population = [_median_auroc(stats.pooled[:, r.to(stats.pooled.device)].float().cpu(), y)
                  for r in rnd]  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    members = [(sent == i).nonzero().flatten() for i in range(n_sent)]
    names = list(dict.fromkeys(doc_of))
    clusters = [torch.cat([members[i] for i in range(n_sent) if doc_of[i] == d]) for d in names]
    boots: dict[str, list[float]] = {k: [] for k in est}
    for _ in range(n_boot):
        pick = torch.randint(len(clusters), (len(clusters),), generator=gen)
        idx = torch.cat([clusters[int(i)] for i in pick])
        if y[idx].all() or not y[idx].any():
            continue
        e, r = _median_auroc(xe[idx], y[idx]), _median_auroc(xr[idx], y[idx])
        boots["experts"].append(e)
        boots["random"].append(r)
        boots["vs_random"].append(e - r)
    hits = dict.fromkeys(est, 0)
    n_perm = 999
    for _ in range(n_perm):
        yp = y.clone()
        for m in members:
            yp[m] = y[m[torch.randperm(len(m), generator=gen)]]
        e, r = _median_auroc(xe, yp), _median_auroc(xr, yp)
        for k, v, null in (("experts", e, 0.5), ("random", r, 0.5), ("vs_random", e - r, 0.0)):
            hits[k] += abs(v - null) >= abs(est[k] - (0.0 if k == "vs_random" else 0.5)) - 1e-12
    out: dict[str, Any] = {"k": int(len(feats)), "n": int(len(y)), "n_pos": int(y.sum()),
                           "n_clusters": len(clusters), "n_sentences": n_sent, "docs": doc_of,
                           "random_population": population, "random_draws": population,
                           "population_rank_p": (1 + sum(v >= est["experts"] for v in population))
                           / (len(population) + 1),
                           "p_floor": 1 / (len(population) + 1)}  # fmt: skip
    for k, v in est.items():
        b = np.asarray(boots[k])
        lo, hi = np.quantile(b, [0.025, 0.975]) if len(b) > 1 else (None, None)
        se = float(b.std(ddof=1)) if len(b) > 1 else None
        iv = Interval(v, None if lo is None else float(lo), None if hi is None else float(hi),
                      int(len(y)))  # fmt: skip
        out[k] = Test(iv, (1 + hits[k]) / (1 + n_perm), None if se is None else mde(se),
                      len(clusters), "median AUROC; cluster bootstrap over documents "
                      "(percentile); p: permutation of the target label within each sentence "
                      f"({n_perm})", {"null": 0.0 if k == "vs_random" else 0.5, "se": se}).to_json()  # fmt: skip
    return out
