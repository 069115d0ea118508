"""Cluster-bootstrap tests for the card's statistics that are not a mean or a paired gain.

:mod:`mechlingo.kernels.significance` has the card's paired, mean and correlation tests;
some rows of :mod:`mechlingo.card.lu` and :mod:`mechlingo.card.sundar` need
a statistic of a whole table of items (a ratio of sums such as CLC, a difference between two
groups of items, the largest per-pair ratio, a correlation across language pairs computed
from per-sentence values). :func:`cluster_bootstrap` resamples whole clusters (facts, documents)
with replacement and recomputes the statistic; the interval is the percentile interval and the
two-sided p-value is the bootstrap's (twice the share of resamples on the far side of ``null``,
at least ``1 / (resamples + 1)``), a less exact p than a permutation test's; ``method`` says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from mechlingo.kernels.significance import N_RESAMPLES, Interval, Test, mde

__all__ = ["cluster_bootstrap", "group_difference_test"]


def cluster_bootstrap(
    data: np.ndarray,
    clusters: Sequence[Any],
    statistic: Callable[[np.ndarray], float],
    *,
    null: float = 0.0,
    method: str = "",
    seed: int = 0,
    n_resamples: int = N_RESAMPLES,
    extra: dict[str, Any] | None = None,
) -> Test:
    """``statistic(rows)`` on ``data`` (one row per item) with a cluster-bootstrap 95% interval.

    Args:
        data: ``[item, ...]`` values; ``statistic`` gets a subset of rows (clusters resampled).
        clusters: the cluster of every item (all items of a cluster move together).
        null: the value of H0 for the two-sided bootstrap p-value.
        method: what the statistic is (prefixed to the test's method).
    """
    data = np.asarray(data, dtype=float)
    labels = np.asarray([str(c) for c in clusters])
    if len(labels) != len(data):
        raise ValueError(f"{len(data)} items but {len(labels)} cluster ids")
    uniq, inv = np.unique(labels, return_inverse=True)
    members = [np.flatnonzero(inv == k) for k in range(len(uniq))]
    est = float(statistic(data))
    gen = np.random.default_rng(seed)
    vals = []
    for _ in range(n_resamples if len(uniq) > 1 else 0):
        pick = gen.integers(0, len(uniq), len(uniq))
        v = statistic(data[np.concatenate([members[k] for k in pick])])
        if np.isfinite(v):
            vals.append(float(v))
    how = (method + "; " if method else "") + "cluster bootstrap (percentile), bootstrap p"
    if len(vals) < 10 or not np.isfinite(est):
        return Test(Interval(est if np.isfinite(est) else None, None, None, len(data)), None,
                    None, len(uniq), how, dict(extra or {}))  # fmt: skip
    arr = np.asarray(vals)
    lo, hi = np.quantile(arr, [0.025, 0.975])
    far = np.mean(arr <= null) if est > null else np.mean(arr >= null)
    p = float(min(1.0, max(2 * far, 1 / (len(arr) + 1))))
    se = float(arr.std(ddof=1))
    return Test(Interval(est, float(lo), float(hi), len(data)), p, mde(se), len(uniq), how,
                dict(extra or {}))  # fmt: skip


def group_difference_test(
    values: Sequence[float],
    groups: Sequence[Any],
    clusters: Sequence[Any],
    a: Any,
    b: Any,
    *,
    seed: int = 0,
) -> Test:
    """``mean(values | group a) - mean(values | group b)`` with a cluster-bootstrap interval
    (items of other groups are ignored; a resample without one of the groups is dropped)."""
    keep = [i for i, g in enumerate(groups) if g in (a, b)]
    data = np.array([[float(values[i]), 1.0 if groups[i] == a else 0.0] for i in keep])
    cl = [clusters[i] for i in keep]

    def stat(m: np.ndarray) -> float:
        ga, gb = m[m[:, 1] == 1, 0], m[m[:, 1] == 0, 0]
        if not len(ga) or not len(gb):
            return float("nan")
        return float(ga.mean() - gb.mean())

    return cluster_bootstrap(data, cl, stat, method=f"difference of means, {a} - {b}", seed=seed)
