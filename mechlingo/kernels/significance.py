"""Confidence intervals and paired tests for accuracies, through ``scipy.stats``.

Every accuracy mechlingo reports is a proportion of n items, and every comparison between two
conditions is paired (the same items under both). Every interval function returns one
:class:`Interval` (``estimate``, ``lo``, ``hi``, ``n``, ``confidence``, ``extra``):
:func:`wilson` (a proportion, Wilson score), :func:`paired_gain` (a mean gain with a paired
BCa bootstrap, and the relative gain), :func:`bootstrap_mean`, :func:`bootstrap_ratio` (a
ratio of sums, e.g. a Jaccard overlap), :func:`paired_bootstrap` (any statistic of paired
samples, percentile), :func:`bootstrap_perplexity` and :func:`perplexity_ratio`.
:func:`mcnemar` is the exact McNemar test of two paired 0/1 outcome vectors. The claims card's
clustered tests live in :mod:`mechlingo.card.clustered_tests`."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mechlingo.core.defaults import SEED
from mechlingo.core.errors import InputError

__all__ = [
    "Interval",
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
    from scipy import stats as sps

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
    from scipy import stats as sps

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
    from scipy import stats as sps

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
    seed: int = SEED,
    confidence: float = CONFIDENCE,
) -> Interval:
    """Mean gain ``mean(new) - mean(base)`` over ``n`` paired items with a bootstrap interval.
    ``extra``: the two means ``base`` and ``new``, and the relative gain
    ``gain / mean(base)`` as its own :class:`Interval` under ``relative`` (``None`` when the
    base mean is 0, where a relative gain is undefined). No items: every number ``None``.

    The bootstrap resamples items (pairs) with ``scipy.stats.bootstrap`` (BCa; percentile
    when every resample gives the same value, e.g. no discordant pairs)."""
    from scipy import stats as sps

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
    values: Sequence[float], *, seed: int = SEED, confidence: float = CONFIDENCE
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
    seed: int = SEED,
    confidence: float = CONFIDENCE,
) -> Interval:
    """``sum(num) / sum(den)`` over ``n`` items (0 when ``sum(den)`` is 0) with a paired
    percentile bootstrap interval over items (an item keeps its numerator and denominator;
    no bounds for one item, none at all for no items). A Jaccard overlap of two sets over a
    common universe is ``num = in both``, ``den = in either``."""
    from scipy import stats as sps

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
    seed: int = SEED,
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
    from scipy import stats as sps

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
    seed: int = SEED,
    confidence: float = CONFIDENCE,
) -> Interval:
    """The perplexity ``exp(sum(nll) / sum(counts))`` of ``n`` lines with summed next-token
    NLL ``nll[i]`` over ``counts[i]`` tokens, and a percentile bootstrap interval over lines
    (``scipy.stats.bootstrap``, lines resampled with their token counts; no bounds for one
    line). ``extra = {"n_tokens": sum(counts)}``."""
    from scipy import stats as sps

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
    seed: int = SEED,
    confidence: float = CONFIDENCE,
) -> Interval:
    """The perplexity of the same ``n`` lines under a new condition divided by their
    perplexity under the base condition (1 = no change; 2 = twice as perplexed), with a
    paired percentile bootstrap interval over lines (no bounds for one line)."""
    from scipy import stats as sps

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
