"""The model's computational graph as data: the components that write into the residual
stream (*senders*: the embeddings, each attention head where the heads' outputs add up to
the attention output, else each attention layer, each MLP), those that read it
(*receivers*: each attention layer's input, each MLP's input, one block input where one norm
feeds both, the logits) and the *edges* between them.

A sender writes at a *stage* and a receiver reads at one; an edge joins a sender that writes
before a receiver reads (in a sequential block the MLP reads its own layer's heads, in a
parallel block it does not). The residual stream is the sum of the senders' outputs (plus
constant biases), which edge attribution and edge patching rely on. Why each choice:
``docs/methods/circuits.md``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Bool
from torch import Tensor

from mechlingo.core.errors import InputError
from mechlingo.core.families import family_of
from mechlingo.core.types import Model

__all__ = ["Graph", "Receiver", "Sender", "build_graph"]

#: Layout names whose attention output is normed after the heads are summed.
_POST_NORM = "post_attention_layernorm"


@dataclass(frozen=True)
class Sender:
    """A component that writes into the residual stream.

    Attributes:
        name: ``"embed"``, ``"a{layer}.h{head}"``, ``"a{layer}"`` or ``"m{layer}"``.
        kind: ``"embed"``, ``"head"``, ``"attn"`` or ``"mlp"``.
        layer: its block (``-1`` for the embeddings).
        head: the head index (``-1`` unless ``kind == "head"``).
        hook: the hook its output is read at (``attn.hook_z`` for a head).
        stage: when it writes (see the module docstring).
    """

    name: str
    kind: str
    layer: int
    head: int
    hook: str
    stage: int


@dataclass(frozen=True)
class Receiver:
    """A component that reads the residual stream.

    Attributes:
        name: ``"attn{layer}"``, ``"mlp{layer}"``, ``"block{layer}"`` or ``"logits"``.
        kind: ``"attn"``, ``"mlp"``, ``"block"`` (attention and MLP behind one norm) or
            ``"logits"``.
        layer: its block (``n_layers`` for the logits).
        hook: the hook whose value is this receiver's input only (before its norm).
        stage: when it reads.
    """

    name: str
    kind: str
    layer: int
    hook: str
    stage: int


@dataclass(frozen=True)
class Graph:
    """Senders, receivers and the edge mask ``[sender, receiver]`` of one model.

    Attributes:
        senders: in the order they fire.
        receivers: in the order they read.
        mask: ``mask[s, r]``: sender ``s`` writes before receiver ``r`` reads (an edge).
        heads: whether attention senders are single heads (else whole layers).
        parallel: whether attention and MLP of a block read the same residual.
    """

    senders: tuple[Sender, ...]
    receivers: tuple[Receiver, ...]
    mask: Bool[Tensor, "sender receiver"]
    heads: bool
    parallel: bool

    @property
    def n_edges(self) -> int:
        """Number of edges (position-summed)."""
        return int(self.mask.sum())

    def n_edges_at(self, n_positions: int) -> int:
        """Number of edges when each is split over ``n_positions`` token positions (an edge
        joins a sender and a receiver at the same position: the residual stream is per
        position)."""
        return self.n_edges * int(n_positions)

    def edges(self) -> list[tuple[int, int]]:
        """Every edge as ``(sender index, receiver index)``."""
        return [(int(s), int(r)) for s, r in self.mask.nonzero().tolist()]

    def edge_name(self, s: int, r: int) -> str:
        return f"{self.senders[s].name}->{self.receivers[r].name}"

    def receiver_of(self, s: int) -> list[int]:
        """The receivers that are the input of sender ``s``'s own component (an attention
        head's layer input, an MLP's input; none for the embeddings)."""
        snd = self.senders[s]
        want = {"head": ("attn", "block"), "attn": ("attn", "block"), "mlp": ("mlp", "block")}
        kinds = want.get(snd.kind, ())
        return [i for i, r in enumerate(self.receivers) if r.layer == snd.layer and r.kind in kinds]

    def to_json(self) -> dict[str, Any]:
        return {
            "senders": [s.name for s in self.senders],
            "receivers": [r.name for r in self.receivers],
            "n_edges": self.n_edges,
            "heads": self.heads,
            "parallel": self.parallel,
        }


def _first_hook(model: Model, candidates: list[str]) -> str | None:
    return next((h for h in candidates if h in model.hook_dict), None)


def _split_heads(model: Model, family: Any) -> bool:
    """Whether head outputs add up to the attention output (no norm after the heads), and
    the hook and ``W_O`` to compute them exist."""
    if family is not None and family.layout is not None and family.layout.attn_out == _POST_NORM:
        return False
    if "blocks.0.attn.hook_z" not in model.hook_dict:
        return False
    w_o = getattr(model.blocks[0].attn, "W_O", None)
    return isinstance(w_o, Tensor) and w_o.ndim == 3


def _receivers(model: Model, n_layers: int, parallel: bool) -> list[Receiver]:
    out: list[Receiver] = []
    for layer in range(n_layers):
        attn = _first_hook(model, [f"blocks.{layer}.ln1.hook_in", f"blocks.{layer}.attn.hook_in"])
        ln2 = f"blocks.{layer}.ln2.hook_in"
        mlp = _first_hook(model, [ln2, f"blocks.{layer}.mlp.hook_in"])
        if attn is None or mlp is None:
            raise InputError(
                f"block {layer} has no attention or MLP input hook (ln1/attn.hook_in, "
                "ln2/mlp.hook_in): circuits need a TransformerLens 4 bridge model"
            )
        a_stage, m_stage = (layer + 1, layer + 1) if parallel else (2 * layer + 1, 2 * layer + 2)
        if parallel and ln2 not in model.hook_dict:  # one norm feeds attention and MLP
            out.append(Receiver(f"block{layer}", "block", layer, attn, a_stage))
            continue
        out.append(Receiver(f"attn{layer}", "attn", layer, attn, a_stage))
        out.append(Receiver(f"mlp{layer}", "mlp", layer, mlp, m_stage))
    last = 2 * n_layers + 3
    out.append(Receiver("logits", "logits", n_layers, "ln_final.hook_in", last))
    return out


def build_graph(model: Model, *, heads: bool | None = None) -> Graph:
    """The computational graph of ``model`` (see the module docstring).

    Args:
        heads: attention senders per head (``True``), per layer (``False``), or per head
            wherever the heads' outputs add up to the attention output (``None``, default).

    Raises:
        InputError: ``heads=True`` on a family whose heads do not add up (a norm after the
            attention), or a model without the hooks the graph needs.
    """
    cfg = model.cfg
    n_layers, n_heads = int(cfg.n_layers), int(cfg.n_heads)
    family = family_of(str(getattr(cfg, "architecture", "") or ""))
    parallel = bool(family.parallel) if family is not None else False
    can_split = _split_heads(model, family)
    if heads and not can_split:
        raise InputError(
            "this model's attention heads do not add up to its attention output (a norm after "
            "the heads, or no attn.hook_z): use heads=False for layer-level attention senders"
        )
    split = can_split if heads is None else bool(heads)
    if "ln_final.hook_in" not in model.hook_dict:
        raise InputError("the model has no ln_final.hook_in: circuits need a final norm input")
    senders = [Sender("embed", "embed", -1, -1, "blocks.0.hook_resid_pre", 0)]
    for layer in range(n_layers):
        a_stage, m_stage = (layer + 1, layer + 1) if parallel else (2 * layer + 1, 2 * layer + 2)
        if split:
            z = f"blocks.{layer}.attn.hook_z"
            senders += [
                Sender(f"a{layer}.h{h}", "head", layer, h, z, a_stage) for h in range(n_heads)
            ]
        else:
            senders.append(
                Sender(f"a{layer}", "attn", layer, -1, f"blocks.{layer}.hook_attn_out", a_stage)
            )
        senders.append(
            Sender(f"m{layer}", "mlp", layer, -1, f"blocks.{layer}.hook_mlp_out", m_stage)
        )
    receivers = _receivers(model, n_layers, parallel)
    s_stage = torch.tensor([s.stage for s in senders])
    r_stage = torch.tensor([r.stage for r in receivers])
    mask = s_stage[:, None] < r_stage[None, :]
    return Graph(tuple(senders), tuple(receivers), mask, split, parallel)
