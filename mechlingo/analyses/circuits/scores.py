"""Edge attribution patching over the computational graph: EAP (Syed et al. 2023) and EAP-IG
(Hanna et al. 2024).

The score of an edge ``s -> r`` at a group of positions ``k`` is

    (corrupted output of s - clean output of s) . d readout / d (input of r)

summed over the positions of ``k``, the gradient taken in the clean run at receiver ``r``'s
input before its norm: by the residual stream's linearity, the input of ``r`` is the sum of
the upstream senders' outputs, so the product is the first-order change of the readout when
only that edge carries the corrupted value (the other receivers unchanged). EAP-IG averages
the gradient over ``steps`` runs whose embeddings (the ``embed`` sender's output) move from
the clean to the corrupted ones, ``alpha = 0, 1/steps, ..., (steps-1)/steps`` (a left
Riemann sum; ``steps=1`` is EAP). Cost: one corrupted forward, then ``steps`` forward and one
backward pass per chunk of rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from mechlingo.analyses.circuits.graph import Graph
from mechlingo.analyses.circuits.runs import ReadoutFn, run_graph
from mechlingo.analyses.recall.patching.runs import repeat_batch
from mechlingo.core.defaults import BATCH_SIZE, PROGRESS
from mechlingo.core.errors import InputError
from mechlingo.core.tokens import TokenBatch
from mechlingo.core.types import Model

__all__ = ["EMBED_HOOK", "check_pairs", "chunks", "edge_scores", "interpolation_hook"]

EMBED_HOOK = "blocks.0.hook_resid_pre"  # the embed sender's output: where EAP-IG interpolates


def check_pairs(clean: TokenBatch, corrupted: TokenBatch) -> None:
    """Clean and corrupted rows must have the same token lengths (positions are compared one
    to one: an edge at position ``t`` of the clean prompt is the same edge at ``t`` of the
    corrupted one)."""
    if clean.tokens.shape != corrupted.tokens.shape or not torch.equal(
        clean.lengths, corrupted.lengths
    ):
        raise InputError(
            "each corrupted prompt needs its clean prompt's token length (got lengths "
            f"{clean.lengths.tolist()} and {corrupted.lengths.tolist()}); pair prompts of "
            "equal length (mechlingo.analyses.circuits.pairs does)"
        )


def interpolation_hook(target: Tensor, alphas: Tensor) -> tuple[str, Callable]:
    """The hook that moves copy ``j`` of a batch (rows ``j*B`` to ``(j+1)*B``) of the embed
    sender's output to ``x + alphas[j] * (target - x)``."""
    a = alphas.repeat_interleave(target.shape[0])

    def hook(t: Tensor, hook: Any) -> Tensor:
        tg = target.to(device=t.device, dtype=t.dtype).repeat(len(alphas), 1, 1)
        return t + a.to(device=t.device, dtype=t.dtype)[:, None, None] * (tg - t)

    return EMBED_HOOK, hook


def _chunk_scores(
    model: Model,
    graph: Graph,
    clean: TokenBatch,
    corrupted: TokenBatch,
    readout: ReadoutFn,
    rows: Tensor,
    roles: Tensor,
    steps: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(scores [row, S, R, K], clean readout [row], corrupted readout [row])`` of one chunk
    (``rows``: the example index of each row)."""
    B = clean.batch_size
    with torch.no_grad():
        corr = run_graph(model, graph, corrupted)
        corr_readout = readout(corr.final, rows).float()
    assert corr.senders is not None
    first = []
    if steps > 1:
        alphas = torch.arange(steps, dtype=torch.float32) / steps
        first = [interpolation_hook(corr.senders[0], alphas)]
    with torch.enable_grad():
        run = run_graph(
            model,
            graph,
            clean if steps == 1 else repeat_batch(clean, steps),
            probes=True,
            first=first,
        )
        values = readout(run.final, rows.repeat(steps))
        grads = torch.autograd.grad(values.sum(), run.probes, allow_unused=True)
    assert run.senders is not None
    g = torch.stack(
        [
            torch.zeros_like(p) if x is None else x.detach()
            for x, p in zip(grads, run.probes, strict=True)
        ]
    ).float()  # [R, steps * B, T, d]
    g = g.view(g.shape[0], steps, B, *g.shape[2:]).mean(1)
    delta = corr.senders - run.senders[:, :B]  # [S, B, T, d]
    per_pos = torch.einsum("sbtd,rbtd->bsrt", delta, g.to(delta.device))
    scores = torch.einsum("bsrt,btk->bsrk", per_pos, roles.to(per_pos))
    scores = scores * graph.mask[None, :, :, None].to(scores)
    return scores, values[:B].detach().float(), corr_readout


def chunks(n_rows: int, batch_size: int) -> list[list[int]]:
    """Consecutive row chunks of at most ``batch_size`` rows."""
    if batch_size < 1:
        raise InputError(f"batch_size must be >= 1, got {batch_size}")
    return [list(range(i, min(n_rows, i + batch_size))) for i in range(0, n_rows, batch_size)]


def edge_scores(
    model: Model,
    graph: Graph,
    clean: TokenBatch,
    corrupted: TokenBatch,
    readout: ReadoutFn,
    roles: Float[Tensor, "row pos group"],
    *,
    steps: int = 1,
    batch_size: int = BATCH_SIZE,
    progress: bool = PROGRESS,
) -> tuple[Float[Tensor, "row sender receiver group"], Tensor, Tensor]:
    """EAP (``steps=1``) or EAP-IG scores of every edge for every row, ``batch_size`` rows
    (times ``steps`` copies) per pass.

    Args:
        clean, corrupted: the row pairs, of equal token lengths (:func:`check_pairs`).
        readout: the readout (:func:`~mechlingo.analyses.circuits.runs.readout_fn`).
        roles: ``[row, pos, group]`` 0/1: which positions each position group holds
            (one group of every real token for position-summed edges).
        steps: integrated-gradient steps (``1``: plain EAP).
        progress: a progress bar over the chunks of rows.

    Returns:
        ``(scores [row, sender, receiver, group], clean readout [row], corrupted readout
        [row])``; scores are 0 off the graph's edges. A score estimates ``readout(clean with
        that edge corrupted) - readout(clean)``.
    """
    check_pairs(clean, corrupted)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise InputError(f"steps must be an integer >= 1, got {steps!r}")
    out, cl, co = [], [], []
    for rows in tqdm(
        chunks(clean.batch_size, batch_size), desc="edge scores", disable=not progress
    ):
        a, b = clean.select(rows), corrupted.select(rows)
        r = torch.tensor(rows)
        k = roles[rows, : a.tokens.shape[1]]
        s, c1, c2 = _chunk_scores(model, graph, a, b, readout, r, k, steps)
        out.append(s.cpu())
        cl.append(c1.cpu())
        co.append(c2.cpu())
    return torch.cat(out), torch.cat(cl), torch.cat(co)
