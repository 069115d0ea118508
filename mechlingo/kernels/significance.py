"""Confidence intervals and paired tests for accuracies, through ``scipy.stats``.

Every accuracy mechlingo reports is a proportion of n items, and every comparison between two
conditions is paired (the same items under both). So:

* :func:`wilson` -- the Wilson score 95% interval of a proportion
  (``scipy.stats.binomtest(...).proportion_ci(method="wilson")``);
* :func:`mcnemar` -- the exact McNemar test of two paired outcome vectors: a two-sided
  binomial test of the *fixed* (wrong -> right) against the *broken* (right -> wrong) items;
* :func:`paired_gain` -- the mean gain of one condition over another with a paired bootstrap
  95% interval (``scipy.stats.bootstrap``, BCa, over items), and the relative gain with its
  own interval where the baseline is above 0;
* :func:`bootstrap_mean` -- the mean of per-item values (a per-sentence distance, a
  per-query retrieval hit rate) with a bootstrap 95% interval over items;
* :func:`bootstrap_ratio` -- a ratio of sums over items (``sum(num) / sum(den)``, e.g. a
  Jaccard overlap of two correct sets) with a percentile bootstrap interval over items;
* :func:`paired_bootstrap` -- any statistic of paired per-item samples (a difference of
  means, a relative change of perplexity) with a percentile bootstrap interval over items, as
  an :class:`Interval`;
* :func:`bootstrap_perplexity` and :func:`perplexity_ratio` -- a perplexity
  ``exp(sum NLL / sum tokens)`` over lines, and the ratio of two perplexities of the same lines,
  with percentile bootstrap intervals over lines (a line keeps its token count).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats as sps

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

    The one vocabulary for every interval mechlingo reports: a proportion (Wilson), a paired
    gain or a mean (bootstrap). ``estimate``, ``lo`` and ``hi`` are ``None`` when ``n`` is too
    small to give them (no items, or one item for a bootstrap).
    """

    estimate: float | None
    lo: float | None
    hi: float | None
    n: int
    confidence: float = CONFIDENCE

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
        """``{"estimate", "lo", "hi", "n", "confidence"}``, JSON-ready."""
        return {"estimate": self.estimate, "lo": self.lo, "hi": self.hi, "n": self.n,
                "confidence": self.confidence}  # fmt: skip

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Interval:
        """The inverse of :meth:`to_json`."""
        return cls(d["estimate"], d["lo"], d["hi"], int(d["n"]), d.get("confidence", CONFIDENCE))

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


def wilson(k: int, n: int, confidence: float = CONFIDENCE) -> dict[str, Any]:
    """``{"k", "n", "p", "lo", "hi"}``: ``k`` successes of ``n`` with the Wilson score
    interval (``p``, ``lo``, ``hi`` are ``None`` when ``n`` is 0)."""
    k, n = int(k), int(n)
    if n == 0:
        return {"k": 0, "n": 0, "p": None, "lo": None, "hi": None}
    ci = sps.binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
    return {"k": k, "n": n, "p": k / n, "lo": float(ci.low), "hi": float(ci.high)}


def wilson_table(
    outcomes: dict[str, dict[str, Sequence[bool]]],
) -> dict[str, dict[str, dict[str, Any]]]:
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
) -> dict[str, Any]:
    """Mean gain ``mean(new) - mean(base)`` over paired items with a bootstrap interval, and
    the relative gain ``gain / mean(base)`` with its own interval (``None`` when the base
    mean is 0, where a relative gain is undefined).

    The bootstrap resamples items (pairs) with ``scipy.stats.bootstrap`` (BCa; percentile
    when every resample gives the same value, e.g. no discordant pairs)."""
    a = np.asarray(base, dtype=float)
    b = np.asarray(new, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise InputError(f"paired outcomes of different shapes: {a.shape} and {b.shape}")
    n = len(a)
    out: dict[str, Any] = {"n": n, "base": None, "new": None, "gain": None, "lo": None}
    out |= {"hi": None, "relative": None, "relative_lo": None, "relative_hi": None}
    if n == 0:
        return out
    out |= {"base": float(a.mean()), "new": float(b.mean()), "gain": float(b.mean() - a.mean())}
    rng = np.random.default_rng(seed)
    d = b - a
    if np.all(d == d[0]):
        out["lo"] = out["hi"] = float(d[0])
    else:
        out["lo"], out["hi"] = _mean_interval(d, confidence, rng)
    if a.mean() > 0:

        def rel(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
            mx = x.mean(axis=axis)
            return np.where(mx > 0, (y.mean(axis=axis) - mx) / np.where(mx > 0, mx, 1), np.nan)

        out["relative"] = float((b.mean() - a.mean()) / a.mean())
        if np.all(d == 0):
            out["relative_lo"] = out["relative_hi"] = 0.0
        else:
            res = sps.bootstrap((a, b), rel, paired=True, vectorized=True,
                                confidence_level=confidence, n_resamples=N_RESAMPLES,
                                method="percentile", random_state=rng)  # fmt: skip
            out["relative_lo"], out["relative_hi"] = _interval(res)
    return out


def bootstrap_mean(
    values: Sequence[float], *, seed: int = 0, confidence: float = CONFIDENCE
) -> dict[str, Any]:
    """``{"n", "mean", "lo", "hi"}``: the mean of per-item values with a bootstrap interval
    over items (``scipy.stats.bootstrap``, BCa; ``lo == hi == mean`` when every value is the
    same, ``None`` bounds for no items; the percentile interval where BCa is undefined). The items are the independent units (sentences),
    so the interval says how much the mean would move on another sample of sentences."""
    x = np.asarray(values, dtype=float)
    if x.ndim != 1:
        raise InputError(f"bootstrap_mean takes a 1-D sequence, got shape {x.shape}")
    n = len(x)
    if n == 0:
        return {"n": 0, "mean": None, "lo": None, "hi": None}
    m = float(x.mean())
    if np.all(x == x[0]):
        return {"n": n, "mean": m, "lo": m, "hi": m}
    lo, hi = _mean_interval(x, confidence, np.random.default_rng(seed))
    return {"n": n, "mean": m, "lo": lo, "hi": hi}


def _ratio(num: np.ndarray, den: np.ndarray, axis: int = -1) -> np.ndarray:
    d = den.sum(axis=axis)
    return np.where(d > 0, num.sum(axis=axis) / np.where(d > 0, d, 1), 0.0)


def bootstrap_ratio(
    num: Sequence[float],
    den: Sequence[float],
    *,
    seed: int = 0,
    confidence: float = CONFIDENCE,
) -> dict[str, Any]:
    """``{"n", "value", "lo", "hi"}``: ``sum(num) / sum(den)`` over items (0 when
    ``sum(den)`` is 0) with a paired percentile bootstrap interval over items (an item keeps
    its numerator and denominator). A Jaccard overlap of two sets over a common universe is
    ``num = in both``, ``den = in either``."""
    a, b = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise InputError(f"need matching 1-D numerators and denominators, got {a.shape}, {b.shape}")
    n = len(a)
    if n == 0:
        return {"n": 0, "value": None, "lo": None, "hi": None}
    value = float(_ratio(a, b))
    if n < 2 or (np.all(a == a[0]) and np.all(b == b[0])):
        return {
            "n": n,
            "value": value,
            "lo": value if n > 1 else None,
            "hi": value if n > 1 else None,
        }
    res = sps.bootstrap((a, b), _ratio, paired=True, vectorized=True, confidence_level=confidence,
                        n_resamples=N_RESAMPLES, method="percentile",
                        random_state=np.random.default_rng(seed))  # fmt: skip
    lo, hi = _interval(res)
    return {"n": n, "value": value, "lo": lo, "hi": hi}


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
) -> dict[str, Any]:
    """``{"n_lines", "n_tokens", "ppl", "lo", "hi"}``: perplexity ``exp(sum(nll) /
    sum(counts))`` of lines with summed next-token NLL ``nll[i]`` over ``counts[i]`` tokens,
    and a percentile bootstrap interval over lines (``scipy.stats.bootstrap``, lines resampled
    with their token counts)."""
    a = np.asarray(nll, dtype=float)
    c = np.asarray(counts, dtype=float)
    if a.shape != c.shape or a.ndim != 1 or len(a) == 0:
        raise InputError(f"need matching non-empty 1-D nll and counts, got {a.shape}, {c.shape}")
    out: dict[str, Any] = {"n_lines": len(a), "n_tokens": int(c.sum()), "ppl": float(_ppl(a, c))}
    if len(a) < 2:
        return out | {"lo": None, "hi": None}
    res = sps.bootstrap((a, c), _ppl, paired=True, vectorized=True, confidence_level=confidence,
                        n_resamples=N_RESAMPLES, method="percentile",
                        random_state=np.random.default_rng(seed))  # fmt: skip
    lo, hi = _interval(res)
    return out | {"lo": lo, "hi": hi}


def perplexity_ratio(
    nll_base: Sequence[float],
    nll_new: Sequence[float],
    counts: Sequence[int],
    *,
    seed: int = 0,
    confidence: float = CONFIDENCE,
) -> dict[str, Any]:
    """``{"ratio", "lo", "hi"}``: perplexity of the same lines under a new condition divided
    by their perplexity under the base condition (1 = no change; 2 = twice as perplexed),
    with a paired percentile bootstrap interval over lines."""
    a, b = np.asarray(nll_base, dtype=float), np.asarray(nll_new, dtype=float)
    c = np.asarray(counts, dtype=float)
    if not (a.shape == b.shape == c.shape) or a.ndim != 1 or len(a) == 0:
        raise InputError(f"need matching non-empty 1-D inputs, got {a.shape}, {b.shape}, {c.shape}")

    def ratio(x: np.ndarray, y: np.ndarray, n: np.ndarray, axis: int = -1) -> np.ndarray:
        return _ppl(y, n, axis) / _ppl(x, n, axis)

    out: dict[str, Any] = {"ratio": float(ratio(a, b, c))}
    if len(a) < 2:
        return out | {"lo": None, "hi": None}
    res = sps.bootstrap((a, b, c), ratio, paired=True, vectorized=True,
                        confidence_level=confidence, n_resamples=N_RESAMPLES,
                        method="percentile", random_state=np.random.default_rng(seed))  # fmt: skip
    lo, hi = _interval(res)
    return out | {"lo": lo, "hi": hi}
