"""Finding a circuit end to end (:func:`find_circuit`) and its result
(:class:`CircuitResult`): edge scores, the top edges verified by exact edge patching (with the
rank correlation between estimate and exact effect), the faithfulness curve, and the circuit
at a target faithfulness, as JSON and as a figure drawn only from measured edges
(:func:`mechlingo.viz.circuit.measured_circuit_figure`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

import torch
from torch import Tensor
from tqdm.auto import tqdm

from mechlingo.activations.runs import model_input_device
from mechlingo.analyses.circuits.faithfulness import (
    curve_areas,
    edge_intervals,
    faithfulness_curve,
    greedy_edges,
    top_edges,
)
from mechlingo.analyses.circuits.graph import Graph, build_graph
from mechlingo.analyses.circuits.pairs import Pairs, make_pairs
from mechlingo.analyses.circuits.patching import EdgePatcher
from mechlingo.analyses.circuits.runs import ReadoutFn, readout_fn
from mechlingo.analyses.circuits.scores import edge_scores
from mechlingo.analyses.results import WritesFolder
from mechlingo.core.defaults import BATCH_SIZE, PROGRESS
from mechlingo.core.distributed import (
    all_gather_rows,
    dist_info,
    scoring_sharded,
    shard_bounds,
)
from mechlingo.core.errors import InputError
from mechlingo.core.types import Model
from mechlingo.interventions.circuit import CircuitAblation
from mechlingo.viz.circuit import measured_circuit_figure

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from mechlingo.data import Fact
    from mechlingo.interventions.circuit import CircuitAblation

__all__ = ["SIZES", "CircuitArgs", "CircuitResult", "find_circuit", "sharded_patcher"]

#: Circuit sizes of the faithfulness curve (capped at the number of edges).
SIZES = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)

Edge = tuple[int, int, int]


class CircuitArgs(TypedDict, total=False):
    """The less often changed keywords of :func:`find_circuit`.

    Attributes:
        target: the faithfulness the reported circuit must reach (default 0.8).
        sizes: circuit sizes of the faithfulness curve (default :data:`SIZES`; every edge is
            always added).
        verify: top edges re-scored by exact edge patching (default 20).
        heads: attention senders per head (see :func:`.graph.build_graph`).
        batch_size: prompt pairs per pass (default the shared ``BATCH_SIZE``).
        progress: progress bars of the edge scores and the exact patching passes.
    """

    target: float
    sizes: Sequence[int]
    verify: int
    heads: bool | None
    batch_size: int
    progress: bool


@dataclass
class CircuitResult(WritesFolder):
    """A measured circuit.

    Attributes:
        graph: the computational graph; ``labels`` the position groups.
        scores: ``[row, sender, receiver, group]`` estimated edge effects (``readout(clean
            with that edge corrupted) - readout(clean)``); ``facts`` the fact id of each row.
        clean, corrupted: the measured readout of each row.
        ranked: edges in selection order; ``circuit`` the chosen first ones.
        curve: faithfulness against circuit size (``n_edges``, ``faithfulness``, ``lo``,
            ``hi``: a 95% interval clustered by fact).
        verified: the top edges patched exactly (``estimate``, ``exact``: mean effects).
        spearman: rank correlation between estimate and exact effect over ``verified``.
        meta: method, steps, readout, language(s), timings.
        areas: MIB's summaries of the curve (:func:`.faithfulness.curve_areas`): ``cpr``
            and ``cmd``, each ``{"value", "lo", "hi"}``, and ``n``.
    """

    graph: Graph
    labels: list[str]
    scores: Tensor
    facts: list[str]
    clean: Tensor
    corrupted: Tensor
    ranked: list[Edge]
    circuit: list[Edge]
    curve: list[dict[str, Any]]
    verified: list[dict[str, Any]]
    spearman: float
    faithfulness: dict[str, float]
    meta: dict[str, Any] = field(default_factory=dict)
    pairs: Pairs | None = field(default=None, repr=False)
    areas: dict[str, Any] = field(default_factory=dict)

    @property
    def n(self) -> int:
        """Number of facts."""
        return len(dict.fromkeys(self.facts))

    def edge_name(self, e: Edge) -> str:
        return f"{self.graph.edge_name(e[0], e[1])}@{self.labels[e[2]]}"

    def edges_table(self, edges: Sequence[Edge] | None = None) -> list[dict[str, Any]]:
        """One row per edge (default: the circuit's): sender, receiver, position, mean score
        with its 95% interval and n, and the exact effect where it was verified."""
        mean, lo, hi, n = edge_intervals(self.scores, self.facts)
        exact = {v["edge"]: v["exact"] for v in self.verified}
        out = []
        for e in self.circuit if edges is None else edges:
            s, r, k = e
            row = {
                "edge": self.edge_name(e),
                "sender": self.graph.senders[s].name,
                "sender_layer": self.graph.senders[s].layer,
                "receiver": self.graph.receivers[r].name,
                "receiver_layer": self.graph.receivers[r].layer,
                "position": self.labels[k],
                "score": float(mean[s, r, k]),
                "lo": float(lo[s, r, k]),
                "hi": float(hi[s, r, k]),
                "n": n,
            }
            if row["edge"] in exact:
                row["exact"] = exact[row["edge"]]
            out.append(row)
        return out

    def to_json(self) -> dict[str, Any]:
        """Everything but the per-row scores, JSON-ready."""
        return {
            "n": self.n,
            "meta": self.meta,
            "graph": self.graph.to_json(),
            "n_layers": self.graph.receivers[-1].layer,
            "positions": self.labels,
            "clean_mean": float(self.clean.mean()),
            "corrupted_mean": float(self.corrupted.mean()),
            "faithfulness": self.faithfulness,
            "curve": self.curve,
            "areas": self.areas,
            "spearman": self.spearman,
            "verified": self.verified,
            "edges": self.edges_table(),
        }

    def intervention(self, model: Model, *, reference: str = "corrupted") -> CircuitAblation:
        """This circuit as an intervention on its own clean prompts: every edge outside it
        carries the ``"corrupted"`` prompts' sender outputs, position by position (then
        applying it to the clean batch gives the faithfulness curve's patched run), or their
        ``"mean"`` over every real position of the corrupted prompts (the reference set).
        With position groups it applies to these rows only (``groups``: their roles).

        Raises:
            InputError: a result without its pairs, or an unknown reference.
        """
        if self.pairs is None or reference not in ("corrupted", "mean"):
            raise InputError("intervention() needs find_circuit's pairs and reference "
                             f"'corrupted' or 'mean', got {reference!r}")  # fmt: skip
        S, R = self.graph.mask.shape
        K = len(self.labels)
        keep = torch.zeros(S, R, K, dtype=torch.bool)
        for s, r, k in self.circuit:
            keep[s, r, k] = True
        batch = self.pairs.corrupted_batch.to(model_input_device(model))
        ref = CircuitAblation.reference_of(
            model, self.graph.senders, batch.tokens, attention_mask=batch.attention_mask(),
            mean=reference == "mean",
        )  # fmt: skip
        meta = {"reference": reference, "circuit": self.meta, "n_edges": len(self.circuit)}
        return CircuitAblation(
            self.graph.senders, self.graph.receivers, self.graph.mask, keep, ref,
            groups=self.pairs.roles if K > 1 else None, meta=meta,
        )  # fmt: skip

    def figure(self, title: str | None = None) -> go.Figure:
        """The circuit drawn from its measured edges only."""
        return measured_circuit_figure(self.to_json(), title=title)

    def files(self, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        return {
            "circuit.json": {**self.to_json(), "run": meta or {}},
            "circuit.html": self.figure().to_html(include_plotlyjs="cdn"),
        }


def _verify(
    res_scores: Tensor, patcher: EdgePatcher, ranked: Sequence[Edge], clean: Tensor, k: int,
    name: Any,
) -> tuple[list[dict[str, Any]], float]:  # fmt: skip
    """The ``k`` top edges patched exactly; Spearman's rho between estimate and exact."""
    from scipy.stats import spearmanr

    top = list(ranked[:k])
    exact = patcher.edge_effects(top, clean)  # [edge, row]
    est = torch.stack([res_scores[:, s, r, g] for s, r, g in top]) if top else exact
    rows = [
        {"edge": name(e), "estimate": float(est[i].mean()), "exact": float(exact[i].mean())}
        for i, e in enumerate(top)
    ]
    if len(top) < 3:
        return rows, float("nan")
    rho = spearmanr([r["estimate"] for r in rows], [r["exact"] for r in rows]).statistic
    return rows, float(rho)


def find_circuit(
    model: Model,
    facts: Sequence[Fact],
    *,
    method: str = "eap-ig",
    steps: int = 5,
    readout: str = "logprob",
    positions: str = "roles",
    selection: str = "top",
    pool: Sequence[Fact] | None = None,
    cross_language: bool = False,
    **more: Unpack[CircuitArgs],
) -> CircuitResult:
    """Score every edge of ``model``'s graph on subject (or cross-language) pairs of
    ``facts``, verify the top ``verify`` edges by exact patching, draw the faithfulness
    curve (with MIB's CPR and CMD, :func:`.faithfulness.curve_areas`) and pick the smallest
    circuit on it reaching ``target`` faithfulness (else the largest).

    Under ``torchrun`` inside :func:`~mechlingo.core.distributed.sharded_scoring`
    each rank scores and patches its contiguous share of the pairs and the per-row results
    are gathered in order, so every rank returns the whole result.

    Args:
        method: ``"eap"`` or ``"eap-ig"`` (``steps`` interpolation steps of the embeddings).
        readout: ``"logprob"`` (clean answer) or ``"logit_diff"`` (clean minus corrupted).
        positions: ``"roles"`` (edges per position group) or ``"all"`` (position-summed).
        selection: ``"top"`` (largest |score|) or ``"greedy"`` (grown from the logits).
        pool, cross_language: where corrupted partners come from (:func:`.pairs.make_pairs`).
        more: :class:`CircuitArgs` (target faithfulness, curve sizes, edges to verify,
            head senders, batch size, progress bars).

    Raises:
        InputError: an unknown method or selection, or facts without partners; before any
            pass over the model.
    """
    if method not in ("eap", "eap-ig"):
        raise InputError(f"method must be 'eap' or 'eap-ig', got {method!r}")
    if selection not in ("top", "greedy"):
        raise InputError(f"selection must be 'top' or 'greedy', got {selection!r}")
    target, sizes = float(more.get("target", 0.8)), more.get("sizes", SIZES)
    verify, batch_size = int(more.get("verify", 20)), int(more.get("batch_size", BATCH_SIZE))
    progress = bool(more.get("progress", PROGRESS))
    t0 = time.perf_counter()
    graph = build_graph(model, heads=more.get("heads"))
    pairs = make_pairs(
        model, facts, pool=pool, cross_language=cross_language, readout=readout, positions=positions
    )
    n_steps = 1 if method == "eap" else int(steps)
    scores, clean, corrupted = _scores(model, graph, pairs, n_steps, batch_size, progress)
    t_scores = time.perf_counter() - t0
    ids = pairs.fact_ids
    mean = edge_intervals(scores, ids)[0]
    total = graph.n_edges * len(pairs.labels)
    pick = top_edges if selection == "top" else greedy_edges
    ranked = pick(graph, mean, total)
    points = sorted({min(int(n), total) for n in [*sizes, total]})
    bar = tqdm(total=min(verify, total) + len(points), desc="exact patching", disable=not progress)
    patcher = sharded_patcher(model, graph, pairs, batch_size=batch_size, tick=bar.update)
    labels = pairs.labels

    def name(e: Edge) -> str:
        return f"{graph.edge_name(e[0], e[1])}@{labels[e[2]]}"

    verified, rho = _verify(scores, patcher, ranked, clean, verify, name)
    curve = faithfulness_curve(patcher, ranked, points, clean, corrupted, ids, keep_readout=True)
    bar.close()
    readouts = torch.stack([p.pop("readout") for p in curve])
    areas = curve_areas(readouts, [p["n_edges"] for p in curve], total, clean, corrupted, ids)
    best = next((p for p in curve if p["faithfulness"] >= target), curve[-1])
    return CircuitResult(
        graph=graph, labels=labels, scores=scores, facts=ids, clean=clean,
        corrupted=corrupted, ranked=ranked, circuit=ranked[: best["n_edges"]], curve=curve,
        verified=verified, spearman=rho,
        faithfulness={k: best[k] for k in ("faithfulness", "lo", "hi")},
        meta=_meta(method, n_steps, readout, selection, target, pairs, t_scores, t0),
        pairs=pairs, areas=areas,
    )  # fmt: skip


def _shard(pairs: Pairs) -> tuple[list[int], int]:
    """This rank's contiguous rows of ``pairs`` and their offset (every row outside
    sharded scoring).

    Raises:
        InputError: fewer pairs than processes.
    """
    n = pairs.clean_batch.batch_size
    if not scoring_sharded():
        return list(range(n)), 0
    world = dist_info().world_size
    if n < world:
        raise InputError(
            f"{n} prompt pairs for {world} processes: give more facts or run fewer processes"
        )
    rows = list(shard_bounds(n))
    return rows, rows[0]


def _offset_readout(readout: ReadoutFn, offset: int) -> ReadoutFn:
    if offset == 0:
        return readout
    return lambda final, rows: readout(final, rows + offset)


def _scores(
    model: Model, graph: Graph, pairs: Pairs, steps: int, batch_size: int, progress: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """Edge scores and the clean and corrupted readout of every row (under sharded scoring:
    this rank's rows, gathered)."""
    rows, offset = _shard(pairs)
    readout = _offset_readout(readout_fn(model, pairs.readout), offset)
    scores, clean, corrupted = edge_scores(
        model, graph, pairs.clean_batch.select(rows), pairs.corrupted_batch.select(rows),
        readout, pairs.roles[rows], steps=steps, batch_size=batch_size, progress=progress,
    )  # fmt: skip
    if not scoring_sharded():
        return scores, clean, corrupted
    return all_gather_rows(scores), all_gather_rows(clean), all_gather_rows(corrupted)


def sharded_patcher(
    model: Model,
    graph: Graph,
    pairs: Pairs,
    *,
    batch_size: int = BATCH_SIZE,
    tick: Callable[..., object] | None = None,
) -> EdgePatcher:
    """An :class:`EdgePatcher` of ``pairs``; under sharded scoring (``torchrun``) it patches
    this rank's rows and gathers every rank's readout in order."""
    rows, offset = _shard(pairs)
    readout = _offset_readout(readout_fn(model, pairs.readout), offset)
    return EdgePatcher(
        model, graph, pairs.clean_batch.select(rows), pairs.corrupted_batch.select(rows),
        readout, pairs.roles[rows], batch_size=batch_size, gather=scoring_sharded(), tick=tick,
    )  # fmt: skip


def _meta(
    method: str, steps: int, readout: str, selection: str, target: float, pairs: Pairs,
    t_scores: float, t0: float,
) -> dict[str, Any]:  # fmt: skip
    return {
        "method": method,
        "steps": steps,
        "readout": readout,
        "selection": selection,
        "target": target,
        "langs": sorted({f.lang for f in pairs.clean}),
        "relations": sorted({f.relation for f in pairs.clean}),
        "skipped_without_partner": pairs.skipped,
        "seconds_scores": round(t_scores, 3),
        "seconds": round(time.perf_counter() - t0, 3),
    }
