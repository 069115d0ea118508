"""The card's clustered tests: one estimate with its interval, p-value and minimum detectable
effect (:class:`Test`), built so that it stays valid with few clusters.

Items of one cluster (a fact asked in several languages, the sentences of one document) move
together. Intervals are CR2 with t on the Bell-McCaffrey degrees of freedom
(:mod:`mechlingo.card.clustered`: G - 1 for balanced clusters, fewer for unbalanced ones);
cluster-bootstrap intervals are scipy's percentile interval widened for few clusters; p-values a
cluster sign-flip permutation test where H0 makes cluster totals symmetric, else the CR2 t test,
and never 0 (:func:`~mechlingo.card.clustered.p_floor`). Entry points: :func:`mean_test`,
:func:`paired_test`, :func:`relative_test`, :func:`ratio_test`, :func:`group_difference_test`,
:func:`correlation_test` and :func:`cluster_bootstrap`. A control as a population of random draws
is tested in :mod:`mechlingo.card.population`; a family of rows is adjusted in
:mod:`mechlingo.card.multiplicity` (each row's multiplier; :meth:`Test.at_level`).
``docs/replicate.md`` ("The verdict rules") gives the reasons, the coverage simulation and every
rule in full.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mechlingo.card.clustered import (
    TINY,
    bm_df,
    bm_df_mean,
    codes_of,
    cr2_ols,
    cr2_se,
    crit,
    quantile,
    sign_flip_p,
    small_sample_scale,
    sums,
    t_p,
)
from mechlingo.core.defaults import SEED
from mechlingo.core.errors import InputError
from mechlingo.kernels.significance import CONFIDENCE, N_RESAMPLES, Interval, mcnemar

__all__ = [
    "Test",
    "cluster_bootstrap",
    "correlation_test",
    "group_difference_test",
    "mde",
    "mean_test",
    "paired_test",
    "ratio_test",
    "relative_test",
]


@dataclass(frozen=True)
class Test:
    """One estimate with its clustered 95% interval, a p-value and the minimum detectable effect.

    ``estimate``: the point estimate and its interval over ``estimate.n`` items. ``p``: the
    p-value of H0 "the effect equals the constructor's ``null``" (two-sided, except a
    population's one-sided permutation p, whose ``extra["one_sided"]`` is True and whose other
    side is ``extra["p_opposite"]``; ``None`` when it cannot be computed). ``mde``: the
    smallest |effect - null| a two-sided test at 0.05 detects with 80% power. ``n_clusters``:
    the independent units behind the interval. ``method``: the procedures in words. ``extra``:
    constructor-specific numbers; ``interval`` says how :meth:`at_level` rebuilds the interval
    at another confidence (``"t"``: ``se`` and ``df``; ``"log t"``: ``se_log`` and ``df``;
    ``"no change"``: the exact bound of ``g`` clusters; otherwise each side is scaled).
    """

    __test__ = False  # not a pytest class

    estimate: Interval
    p: float | None
    mde: float | None
    n_clusters: int
    method: str
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready: the interval as :meth:`Interval.to_json` and every other field."""
        return {"estimate": self.estimate.to_json(), "p": self.p, "mde": self.mde,
                "n_clusters": self.n_clusters, "method": self.method,
                "extra": dict(self.extra)}  # fmt: skip

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Test:
        """The inverse of :meth:`to_json`."""
        return cls(Interval.from_json(d["estimate"]), d.get("p"), d.get("mde"),
                   int(d.get("n_clusters", 0)), str(d.get("method", "")),
                   dict(d.get("extra") or {}))  # fmt: skip

    def at_level(self, confidence: float) -> Interval:
        """The interval at ``confidence`` (a row's adjusted level), rebuilt the way the test
        made its 95% one (see the class docstring); an undefined interval stays undefined."""
        iv, x = self.estimate, self.extra
        est = iv.estimate
        if not iv.defined or est is None:
            return Interval(est, None, None, iv.n, confidence, iv.extra)
        kind = x.get("interval")
        if kind == "no change":
            u = 1 - ((1 - confidence) / 2) ** (1 / int(x["g"]))
            lo, hi = est - u, est + u
        elif kind == "t" and x.get("se") is not None:
            half = crit(confidence, x.get("df")) * float(x["se"])
            lo, hi = est - half, est + half
        elif kind == "log t" and x.get("se_log") is not None and est > -1:
            half = crit(confidence, x.get("df")) * float(x["se_log"])
            c = math.log1p(est)
            lo, hi = math.expm1(c - half), math.expm1(c + half)
        else:  # a bootstrap interval: each side scaled (t on its df where it has one)
            df = x.get("df") if kind == "scaled" else None
            f = crit(confidence, df) / crit(iv.confidence, df)
            lo, hi = est - (est - iv.lo) * f, est + (iv.hi - est) * f  # type: ignore[operator]
        if x.get("share"):
            lo, hi = max(0.0, lo), min(1.0, hi)
        return Interval(est, float(lo), float(hi), iv.n, confidence, iv.extra)


def mde(se: float, alpha: float = 0.05, power: float = 0.8, df: float | None = None) -> float:
    """The minimum detectable effect ``(q_{1-alpha/2} + q_{power}) * se`` (normal quantiles,
    Student's t on ``df`` when given): the smallest true |effect| that a two-sided test at
    level ``alpha`` finds with probability ``power`` when the estimate's SE is ``se``."""
    return float((quantile(1 - alpha / 2, df) + quantile(power, df)) * se)


def _binary(*arrays: np.ndarray) -> bool:
    return all(bool(np.all((a == 0) | (a == 1))) for a in arrays)


def _mean_core(
    d: np.ndarray, codes: np.ndarray, g: int, null: float, seed: int, binary: bool,
    symmetric: bool,
) -> tuple[Interval, float | None, float | None, str, dict[str, Any]]:  # fmt: skip
    """The clustered mean of ``d``: interval, p (vs ``null``), MDE, p's method and the
    interval's fields (``se``, ``df``, ``interval``).

    The interval is the CR2 t interval on the Bell-McCaffrey df (:func:`bm_df_mean`: G - 1
    for balanced clusters, fewer for unbalanced ones). When ``d`` does not vary and is 0/1, it is
    widened to the exact 95% bound of the change rate of ``g`` clusters with no change seen
    (``1 - 0.025^(1/g)``), so "nothing changed on 24 facts" reads as "a change up to 14
    points is not excluded" and not as a proof of 0. ``symmetric``: ``p`` is the sign-flip
    permutation test, otherwise the CR2 t test."""
    n = len(d)
    cnt = sums(np.ones(n), codes, g)
    s = sums(d, codes, g)
    m = float(d.mean())
    se = cr2_se((s - cnt * m) / n, cnt)
    df = bm_df_mean(cnt) if g >= 2 else float(g - 1)
    fields: dict[str, Any] = {"se": se, "df": df, "interval": "t"}
    if np.all(d == d[0]) and binary and g >= 1:
        u = 1 - 0.025 ** (1 / g)
        lo, hi = m - u, m + u
        se = u / quantile(0.975, None)
        fields = {"se": se, "df": df, "interval": "no change", "g": g}
    elif se is None:
        lo = hi = None
    else:
        half = crit(CONFIDENCE, df) * se
        lo, hi = m - half, m + half
    if symmetric:
        p, how = sign_flip_p(s - cnt * null, seed)
        how = f"sign-flip permutation ({how})"
    else:
        p, how = t_p(m, null, fields["se"], df, g), "CR2 t"
    md = None if se is None else mde(se, df=df)
    return Interval(m, lo, hi, n), p, md, how, fields


def _log_ratio(a: np.ndarray, b: np.ndarray, codes: np.ndarray, g: int) -> Interval | None:
    """``mean(b) / mean(a) - 1`` with a 95% interval from the clustered log ratio (delta
    method, CR2, t on the Bell-McCaffrey df); defined whenever ``mean(a) > 0``. When ``mean(b)`` is 0 the log
    uses half an item of ``b`` (the estimate stays -1). Successes (of either condition) in
    fewer than two clusters, or a log ratio that is the same in every cluster, give no
    interval (``extra["undefined"]`` says why): one cluster cannot show how the ratio varies."""
    n = len(a)
    ma, mb = float(a.mean()), float(b.mean())
    if n == 0 or ma <= 0:
        return None
    cnt = sums(np.ones(n), codes, g)
    sa, sb = sums(a, codes, g), sums(b, codes, g)
    est = mb / ma - 1
    with_success = int(((sa != 0) | (sb != 0)).sum())
    if g < 2 or with_success < 2:
        why = (f"not enough clusters: the successes fall in {with_success} cluster(s) of {g}; "
               "a relative gain needs them in at least 2")  # fmt: skip
        return Interval(est, None, None, n, CONFIDENCE, {"undefined": why})
    mb_eff = mb if mb > 0 else 0.5 / n
    u = (sb - cnt * mb) / (n * mb_eff) - (sa - cnt * ma) / (n * ma)
    se = cr2_se(u, cnt) or 0.0
    if se == 0:
        why = "the log ratio is the same in every cluster: no between-cluster spread to use"
        return Interval(est, None, None, n, CONFIDENCE, {"undefined": why})
    df = bm_df_mean(cnt)
    c, half = math.log(mb_eff / ma), crit(CONFIDENCE, df) * se
    top = math.log(np.finfo(float).max) - 1  # a baseline mean near 0: a finite, huge bound
    lo, hi = math.exp(min(c - half, top)) - 1, math.exp(min(c + half, top)) - 1
    return Interval(est, -1.0 if mb == 0 else lo, hi, n, CONFIDENCE, {"se_log": se, "df": df})


def paired_test(
    base: Sequence[float],
    new: Sequence[float],
    clusters: Sequence[Any] | None = None,
    *,
    null: float = 0.0,
    seed: int = SEED,
    n_resamples: int = N_RESAMPLES,
) -> Test:
    """The paired gain ``mean(new - base)`` of two conditions on the same items.

    Args:
        base, new: per-item outcomes (0/1 or float), item ``i`` of both is one pair.
        clusters: per-item cluster id (a fact id, a document); items of one cluster are
            sign-flipped and weighed together. ``None``: every item its own cluster.
        null: the gain of H0 (``p`` tests ``mean(new - base) == null``).
        n_resamples: accepted for callers of the bootstrap version; the CR2 interval needs none.

    Returns:
        A :class:`Test`: the gain with its CR2 t(BM df) 95% interval (for 0/1 outcomes that
        never change: the exact bound of the change rate); ``p`` from the cluster sign-flip
        test of ``new - base`` when ``null`` is 0 (the exact McNemar p for unclustered 0/1
        pairs), else the CR2 t test; ``mde`` at 0.05 from the CR2 SE. ``extra``: ``base``/
        ``new`` means, ``null``, ``se``, ``df``, ``relative`` (``mean(new) / mean(base) - 1``
        as JSON, from the clustered log ratio; ``None`` when ``mean(base)`` is 0) and for 0/1
        outcomes ``fixed``, ``broken`` and ``p_mcnemar`` (unclustered).

    Raises:
        InputError: outcomes of different lengths, or no items.
    """
    del n_resamples
    a, b = np.asarray(base, dtype=float), np.asarray(new, dtype=float)
    if a.shape != b.shape or a.ndim != 1 or len(a) == 0:
        raise InputError(f"need non-empty paired outcomes of one length, got {a.shape}, {b.shape}")
    codes, g = codes_of(clusters, len(a))
    diff = b - a
    iv, p, md, how, fields = _mean_core(diff, codes, g, null, seed, _binary(np.abs(diff)),
                                        null == 0)  # fmt: skip
    rel = _log_ratio(a, b, codes, g)
    extra: dict[str, Any] = {"base": float(a.mean()), "new": float(b.mean()), "null": null,
                             **fields, "relative": None if rel is None else rel.to_json()}  # fmt: skip
    if _binary(a, b):
        mc = mcnemar(list(a.astype(bool)), list(b.astype(bool)))
        extra |= {"fixed": mc["fixed"], "broken": mc["broken"], "p_mcnemar": mc["p"]}
    method = (f"p: cluster {how}, {g} clusters; interval: CR2 t({fields['df']:.1f}); relative: clustered "
              "log ratio (delta method, CR2)")  # fmt: skip
    return Test(iv, p, md, g, method, extra)


def relative_test(
    base: Sequence[float],
    new: Sequence[float],
    clusters: Sequence[Any] | None = None,
    *,
    null: float = 0.0,
    seed: int = SEED,
) -> Test:
    """The relative gain ``mean(new) / mean(base) - 1`` of paired items: the interval of the
    clustered log ratio (CR2, t(BM df)); ``p`` of H0 "relative gain == ``null``" by the t test
    on the same log ratio (so ``p`` and the interval agree); ``mde`` on the relative scale.
    Undefined (``p`` None, the reason under ``extra["undefined"]``) when ``mean(base)`` is
    0, every new outcome is 0, or the successes fall in fewer than two clusters. ``extra``
    holds the points reading (:func:`paired_test`'s JSON) under ``"points"``.

    Raises:
        InputError: as :func:`paired_test`.
    """
    pts = paired_test(base, new, clusters, seed=seed)
    a = np.asarray(base, dtype=float)
    rel = pts.extra["relative"]
    extra: dict[str, Any] = {"points": pts.to_json(), "null": null}
    if rel is None:
        iv = Interval(None, None, None, len(a))
        extra["undefined"] = "the baseline is 0: a relative gain is undefined"
        return Test(iv, None, None, pts.n_clusters, "relative gain: baseline 0", extra)
    iv = Interval.from_json(rel)
    iv = Interval(iv.estimate, iv.lo, iv.hi, iv.n, iv.confidence)
    if "undefined" in rel:
        extra["undefined"] = rel["undefined"]
    p = md = None
    se_log, df = rel.get("se_log"), rel.get("df")
    if iv.defined and rel["estimate"] > -1 and se_log:
        md = mde(se_log, df=df) * (1 + iv.estimate)  # type: ignore[operator]
        c = math.log1p(iv.estimate) - math.log1p(null)  # type: ignore[arg-type]
        p = t_p(c, 0.0, se_log, df, pts.n_clusters)
        extra |= {"se_log": se_log, "df": df, "interval": "log t"}
    method = "relative gain: clustered log ratio (delta method, CR2, t(BM df)); p: t test on it"
    return Test(iv, p, md, pts.n_clusters, method, extra)


def ratio_test(
    num: Sequence[float],
    den: Sequence[float],
    clusters: Sequence[Any] | None = None,
    *,
    null: float = 1.0,
) -> Test:
    """A ratio of sums ``sum(num) / sum(den)`` over items (e.g. the share of one gain kept
    by another on the same items) with a CR2 delta-method t(BM df) 95% interval and t test of
    H0 "ratio == ``null``". Undefined (``None`` estimate) when ``sum(den) <= 0``: the ratio
    of a gain that does not exist says nothing.

    Raises:
        InputError: inputs of different lengths or none.
    """
    a, b = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    if a.shape != b.shape or a.ndim != 1 or len(a) == 0:
        raise InputError(f"need non-empty paired 1-D inputs, got {a.shape}, {b.shape}")
    codes, g = codes_of(clusters, len(a))
    method = "ratio of sums; CR2 delta method, t on the Bell-McCaffrey df; p: t test"
    if b.sum() <= 0:
        return Test(Interval(None, None, None, len(a)), None, None, g, method, {"null": null})
    r = float(a.sum() / b.sum())
    if g < 2:
        return Test(Interval(r, None, None, len(a)), None, None, g, method, {"null": null})
    cnt = sums(np.ones(len(a)), codes, g)
    u = (sums(a, codes, g) - r * sums(b, codes, g)) / float(b.sum())
    se = cr2_se(u, cnt) or 0.0
    df = bm_df_mean(cnt)
    half = crit(CONFIDENCE, df) * se
    iv = Interval(r, r - half, r + half, len(a))
    return Test(iv, t_p(r, null, se, df, g), mde(se, df=df), g, method,
                {"null": null, "se": se, "df": df, "interval": "t"})  # fmt: skip


def mean_test(
    values: Sequence[float],
    clusters: Sequence[Any] | None = None,
    *,
    null: float = 0.0,
    seed: int = SEED,
    n_resamples: int = N_RESAMPLES,
) -> Test:
    """The mean of per-item values (a 0/1 share, a per-sentence distance) against ``null``
    (0.5 for "a majority"): the CR2 t(BM df) 95% interval (a share's clipped to [0, 1]); ``p``
    from the cluster sign-flip test of ``values - null`` where H0 makes it symmetric (``null``
    0, or a 0/1 share against 0.5: for unclustered items the exact binomial test), else the
    CR2 t test; ``mde`` from the CR2 SE. ``n_resamples``: accepted, unused (no resampling).

    Raises:
        InputError: no values or not 1-D.
    """
    del n_resamples
    x = np.asarray(values, dtype=float)
    if x.ndim != 1 or len(x) == 0:
        raise InputError(f"mean_test needs a non-empty 1-D sequence, got shape {x.shape}")
    codes, g = codes_of(clusters, len(x))
    binary = _binary(x)
    symmetric = null == 0 or (binary and null == 0.5)
    iv, p, md, how, fields = _mean_core(x, codes, g, null, seed, binary, symmetric)
    if binary and iv.defined:  # a share stays within [0, 1]
        iv = Interval(iv.estimate, max(0.0, iv.lo), min(1.0, iv.hi), iv.n)  # type: ignore[type-var]
        fields["share"] = True
    method = f"p: cluster {how}, {g} clusters; interval: CR2 t({fields['df']:.1f})"
    return Test(iv, p, md, g, method, {"null": null, **fields})


def correlation_test(
    x: Sequence[float],
    y: Sequence[float],
    clusters: Sequence[Any] | None = None,
    *,
    seed: int = SEED,
    n_resamples: int = N_RESAMPLES,
) -> Test:
    """Spearman's rank correlation of paired ``x`` and ``y`` with a cluster-bootstrap
    percentile 95% interval; ``p`` (H0: no correlation) from the t approximation on G - 2 df
    (without clusters: ``scipy.stats.spearmanr``'s p), at least ``2 / G!`` (the exact
    permutation minimum, so a perfect correlation gets no p of 0).

    Raises:
        InputError: inputs of different lengths or fewer than 3 items.
    """
    from scipy import stats as sps

    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if a.shape != b.shape or a.ndim != 1 or len(a) < 3:
        raise InputError(f"need paired 1-D samples of >= 3 items, got {a.shape}, {b.shape}")
    codes, g = codes_of(clusters, len(a))
    r = float(sps.spearmanr(a, b).statistic)
    if not math.isfinite(r):
        return Test(Interval(None, None, None, len(a)), None, None, g, "Spearman (constant input)")
    if g < 3:
        p = None
    elif clusters is None:
        p = float(sps.spearmanr(a, b).pvalue)
    else:
        t = r * math.sqrt((g - 2) / max(1e-12, 1 - r * r))
        p = float(2 * sps.t.sf(abs(t), g - 2))
    if p is not None:
        p = max(p, 2 * math.exp(-math.lgamma(g + 1)), TINY)
    rng = np.random.default_rng(seed)
    members = [np.flatnonzero(codes == i) for i in range(g)]
    vals = []
    for _ in range(n_resamples):
        idx = np.concatenate([members[i] for i in rng.integers(0, g, g)])
        v = sps.spearmanr(a[idx], b[idx]).statistic
        if math.isfinite(v):
            vals.append(float(v))
    lo, hi = np.quantile(vals, [0.025, 0.975]) if len(vals) > 1 else (None, None)
    se = float(np.std(vals, ddof=1)) if len(vals) > 1 else None
    iv = Interval(r, None if lo is None else float(lo), None if hi is None else float(hi), len(a))
    method = f"Spearman; cluster bootstrap (percentile, {g} clusters); p: t approximation"
    return Test(iv, p, None if se is None else mde(se), g, method, {"se": se})


# --------------------------------------------------------------------------------------
# Statistics of a whole table of items, and two-group differences
# --------------------------------------------------------------------------------------


def cluster_bootstrap(
    data: np.ndarray,
    clusters: Sequence[Any],
    statistic: Callable[[np.ndarray], float],
    *,
    null: float = 0.0,
    method: str = "",
    seed: int = SEED,
    n_resamples: int = N_RESAMPLES,
    extra: dict[str, Any] | None = None,
) -> Test:
    """``statistic(rows)`` on ``data`` (one row per item) with a cluster-bootstrap 95%
    interval, for statistics with no closed-form SE (a median over pairs, a correlation of
    per-pair changes).

    The clusters are resampled by ``scipy.stats.bootstrap`` (its percentile interval; of the
    finite resamples where some give no finite statistic), and the interval is widened about the
    estimate by :func:`~mechlingo.card.clustered.small_sample_scale` (``t_df / z * sqrt(G /
    (G - 1))``, ``df`` the Bell-McCaffrey df of a mean over clusters of these sizes: G - 1 when
    balanced): with 8 to 12 documents the unwidened interval covers about 0.89 at a nominal
    0.95, less with skewed documents (``docs/calibration.md``). ``p``: the two-sided t test
    of ``null`` on that df with the bootstrap SE scaled alike; ``method`` says so.

    Args:
        data: ``[item, ...]`` values; ``statistic`` gets a subset of rows (clusters resampled).
        clusters: the cluster of every item (all items of a cluster move together).
        null: the value of H0 for the p-value.
        method: what the statistic is (prefixed to the test's method).
    """
    data = np.asarray(data, dtype=float)
    labels = np.asarray([str(c) for c in clusters])
    if len(labels) != len(data):
        raise InputError(f"{len(data)} items but {len(labels)} cluster ids: give one per item")
    uniq, inv = np.unique(labels, return_inverse=True)
    g = len(uniq)
    members = [np.flatnonzero(inv == k) for k in range(g)]
    est = float(statistic(data))
    how = (method + "; " if method else "") + "cluster bootstrap"
    if g < 2 or not np.isfinite(est):
        return Test(Interval(est if np.isfinite(est) else None, None, None, len(data)), None,
                    None, g, how, dict(extra or {}))  # fmt: skip
    lo, hi, se, kind = _percentile(data, members, statistic, seed, n_resamples)
    if lo is None or se is None:
        return Test(Interval(est, None, None, len(data)), None, None, g, how, dict(extra or {}))
    f, df = small_sample_scale(np.array([len(m) for m in members], dtype=float), CONFIDENCE)
    lo, hi, se = est - f * (est - lo), est + f * (hi - est), se * math.sqrt(g / (g - 1))
    how += (f" ({kind}, {g} clusters), widened by t({df:.1f})/z * sqrt(G/(G-1)) = {f:.2f}; "
            f"p: t({df:.1f}) with the bootstrap SE")  # fmt: skip
    fields = {"se": se, "df": df, "interval": "scaled", "null": null}
    return Test(Interval(est, float(lo), float(hi), len(data)), t_p(est, null, se, df, g),
                mde(se, df=df), g, how, {**dict(extra or {}), **fields})  # fmt: skip


def _percentile(
    data: np.ndarray,
    members: Sequence[np.ndarray],
    statistic: Callable[[np.ndarray], float],
    seed: int,
    n_resamples: int,
) -> tuple[float | None, float | None, float | None, str]:
    """``scipy.stats.bootstrap`` over the cluster indices: the percentile 95% bounds (those
    of the finite resamples where some give no finite statistic), the SE of the finite
    resamples and which interval it is. Not BCa: its jackknife acceleration and bias
    correction misplace the interval of the card's non-smooth statistics (a median over
    language pairs covered 0.83 to 0.90 with BCa in ``docs/calibration.md``)."""
    from scipy import stats as sps

    def stat(idx: np.ndarray) -> float:
        return float(statistic(data[np.concatenate([members[int(k)] for k in idx])]))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = sps.bootstrap((np.arange(len(members)),), stat, vectorized=False,
                            n_resamples=n_resamples, method="percentile",
                            rng=np.random.default_rng(seed))  # fmt: skip
    vals = np.asarray(res.bootstrap_distribution, dtype=float)
    vals = vals[np.isfinite(vals)]
    if len(vals) < 10:
        return None, None, None, "too few finite resamples"
    se = float(vals.std(ddof=1))
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if math.isfinite(lo) and math.isfinite(hi):
        return lo, hi, se, "percentile"
    q = np.quantile(vals, [0.025, 0.975])
    return float(q[0]), float(q[1]), se, "percentile of the finite resamples"


def group_difference_test(
    values: Sequence[float],
    groups: Sequence[Any],
    clusters: Sequence[Any],
    a: Any,
    b: Any,
    *,
    seed: int = SEED,
) -> Test:
    """``mean(values | group a) - mean(values | group b)`` (items of other groups ignored):
    the slope of a regression on the group indicator with its CR2 standard error, the
    t(BM df) 95% interval and t test of H0 "no difference" (a cluster may hold items of both
    groups). A difference in differences is this test on per-item differences of two
    conditions. Undefined when a group has no item. ``seed``: unused (kept for callers)."""
    del seed
    keep = [i for i, x in enumerate(groups) if x in (a, b)]
    y = np.array([float(values[i]) for i in keep])
    ind = np.array([1.0 if groups[i] == a else 0.0 for i in keep])
    codes, g = codes_of([clusters[i] for i in keep], len(keep))
    method = (f"difference of means, {a} - {b}; CR2 (regression on the group), t on the "
              "Bell-McCaffrey df")  # fmt: skip
    if not len(y) or ind.all() or not ind.any() or g < 2:
        est = (
            None
            if not len(y) or ind.all() or not ind.any()
            else float(y[ind == 1].mean() - y[ind == 0].mean())
        )
        return Test(Interval(est, None, None, len(y)), None, None, g, method)
    x = np.column_stack([np.ones(len(y)), ind])
    beta, cov, adj = cr2_ols(y, x, codes, g)
    df = bm_df(x, codes, adj, np.array([0.0, 1.0]))
    est, se = float(beta[1]), float(math.sqrt(max(cov[1, 1], 0.0)))
    half = crit(CONFIDENCE, df) * se
    extra = {"se": se, "df": df, "interval": "t", "n_a": int(ind.sum()),
             "n_b": int(len(ind) - ind.sum())}  # fmt: skip
    return Test(Interval(est, est - half, est + half, len(y)), t_p(est, 0.0, se, df, g),
                mde(se, df=df), g, method, extra)  # fmt: skip
