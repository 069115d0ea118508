"""Circuits compared across languages: edge overlap against a null of random circuits, and
one language's circuit run on another language's prompts.

* :func:`edge_overlap`: the Jaccard index of two circuits' edge sets, and its permutation
  p-value against size-matched random circuits drawn (uniformly, without replacement) from
  the same scored graph: ``p = (1 + #{null >= observed}) / (1 + n_null)``;
* :func:`cross_faithfulness`: the faithfulness of a circuit (edges named as
  ``sender->receiver@position``) on another result's pairs (the English circuit on French
  prompts), with its interval clustered by fact.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mechlingo.analyses.circuits.faithfulness import faithfulness
from mechlingo.analyses.circuits.result import CircuitResult, sharded_patcher
from mechlingo.core.defaults import SEED
from mechlingo.core.errors import InputError
from mechlingo.core.types import Model

__all__ = ["cross_faithfulness", "edge_overlap"]


def _jaccard(a: set[Any], b: set[Any]) -> float:
    return len(a & b) / len(a | b) if a | b else float("nan")


def edge_overlap(
    a: Sequence[Any],
    b: Sequence[Any],
    universe: Sequence[Any],
    *,
    n_null: int = 2000,
    seed: int = SEED,
) -> dict[str, float]:
    """``{"jaccard", "null_mean", "p", "n_a", "n_b"}``: the edge Jaccard index of circuits
    ``a`` and ``b`` (edges as hashable ids) and its one-sided permutation p-value against
    ``n_null`` pairs of random circuits of the same sizes drawn from ``universe`` (every
    scored edge)."""
    sa, sb, uni = set(a), set(b), list(dict.fromkeys(universe))
    if not sa <= set(uni) or not sb <= set(uni):
        raise InputError("every circuit edge must be in the universe of scored edges")
    obs = _jaccard(sa, sb)
    rng = np.random.default_rng(seed)
    null = np.empty(n_null)
    for i in range(n_null):
        ra = set(rng.choice(len(uni), size=len(sa), replace=False).tolist())
        rb = set(rng.choice(len(uni), size=len(sb), replace=False).tolist())
        null[i] = _jaccard(ra, rb)
    p = (1 + int((null >= obs - 1e-12).sum())) / (1 + n_null)
    return {"jaccard": obs, "null_mean": float(null.mean()), "p": p, "n_a": len(sa), "n_b": len(sb)}


def cross_faithfulness(model: Model, circuit: CircuitResult, on: CircuitResult) -> dict[str, Any]:
    """The faithfulness of ``circuit``'s edges on the pairs of ``on`` (same model, graph and
    position groups): ``{"n_edges", "faithfulness", "lo", "hi"}``."""
    if on.pairs is None or circuit.labels != on.labels:
        raise InputError("both results need find_circuit's pairs and the same position groups")
    names = {on.edge_name(e): e for e in on.ranked}
    edges = [names[circuit.edge_name(e)] for e in circuit.circuit]
    patcher = sharded_patcher(model, on.graph, on.pairs)
    out = faithfulness(patcher, edges, on.clean, on.corrupted, on.facts)
    out.pop("readout")
    return out
