"""Circuits of several languages compared: overlap matrices against a null, the
cross-language faithfulness matrix, and the edges every language shares.

* :func:`weighted_overlap`: a score-weighted overlap of two circuits, ``sum_e min(w_a(e),
  w_b(e))`` where ``w(e)`` is an edge's |mean score| over its circuit's total (1: the same
  edges carrying the same shares of the score; 0: no edge in common), with its one-sided
  permutation p against size-matched random circuits drawn from the same scored graph
  (each random edge weighted by its own language's score);
* :func:`compare_languages`: for circuits of several languages (one
  :class:`~mechlingo.analyses.circuits.result.CircuitResult` each, same model and position
  groups), the edge-Jaccard and score-weighted overlap matrices with their permutation p
  (and Holm-adjusted p over the language pairs), the cross-language faithfulness matrix
  (each language's circuit on every language's pairs, 95% intervals clustered by fact), the
  edges every circuit holds and those every non-reference circuit holds but the reference's
  does not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import combinations
from typing import Any

import numpy as np
from jaxtyping import Float
from torch import Tensor

from mechlingo.analyses.circuits.compare import cross_faithfulness, edge_overlap
from mechlingo.analyses.circuits.faithfulness import edge_intervals
from mechlingo.analyses.circuits.result import CircuitResult
from mechlingo.core.defaults import SEED
from mechlingo.core.errors import InputError
from mechlingo.core.types import Model

__all__ = ["compare_languages", "overlap_null", "weighted_overlap"]

Edge = tuple[int, int, int]


def _weights(mean: np.ndarray, idx: np.ndarray) -> np.ndarray:
    w = np.abs(mean[idx])
    s = w.sum()
    return w / s if s > 0 else np.full(len(idx), 1.0 / max(1, len(idx)))


def _overlap(ia: np.ndarray, wa: np.ndarray, ib: np.ndarray, wb: np.ndarray) -> float:
    """``sum_e min(wa(e), wb(e))`` over the edges of both (flat indices ``ia``, ``ib``)."""
    a = dict(zip(ia.tolist(), wa.tolist(), strict=True))
    return float(sum(min(a[e], w) for e, w in zip(ib.tolist(), wb.tolist(), strict=True) if e in a))


def weighted_overlap(
    a: Sequence[int],
    b: Sequence[int],
    mean_a: Float[np.ndarray, " edge"],
    mean_b: Float[np.ndarray, " edge"],
    universe: Sequence[int],
    *,
    n_null: int = 2000,
    seed: int = SEED,
) -> dict[str, float]:
    """``{"overlap", "null_mean", "p", "n_a", "n_b"}``: the score-weighted overlap of
    circuits ``a`` and ``b`` (flat edge indices into ``mean_a``/``mean_b``, each language's
    mean edge scores) and its one-sided permutation p ``(1 + #{null >= observed}) / (1 +
    n_null)`` against random circuits of the same sizes drawn from ``universe`` (the scored
    edges), each weighted by its own language's scores."""
    ia, ib, uni = np.asarray(a), np.asarray(b), np.asarray(list(dict.fromkeys(universe)))
    if not set(ia.tolist()) <= set(uni.tolist()) or not set(ib.tolist()) <= set(uni.tolist()):
        raise InputError("every circuit edge must be in the universe of scored edges")
    obs = _overlap(ia, _weights(mean_a, ia), ib, _weights(mean_b, ib))
    rng = np.random.default_rng(seed)
    null = np.empty(n_null)
    for i in range(n_null):
        ra = uni[rng.choice(len(uni), size=len(ia), replace=False)]
        rb = uni[rng.choice(len(uni), size=len(ib), replace=False)]
        null[i] = _overlap(ra, _weights(mean_a, ra), rb, _weights(mean_b, rb))
    p = (1 + int((null >= obs - 1e-12).sum())) / (1 + n_null)
    return {"overlap": obs, "null_mean": float(null.mean()), "p": p, "n_a": len(ia),
            "n_b": len(ib)}  # fmt: skip


def overlap_null(n_a: int, n_b: int, universe: int, *, n_null: int, seed: int = SEED) -> np.ndarray:
    """Edge Jaccard indices of ``n_null`` pairs of random circuits of sizes ``n_a`` and
    ``n_b`` drawn uniformly without replacement from ``universe`` edges (the null of
    :func:`~mechlingo.analyses.circuits.compare.edge_overlap`, as draws)."""
    rng = np.random.default_rng(seed)
    out = np.empty(n_null)
    for i in range(n_null):
        ra = set(rng.choice(universe, size=n_a, replace=False).tolist())
        rb = set(rng.choice(universe, size=n_b, replace=False).tolist())
        u = len(ra | rb)
        out[i] = len(ra & rb) / u if u else float("nan")
    return out


def _flat(res: CircuitResult, edges: Sequence[Edge]) -> list[int]:
    S, R, K = res.scores.shape[1:]
    return [s * R * K + r * K + k for s, r, k in edges]


def _mean(res: CircuitResult) -> np.ndarray:
    mean: Tensor = edge_intervals(res.scores, res.facts)[0]
    return mean.flatten().double().numpy()


def _holm(ps: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (monotone, capped at 1), in the input's order."""
    m = len(ps)
    order = sorted(range(m), key=lambda i: ps[i])
    out = [0.0] * m
    run = 0.0
    for rank, i in enumerate(order):
        run = max(run, min(1.0, (m - rank) * ps[i]))
        out[i] = run
    return out


def _pair_tables(
    results: Mapping[str, CircuitResult], n_null: int, seed: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The edge-Jaccard and weighted-overlap entries of every pair of languages."""
    langs = list(results)
    first = results[langs[0]]
    universe = _flat(first, first.ranked)  # every scored edge (ranked holds them all)
    means = {lg: _mean(r) for lg, r in results.items()}
    jac: dict[str, Any] = {}
    wov: dict[str, Any] = {}
    for a, b in combinations(langs, 2):
        ea, eb = _flat(results[a], results[a].circuit), _flat(results[b], results[b].circuit)
        jac[f"{a}-{b}"] = edge_overlap(ea, eb, universe, n_null=n_null, seed=seed)
        wov[f"{a}-{b}"] = weighted_overlap(
            ea, eb, means[a], means[b], universe, n_null=n_null, seed=seed
        )
    for table in (jac, wov):
        for key, adj in zip(table, _holm([v["p"] for v in table.values()]), strict=True):
            table[key]["p_holm"] = adj
    return jac, wov


def _cross(model: Model, results: Mapping[str, CircuitResult]) -> dict[str, Any]:
    """``{circuit language: {pairs language: faithfulness with its interval}}``."""
    out: dict[str, Any] = {}
    for a, ra in results.items():
        out[a] = {}
        for b, rb in results.items():
            if a == b:
                own = {k: ra.faithfulness[k] for k in ("faithfulness", "lo", "hi")}
                out[a][b] = {"n_edges": len(ra.circuit), **own, "n": ra.n}
            else:
                out[a][b] = {**cross_faithfulness(model, ra, rb), "n": rb.n}
    return out


def _edge_sets(results: Mapping[str, CircuitResult], reference: str) -> dict[str, Any]:
    """The edges in every circuit, and those in every non-reference circuit but not in the
    reference's, with each language's mean score and 95% interval."""
    sets = {lg: {r.edge_name(e) for e in r.circuit} for lg, r in results.items()}
    shared = set.intersection(*sets.values()) if sets else set()
    others = [lg for lg in results if lg != reference]
    only = set.intersection(*(sets[lg] for lg in others)) - sets.get(reference, set())
    any_other = set.union(*(sets[lg] for lg in others)) - sets.get(reference, set())

    wanted = sorted(shared | only)
    per: dict[str, dict[str, Any]] = {}
    for lg, r in results.items():
        names = {r.edge_name(e): e for e in r.ranked}
        got = r.edges_table([names[w] for w in wanted])
        per[lg] = {t["edge"]: {k: t[k] for k in ("score", "lo", "hi", "n")} for t in got}

    def table(names: set[str]) -> list[dict[str, Any]]:
        rows = [{"edge": w, **{lg: per[lg][w] for lg in results}} for w in sorted(names)]
        return sorted(rows, key=lambda x: -abs(x[others[0] if others else reference]["score"]))

    return {"shared": table(shared), "non_reference_only": table(only),
            "n_in_any_non_reference_only": len(any_other),
            "sizes": {lg: len(s) for lg, s in sets.items()}}  # fmt: skip


def compare_languages(
    model: Model,
    results: Mapping[str, CircuitResult],
    *,
    reference: str = "en",
    n_null: int = 2000,
    seed: int = SEED,
) -> dict[str, Any]:
    """Every language's circuit compared with every other's (see the module docstring):
    ``languages`` (n, correct facts, circuit size and faithfulness, the curve, Spearman of
    the verified edges), ``jaccard`` and ``weighted`` (per pair ``"a-b"``: the statistic,
    the null mean, p and Holm-adjusted p), ``cross`` (``[circuit][pairs]`` faithfulness with
    its interval and n) and ``edges`` (shared and non-reference-only edges).

    Raises:
        InputError: fewer than two languages, or results of different position groups.
    """
    if len(results) < 2:
        raise InputError("compare_languages needs the circuits of at least two languages")
    labels = {tuple(r.labels) for r in results.values()}
    if len(labels) != 1:
        raise InputError("every circuit must have the same position groups")
    jac, wov = _pair_tables(results, n_null, seed)
    langs = {
        lg: {"n": r.n, "n_correct": r.meta.get("n_correct"), "n_scored": r.meta.get("n_scored"),
             "skipped_without_partner": r.meta.get("skipped_without_partner"),
             "n_edges": len(r.circuit), **r.faithfulness, "curve": r.curve,
             "spearman_top": r.spearman, "n_verified": len(r.verified),
             "clean_mean": float(r.clean.mean()), "corrupted_mean": float(r.corrupted.mean()),
             "seconds": r.meta.get("seconds"), "top_edges": r.edges_table(r.circuit[:10])}
        for lg, r in results.items()
    }  # fmt: skip
    return {
        "languages": langs,
        "jaccard": jac,
        "weighted": wov,
        "cross": _cross(model, results),
        "edges": _edge_sets(results, reference),
        "reference": reference,
        "n_null": n_null,
    }
