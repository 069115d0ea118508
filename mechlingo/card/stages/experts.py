"""The experts stage: the expert neurons of Sundar et al., k chosen by the papers' rule on
held-out lines, and everything that judges the chosen clamp measured elsewhere (its steering
on fresh BOS samples, the held-out AUROC and the overlap at its k), with the random-neuron
population; its rows (experts exist, the sets barely overlap, the clamp steers) and the
report's AUROC, overlap and k-curve sections."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from mechlingo.analyses.experts import (
    KCurve,
    KCurveOptions,
    collect_neuron_stats,
    find_experts,
    k_curve,
)
from mechlingo.card import claims as C
from mechlingo.card.claims import SUNDAR
from mechlingo.card.clustered import p_floor
from mechlingo.card.clustered_tests import Test, mde, paired_test
from mechlingo.card.population import by_rank, population_gain_test, rank_population_test
from mechlingo.card.rules import make_row
from mechlingo.card.stages.base import (
    Budget,
    Context,
    ReportLike,
    Stage,
    check,
    failed,
    heading,
    processes,
    token_seconds,
)
from mechlingo.core.errors import InputError
from mechlingo.core.types import Model
from mechlingo.kernels.ranking import auroc_and_average_precision
from mechlingo.kernels.significance import Interval
from mechlingo.viz.experts import interval_bars_figure, k_curve_figure, overlap_figure

#: The seed of the BOS samples that measure the chosen clamp (seed 0 chose k).
MEASURE_SEED = 1

if TYPE_CHECKING:
    from mechlingo.card.stages import CardSettings


def _overlap(res: Any, k: int) -> dict[str, Any]:
    """The languages' pairwise overlap matrix of the top-``k`` expert sets (the row judges it
    with the languages as units, :func:`overlap_test`)."""
    ov = res.overlap(k).cpu()
    return {"k": k, "langs": res.langs, "matrix": ov.tolist(), "chance": k / res.stats.n_features}


def stage_experts(
    model: Model, texts: dict, settings: CardSettings, progress: bool, tmp: Path
) -> dict:
    """The experts, k chosen on the held-out lines' perplexity and BOS samples of seed 0,
    and everything that judges the chosen clamp measured elsewhere: its steering on fresh BOS
    samples (seed 1) with perplexity on evaluation lines, the AUROC at its k on the
    evaluation lines, the overlap at its k (the smallest k when the rule chose none)."""
    e = settings.budget.experts
    target = e.target
    if target not in texts["find"]:
        raise InputError(f"the experts' target {target!r} has no parallel sentences",
                         fix=f"give <{target}>.txt or another target")  # fmt: skip
    res = find_experts(model, texts["find"], max_tokens=e.max_tokens,
                       batch_size=settings.batch(), progress=progress)  # fmt: skip
    n_feat = res.stats.n_features
    ks = sorted({k for k in e.ks if 2 * k <= n_feat}) or [max(1, n_feat // 4)]
    opts = KCurveOptions(n_samples=e.samples, max_new_tokens=e.new_tokens,
                         max_tokens=e.max_tokens, progress=progress, seed=0)  # fmt: skip
    curve = k_curve(model, res, target, ks, texts["heldout"], opts)
    papers = curve.choose(e.ppl_budget, "none")
    strict = curve.choose(e.ppl_budget, "geomean")
    k = papers["k"] if papers["k"] is not None else ks[0]
    measure = []
    draws = max(1, int(e.random_sets))
    if papers["k"] is not None:  # the random arm: the layer-matched population of the controls
        lines = {lg: v[: max(2, e.n_heldout)] for lg, v in texts["eval"].items()}
        again = replace(opts, seed=MEASURE_SEED, control_seeds=range(draws), layer_matched=True,
                        shard_turn=1)  # the odd arm of each curve on another rank  # fmt: skip
        measure = k_curve(model, res, target, [k], lines, again).records()
    if papers["k"] is not None:
        res.clamp(target, k).save(tmp / "clamp", model)
        for i in range(draws):  # draw 0 is also the paired control
            res.random_clamp(target, k, seed=i, layer_matched=True).save(
                tmp / ("control" if i == 0 else f"control_s{i}"), model)  # fmt: skip
    ev = collect_neuron_stats(model, texts["eval"], max_tokens=e.max_tokens,
                              batch_size=settings.batch(), progress=progress)  # fmt: skip
    top = res.top(target, k)
    rnd = [res.random_features(target, k, seed=i, layer_matched=True) for i in range(draws)]
    auroc = auroc_tests(ev, target, top, rnd, e.n_boot, 0, texts["docs"]["eval"])
    auroc["k_rule"] = "the papers' rule" if papers["k"] is not None else "none chosen: smallest k"
    return {
        "target": target, "ks": ks, "n_features": n_feat, "langs": res.langs,
        "curve": curve.records(), "tests": curve.tests(), "measure_curve": measure,
        "measure_seed": MEASURE_SEED, "choice_papers": papers, "choice_strict": strict,
        "auroc": auroc, "overlap": _overlap(res, k), "summary": res.summary(k),
    }  # fmt: skip


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
    paired control) on held-out sentences, as :class:`~mechlingo.card.clustered_tests.Test`
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


def overlap_test(matrix: Sequence[Sequence[float]], null: float) -> Test:
    """The mean overlap of the language pairs' expert sets, with a delete-one-language
    jackknife standard error (the pairs that share a language are not independent: the
    languages are the units), a t interval and t test of H0 "mean == ``null``" on L - 1 df."""
    from scipy import stats as sps

    m = np.asarray(matrix, dtype=float)
    n = m.shape[0]
    iu = np.triu_indices(n, 1)
    est = float(m[iu].mean()) if n > 1 else math.nan
    method = f"mean over {len(iu[0])} language pairs; delete-one-language jackknife ({n} languages)"
    if n < 3:
        return Test(Interval(est if n > 1 else None, None, None, n), None, None, n, method)
    loo = []
    for drop in range(n):
        keep = [i for i in range(n) if i != drop]
        sub = m[np.ix_(keep, keep)]
        loo.append(float(sub[np.triu_indices(n - 1, 1)].mean()))
    se = math.sqrt((n - 1) / n * float(((np.array(loo) - np.mean(loo)) ** 2).sum()))
    half = float(sps.t.ppf(0.975, n - 1)) * se
    if se == 0:  # every language's pairs alike: bounded, never 0
        p = 1.0 if math.isclose(est, null, abs_tol=1e-12) else p_floor(n)
    else:
        p = max(float(2 * sps.t.sf(abs(est - null) / se, n - 1)), float(np.finfo(float).tiny))
    return Test(Interval(est, est - half, est + half, n), p, mde(se, df=n - 1), n, method,
                {"null": null, "se": se, "df": n - 1, "interval": "t",
                 "pairs": int(len(iu[0]))})  # fmt: skip


def chance_overlap(matrix: Sequence[Sequence[float]], k: int, n_neurons: int) -> Test:
    """The chance overlap of two top-``k`` sets drawn from ``n_neurons`` MLP neurons: the
    hypergeometric expectation ``k / N`` of the shared share, and the exact one-sided
    ``scipy.stats.hypergeom`` p that the most-shared pair shares as many neurons by chance
    (Bonferroni over the pairs, at most 1). ``extra``: each pair's p, the pairs above chance
    at 0.05."""
    from scipy import stats as sps

    m = np.asarray(matrix, dtype=float)
    iu = np.triu_indices(m.shape[0], 1)
    shared = np.rint(m[iu] * k).astype(int)
    tiny = float(np.finfo(float).tiny)  # an underflowed p is below this, never 0
    ps = np.maximum(sps.hypergeom.sf(shared - 1, n_neurons, k, k), tiny)
    chance = k / n_neurons
    p = float(min(1.0, ps.min() * len(ps))) if len(ps) else None
    extra = {"chance": chance, "pair_p": [float(x) for x in ps],
             "pairs_above_chance": int((ps < 0.05).sum())}  # fmt: skip
    return Test(Interval(chance, chance, chance, len(ps)), p, None, len(ps),
                "hypergeometric chance overlap k/N; p: exact, the largest pair (Bonferroni)",
                extra)  # fmt: skip


def rank_test(effect: float | None, draws: Sequence[float], direction: int = 1, *,
              exact: bool = False) -> Test:  # fmt: skip
    """A statistic of the effect against the same statistic of m random draws (a median AUROC
    against random neuron sets'; with ``exact``, the largest per-pair ratio against the random
    clamps' own maxima). The estimate is effect - mean of the draws with a t interval from the
    draws' spread (a new draw's; undefined for one draw). ``p``: the two-sided t of that
    estimate; with ``exact`` (a maximum, far from normal), or with fewer than two distinct
    draws, the exact one-sided permutation p ``(1 + #{draws at least as far in direction}) /
    (m + 1)`` alone (floor ``1/(m + 1)``: 0.5 for one draw)."""
    from scipy import stats as sps

    x = np.asarray([v for v in draws if np.isfinite(v)], dtype=float)
    m = len(x)
    if effect is None or m == 0:
        return Test(Interval(None, None, None, m), None, None, m, "no random-clamp maximum")
    est = float(effect - x.mean())
    p = (1 + int((direction * (x - effect) >= -1e-12).sum())) / (m + 1)
    p_opp = (1 + int((direction * (effect - x) >= -1e-12).sum())) / (m + 1)
    lo = hi = se = p_t = None
    if m >= 2:
        se = float(x.std(ddof=1) * np.sqrt(1 + 1 / m))
        half = float(sps.t.ppf(0.975, m - 1)) * se
        lo, hi = est - half, est + half
        if se > 0:
            p_t = max(float(2 * sps.t.sf(abs(est) / se, m - 1)), 1e-300)
    extra = {"direction": direction, "draws": m, "p_rank": p, "p_rank_opposite": p_opp,
             "p_floor": 1 / (m + 1), "draw_stats": x.tolist(), "se": se, "df": m - 1,
             "interval": "t"}  # fmt: skip
    if exact:  # the verdict's p is the rank p
        p_t = None
    if p_t is None:  # exact, one draw or draws all equal: only the rank p
        extra.update(one_sided=True, p_opposite=p_opp)
    method = (
        f"effect vs {m} random draws' statistic; p: "
        + ("its rank (exact permutation" if p_t is None else
           f"two-sided t of effect - draws' mean (prediction SE), rank p {p:.3g} (floor")
        + f" 1/{m + 1})"
    )  # fmt: skip
    return Test(Interval(est, lo, hi, m), p if p_t is None else p_t, None, m, method, extra)


def draw_index(key: str) -> int:
    """``random_s12`` -> 12 (draws in their seed order; other keys first)."""
    tail = key.removeprefix("random_s")
    return int(tail) if tail.isdigit() else -1


def rows_experts(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``experts_exist`` (held-out AUROC at the clamp's k against random neurons),
    ``experts_disjoint`` (overlap, languages as units) and ``clamp_steers`` (on BOS samples
    that did not choose k)."""
    a = data["auroc"]
    eff = Test.from_json(a["experts"])
    vs = Test.from_json(a["vs_random"])
    if a.get("random_draws"):  # a population of random neuron sets: the experts' rank
        vs = by_rank(rank_test(eff.estimate.estimate, [float(x) for x in a["random_draws"]]))
    rows = [make_row(C.EXPERTS_EXIST, eff, Test.from_json(a["random"]), vs_control=vs,
                     details=f"top {a['k']} {data['target']} experts (the clamp's k: "
                     f"{a['k_rule']}); {a['n_pos']} of {a['n']} held-out sentences in "
                     f"{data['target']}, {a['n_clusters']} sentence clusters")]  # fmt: skip
    rows.append(_row_disjoint(data["overlap"]))
    rows.append(_row_steers(data))
    return rows


def _row_disjoint(ov: Mapping[str, Any]) -> dict[str, Any]:
    """``experts_disjoint``: the mean shared share of the language pairs' top-k sets minus
    the chance share k/N (the excess over chance, languages as units) below the threshold;
    the control is the hypergeometric chance overlap with its exact p."""
    c, k = C.EXPERTS_DISJOINT, int(ov["k"])
    n_neurons = int(ov.get("n_neurons") or round(k / ov["chance"]))
    ctl = chance_overlap(ov["matrix"], k, n_neurons)
    excess = (np.asarray(ov["matrix"], dtype=float) - ctl.extra["chance"]).tolist()
    eff = overlap_test(excess, c.null_value)
    raw = overlap_test(ov["matrix"], c.null_value).estimate.format(4)
    return make_row(c, eff, ctl, details=f"k = {k} of N = {n_neurons} MLP neurons; overlap "
                    f"{raw}; chance k/N {ctl.extra['chance']:.4f}; "
                    f"{ctl.extra['pairs_above_chance']} of {ctl.n_clusters} pairs above chance "
                    "(hypergeometric p < 0.05)")  # fmt: skip


def _row_steers(data: Mapping[str, Any]) -> dict[str, Any]:
    papers, strict = data["choice_papers"], data["choice_strict"]
    details = (f"papers' rule (target rate; target perplexity <= {papers['ppl_budget']:g}x): "
               f"k = {papers['k']}; stricter rule (also the geometric mean of the other "
               f"languages' perplexity ratios): k = {strict['k']}")  # fmt: skip
    k, claim = papers["k"], C.CLAMP_STEERS
    if k is None or not data.get("measure_curve"):
        why = "the papers' rule chose no k (no k keeps the target's perplexity within the budget)"
        return make_row(claim, None, details=details, untestable=why)
    rows = data["measure_curve"]
    none = next(r for r in rows if r["arm"] == "none")
    exp = next(r for r in rows if r["arm"] == "experts" and r["k"] == k)
    rnds = [r for r in rows if r["arm"] == "random" and r["k"] == k]  # one row per draw
    n0, e = [float(x) for x in none["bos_hits"]], [float(x) for x in exp["bos_hits"]]
    draws = [[float(x) for x in r["bos_hits"]] for r in rnds]
    rate = (f" (random population's mean {np.mean([r['target_rate_bos'] for r in rnds]):.2f})"
            if rnds else "")  # fmt: skip
    details += (f"; measured on fresh BOS samples (seed {data.get('measure_seed')}) and "
                f"perplexity lines that did not choose k: target rate "
                f"{none['target_rate_bos']:.2f} -> {exp['target_rate_bos']:.2f}{rate}")  # fmt: skip
    ctl = vs = None
    if draws:
        ctl = population_gain_test(n0, draws)
        vs = rank_population_test(e, draws, base=n0, direction=claim.direction)
        details += (f"; control: {len(draws)} random-neuron clamp(s) at k = {k}; the clamp's "
                    f"exact permutation p among them {vs.extra['p_rank']:.3g} (floor "
                    f"1/{len(draws) + 1})")  # fmt: skip
    return make_row(claim, paired_test(n0, e), ctl, vs_control=vs, details=details,
                    extra={"k": k, "k_strict": strict["k"]})  # fmt: skip


@dataclass(frozen=True)
class ExpertsBudget(Budget):
    """The experts' ``target`` language; the parallel lines that find the experts
    (``n_find``), the held-out lines of the k curve (``n_heldout``) and the evaluation lines
    (``n_eval``, at most ``eval_per_doc`` per document); the candidate ``ks``; BOS
    ``samples`` of ``new_tokens`` each; ``max_tokens`` per line; the perplexity budget of
    the k rule (``ppl_budget``, a ratio); the AUROC bootstrap's ``n_boot``; the random
    neuron sets (``random_sets``). The align stage reads the same section."""

    target: str
    n_find: int
    n_heldout: int
    ks: tuple[int, ...]
    samples: int
    new_tokens: int
    max_tokens: int
    n_eval: int
    ppl_budget: float
    n_boot: int
    eval_per_doc: int | None
    random_sets: int

    def __post_init__(self) -> None:
        check(self.n_find >= 2, "experts.n_find", "must be at least 2")
        check(len(self.ks) > 0 and all(k >= 1 for k in self.ks), "experts.ks",
              "must be positive numbers of neurons")  # fmt: skip
        check(self.ppl_budget > 0, "experts.ppl_budget", "must be above 0")
        for name in ("n_heldout", "samples", "new_tokens", "max_tokens", "n_eval", "n_boot",
                     "random_sets"):  # fmt: skip
            check(getattr(self, name) >= 1, f"experts.{name}", "must be at least 1")
        check(self.eval_per_doc is None or self.eval_per_doc >= 1, "experts.eval_per_doc",
              "must be at least 1")  # fmt: skip

    def eval_caps(self) -> list[int | None]:
        """The caps of lines per document of the finding, held-out and evaluation parts
        (:func:`~mechlingo.data.natural_parallel.split_by_documents`): the evaluation part's
        ``eval_per_doc``."""
        return [None, None, self.eval_per_doc]


QUICK = ExpertsBudget(
    target="es", n_find=32, n_heldout=4, ks=(50, 500), samples=16, new_tokens=12,
    max_tokens=24, n_eval=24, ppl_budget=2.0, n_boot=200, eval_per_doc=3, random_sets=5,
)  # fmt: skip
FULL = ExpertsBudget(
    target="es", n_find=60, n_heldout=6, ks=(50, 200, 500, 2000), samples=24, new_tokens=16,
    max_tokens=24, n_eval=48, ppl_budget=2.0, n_boot=500, eval_per_doc=4, random_sets=20,
)  # fmt: skip


def run(ctx: Context, folder: Path) -> dict[str, Any]:
    """The experts stage's result; the clamp and its random controls saved in ``folder``."""
    return stage_experts(ctx.model, ctx.texts(), ctx.settings, ctx.progress, folder)


def report(rep: ReportLike, results: Mapping[str, Any]) -> None:
    """The held-out AUROC, the overlap of the expert sets and the k curve with its rules."""
    data = results.get("experts")
    heading(rep, "fig-experts", "Expert neurons: held-out AUROC")
    if data is None or failed(rep, data, "experts"):
        return
    a = data["auroc"]
    e, r = a["experts"]["estimate"], a["random"]["estimate"]
    measures = {f"median AUROC, top {a['k']}": {"experts": e, "random neurons": r}}
    rep.add_figure(interval_bars_figure(
        measures, "Held-out AUROC (95% CI, sentences and their translations resampled together)"))  # fmt: skip
    ov = data["overlap"]
    heading(rep, "fig-overlap", "Overlap of the expert sets")
    rep.add_figure(overlap_figure(torch.tensor(ov["matrix"]), ov["langs"], ov["k"]))
    heading(rep, "fig-kcurve", f"The k curve of {data['target']} and the two k rules")
    curve = KCurve(data["target"], data["curve"])
    rep.add_figure(k_curve_figure(curve.rows, curve.lang, data["choice_papers"]["k"]))
    for label, ch in (("papers' rule", data["choice_papers"]),
                      ("stricter rule", data["choice_strict"])):  # fmt: skip
        rep.add_text(f"{label}: k = {ch['k']}. {ch['rule']}")
        rep.add_table(ch["candidates"])


#: Measured CPU seconds of the experts stage over its modelled passes (below).
EXPERTS_FACTOR = 1.03
#: One held-out line's log-likelihood (the unembedding at every token) in embedding passes.
NLL_PASSES = 3.0
#: The AUROC tests at the clamp's k (:func:`auroc_tests`: ``n_boot`` cluster-bootstrap and
#: 999 permutation rounds, each two median AUROCs over the k neurons), which every process
#: computes whole, in embedding passes: measured on 288 evaluation rows (24 sentences x 12
#: languages), 200 bootstrap rounds and 5 random draws (7 December 2026, one process): 3.72
#: CPU-seconds at k = 50 and 7.91 at k = 500 against 0.0647 s per embedded sentence, i.e.
#: ``STATS_BASE + STATS_PER_K * k`` passes (50.3 + 0.144 k) per 1,199 rounds of 288 rows.
STATS_BASE = 50.3
STATS_PER_K = 0.144
#: The rounds and rows those constants were measured at.
STATS_ROUNDS, STATS_ROWS = 1199, 288


def cost(settings: CardSettings, sizes: Mapping[str, Any], unit: Mapping[str, float]) -> float:
    """CPU seconds: one embedding pass over the finding and the evaluation lines of every
    language; and for every arm of the two k curves (the first: each k with its random arm,
    and no clamp; the measurement: the clamp, every random draw and no clamp) its BOS samples
    token by token and the log-likelihood of ``n_heldout`` lines of every language; and the
    AUROC tests on the evaluation lines at the smallest k (:data:`STATS_BASE`), which every
    process computes whole under torchrun (``processes`` x the embedding seconds, one
    process's share of sharded embedding)."""
    e = settings.budget.experts
    langs = int(sizes.get("langs", 12))
    embed = unit.get("embed", 0.0)
    lines = (int(e.n_find) + int(e.n_eval)) * langs * embed
    arms = 2 * len(e.ks) + 1 + 2 + int(e.random_sets)
    tokens = arms * int(e.samples) * int(e.new_tokens)
    new = int(settings.budget.repair.max_new_tokens)
    nll = arms * max(2, int(e.n_heldout)) * langs * NLL_PASSES * embed
    rows = int(sizes.get("eval_sentences", e.n_eval)) * langs / STATS_ROWS
    rounds = (int(e.n_boot) + 999) / STATS_ROUNDS
    stats = (STATS_BASE + STATS_PER_K * min(e.ks)) * rows * rounds
    whole = processes(sizes) * stats * embed
    return EXPERTS_FACTOR * (lines + tokens * token_seconds(unit, new) + nll) + whole


STAGE = Stage(
    name="experts",
    paper=SUNDAR,
    run=run,
    rows=(rows_experts,),
    report=report,
    section="experts",
    budget=ExpertsBudget,
    folder=True,
    cost=cost,
)
