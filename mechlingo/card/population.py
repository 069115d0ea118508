"""The card's one definition of beating a control, the draws it needs, and precise zeros.

A control is a population of m random draws (norm-matched random vectors, random-neuron
sets, random clamps). An effect beats it when its **rank** among the draws says so: the
exact one-sided permutation p ``(1 + #{draws at least as good}) / (m + 1)``
(:func:`by_rank`, :func:`rank_population_test`), the share of random draws that do at
least as well. The rank p needs no model of the draws' spread, so it is exact for any
population, but it cannot go below ``1 / (m + 1)``: :func:`draws_needed` gives the fewest
draws with which a row at Holm multiplier k can be decided at all. :func:`no_change_relative`
is the relative gain of a condition that changes nothing, a testable zero; :func:`p_text`
writes a p without ever showing 0. ``docs/replicate.md`` ("The verdict rules") gives why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from mechlingo.card.statistics import Test, population_test
from mechlingo.kernels.significance import CONFIDENCE, Interval

__all__ = ["by_rank", "draws_needed", "no_change_relative", "p_text", "rank_population_test"]


def by_rank(t: Test) -> Test:
    """``t`` (a :func:`~mechlingo.card.statistics.population_test` or a rank test of a
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
    (:func:`by_rank` of :func:`~mechlingo.card.statistics.population_test`): the estimate is
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
