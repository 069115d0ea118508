"""A circuit as an intervention: everything but the circuit ablated.

:class:`CircuitAblation` keeps a circuit's edges (``sender -> receiver``, optionally per
position group) and makes every other edge of the model's graph carry a *reference* value
of its sender: receiver ``r`` reads its input plus, over its removed edges, reference minus
the sender's output in this run (exact edge patching as a hook object). The reference is a
corrupted batch's outputs, position by position (``[sender, row, pos, d_model]``), or their
mean over a reference set (``[sender, 1, 1, d_model]``, any prompt). Every edge kept is the
model's own run; none kept with the corrupted reference is the corrupted run. What is no
sender's output (biases, a steering vector) reaches every receiver, so it composes with the
other interventions. Saved as plain fields and safetensors; every hook name is checked
against the model before a hook is attached. Built by
:meth:`mechlingo.analyses.circuits.CircuitResult.intervention`; the method and its checks:
``docs/methods/circuits.md``."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from mechlingo.core.describe import check_model
from mechlingo.core.errors import InterventionError
from mechlingo.core.types import HookFn, Model
from mechlingo.interventions.base import Intervention, check_finite, register_kind

__all__ = ["CircuitAblation"]

_SENDER_KINDS = ("embed", "head", "attn", "mlp")
_RECEIVER_KINDS = ("attn", "mlp", "block", "logits")
_HOOK = re.compile(r"^[A-Za-z0-9_.]{1,200}$")
_FIELDS = ("name", "kind", "layer", "head", "hook", "stage")


def _spec(obj: Any, kinds: Sequence[str], what: str) -> dict[str, Any]:
    """A sender or receiver (a graph's dataclass or a saved dict) as a checked plain dict."""
    get = obj.get if isinstance(obj, Mapping) else lambda k, d=None: getattr(obj, k, d)
    out = {k: get(k, -1 if k == "head" else None) for k in _FIELDS}
    ok = (
        isinstance(out["name"], str) and out["kind"] in kinds
        and isinstance(out["hook"], str) and bool(_HOOK.match(out["hook"]))
        and all(isinstance(out[k], int) and not isinstance(out[k], bool)
                and abs(out[k]) < 2**20 for k in ("layer", "head", "stage"))
    )  # fmt: skip
    if not ok:
        raise InterventionError(
            f"CircuitAblation: a malformed {what} {str(obj)[:120]!r}",
            fix="build it from a graph (mechlingo.analyses.circuits.build_graph)",
        )
    return out


def head_write(z: Tensor, w_o: Tensor, head: int) -> Float[Tensor, "batch pos d_model"]:
    """One head's write into the residual stream, ``z[:, :, head] @ W_O[head]``."""
    return torch.einsum("bpd,dm->bpm", z[:, :, head].to(w_o.dtype), w_o[head])


@register_kind
class CircuitAblation(Intervention):
    """Every edge of the graph outside the circuit carries its sender's reference value (see
    the module docstring).

    Args:
        senders, receivers: the graph's (:class:`~mechlingo.analyses.circuits.Sender` and
            ``Receiver``, or dicts of their fields ``name, kind, layer, head, hook, stage``).
        edges: ``[sender, receiver]`` the graph's edge mask.
        keep: ``[sender, receiver, group]`` the circuit's edges (``[sender, receiver]``: one
            group of every position).
        reference: ``[sender, 1, 1, d_model]`` (a mean) or ``[sender, row, pos, d_model]``
            (a corrupted batch's outputs).
        groups: ``[row, pos, group]`` 0/1 position groups, needed with more than one group.
        meta: saved metadata (``meta["reference"]`` says which reference it holds).

    It runs on the TransformerLens bridge (its hooks are the graph's receiver inputs);
    :meth:`attach` to a plain transformers model and :meth:`only_for` gates are untested
    with it.
    """

    kind = "CircuitAblation"

    def __init__(
        self,
        senders: Sequence[Any],
        receivers: Sequence[Any],
        edges: Bool[Tensor, "sender receiver"],
        keep: Bool[Tensor, "sender receiver *group"],
        reference: Float[Tensor, "sender row pos d_model"],
        *,
        groups: Float[Tensor, "row pos group"] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        self.senders = [_spec(s, _SENDER_KINDS, "sender") for s in senders]
        self.receivers = [_spec(r, _RECEIVER_KINDS, "receiver") for r in receivers]
        S, R = len(self.senders), len(self.receivers)
        edges, keep = torch.as_tensor(edges).bool().clone(), torch.as_tensor(keep).bool().clone()
        keep = keep[:, :, None].clone() if keep.ndim == 2 else keep
        reference = torch.as_tensor(reference).detach().float()
        if tuple(edges.shape) != (S, R) or keep.ndim != 3 or tuple(keep.shape[:2]) != (S, R):
            raise InterventionError(
                f"CircuitAblation: edges {tuple(edges.shape)} and keep {tuple(keep.shape)} do "
                f"not fit {S} senders and {R} receivers"
            )
        if reference.ndim != 4 or reference.shape[0] != S:
            raise InterventionError(
                f"CircuitAblation: the reference must be [sender={S}, row, pos, d_model], got "
                f"{tuple(reference.shape)}"
            )
        check_finite(reference, "the circuit's reference")
        K = keep.shape[2]
        if K > 1 and (groups is None or groups.ndim != 3 or groups.shape[2] != K):
            raise InterventionError(
                f"a circuit of {K} position groups needs groups= [row, pos, {K}] (the rows it "
                "applies to)"
            )
        self.edges, self.keep, self.reference = edges, keep, reference
        self.groups = None if groups is None else torch.as_tensor(groups).float()
        self.meta = dict(meta or {})

    @property
    def removed(self) -> Bool[Tensor, "sender receiver group"]:
        """The ablated edges: the graph's edges outside the circuit."""
        return self.edges[:, :, None] & ~self.keep

    @property
    def n_edges(self) -> int:
        """Edges kept (per position group)."""
        return int((self.edges[:, :, None] & self.keep).sum())

    def fwd_hooks(self, model: Model) -> list[tuple[str, HookFn]]:
        check_model(self.meta.get("model"), model, what=repr(self))
        for spec in (*self.senders, *self.receivers):
            if spec["hook"] not in model.hook_dict:
                raise InterventionError(
                    f"CircuitAblation: the model has no hook {spec['hook']!r} ({spec['name']})",
                    fix="apply it to the model (family) its circuit was found on",
                )
        d = int(model.cfg.d_model)
        if self.reference.shape[-1] != d:
            raise InterventionError(
                f"CircuitAblation: reference width {self.reference.shape[-1]}, model d_model {d}"
            )
        live: dict[str, Tensor] = {}
        hooks: list[tuple[str, HookFn]] = []
        for name in dict.fromkeys(s["hook"] for s in self.senders):
            hooks.append((name, _keeper(live, name)))
        removed = self.removed
        for r, rec in enumerate(self.receivers):
            idx = [int(s) for s in removed[:, r, :].any(-1).nonzero().flatten().tolist()]
            if idx:
                hooks.append((rec["hook"], self._patch(model, live, r, idx)))
        return hooks

    def _patch(self, model: Model, live: dict[str, Tensor], r: int, idx: list[int]) -> HookFn:
        """Receiver ``r``'s hook: add the removed senders' reference minus live outputs."""
        specs = [self.senders[s] for s in idx]
        weights = self.removed[idx, r, :].float()  # [n, group]
        ref_all = self.reference[idx]
        groups = self.groups

        def hook(t: Tensor, hook: Any) -> Tensor:
            outs = []
            for sp in specs:
                v = live[sp["hook"]]
                if sp["kind"] == "head":
                    v = head_write(v, model.blocks[sp["layer"]].attn.W_O, sp["head"])
                outs.append(v.float())
            now = torch.stack(outs)  # [n, batch, pos, d]
            B, T = t.shape[0], t.shape[1]
            ref = ref_all[:, :, :T] if ref_all.shape[2] > 1 else ref_all
            if ref.shape[1] not in (1, B) or ref.shape[2] not in (1, T):
                raise InterventionError(
                    f"CircuitAblation: a reference of {ref_all.shape[1]} rows x "
                    f"{ref_all.shape[2]} positions on a batch of {B} x {T}: a per-position "
                    "reference fits the batch it was read from"
                )
            diff = ref.to(device=t.device) - now
            if groups is None:
                w = weights[:, 0].to(t.device)[:, None, None]  # every position
                add = (w[..., None] * diff).sum(0)
            else:
                if groups.shape[0] != B:
                    raise InterventionError(
                        f"CircuitAblation: position groups of {groups.shape[0]} rows on a "
                        f"batch of {B}: a circuit of position groups fits its own rows"
                    )
                w = torch.einsum("sk,btk->bts", weights, groups[:, :T]).to(t.device)
                add = torch.einsum("bts,sbtd->btd", w, diff)
            return t + add.to(t.dtype)

        return hook

    @classmethod
    def reference_of(
        cls,
        model: Model,
        senders: Sequence[Any],
        tokens: Tensor,
        *,
        attention_mask: Tensor | None = None,
        mean: bool = False,
    ) -> Float[Tensor, "sender row pos d_model"]:
        """The senders' outputs on ``tokens`` (one plain forward pass): ``[sender, row,
        pos, d_model]``, or with ``mean`` their average over every real position of every
        row, ``[sender, 1, 1, d_model]``."""
        specs = [_spec(s, _SENDER_KINDS, "sender") for s in senders]
        acts: dict[str, Tensor] = {}
        hooks = [(h, _keeper(acts, h)) for h in dict.fromkeys(s["hook"] for s in specs)]
        with torch.no_grad():
            model.run_with_hooks(tokens, attention_mask=attention_mask, fwd_hooks=hooks)
        outs = []
        for sp in specs:
            v = acts[sp["hook"]]
            if sp["kind"] == "head":
                v = head_write(v, model.blocks[sp["layer"]].attn.W_O, sp["head"])
            outs.append(v.detach().float().cpu())
        out = torch.stack(outs)
        if not mean:
            return out
        real = (
            torch.ones(out.shape[1:3]) if attention_mask is None else attention_mask.float().cpu()
        )
        avg = (out * real[None, :, :, None]).sum((1, 2)) / real.sum()
        return avg[:, None, None, :]

    def _tensors(self) -> dict[str, Tensor]:
        out = {"edges": self.edges, "keep": self.keep, "reference": self.reference}
        if self.groups is not None:
            out["groups"] = self.groups
        return out

    def _config(self) -> dict[str, Any]:
        return {"senders": self.senders, "receivers": self.receivers}

    @classmethod
    def _restore(cls, tensors: dict[str, Tensor], config: dict[str, Any]) -> CircuitAblation:
        return cls(config["senders"], config["receivers"], tensors["edges"], tensors["keep"],
                   tensors["reference"], groups=tensors.get("groups"))  # fmt: skip

    def _fields(self) -> dict[str, str]:
        total = int(self.edges.sum()) * self.keep.shape[2]
        return {
            "kept": f"{self.n_edges} of {total} edges",
            "reference": str(self.meta.get("reference", "given")),
        }


def _keeper(store: dict[str, Tensor], name: str) -> HookFn:
    def hook(t: Tensor, hook: Any) -> None:
        store[name] = t

    return hook
