"""Circuits from edge scores, and how much of the behaviour they carry.

A circuit is a set of edges ``(sender, receiver, position group)``: the ``n`` edges with the
largest absolute mean score (:func:`top_edges`), or grown greedily from the logits
(:func:`greedy_edges`: each added edge's receiver is already in the circuit). Its
*faithfulness* is ``(readout with only its edges clean - corrupted) / (clean - corrupted)``,
the ratio of means over facts with a 95% bootstrap interval clustered by fact
(:func:`ratio_interval`). Over the whole curve, MIB's integrated circuit performance ratio
(CPR, the area under the curve over circuit size as a fraction of the edges) and
circuit-model distance (CMD, the area between the curve and 1), with intervals over facts:
:func:`curve_areas`. Definitions and measured numbers: ``docs/methods/circuits.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from mechlingo.analyses.circuits.graph import Graph
from mechlingo.analyses.circuits.patching import EdgePatcher
from mechlingo.core.defaults import SEED

__all__ = [
    "curve_areas",
    "edge_intervals",
    "faithfulness",
    "faithfulness_curve",
    "greedy_edges",
    "ratio_interval",
    "top_edges",
]

Edge = tuple[int, int, int]


def _flat_valid(graph: Graph, mean: Tensor) -> tuple[Tensor, Tensor]:
    valid = graph.mask[:, :, None].expand_as(mean)
    key = torch.where(valid, mean.abs(), torch.full_like(mean, -1.0))
    return key, valid


def top_edges(graph: Graph, mean: Float[Tensor, "sender receiver group"], n: int) -> list[Edge]:
    """The ``n`` edges with the largest absolute mean score, largest first."""
    key, valid = _flat_valid(graph, mean)
    n = min(int(n), int(valid.sum()))
    idx = torch.argsort(key.flatten(), descending=True, stable=True)[:n]
    S, R, K = mean.shape
    return [(i // (R * K), (i // K) % R, i % K) for i in idx.tolist()]


def greedy_edges(graph: Graph, mean: Float[Tensor, "sender receiver group"], n: int) -> list[Edge]:
    """Grow a circuit from the logits: at each step the highest-|score| edge whose receiver
    is the logits or a component already in the circuit (through one of its senders)."""
    order = top_edges(graph, mean, int(graph.mask.sum()) * mean.shape[2])
    reached = {len(graph.receivers) - 1}
    chosen: list[Edge] = []
    taken: set[Edge] = set()
    while len(chosen) < n:
        nxt = next((e for e in order if e not in taken and e[1] in reached), None)
        if nxt is None:
            break
        chosen.append(nxt)
        taken.add(nxt)
        reached.update(graph.receiver_of(nxt[0]))
    return chosen


def removed_mask(graph: Graph, circuit: Sequence[Edge], K: int) -> Bool[Tensor, "s r k"]:
    """Every edge of the graph but the circuit's."""
    keep = torch.zeros(*graph.mask.shape, K, dtype=torch.bool)
    for s, r, k in circuit:
        keep[s, r, k] = True
    return graph.mask[:, :, None].expand(-1, -1, K) & ~keep


def _per_fact(values: Tensor, facts: Sequence[str]) -> np.ndarray:
    ids = list(dict.fromkeys(facts))
    v = values.double().numpy()
    return np.array([v[[i for i, f in enumerate(facts) if f == g]].mean() for g in ids])


def ratio_interval(
    num: Tensor, den: Tensor, facts: Sequence[str], *, seed: int = SEED
) -> tuple[float, float, float]:
    """``(mean(num) / mean(den), 2.5%, 97.5%)``: the ratio of means with a percentile
    bootstrap interval over facts (rows of one fact averaged first), from
    ``scipy.stats.bootstrap``; the interval is NaN with fewer than 3 facts."""
    from scipy.stats import bootstrap

    a, b = _per_fact(num, facts), _per_fact(den, facts)
    est = float(a.mean() / b.mean()) if b.mean() != 0 else float("nan")
    if len(a) < 3:
        return est, float("nan"), float("nan")

    def stat(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
        return x.mean(axis=axis) / y.mean(axis=axis)

    res = bootstrap(
        (a, b), stat, paired=True, vectorized=True, n_resamples=2000, method="percentile",
        confidence_level=0.95, rng=np.random.default_rng(seed),
    )  # fmt: skip
    ci = res.confidence_interval
    return est, float(ci.low), float(ci.high)


def faithfulness(
    patcher: EdgePatcher,
    circuit: Sequence[Edge],
    clean: Float[Tensor, " row"],
    corrupted: Float[Tensor, " row"],
    facts: Sequence[str],
) -> dict[str, Any]:
    """The faithfulness of one circuit: ``{"n_edges", "faithfulness", "lo", "hi",
    "readout"}`` (``readout``: the per-row readout with only the circuit clean)."""
    K = patcher.roles[0].shape[-1]
    m = patcher.read(removed_mask(patcher.graph, circuit, K))
    f, lo, hi = ratio_interval(m - corrupted, clean - corrupted, facts)
    return {"n_edges": len(circuit), "faithfulness": f, "lo": lo, "hi": hi, "readout": m}


def faithfulness_curve(
    patcher: EdgePatcher,
    ranked: Sequence[Edge],
    sizes: Sequence[int],
    clean: Float[Tensor, " row"],
    corrupted: Float[Tensor, " row"],
    facts: Sequence[str],
    *,
    keep_readout: bool = False,
) -> list[dict[str, Any]]:
    """Faithfulness of the first ``n`` edges of ``ranked`` for each ``n`` of ``sizes``
    (one patched pass over the rows per size); ``keep_readout``: each point keeps its
    per-row ``readout`` (for :func:`curve_areas`)."""
    out = []
    for n in sorted({min(int(n), len(ranked)) for n in sizes}):
        point = faithfulness(patcher, ranked[:n], clean, corrupted, facts)
        if not keep_readout:
            point.pop("readout")
        out.append(point)
    return out


def _areas(x: np.ndarray, num: np.ndarray, den: np.ndarray) -> tuple[float, float]:
    """``(CPR, CMD)`` of the curve ``f = mean(num) / mean(den)`` (per point, over the rows
    of ``num [point, fact]`` and ``den [fact]``) at sizes ``x``."""
    f = num.mean(axis=1) / den.mean()
    return float(np.trapezoid(f, x)), float(np.trapezoid(np.abs(1.0 - f), x))


def curve_areas(
    readout: Float[Tensor, "point row"],
    n_edges: Sequence[int],
    total: int,
    clean: Float[Tensor, " row"],
    corrupted: Float[Tensor, " row"],
    facts: Sequence[str],
    *,
    seed: int = SEED,
) -> dict[str, Any]:
    """MIB's integrated circuit performance ratio and circuit-model distance of a
    faithfulness curve (see the module docstring): ``{"cpr": {"value", "lo", "hi"}, "cmd":
    {...}, "n": facts, "points": curve points used}``.

    Args:
        readout: the per-row readout with only the first ``n_edges[i]`` edges clean.
        total: the number of edges of the graph (the curve's ``x = n_edges / total``).

    The intervals are 95% percentile bootstrap intervals (``scipy.stats.bootstrap``, 2,000
    resamples) over facts, each fact's rows averaged first; NaN with fewer than 3 facts.
    Points at 0 and ``total`` edges are added where the curve lacks them (``f = 0``, ``f =
    1``: the corrupted and the clean run, exactly).
    """
    from scipy.stats import bootstrap

    sizes = [int(n) for n in n_edges]
    rows = list(readout)
    if 0 not in sizes:
        sizes, rows = [0, *sizes], [corrupted, *rows]
    if total not in sizes:
        sizes, rows = [*sizes, int(total)], [*rows, clean]
    order = np.argsort(sizes, kind="stable")
    x = np.array(sizes, dtype=float)[order] / float(total)
    num = np.stack([_per_fact(rows[i] - corrupted, facts) for i in order])  # [point, fact]
    den = _per_fact(clean - corrupted, facts)
    cpr, cmd = _areas(x, num, den)
    out: dict[str, Any] = {"cpr": {"value": cpr}, "cmd": {"value": cmd}, "n": len(den)}
    out["points"] = len(x)
    if len(den) < 3:
        for k in ("cpr", "cmd"):
            out[k].update(lo=float("nan"), hi=float("nan"))
        return out

    def stat(idx: np.ndarray) -> np.ndarray:
        i = idx.astype(int)
        return np.array(_areas(x, num[:, i], den[i]))

    res = bootstrap(
        (np.arange(len(den)),), stat, vectorized=False, n_resamples=2000, method="percentile",
        confidence_level=0.95, rng=np.random.default_rng(seed),
    )  # fmt: skip
    ci = res.confidence_interval
    for j, k in enumerate(("cpr", "cmd")):
        out[k].update(lo=float(ci.low[j]), hi=float(ci.high[j]))
    return out


def edge_intervals(
    scores: Float[Tensor, "row sender receiver group"], facts: Sequence[str]
) -> tuple[Tensor, Tensor, Tensor, int]:
    """``(mean, lo, hi, n)``: each edge's mean score over facts (rows of one fact averaged
    first) with a 95% t interval (``scipy.stats.t``); ``n`` the number of facts."""
    from scipy.stats import t as student_t

    ids = list(dict.fromkeys(facts))
    per = torch.stack([scores[[i for i, f in enumerate(facts) if f == g]].mean(0) for g in ids])
    n = per.shape[0]
    mean = per.mean(0)
    if n < 2:
        nan = torch.full_like(mean, float("nan"))
        return mean, nan, nan, n
    half = float(student_t.ppf(0.975, n - 1)) * per.std(0) / n**0.5
    return mean, mean - half, mean + half, n
