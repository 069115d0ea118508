"""Confidence intervals and paired tests for accuracies, through ``scipy.stats``.

Every accuracy mechlingo reports is a proportion of n items, and every comparison between two
conditions is paired (the same items under both). Every interval function returns one
:class:`Interval` (``estimate``, ``lo``, ``hi``, ``n``, ``confidence`` and function-specific
``extra``):

* :func:`wilson` -- a proportion with its Wilson score interval (``scipy.stats.binomtest``);
* :func:`paired_gain` -- the mean gain of one condition over another with a paired bootstrap
  interval (BCa, over items), and the relative gain with its own interval;
* :func:`bootstrap_mean` -- the mean of per-item values with a bootstrap interval over items;
* :func:`bootstrap_ratio` -- a ratio of sums over items (a Jaccard overlap of two correct sets);
* :func:`paired_bootstrap` -- any statistic of paired per-item samples (percentile bootstrap);
* :func:`bootstrap_perplexity` and :func:`perplexity_ratio` -- a perplexity over lines and the
  ratio of two perplexities of the same lines (a line keeps its token count).

:func:`mcnemar` is the exact McNemar test of two paired 0/1 outcome vectors; the card's
clustered tests (:class:`Test`) follow below.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import stats as sps

from mechlingo.core.errors import InputError

__all__ = [
    "Interval",
    "Test",
    "correlation_test",
    "holm",
    "mde",
    "mean_test",
    "paired_test",
    "pool_controls",
    "ratio_test",
    "relative_test",
    "bootstrap_mean",
    "bootstrap_perplexity",
    "bootstrap_ratio",
    "mcnemar",
    "paired_bootstrap",
    "paired_gain",
    "perplexity_ratio",
    "wilson",
    "wilson_table",
]

CONFIDENCE = 0.95
N_RESAMPLES = 2000


@dataclass(frozen=True)
class Interval:
    """An estimate over ``n`` items with its ``confidence`` interval ``[lo, hi]``.

    The one vocabulary for every interval mechlingo reports: a proportion (:func:`wilson`), a
    paired gain, a mean, a ratio or a perplexity (the bootstrap functions). ``estimate``,
    ``lo`` and ``hi`` are ``None`` when ``n`` is too small to give them (no items, or one item
    for a bootstrap). ``extra`` holds what a function knows beyond that (``k`` of a Wilson
    interval; ``base``, ``new`` and the ``relative`` gain of :func:`paired_gain`; ``n_tokens``
    of a perplexity); it is written beside the other keys by :meth:`to_json`.
    """

    estimate: float | None
    lo: float | None
    hi: float | None
    n: int
    confidence: float = CONFIDENCE
    extra: Mapping[str, Any] = field(default_factory=dict, hash=False)

    @property
    def defined(self) -> bool:
        """Whether the interval exists (enough items)."""
        return self.lo is not None and self.hi is not None

    def above(self, threshold: float = 0.0) -> bool:
        """Whether the whole interval lies above ``threshold`` (False when undefined)."""
        return self.defined and self.lo > threshold  # type: ignore[operator]

    def below(self, threshold: float = 0.0) -> bool:
        """Whether the whole interval lies below ``threshold`` (False when undefined)."""
        return self.defined and self.hi < threshold  # type: ignore[operator]

    def excludes(self, value: float = 0.0) -> bool:
        """Whether ``value`` lies outside the interval (False when undefined)."""
        return self.above(value) or self.below(value)

    def to_json(self) -> dict[str, Any]:
        """``{"estimate", "lo", "hi", "n", "confidence", **extra}``, JSON-ready (an
        :class:`Interval` in ``extra`` as its own ``to_json``)."""
        out = {"estimate": self.estimate, "lo": self.lo, "hi": self.hi, "n": self.n,
               "confidence": self.confidence}  # fmt: skip
        for k, v in self.extra.items():
            out[k] = v.to_json() if isinstance(v, Interval) else v
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Interval:
        """The inverse of :meth:`to_json` (an extra interval comes back as its dict)."""
        extra = {k: v for k, v in d.items() if k not in _FIELDS}
        return cls(d["estimate"], d["lo"], d["hi"], int(d["n"]),
                   d.get("confidence", CONFIDENCE), extra)  # fmt: skip

    def format(self, digits: int = 3, signed: bool = False) -> str:
        """``"0.833 [0.700, 0.910] (n=48)"``; ``signed`` puts ``+`` on positive numbers."""
        if self.estimate is None:
            return f"n/a (n={self.n})"
        f = f"{{:+.{digits}f}}" if signed else f"{{:.{digits}f}}"
        if not self.defined:
            return f"{f.format(self.estimate)} (n={self.n})"
        return f"{f.format(self.estimate)} [{f.format(self.lo)}, {f.format(self.hi)}] (n={self.n})"

    def __str__(self) -> str:
        return self.format()


_FIELDS = ("estimate", "lo", "hi", "n", "confidence")


def wilson(k: int, n: int, confidence: float = CONFIDENCE) -> Interval:
    """The share ``k / n`` of ``k`` successes in ``n`` items with its Wilson score interval;
    ``extra = {"k": k}``. ``estimate``, ``lo``, ``hi`` are ``None`` when ``n`` is 0."""
    k, n = int(k), int(n)
    if n == 0:
        return Interval(None, None, None, 0, confidence, {"k": 0})
    ci = sps.binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
    return Interval(k / n, float(ci.low), float(ci.high), n, confidence, {"k": k})


def wilson_table(
    outcomes: dict[str, dict[str, Sequence[bool]]],
) -> dict[str, dict[str, Interval]]:
    """Wilson intervals for ``{condition: {lang: [correct, ...]}}``."""
    return {
        c: {lg: wilson(sum(map(bool, v)), len(v)) for lg, v in by_lang.items()}
        for c, by_lang in outcomes.items()
    }


def mcnemar(base: Sequence[bool], new: Sequence[bool]) -> dict[str, Any]:
    """Exact McNemar test of paired outcomes: ``fixed`` (base wrong, new right), ``broken``
    (base right, new wrong) and the two-sided p-value of a binomial test of ``fixed`` out of
    ``fixed + broken`` at 1/2 (1.0 when there are no discordant pairs)."""
    if len(base) != len(new):
        raise InputError(f"paired outcomes of different lengths: {len(base)} and {len(new)}")
    fixed = sum(1 for a, b in zip(base, new, strict=True) if not a and b)
    broken = sum(1 for a, b in zip(base, new, strict=True) if a and not b)
    p = 1.0 if fixed + broken == 0 else float(sps.binomtest(fixed, fixed + broken).pvalue)
    return {"fixed": fixed, "broken": broken, "n": len(base), "p": p}


def _interval(result: Any) -> tuple[float | None, float | None]:
    lo, hi = float(result.confidence_interval.low), float(result.confidence_interval.high)
    return (lo if math.isfinite(lo) else None, hi if math.isfinite(hi) else None)


def _mean_interval(
    d: np.ndarray, confidence: float, rng: np.random.Generator
) -> tuple[float | None, float | None]:
    """BCa bootstrap interval of a mean; the percentile interval where BCa is undefined (a
    sample whose resamples are nearly all equal, e.g. a handful of discordant pairs)."""

    kw = {"confidence_level": confidence, "n_resamples": N_RESAMPLES, "random_state": rng}
    with warnings.catch_warnings():
        warnings.simplefilter("error", sps.DegenerateDataWarning)
        try:
            lo, hi = _interval(sps.bootstrap((d,), np.mean, method="BCa", **kw))
        except sps.DegenerateDataWarning:
            lo, hi = None, None
    if lo is None or hi is None:
        lo, hi = _interval(sps.bootstrap((d,), np.mean, method="percentile", **kw))
    return lo, hi


def paired_gain(
    base: Sequence[bool | float],
    new: Sequence[bool | float],
    *,
    seed: int = 0,
    confidence: float = CONFIDENCE,
) -> Interval:
    """Mean gain ``mean(new) - mean(base)`` over ``n`` paired items with a bootstrap interval.
    ``extra``: the two means ``base`` and ``new``, and the relative gain
    ``gain / mean(base)`` as its own :class:`Interval` under ``relative`` (``None`` when the
    base mean is 0, where a relative gain is undefined). No items: every number ``None``.

    The bootstrap resamples items (pairs) with ``scipy.stats.bootstrap`` (BCa; percentile
    when every resample gives the same value, e.g. no discordant pairs)."""
    a = np.asarray(base, dtype=float)
    b = np.asarray(new, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise InputError(f"paired outcomes of different shapes: {a.shape} and {b.shape}")
    n = len(a)
    if n == 0:
        return Interval(
            None, None, None, 0, confidence, {"base": None, "new": None, "relative": None}
        )
    gain = float(b.mean() - a.mean())
    rng = np.random.default_rng(seed)
    d = b - a
    if np.all(d == d[0]):
        lo = hi = float(d[0])
    else:
        lo, hi = _mean_interval(d, confidence, rng)
    relative = None
    if a.mean() > 0:

        def rel(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
            mx = x.mean(axis=axis)
            return np.where(mx > 0, (y.mean(axis=axis) - mx) / np.where(mx > 0, mx, 1), np.nan)

        r_lo: float | None
        r_hi: float | None
        if np.all(d == 0):
            r_lo = r_hi = 0.0
        else:
            # resamples whose base mean is 0 have no relative gain (NaN): scipy warns and
            # gives NaN bounds, which come back as None (an undefined interval, said so)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", sps.DegenerateDataWarning)
                res = sps.bootstrap((a, b), rel, paired=True, vectorized=True,
                                    confidence_level=confidence, n_resamples=N_RESAMPLES,
                                    method="percentile", random_state=rng)  # fmt: skip
            r_lo, r_hi = _interval(res)
        relative = Interval(float((b.mean() - a.mean()) / a.mean()), r_lo, r_hi, n, confidence)
    extra = {"base": float(a.mean()), "new": float(b.mean()), "relative": relative}
    return Interval(gain, lo, hi, n, confidence, extra)


def bootstrap_mean(
    values: Sequence[float], *, seed: int = 0, confidence: float = CONFIDENCE
) -> Interval:
    """The mean of ``n`` per-item values with a bootstrap interval over items
    (``scipy.stats.bootstrap``, BCa; ``lo == hi == estimate`` when every value is the same,
    ``None`` everywhere for no items; the percentile interval where BCa is undefined). The
    items are the independent units (sentences), so the interval says how much the mean
    would move on another sample of sentences."""
    x = np.asarray(values, dtype=float)
    if x.ndim != 1:
        raise InputError(f"bootstrap_mean takes a 1-D sequence, got shape {x.shape}")
    n = len(x)
    if n == 0:
        return Interval(None, None, None, 0, confidence)
    m = float(x.mean())
    if np.all(x == x[0]):
        return Interval(m, m, m, n, confidence)
    lo, hi = _mean_interval(x, confidence, np.random.default_rng(seed))
    return Interval(m, lo, hi, n, confidence)


def _ratio(num: np.ndarray, den: np.ndarray, axis: int = -1) -> np.ndarray:
    d = den.sum(axis=axis)
    return np.where(d > 0, num.sum(axis=axis) / np.where(d > 0, d, 1), 0.0)


def bootstrap_ratio(
    num: Sequence[float],
    den: Sequence[float],
    *,
    seed: int = 0,
    confidence: float = CONFIDENCE,
) -> Interval:
    """``sum(num) / sum(den)`` over ``n`` items (0 when ``sum(den)`` is 0) with a paired
    percentile bootstrap interval over items (an item keeps its numerator and denominator;
    no bounds for one item, none at all for no items). A Jaccard overlap of two sets over a
    common universe is ``num = in both``, ``den = in either``."""
    a, b = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise InputError(f"need matching 1-D numerators and denominators, got {a.shape}, {b.shape}")
    n = len(a)
    if n == 0:
        return Interval(None, None, None, 0, confidence)
    value = float(_ratio(a, b))
    if n < 2 or (np.all(a == a[0]) and np.all(b == b[0])):
        bound = value if n > 1 else None
        return Interval(value, bound, bound, n, confidence)
    res = sps.bootstrap((a, b), _ratio, paired=True, vectorized=True, confidence_level=confidence,
                        n_resamples=N_RESAMPLES, method="percentile",
                        random_state=np.random.default_rng(seed))  # fmt: skip
    lo, hi = _interval(res)
    return Interval(value, lo, hi, n, confidence)


def paired_bootstrap(
    samples: Sequence[Sequence[float] | np.ndarray],
    statistic: Callable[..., np.ndarray],
    *,
    n_resamples: int = N_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> Interval:
    """``statistic(*samples, axis=-1)`` over paired items (item ``i`` of every sample is one
    unit, resampled together) with a percentile bootstrap interval (``scipy.stats.bootstrap``,
    ``paired=True``, ``vectorized=True``; ``statistic`` must take ``axis``).

    The estimate is the statistic of the full samples; ``lo``/``hi`` are ``None`` for fewer
    than two items, and both equal the estimate when every sample is constant or every
    resample gives the same value (a degenerate sample has no spread to resample). ``n`` is
    the number of items.

    Raises:
        InputError: no sample, or samples that are not 1-D of one length.
    """
    arrays = tuple(np.asarray(x, dtype=float) for x in samples)
    if not arrays or any(a.ndim != 1 or a.shape != arrays[0].shape for a in arrays):
        raise InputError(f"need 1-D samples of one length, got {[a.shape for a in arrays]}")
    n = len(arrays[0])
    if n == 0:
        return Interval(None, None, None, 0, confidence)
    point = float(statistic(*arrays, axis=-1))
    if n < 2:
        return Interval(point, None, None, n, confidence)
    if all(np.all(a == a[0]) for a in arrays):
        return Interval(point, point, point, n, confidence)
    res = sps.bootstrap(arrays, statistic, paired=True, vectorized=True, n_resamples=n_resamples,
                        confidence_level=confidence, method="percentile",
                        rng=np.random.default_rng(seed))  # fmt: skip
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if not (math.isfinite(lo) and math.isfinite(hi)):  # every resample equal
        return Interval(point, point, point, n, confidence)
    return Interval(point, lo, hi, n, confidence)


def _ppl(nll: np.ndarray, count: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.exp(nll.sum(axis=axis) / count.sum(axis=axis))


def bootstrap_perplexity(
    nll: Sequence[float],
    counts: Sequence[int],
    *,
    seed: int = 0,
    confidence: float = CONFIDENCE,
) -> Interval:
    """The perplexity ``exp(sum(nll) / sum(counts))`` of ``n`` lines with summed next-token
    NLL ``nll[i]`` over ``counts[i]`` tokens, and a percentile bootstrap interval over lines
    (``scipy.stats.bootstrap``, lines resampled with their token counts; no bounds for one
    line). ``extra = {"n_tokens": sum(counts)}``."""
    a = np.asarray(nll, dtype=float)
    c = np.asarray(counts, dtype=float)
    if a.shape != c.shape or a.ndim != 1 or len(a) == 0:
        raise InputError(f"need matching non-empty 1-D nll and counts, got {a.shape}, {c.shape}")
    ppl, extra = float(_ppl(a, c)), {"n_tokens": int(c.sum())}
    if len(a) < 2:
        return Interval(ppl, None, None, len(a), confidence, extra)
    res = sps.bootstrap((a, c), _ppl, paired=True, vectorized=True, confidence_level=confidence,
                        n_resamples=N_RESAMPLES, method="percentile",
                        random_state=np.random.default_rng(seed))  # fmt: skip
    lo, hi = _interval(res)
    return Interval(ppl, lo, hi, len(a), confidence, extra)


def perplexity_ratio(
    nll_base: Sequence[float],
    nll_new: Sequence[float],
    counts: Sequence[int],
    *,
    seed: int = 0,
    confidence: float = CONFIDENCE,
) -> Interval:
    """The perplexity of the same ``n`` lines under a new condition divided by their
    perplexity under the base condition (1 = no change; 2 = twice as perplexed), with a
    paired percentile bootstrap interval over lines (no bounds for one line)."""
    a, b = np.asarray(nll_base, dtype=float), np.asarray(nll_new, dtype=float)
    c = np.asarray(counts, dtype=float)
    if not (a.shape == b.shape == c.shape) or a.ndim != 1 or len(a) == 0:
        raise InputError(f"need matching non-empty 1-D inputs, got {a.shape}, {b.shape}, {c.shape}")

    def ratio(x: np.ndarray, y: np.ndarray, n: np.ndarray, axis: int = -1) -> np.ndarray:
        return _ppl(y, n, axis) / _ppl(x, n, axis)

    est = float(ratio(a, b, c))
    if len(a) < 2:
        return Interval(est, None, None, len(a), confidence)
    res = sps.bootstrap((a, b, c), ratio, paired=True, vectorized=True,
                        confidence_level=confidence, n_resamples=N_RESAMPLES,
                        method="percentile", random_state=np.random.default_rng(seed))  # fmt: skip
    lo, hi = _interval(res)
    return Interval(est, lo, hi, len(a), confidence)


# --------------------------------------------------------------------------------------
# The card's statistics (issue 32): clustered intervals, exact paired p-values, Holm, MDE
# --------------------------------------------------------------------------------------

#: Sign-flip permutations of the Monte Carlo p-value (the exact enumeration is used up to
#: :data:`EXACT_CLUSTERS` informative clusters, or when all clusters weigh the same).
N_PERMUTATIONS = 9999
EXACT_CLUSTERS = 16
_Z = float(sps.norm.ppf(0.975))


@dataclass(frozen=True)
class Test:
    """One estimate with its clustered 95% interval, a p-value and the minimum detectable effect.

    ``estimate``: the point estimate and its interval over ``estimate.n`` items. ``p``: the
    two-sided p-value of H0 "the effect equals the constructor's ``null``" (``None`` when it
    cannot be computed). ``mde``: the smallest |effect - null| that a two-sided test at 0.05
    detects with 80% power, from the clustered standard error. ``n_clusters``: the independent
    units (facts, sentences) behind the interval. ``method``: the procedures in words.
    ``extra``: constructor-specific numbers (``fixed``, ``broken``, ``p_mcnemar``,
    ``relative``, ``base``, ``new``, ``null``, ``se``).
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


def mde(se: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """The minimum detectable effect ``(z_{1-alpha/2} + z_{power}) * se``: the smallest
    true |effect| that a two-sided z test at level ``alpha`` finds with probability ``power``
    when the estimate's standard error is ``se``."""
    return float((sps.norm.ppf(1 - alpha / 2) + sps.norm.ppf(power)) * se)


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values, in the input order (``None`` stays ``None`` and
    does not count in the family): the i-th smallest of m p-values becomes
    ``max_{j<=i} min(1, (m - j + 1) p_(j))``, as ``statsmodels``' ``multipletests(method="holm")``."""
    idx = [i for i, p in enumerate(pvalues) if p is not None]
    out: list[float | None] = [None] * len(pvalues)
    m = len(idx)
    running = 0.0
    for rank, i in enumerate(sorted(idx, key=lambda i: pvalues[i])):  # type: ignore[arg-type,return-value]
        running = max(running, min(1.0, (m - rank) * float(pvalues[i])))  # type: ignore[arg-type]
        out[i] = running
    return out


def pool_controls(controls: Sequence[Sequence[float]]) -> list[float]:
    """One control outcome per item: the mean over control seeds of each item's outcome
    (``controls[seed][item]``). Pairing this with the baseline counts every item once, where
    stacking the seeds would repeat each baseline outcome once per seed.

    Raises:
        InputError: no seed, or seeds of different lengths.
    """
    arr = [np.asarray(c, dtype=float) for c in controls]
    if not arr or any(a.ndim != 1 or a.shape != arr[0].shape for a in arr):
        raise InputError(f"need control seeds of one length, got {[a.shape for a in arr]}")
    return [float(x) for x in np.mean(np.stack(arr), axis=0)]


def _codes(clusters: Sequence[Any] | None, n: int) -> tuple[np.ndarray, int]:
    """Integer cluster codes ``0..G-1`` of ``n`` items (each item its own with ``None``)."""
    if clusters is None:
        return np.arange(n), n
    if len(clusters) != n:
        raise InputError(f"{len(clusters)} cluster ids for {n} items: give one per item")
    seen: dict[Any, int] = {}
    codes = np.array([seen.setdefault(c, len(seen)) for c in clusters], dtype=int)
    return codes, len(seen)


def _sums(values: np.ndarray, codes: np.ndarray, g: int) -> np.ndarray:
    return np.bincount(codes, weights=values, minlength=g)


def _robust_se(s: np.ndarray, cnt: np.ndarray) -> float | None:
    """The cluster-robust (CR1) standard error of ``sum(s) / sum(cnt)``: the influence of
    each cluster ``s_g - cnt_g * mean`` squared, summed, times ``G / (G - 1)``."""
    g, n = len(s), float(cnt.sum())
    if g < 2:
        return None
    m = s.sum() / n
    return float(math.sqrt(g / (g - 1) * float(((s - cnt * m) ** 2).sum())) / n)


def _boot_mean(s: np.ndarray, cnt: np.ndarray, seed: int, n_resamples: int) -> tuple:
    """Percentile 95% interval of ``sum(s) / sum(cnt)`` by resampling clusters."""
    g = len(s)
    if g < 2:
        return None, None
    rng = np.random.default_rng(seed)
    w = rng.multinomial(g, np.full(g, 1.0 / g), size=n_resamples).astype(float)
    est = (w @ s) / (w @ cnt)
    lo, hi = np.quantile(est, [(1 - CONFIDENCE) / 2, (1 + CONFIDENCE) / 2])
    return float(lo), float(hi)


def _sign_flip_p(d: np.ndarray, seed: int, n_perm: int = N_PERMUTATIONS) -> tuple[float, str]:
    """Two-sided p of H0 "the cluster totals ``d`` are symmetric about 0" (each cluster's
    sign flipped): exact (binomial) when every informative cluster weighs the same, exact
    enumeration up to :data:`EXACT_CLUSTERS` of them, Monte Carlo ``(1 + hits) / (1 + n)``."""
    scale = max(1.0, float(np.abs(d).max(initial=0.0)))
    d = d[np.abs(d) > 1e-12 * scale]
    if len(d) == 0:
        return 1.0, "exact"
    t = abs(float(d.sum()))
    tol = 1e-9 * scale
    if np.allclose(np.abs(d), abs(d[0]), rtol=1e-9, atol=0):
        return float(sps.binomtest(int((d > 0).sum()), len(d)).pvalue), "exact"
    if len(d) <= EXACT_CLUSTERS:
        signs = 1 - 2 * ((np.arange(2 ** len(d))[:, None] >> np.arange(len(d))) & 1)
        return float(np.mean(np.abs(signs @ d) >= t - tol)), "exact"
    rng = np.random.default_rng(seed)
    hits = 0
    for start in range(0, n_perm, 1000):
        signs = rng.choice(np.array([-1.0, 1.0]), size=(min(1000, n_perm - start), len(d)))
        hits += int((np.abs(signs @ d) >= t - tol).sum())
    return (1 + hits) / (1 + n_perm), "Monte Carlo"


def _binary(*arrays: np.ndarray) -> bool:
    return all(bool(np.all((a == 0) | (a == 1))) for a in arrays)


def _t_p(m: float, null: float, se: float | None, g: int) -> float | None:
    """Two-sided p of the cluster-robust t test of ``mean == null`` on ``g - 1`` df."""
    if se is None or g < 2:
        return None
    if se == 0:
        return 1.0 if m == null else 0.0
    return float(2 * sps.t.sf(abs(m - null) / se, g - 1))


def _mean_core(
    d: np.ndarray,
    codes: np.ndarray,
    g: int,
    null: float,
    seed: int,
    n_resamples: int,
    binary: bool,
    symmetric: bool,
) -> tuple[Interval, float | None, float | None, str, float | None]:
    """The clustered mean of ``d``: interval, p (vs ``null``), MDE, p's method and the SE.

    ``symmetric``: H0 makes each cluster's total symmetric about ``null`` (a paired
    difference against 0, a 0/1 share against 1/2): ``p`` is the sign-flip permutation
    test; otherwise the cluster-robust t test. When ``d`` does not vary (every item the
    same), the bootstrap has no spread; for 0/1 outcomes the interval is then widened to the
    exact 95% bound of the change rate of ``g`` clusters with no change seen
    (``1 - 0.025^(1/g)``), so "nothing changed on 24 facts" reads as "a change up to 14
    points is not excluded" and not as a proof of 0."""
    n = len(d)
    cnt = _sums(np.ones(n), codes, g)
    s = _sums(d, codes, g)
    m = float(d.mean())
    se = _robust_se(s, cnt)
    if np.all(d == d[0]) and binary and g >= 1:
        u = 1 - 0.025 ** (1 / g)
        lo, hi = m - u, m + u
        se = u / _Z
    else:
        lo, hi = _boot_mean(s, cnt, seed, n_resamples)
        if se == 0.0 and lo is not None:
            lo = hi = m
    if symmetric:
        p, how = _sign_flip_p(s - cnt * null, seed)
        how = f"sign-flip permutation ({how})"
    else:
        p, how = _t_p(m, null, se, g), "cluster-robust t"
    return Interval(m, lo, hi, n), p, None if se is None else mde(se), how, se


def _log_ratio(a: np.ndarray, b: np.ndarray, codes: np.ndarray, g: int) -> Interval | None:
    """``mean(b) / mean(a) - 1`` with a 95% interval from the clustered log ratio (delta
    method, CR1); defined whenever ``mean(a) > 0``. When ``mean(b)`` is 0 the log uses half
    an item of ``b`` (the estimate stays -1)."""
    n = len(a)
    ma, mb = float(a.mean()), float(b.mean())
    if n == 0 or ma <= 0:
        return None
    cnt = _sums(np.ones(n), codes, g)
    sa, sb = _sums(a, codes, g), _sums(b, codes, g)
    mb_eff = mb if mb > 0 else 0.5 / n
    est = mb / ma - 1
    if g < 2:
        return Interval(est, None, None, n)
    u = (sb - cnt * mb) / (n * mb_eff) - (sa - cnt * ma) / (n * ma)
    se = math.sqrt(g / (g - 1) * float((u**2).sum()))
    c = math.log(mb_eff / ma)
    lo, hi = math.exp(c - _Z * se) - 1, math.exp(c + _Z * se) - 1
    return Interval(est, -1.0 if mb == 0 else lo, hi, n)


def paired_test(
    base: Sequence[float],
    new: Sequence[float],
    clusters: Sequence[Any] | None = None,
    *,
    null: float = 0.0,
    seed: int = 0,
    n_resamples: int = N_RESAMPLES,
) -> Test:
    """The paired gain ``mean(new - base)`` of two conditions on the same items.

    Args:
        base, new: per-item outcomes (0/1 or float), item ``i`` of both is one pair.
        clusters: per-item cluster id (the fact id of a (fact, language) item; a sentence
            index); items of one cluster are resampled and sign-flipped together. ``None``:
            every item its own cluster.
        null: the gain of H0 (``p`` tests ``mean(new - base) == null``).

    Returns:
        A :class:`Test`: the gain with a cluster-bootstrap percentile 95% interval (for 0/1
        outcomes that never change: the exact bound of the change rate); ``p`` from the
        cluster sign-flip permutation test of ``new - base - null`` (equal to the exact
        McNemar p when every item is its own cluster, outcomes are 0/1 and ``null`` is 0);
        ``mde`` from the cluster-robust SE. With ``null`` other than 0 (H0 does not make the
        differences symmetric) ``p`` is the cluster-robust t test. ``extra``: ``base``/``new`` means, ``null``,
        ``se``, ``relative`` (``mean(new) / mean(base) - 1`` as :meth:`Interval.to_json`,
        its interval from the clustered log ratio; ``None`` when ``mean(base)`` is 0) and for
        0/1 outcomes ``fixed``, ``broken`` and ``p_mcnemar`` (unclustered).

    Raises:
        InputError: outcomes of different lengths, or no items.
    """
    a, b = np.asarray(base, dtype=float), np.asarray(new, dtype=float)
    if a.shape != b.shape or a.ndim != 1 or len(a) == 0:
        raise InputError(f"need non-empty paired outcomes of one length, got {a.shape}, {b.shape}")
    codes, g = _codes(clusters, len(a))
    binary = _binary(a, b)
    diff = b - a
    iv, p, md, how, se = _mean_core(diff, codes, g, null, seed, n_resamples,
                                    _binary(np.abs(diff)), null == 0)  # fmt: skip
    rel = _log_ratio(a, b, codes, g)
    extra: dict[str, Any] = {"base": float(a.mean()), "new": float(b.mean()), "null": null,
                             "se": se, "relative": None if rel is None else rel.to_json()}  # fmt: skip
    if binary:
        mc = mcnemar(list(a.astype(bool)), list(b.astype(bool)))
        extra |= {"fixed": mc["fixed"], "broken": mc["broken"], "p_mcnemar": mc["p"]}
    method = (f"p: cluster {how}, {g} clusters; interval: cluster bootstrap (percentile); "
              "relative: clustered log ratio (delta method)")  # fmt: skip
    return Test(iv, p, md, g, method, extra)


def relative_test(
    base: Sequence[float],
    new: Sequence[float],
    clusters: Sequence[Any] | None = None,
    *,
    null: float = 0.0,
    seed: int = 0,
) -> Test:
    """The relative gain ``mean(new) / mean(base) - 1`` of paired items: the interval of the
    clustered log ratio (defined whenever ``mean(base) > 0``; undefined, with ``p`` None,
    when it is 0), ``p`` of H0 "relative gain == ``null``" by the z test on the same log
    ratio (so ``p`` and the interval agree; ``None`` when every new outcome is 0, where the
    log ratio is -inf); ``mde`` on the relative scale (the log-ratio SE times ``1 +
    estimate``).
    ``extra`` holds the points reading (:func:`paired_test`'s JSON) under ``"points"``.

    Raises:
        InputError: as :func:`paired_test`.
    """
    pts = paired_test(base, new, clusters, seed=seed)
    a = np.asarray(base, dtype=float)
    rel = pts.extra["relative"]
    if rel is None:
        iv = Interval(None, None, None, len(a))
        return Test(iv, None, None, pts.n_clusters, "relative gain: baseline 0 (undefined)",
                    {"points": pts.to_json(), "null": null})  # fmt: skip
    iv = Interval.from_json(rel)
    p = md = None
    if iv.defined and rel["estimate"] > -1:
        se_log = (math.log1p(iv.hi) - math.log1p(iv.estimate)) / _Z  # type: ignore[arg-type]
        md = mde(se_log) * (1 + iv.estimate)  # type: ignore[operator]
        z = (math.log1p(iv.estimate) - math.log1p(null)) / se_log if se_log > 0 else math.inf  # type: ignore[arg-type]
        p = 1.0 if z == 0 else float(2 * sps.norm.sf(abs(z)))
    method = "relative gain: clustered log ratio (delta method); p: z test on the log ratio"
    return Test(iv, p, md, pts.n_clusters, method, {"points": pts.to_json(), "null": null})


def ratio_test(
    num: Sequence[float],
    den: Sequence[float],
    clusters: Sequence[Any] | None = None,
    *,
    null: float = 1.0,
) -> Test:
    """A ratio of sums ``sum(num) / sum(den)`` over items (e.g. the share of one gain kept
    by another on the same items: ``num = new_held_out - base``, ``den = new_all - base``)
    with a 95% Wald interval from the cluster-robust (CR1) delta-method standard error and
    the t test of H0 "ratio == ``null``" on ``G - 1`` degrees of freedom. Undefined (``None``
    estimate) when ``sum(den) <= 0``: the ratio of a gain that does not exist says nothing.

    Raises:
        InputError: inputs of different lengths or none.
    """
    a, b = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    if a.shape != b.shape or a.ndim != 1 or len(a) == 0:
        raise InputError(f"need non-empty paired 1-D inputs, got {a.shape}, {b.shape}")
    codes, g = _codes(clusters, len(a))
    method = f"ratio of sums; cluster-robust delta method (CR1, {g} clusters); p: t test"
    if b.sum() <= 0:
        return Test(Interval(None, None, None, len(a)), None, None, g, method, {"null": null})
    r = float(a.sum() / b.sum())
    if g < 2:
        return Test(Interval(r, None, None, len(a)), None, None, g, method, {"null": null})
    u = (_sums(a, codes, g) - r * _sums(b, codes, g)) / float(b.sum())
    se = math.sqrt(g / (g - 1) * float((u**2).sum()))
    half = float(sps.t.ppf(0.975, g - 1)) * se
    iv = Interval(r, r - half, r + half, len(a))
    return Test(iv, _t_p(r, null, se, g), mde(se), g, method, {"null": null, "se": se})


def mean_test(
    values: Sequence[float],
    clusters: Sequence[Any] | None = None,
    *,
    null: float = 0.0,
    seed: int = 0,
    n_resamples: int = N_RESAMPLES,
) -> Test:
    """The mean of per-item values (a 0/1 share, a per-sentence distance) against ``null``
    (0.5 for "a majority"): a cluster-bootstrap percentile 95% interval, ``p`` from the
    cluster sign-flip test of ``values - null`` where H0 makes it symmetric (``null`` 0, or a
    0/1 share against 0.5: for unclustered items the exact binomial test), else the
    cluster-robust t test; ``mde`` from the cluster-robust SE.

    Raises:
        InputError: no values or not 1-D.
    """
    x = np.asarray(values, dtype=float)
    if x.ndim != 1 or len(x) == 0:
        raise InputError(f"mean_test needs a non-empty 1-D sequence, got shape {x.shape}")
    codes, g = _codes(clusters, len(x))
    binary = _binary(x)
    symmetric = null == 0 or (binary and null == 0.5)
    iv, p, md, how, se = _mean_core(x, codes, g, null, seed, n_resamples, binary, symmetric)
    if binary and iv.defined:  # a share stays within [0, 1]
        iv = Interval(iv.estimate, max(0.0, iv.lo), min(1.0, iv.hi), iv.n)  # type: ignore[type-var]
    method = f"p: cluster {how}, {g} clusters; interval: cluster bootstrap (percentile)"
    return Test(iv, p, md, g, method, {"null": null, "se": se})


def correlation_test(
    x: Sequence[float],
    y: Sequence[float],
    clusters: Sequence[Any] | None = None,
    *,
    seed: int = 0,
    n_resamples: int = N_RESAMPLES,
) -> Test:
    """Spearman's rank correlation of paired ``x`` and ``y`` with a cluster-bootstrap
    percentile 95% interval; ``p`` (H0: no correlation) from the t approximation
    ``r sqrt((G - 2) / (1 - r^2))`` on ``G - 2`` degrees of freedom with ``G`` the number of
    clusters (without clusters: ``scipy.stats.spearmanr``'s p); ``mde`` from the bootstrap SE.

    Raises:
        InputError: inputs of different lengths or fewer than 3 items.
    """
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if a.shape != b.shape or a.ndim != 1 or len(a) < 3:
        raise InputError(f"need paired 1-D samples of >= 3 items, got {a.shape}, {b.shape}")
    codes, g = _codes(clusters, len(a))
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
