"""Few-cluster inference for the card: CR2 standard errors with Bell-McCaffrey degrees of
freedom, the cluster sign-flip permutation p, and the widening of a cluster bootstrap's interval.

Items of one cluster (a fact asked in several languages, the sentences of one document) move
together. The CR2 (Bell and McCaffrey) variance divides each cluster's residuals by its
leverage; its t reference distribution has the **Bell-McCaffrey Satterthwaite degrees of
freedom** (:func:`bm_df`, :func:`bm_df_mean`): ``G - 1`` with balanced clusters, fewer when a
few clusters hold most items (one document of 40 sentences among 8: about 2.3), where t(G - 1)
covers far less than its nominal level (0.87 at 95% in ``docs/calibration.md``). The tests of
:mod:`mechlingo.card.clustered_tests` and :mod:`mechlingo.card.population` are built from
these pieces.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from mechlingo.core.errors import InputError

__all__ = [
    "EXACT_CLUSTERS",
    "N_PERMUTATIONS",
    "TINY",
    "bm_df",
    "bm_df_mean",
    "codes_of",
    "cr2_ols",
    "cr2_se",
    "crit",
    "p_floor",
    "quantile",
    "sign_flip_p",
    "small_sample_scale",
    "sums",
    "t_p",
]

#: Sign-flip permutations of the Monte Carlo p-value (exact enumeration up to
#: :data:`EXACT_CLUSTERS` informative clusters, or when all clusters weigh the same).
N_PERMUTATIONS = 9999
EXACT_CLUSTERS = 16
#: The least p a test returns where floating point would underflow to 0.
TINY = float(np.finfo(float).tiny)


@functools.lru_cache(maxsize=4096)
def quantile(q: float, df: float | None) -> float:
    """The ``q`` quantile of Student's t on ``df`` (the normal for ``None`` or inf)."""
    from scipy import stats as sps

    return float(sps.norm.ppf(q) if df is None or not math.isfinite(df) else sps.t.ppf(q, df))


def crit(confidence: float, df: float | None) -> float:
    """The two-sided critical value of a ``confidence`` interval on ``df`` (t) or normal."""
    return quantile(1 - (1 - confidence) / 2, df)


def p_floor(g: int) -> float:
    """The smallest two-sided p of a sign-flip test over ``g`` clusters, ``1 / 2^(g-1)``:
    the bounded p of a zero-variance estimate away from its null (1.0 for ``g < 2``)."""
    return 1.0 if g < 2 else float(2.0 ** (1 - g))


def codes_of(clusters: Sequence[Any] | None, n: int) -> tuple[np.ndarray, int]:
    """Integer cluster codes ``0..G-1`` of ``n`` items (each item its own with ``None``).

    Raises:
        InputError: not one cluster id per item.
    """
    if clusters is None:
        return np.arange(n), n
    if len(clusters) != n:
        raise InputError(f"{len(clusters)} cluster ids for {n} items: give one per item")
    seen: dict[Any, int] = {}
    codes = np.array([seen.setdefault(c, len(seen)) for c in clusters], dtype=int)
    return codes, len(seen)


def sums(values: np.ndarray, codes: np.ndarray, g: int) -> np.ndarray:
    """Each cluster's total of ``values``."""
    return np.bincount(codes, weights=values, minlength=g)


def cr2_se(u: np.ndarray, cnt: np.ndarray) -> float | None:
    """The CR2 standard error from each cluster's influence ``u_g`` on the estimate (for a
    mean: ``(s_g - n_g m) / n``), each squared term divided by ``1 - n_g / n`` (the cluster's
    leverage in the intercept model: Bell and McCaffrey's bias correction); ``None`` for
    fewer than two clusters."""
    n = float(cnt.sum())
    if len(u) < 2:
        return None
    return float(math.sqrt(float((u**2 / (1 - cnt / n)).sum())))


def _df_of(q: np.ndarray) -> float:
    """Satterthwaite's df of a quadratic form with matrix ``q``: ``tr(q)^2 / tr(q^2)``."""
    den = float(np.sum(q * q))
    return float(np.trace(q) ** 2 / den) if den > 0 else math.nan


def bm_df_mean(cnt: np.ndarray) -> float:
    """The Bell-McCaffrey degrees of freedom of the CR2 t test of a mean (the intercept
    model) over clusters of ``cnt`` items, under working independence: ``tr(Q)^2 / tr(Q^2)``
    with ``Q = D - v v' / n``, ``D_g = n_g / (n^2 (1 - n_g/n))`` and ``v_g = n_g / (n sqrt(1 -
    n_g/n))`` (the closed form of :func:`bm_df` for a column of ones). ``G - 1`` exactly for
    balanced clusters; fewer as the sizes spread. The same df serves every estimate whose
    CR2 SE is that of a mean of per-item influences (paired gains, log ratios, ratios)."""
    c = np.asarray(cnt, dtype=float)
    g, n = len(c), float(c.sum())
    if g < 2:
        return math.nan
    if np.all(c == c[0]):
        return float(g - 1)
    w = c / n
    d = c / (n * n * (1 - w))
    v = c / (n * np.sqrt(1 - w))
    return _df_of(np.diag(d) - np.outer(v, v) / n)


def _inv_sqrt(m: np.ndarray) -> np.ndarray:
    """``m^(-1/2)`` of a symmetric positive semi-definite matrix (0 on its null space)."""
    w, v = np.linalg.eigh(m)
    inv = np.where(w > 1e-12, 1 / np.sqrt(np.clip(w, 1e-12, None)), 0.0)
    return (v * inv) @ v.T


def cr2_ols(
    y: np.ndarray, x: np.ndarray, codes: np.ndarray, g: int
) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """OLS coefficients of ``y`` on ``x``, their CR2 covariance (each cluster's residuals
    times ``(I - H_gg)^(-1/2)``, Bell and McCaffrey) and each cluster's adjustment matrix
    (for :func:`bm_df`)."""
    bread = np.linalg.pinv(x.T @ x)
    beta = bread @ x.T @ y
    e = y - x @ beta
    meat = np.zeros((x.shape[1], x.shape[1]))
    adj = []
    for k in range(g):
        idx = np.flatnonzero(codes == k)
        xg = x[idx]
        a = _inv_sqrt(np.eye(len(idx)) - xg @ bread @ xg.T)
        ug = xg.T @ (a @ e[idx])
        meat += np.outer(ug, ug)
        adj.append(a)
    return beta, bread @ meat @ bread, adj


def bm_df(
    x: np.ndarray, codes: np.ndarray, adj: Sequence[np.ndarray], contrast: np.ndarray
) -> float:
    """The Bell-McCaffrey degrees of freedom of the CR2 t test of ``contrast' beta`` in the
    regression on ``x`` (``adj``: :func:`cr2_ols`'s per-cluster matrices), under working
    independence: Satterthwaite's ``tr(Q)^2 / tr(Q^2)`` with ``Q = P' (I - H) P``, column
    ``g`` of ``P`` being ``A_g X_g (X'X)^-1 c`` on cluster ``g``'s items (Pustejovsky and
    Tipton 2018, as R's clubSandwich computes it)."""
    bread = np.linalg.pinv(x.T @ x)
    p = np.zeros((len(codes), len(adj)))
    for k, a in enumerate(adj):
        idx = np.flatnonzero(codes == k)
        p[idx, k] = a @ (x[idx] @ (bread @ contrast))
    resid = p - x @ (bread @ (x.T @ p))  # (I - H) P
    return _df_of(p.T @ resid)


def t_p(est: float, null: float, se: float | None, df: float, g: int) -> float | None:
    """Two-sided p of the t test of ``estimate == null`` on ``df`` (bounded by
    :func:`p_floor` of ``g`` clusters when ``se`` is 0 and the estimate is away from the
    null); ``None`` without an SE or with fewer than two clusters."""
    from scipy import stats as sps

    if se is None or g < 2 or not math.isfinite(df):
        return None
    if se == 0:
        return 1.0 if math.isclose(est, null, abs_tol=1e-12) else p_floor(g)
    return max(float(2 * sps.t.sf(abs(est - null) / se, df)), TINY)


def sign_flip_p(d: np.ndarray, seed: int, n_perm: int = N_PERMUTATIONS) -> tuple[float, str]:
    """Two-sided p of H0 "the cluster totals ``d`` are symmetric about 0" (each cluster's
    sign flipped): exact (binomial) when every informative cluster weighs the same, exact
    enumeration up to :data:`EXACT_CLUSTERS` of them, Monte Carlo ``(1 + hits) / (1 + n)``."""
    from scipy import stats as sps

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


def small_sample_scale(cnt: np.ndarray, confidence: float) -> tuple[float, float]:
    """How much wider a cluster-bootstrap interval over clusters of ``cnt`` items is made, and
    the df it is made on: ``t_df / z`` at ``confidence`` times ``sqrt(G / (G - 1))``, ``df``
    the Bell-McCaffrey df of a mean over such clusters (:func:`bm_df_mean`: G - 1 when they
    are balanced). The bootstrap variance of a mean over ``G`` resampled clusters is ``(G -
    1) / G`` of the unbiased one and its quantiles are normal ones, so with 8 documents its
    95% interval covers about 0.89, less when one document holds most sentences; scaled, it
    is the CR2 t interval of a mean (1 for many balanced clusters)."""
    g = len(cnt)
    if g < 2:
        return math.nan, math.nan
    df = bm_df_mean(cnt)
    return crit(confidence, df) / crit(confidence, None) * math.sqrt(g / (g - 1)), df
