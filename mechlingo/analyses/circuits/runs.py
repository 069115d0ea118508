"""One forward pass over the computational graph (:mod:`.graph`): it reads every sender's
output, and at every receiver's input (before its norm) it can add a zero *probe* (for the
gradient of the readout there) and an *edge patch*: for each removed edge ``s -> r``, the
sender's corrupted output minus its output in this very run, at the positions the edge
covers, on receiver ``r``'s input only (the other receivers reading the same residual
stream are unchanged). The pass stops at the logits receiver and returns each row's final
residual at its last real token, from which a :data:`ReadoutFn` computes the readout.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from mechlingo.activations.runs import StopForward, hooked, model_input_device
from mechlingo.analyses.circuits.graph import Graph
from mechlingo.analyses.recall.gradients import _readout_values
from mechlingo.analyses.recall.patching.readouts import AnswerReadout, pack_readouts
from mechlingo.core.tokens import TokenBatch, batch_context
from mechlingo.core.types import Model

__all__ = ["Pass", "ReadoutFn", "readout_fn", "run_graph", "sender_outputs"]

#: The readout of each row from its final residual at the last real token (differentiable),
#: given the example index of each row.
ReadoutFn = Callable[[Float[Tensor, "row d_model"], Tensor], Float[Tensor, " row"]]


def readout_fn(model: Model, answer: AnswerReadout) -> ReadoutFn:
    """A :class:`~mechlingo.analyses.recall.patching.AnswerReadout` (answer log-probability or
    logit difference over the project's answer sets) as a :data:`ReadoutFn`: final norm,
    unembedding and log-softmax, differentiably."""
    ids, primary, slices = pack_readouts([answer], answer.n_examples)

    def readout(final: Tensor, rows: Tensor) -> Tensor:
        r = rows.to(ids.device)
        return _readout_values(model, final, [answer], (ids[r], primary[r], slices))[0]

    return readout


def head_outputs(model: Model, layer: int, z: Tensor) -> Float[Tensor, "batch pos head d_model"]:
    """Each head's write into the residual stream, ``z_h @ W_O[h]`` (bias excluded: it is
    the same in every run)."""
    w_o = model.blocks[layer].attn.W_O  # [head, d_head, d_model]
    return torch.einsum("bphd,hdm->bphm", z.to(w_o.dtype), w_o)


def sender_outputs(
    model: Model, graph: Graph, acts: dict[str, Tensor]
) -> Float[Tensor, "sender batch pos d_model"]:
    """The senders' outputs stacked, from the activations of their hooks."""
    out: list[Tensor] = []
    heads: dict[str, Tensor] = {}
    for s in graph.senders:
        if s.kind == "head":
            if s.hook not in heads:
                heads[s.hook] = head_outputs(model, s.layer, acts[s.hook])
            out.append(heads[s.hook][:, :, s.head])
        else:
            out.append(acts[s.hook])
    return torch.stack([o.float() for o in out])


@dataclass
class Pass:
    """What :func:`run_graph` returns: ``final`` ``[row, d_model]`` (in the autograd graph
    when probes were on), the receivers' ``probes`` (``[row, pos, d_model]`` zeros
    requiring grad), and ``senders`` ``[sender, row, pos, d_model]`` (detached)."""

    final: Tensor
    probes: list[Tensor] = field(default_factory=list)
    senders: Tensor | None = None


@dataclass
class _State:
    acts: dict[str, Tensor] = field(default_factory=dict)  # sender hook -> live tensor
    probes: dict[int, Tensor] = field(default_factory=dict)
    final: list[Tensor] = field(default_factory=list)


def _live_senders(model: Model, graph: Graph, st: _State, upto: int) -> tuple[list[int], Tensor]:
    """Indices and current outputs ``[k, row, pos, d]`` of the senders that fired before
    receiver stage ``upto``."""
    idx = [i for i, s in enumerate(graph.senders) if s.stage < upto]
    heads: dict[str, Tensor] = {}
    out = []
    for i in idx:
        s = graph.senders[i]
        t = st.acts[s.hook]
        if s.kind == "head":
            if s.hook not in heads:
                heads[s.hook] = head_outputs(model, s.layer, t)
            t = heads[s.hook][:, :, s.head]
        out.append(t)
    return idx, torch.stack(out)


def _receiver_hook(
    model: Model,
    graph: Graph,
    r: int,
    st: _State,
    probe: bool,
    patch: tuple[Tensor, Tensor] | None,
    last: Tensor,
) -> Callable:
    """The hook at receiver ``r``'s input: probe, edge patch, and at the logits the stop.
    ``patch``: ``(corrupted sender outputs [S, row, pos, d], weights [R, row, pos, S])``."""
    rec = graph.receivers[r]

    def hook(t: Tensor, hook: Any) -> Tensor:
        if patch is not None and bool(patch[1][r].any()):
            idx, live = _live_senders(model, graph, st, rec.stage)
            corr = patch[0][idx].to(device=t.device, dtype=live.dtype)
            w = patch[1][r][:, : t.shape[1], idx].to(device=t.device, dtype=live.dtype)
            diff = corr[:, :, : t.shape[1]] - live
            t = t + torch.einsum("bts,sbtd->btd", w, diff).to(t.dtype)
        if probe:
            p = torch.zeros_like(t).requires_grad_(True)
            st.probes[r] = p
            t = t + p
        if rec.kind == "logits":
            rows = torch.arange(t.shape[0], device=t.device)
            st.final.append(t[rows, last.to(t.device)])
            raise StopForward
        return t

    return hook


def _keep(st: _State, name: str) -> Callable:
    def hook(t: Tensor, hook: Any) -> None:
        st.acts[name] = t

    return hook


def run_graph(
    model: Model,
    graph: Graph,
    batch: TokenBatch,
    *,
    probes: bool = False,
    patch: tuple[Tensor, Tensor] | None = None,
    first: Sequence[tuple[str, Callable]] = (),
) -> Pass:
    """Run ``batch`` over ``graph`` (see the module docstring). ``probes``: add zero probes
    at the receivers (call under ``torch.enable_grad()``); ``patch``: ``(corrupted sender
    outputs [sender, row, pos, d_model], weights [receiver, row, pos, sender])``, the share
    of each sender's corrupted-minus-current output that each receiver reads at each
    position (1 on a removed edge, 0 elsewhere); ``first``: hooks registered before all
    others (the input interpolation of integrated gradients)."""
    st = _State()
    hooks: list[tuple[str, Callable]] = list(first)
    for hook_name in dict.fromkeys(s.hook for s in graph.senders):
        hooks.append((hook_name, _keep(st, hook_name)))
    for r, rec in enumerate(graph.receivers):
        hooks.append(
            (rec.hook, _receiver_hook(model, graph, r, st, probes, patch, batch.last_index))
        )
    b = batch.to(model_input_device(model))
    with batch_context(b), hooked(model, hooks):
        try:
            model(b.tokens, attention_mask=b.attention_mask())
        except StopForward:
            pass
    if len(st.final) != 1:
        raise RuntimeError("the logits receiver (ln_final.hook_in) did not fire exactly once")
    acts = {k: v.detach() for k, v in st.acts.items()}
    probe_list = [st.probes[r] for r in range(len(graph.receivers))] if probes else []
    return Pass(st.final[0], probe_list, sender_outputs(model, graph, acts))
