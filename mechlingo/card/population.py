"""The card's one definition of beating a control, the draws it needs, and precise zeros.

A control is a population of m random draws (norm-matched random vectors, random-neuron
sets, random clamps). An effect beats it when its **rank** among the draws says so: the
exact one-sided permutation p ``(1 + #{draws at least as good}) / (m + 1)``
(:func:`by_rank`, :func:`rank_population_test`), the share of random draws that do at
least as well. The rank p needs no model of the draws' spread, so it is exact for any
population, but it cannot go below ``1 / (m + 1)``: :func:`draws_needed` gives the fewest
draws with which a row at Holm multiplier k can be decided at all. :func:`no_change_relative`
is the relative gain of a condition that changes nothing, a testable zero; :func:`p_text`
writes a p without ever showing 0. :func:`population_test` tests an effect against the draws
with a t interval whose SE adds the between-draw variance to the CR2 cluster variance;
:func:`population_gain_test` is the draws' own mean gain, :func:`pool_controls` one outcome per
item over control seeds. ``docs/replicate.md`` ("The verdict rules") gives why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from mechlingo.card.clustered import TINY, bm_df_mean, codes_of, cr2_se, crit, p_floor, sums
from mechlingo.card.clustered_tests import Test, mde
from mechlingo.core.errors import InputError
from mechlingo.kernels.significance import CONFIDENCE, Interval

__all__ = [
    "by_rank",
    "draws_needed",
    "no_change_relative",
    "p_text",
    "pool_controls",
    "population_gain_test",
    "population_test",
    "rank_population_test",
]


def by_rank(t: Test) -> Test:
    """``t`` (a :func:`population_test` or a rank test of a
    statistic against its draws) judged by the effect's rank among the draws: ``p`` becomes
    the exact one-sided rank p ``extra["p_rank"]``, the other side's ``p_opposite`` the rank
    p of the other direction, and ``extra["decides"] = "rank"`` (the verdict then reads the
    p alone; the interval of effect - population mean stays as a description). A test
    without a rank p is returned as it is."""
    x = t.extra
    if x.get("p_rank") is None:
        return t
    extra = {**x, "one_sided": True, "p_opposite": x.get("p_rank_opposite"), "decides": "rank",
             "p_t": t.p}  # fmt: skip
    m = x.get("draws")
    method = (f"{t.method.split('; p:')[0]}; p: the effect's rank among {m} random draws "
              f"(exact permutation, floor 1/{(m or 0) + 1})")  # fmt: skip
    return replace(t, p=float(x["p_rank"]), method=method, extra=extra)


def rank_population_test(
    effect: Sequence[float],
    draws: Sequence[Sequence[float]] | np.ndarray,
    clusters: Sequence[Any] | None = None,
    *,
    base: Sequence[float] | None = None,
    direction: int = 1,
) -> Test:
    """An effect against a population of random draws on the same items, judged by its rank
    (:func:`by_rank` of :func:`population_test`): the estimate is
    effect - population mean with its interval; ``p`` the share of draws (plus the effect)
    at least as good in ``direction``."""
    return by_rank(population_test(effect, draws, clusters, base=base, direction=direction))


def draws_needed(multiplier: float, alpha: float = 0.05) -> int:
    """The fewest random draws m whose rank p floor ``1 / (m + 1)`` lies below the row's
    adjusted level ``alpha / multiplier``: ``floor(multiplier / alpha)`` (a Holm family of K
    rows needs ``20 K`` draws for its first step at 0.05). With fewer, the row can never
    hold, whatever its effect."""
    k = max(1.0, float(multiplier))
    return int(math.floor(k / alpha + 1e-9))


def no_change_relative(
    base: Sequence[float], clusters: Sequence[Any] | None, *, null: float
) -> Test:
    """The relative gain of a condition that changes no item (``new == base`` item by item):
    exactly 0, with the interval of the change rate never seen in G clusters (the exact 95%
    bound ``u = 1 - 0.025^(1/G)`` in points) over the baseline mean, as a t interval on
    G - 1 df, and the t test of H0 "relative gain == ``null``". A gain that does not move at
    all is a testable zero that can refute a claim, not an undefined ratio."""
    from scipy import stats as sps

    a = np.asarray(base, dtype=float)
    g = len(set(clusters)) if clusters is not None else len(a)
    mean = float(a.mean())
    if g < 2 or mean <= 0:
        return Test(Interval(0.0, None, None, len(a)), None, None, g, "no change: no interval")
    u = 1 - 0.025 ** (1 / g)
    se = u / float(sps.norm.ppf(0.975)) / mean
    half = float(sps.t.ppf(1 - (1 - CONFIDENCE) / 2, g - 1)) * se
    p = max(float(2 * sps.t.sf(abs(null) / se, g - 1)), float(np.finfo(float).tiny))
    method = (f"relative gain of a condition that changes no item: 0, interval the exact bound "
              f"of a change never seen in {g} clusters over the baseline mean; t({g - 1}) test")  # fmt: skip
    return Test(Interval(0.0, -half, half, len(a)), p, None, g, method,
                {"null": null, "se": se, "df": g - 1, "interval": "t", "no_change": True})  # fmt: skip


def p_text(p: float | None, digits: int = 3) -> str:
    """A p-value as text: ``"0.0123"``; below ``1e-12`` ``"< 1e-k"`` (never ``"0"``: a p
    that underflowed says only that it is smaller than the smallest shown)."""
    if p is None:
        return ""
    if p < 1e-12:
        k = 12 if p <= 0 else min(300, int(math.floor(-math.log10(p))))
        return f"< 1e-{k}"
    return f"{p:.{digits}g}"


# --------------------------------------------------------------------------------------
# Random controls as populations: the t test against the draws
# --------------------------------------------------------------------------------------


def pool_controls(controls: Sequence[Sequence[float]]) -> list[float]:
    """One control outcome per item: the mean over control seeds of each item's outcome
    (``controls[seed][item]``), so a baseline paired with it counts every item once.

    Raises:
        InputError: no seed, or seeds of different lengths.
    """
    arr = [np.asarray(c, dtype=float) for c in controls]
    if not arr or any(a.ndim != 1 or a.shape != arr[0].shape for a in arr):
        raise InputError(f"need control seeds of one length, got {[a.shape for a in arr]}")
    return [float(x) for x in np.mean(np.stack(arr), axis=0)]


def _draws(effect_len: int, draws: Sequence[Sequence[float]] | np.ndarray) -> np.ndarray:
    d = np.asarray(draws, dtype=float)
    if d.ndim == 1:
        d = d[None, :]
    if d.ndim != 2 or d.shape[0] == 0 or d.shape[1] != effect_len or effect_len == 0:
        raise InputError(f"need [draw, item] control outcomes for {effect_len} items, got "
                         f"shape {d.shape}")  # fmt: skip
    return d


def _pooled_contrast(
    x: np.ndarray, draws: np.ndarray, codes: np.ndarray, g: int
) -> tuple[float, float | None, float, dict[str, Any]]:
    """``mean(x - mean over draws)``: its SE (the CR2 cluster variance of the per-item
    contrast plus the between-draw variance of the draws' means over m, a conservative sum)
    and Satterthwaite's df (the cluster part on its Bell-McCaffrey df); the between-draw part
    is absent with one draw (said so)."""
    n, m = len(x), draws.shape[0]
    diff = x - draws.mean(axis=0)
    cnt = sums(np.ones(n), codes, g)
    mu = float(diff.mean())
    se_c = cr2_se((sums(diff, codes, g) - cnt * mu) / n, cnt)
    var_b = float(draws.mean(axis=1).var(ddof=1)) / m if m >= 2 else None
    fields: dict[str, Any] = {"se_clusters": se_c, "se_draws": None if var_b is None else
                              math.sqrt(var_b)}  # fmt: skip
    df_c = bm_df_mean(cnt) if g >= 2 else float(g - 1)
    if se_c is None:
        return mu, None, df_c, fields
    if var_b is None:
        return mu, se_c, df_c, fields
    var = se_c**2 + var_b
    den = se_c**4 / max(df_c, 1e-9) + var_b**2 / (m - 1)
    df = var**2 / den if den > 0 else df_c
    return mu, math.sqrt(var), float(df), fields


def population_test(
    effect: Sequence[float],
    draws: Sequence[Sequence[float]] | np.ndarray,
    clusters: Sequence[Any] | None = None,
    *,
    base: Sequence[float] | None = None,
    direction: int = 1,
) -> Test:
    """An effect against a population of m random control draws on the same items.

    Args:
        effect: per-item outcomes of the effect's condition.
        draws: ``[draw][item]`` outcomes of the m random draws (one draw: a list of one).
        clusters: per-item cluster ids (facts, documents).
        base: per-item outcomes of no intervention; the statistic is the mean gain over it
            (without: the mean). It shifts every draw alike, so only the printed values move.
        direction: the claim's direction (+1: the effect must beat the draws).

    Returns:
        A :class:`Test` of effect - control: the estimate is ``mean(effect) - mean over draws
        of mean(draw)`` with a t interval whose SE adds the between-draw variance to the CR2
        cluster variance; ``p`` is its two-sided t p (Satterthwaite df) when m >= 2, else the
        exact one-sided rank p ``(1 + #{draws at least as far in direction}) / (m + 1)``
        (``extra["p_floor"]``: 0.5 for one draw, never enough for "holds"; ``p_opposite``:
        the other direction's). The rank p is always in ``extra["p_rank"]``.

    Raises:
        InputError: draws that do not match the items.
    """
    e = np.asarray(effect, dtype=float)
    dr = _draws(len(e), draws)
    b = np.zeros_like(e) if base is None else np.asarray(base, dtype=float)
    codes, g = codes_of(clusters, len(e))
    m = dr.shape[0]
    stat_e, stat_d = float((e - b).mean()), (dr - b).mean(axis=1)
    tol = 1e-12 * max(1.0, float(np.abs(stat_d).max()), abs(stat_e))
    p = (1 + int((direction * (stat_d - stat_e) >= -tol).sum())) / (m + 1)
    p_opp = (1 + int((direction * (stat_e - stat_d) >= -tol).sum())) / (m + 1)
    mu, se, df, fields = _pooled_contrast(e, dr, codes, g)
    lo = hi = None
    if se is not None:
        half = crit(CONFIDENCE, df) * se
        lo, hi = mu - half, mu + half
    extra = {"direction": direction, "draws": m, "p_rank": p, "p_rank_opposite": p_opp,
             "p_floor": 1 / (m + 1), "effect_stat": stat_e,
             "draw_stats": [float(x) for x in stat_d], "se": se, "df": df, "interval": "t",
             **fields}  # fmt: skip
    p_t = _population_t_p(mu, se, df, g, m)
    if p_t is None:  # one draw (or no SE): only the rank p, whose floor is 1 / (m + 1)
        extra.update(one_sided=True, p_opposite=p_opp)
    between = "between-draw variance included" if m >= 2 else "one draw: no between-draw variance"
    how_p = (
        "the rank p"
        if p_t is None
        else f"two-sided t on effect - population mean; rank p {p:.3g} (floor 1/{m + 1})"
    )
    method = (f"effect - population of {m} random draws; p: {how_p}; interval: CR2 "
              f"({g} clusters) + {between}, t({df:.1f})")  # fmt: skip
    return Test(Interval(mu, lo, hi, len(e)), p if p_t is None else p_t,
                None if se is None else mde(se, df=df), g, method, extra)  # fmt: skip


def _population_t_p(mu: float, se: float | None, df: float, g: int, m: int) -> float | None:
    """The two-sided t p of H0 "effect - population mean = 0" (SE with the between-draw
    variance, Satterthwaite df); ``None`` with fewer than two draws (no between-draw variance
    to judge by: the rank p, floor 0.5, stands alone). Never 0."""
    from scipy import stats as sps

    if m < 2 or se is None:
        return None
    if se == 0:
        return 1.0 if math.isclose(mu, 0.0, abs_tol=1e-12) else p_floor(g)
    return max(float(2 * sps.t.sf(abs(mu) / se, df)), TINY)


def population_gain_test(
    base: Sequence[float],
    draws: Sequence[Sequence[float]] | np.ndarray,
    clusters: Sequence[Any] | None = None,
    *,
    null: float = 0.0,
) -> Test:
    """The random population's mean gain over ``base``, ``mean over draws of mean(draw -
    base)``, with the t interval of :func:`population_test` (cluster plus between-draw
    variance) and the two-sided t test of H0 "gain == ``null``" (bounded away from 0)."""
    from scipy import stats as sps

    a = np.asarray(base, dtype=float)
    dr = _draws(len(a), draws)
    codes, g = codes_of(clusters, len(a))
    mu, se, df, fields = _pooled_contrast(a, dr, codes, g)
    mu = -mu
    lo = hi = p = None
    if se is not None:
        half = crit(CONFIDENCE, df) * se
        lo, hi = mu - half, mu + half
        if se == 0:
            p = 1.0 if math.isclose(mu, null, abs_tol=1e-12) else p_floor(g)
        else:
            p = max(float(2 * sps.t.sf(abs(mu - null) / se, df)), TINY)
    m = dr.shape[0]
    extra = {"null": null, "draws": m, "se": se, "df": df, "interval": "t", **fields}
    method = (f"mean gain of {m} random draws; CR2 ({g} clusters)"
              f"{' + between-draw variance' if m >= 2 else ''}, t({df:.1f})")  # fmt: skip
    return Test(Interval(mu, lo, hi, len(a)), p, None if se is None else mde(se, df=df), g,
                method, extra)  # fmt: skip
