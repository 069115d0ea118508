"""Exact edge patching: the readout when a set of edges carries the corrupted sender output
and every other edge the value of the run itself.

On each removed edge ``s -> r`` (at the positions of its group ``k``) receiver ``r`` reads
``its input + (corrupted output of s - output of s in this run)``; every other receiver
reading the same residual stream is unchanged. With one edge removed this is the edge's
exact effect (its sender is upstream of its receiver, so its output in the run is the clean
one); with every edge but a circuit's removed, the circuit alone carries clean values
(faithfulness, :mod:`.faithfulness`); with every edge removed, every receiver reads the
corrupted residual stream and the run is the corrupted run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from mechlingo.analyses.circuits.graph import Graph
from mechlingo.analyses.circuits.runs import ReadoutFn, run_graph
from mechlingo.analyses.circuits.scores import check_pairs, chunks
from mechlingo.core.defaults import BATCH_SIZE
from mechlingo.core.distributed import all_gather_rows
from mechlingo.core.tokens import TokenBatch
from mechlingo.core.types import Model

__all__ = ["EdgePatcher", "patch_weights"]


def patch_weights(
    removed: Bool[Tensor, "sender receiver group"], roles: Float[Tensor, "row pos group"]
) -> Float[Tensor, "receiver row pos sender"]:
    """For each receiver, row and position, which senders' corrupted-minus-current outputs
    it reads (1) or not (0)."""
    return torch.einsum("srk,btk->rbts", removed.float(), roles.float())


class EdgePatcher:
    """Exact edge patching of one set of clean/corrupted pairs: the corrupted sender outputs
    are read once (per chunk of rows), then :meth:`read` runs any set of removed edges.

    Args:
        clean, corrupted: row pairs of equal token lengths.
        readout: the readout.
        roles: ``[row, pos, group]`` position groups (as for the scores).
        gather: under ``torchrun``, every rank's rows of :meth:`read` gathered in rank order
            (each rank patches its own shard of the rows).
        tick: called after each :meth:`read` pass (a progress bar).
    """

    def __init__(
        self,
        model: Model,
        graph: Graph,
        clean: TokenBatch,
        corrupted: TokenBatch,
        readout: ReadoutFn,
        roles: Float[Tensor, "row pos group"],
        *,
        batch_size: int = BATCH_SIZE,
        gather: bool = False,
        tick: Callable[[], object] | None = None,
    ) -> None:
        check_pairs(clean, corrupted)
        self.gather, self.tick = gather, tick
        self.model, self.graph, self.readout = model, graph, readout
        self.chunks = chunks(clean.batch_size, batch_size)
        self.clean = [clean.select(rows) for rows in self.chunks]
        self.roles = [
            roles[rows, : c.tokens.shape[1]]
            for rows, c in zip(self.chunks, self.clean, strict=True)
        ]
        self.corr: list[Tensor] = []
        for rows in self.chunks:
            with torch.no_grad():
                run = run_graph(model, graph, corrupted.select(rows))
            assert run.senders is not None
            self.corr.append(run.senders)
        self.n_calls = 0

    def read(self, removed: Bool[Tensor, "sender receiver group"]) -> Float[Tensor, " row"]:
        """The readout of every row with the edges of ``removed`` carrying corrupted values
        (``removed`` outside the graph's edges is ignored)."""
        removed = removed & self.graph.mask[:, :, None]
        out = []
        for rows, batch, roles, corr in zip(
            self.chunks, self.clean, self.roles, self.corr, strict=True
        ):
            w = patch_weights(removed, roles)
            with torch.no_grad():
                run = run_graph(self.model, self.graph, batch, patch=(corr, w))
                out.append(self.readout(run.final, torch.tensor(rows)).float().cpu())
        self.n_calls += 1
        if self.tick is not None:
            self.tick()
        rows = torch.cat(out) if out else torch.empty(0)
        return all_gather_rows(rows) if self.gather else rows

    def edge_effects(
        self, edges: Sequence[tuple[int, int, int]], base: Float[Tensor, " row"]
    ) -> Float[Tensor, "edge row"]:
        """The exact effect ``readout(only that edge corrupted) - base`` of each edge ``(s,
        r, k)`` (``base``: the clean readout)."""
        S, R = self.graph.mask.shape
        K = self.roles[0].shape[-1]
        out = []
        for s, r, k in edges:
            removed = torch.zeros(S, R, K, dtype=torch.bool)
            removed[s, r, k] = True
            out.append(self.read(removed) - base)
        return torch.stack(out) if out else torch.empty(0, base.shape[0])
