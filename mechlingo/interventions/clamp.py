"""Neuron clamps: set, scale, add to or zero chosen MLP neurons (``mlp_post``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from mechlingo.core.describe import check_model
from mechlingo.core.errors import InterventionError
from mechlingo.core.sites import canonical_site
from mechlingo.core.tokens import PositionSpec, prepends_bos
from mechlingo.core.types import HookFn, Model
from mechlingo.interventions.base import (
    Intervention,
    check_finite,
    check_positions,
    mask_for,
    positions_text,
    positions_to_json,
    refuse_pattern,
    register_kind,
    site_for,
)

_CLAMP_MODES = ("set", "scale", "add", "zero")


@register_kind
class NeuronClamp(Intervention):
    """Set, scale, add to or zero chosen MLP neurons (``mlp_post``) of one or more layers.

    Args:
        neurons: ``{layer: neuron indices}``.
        values: one number for every chosen neuron, a flat sequence with one value per chosen
            neuron (layers in the order of ``neurons``), or ``{layer: one value per neuron}``.
            Ignored for ``mode="zero"``.
        mode: ``"set"`` (activation := value), ``"scale"`` (activation *= value), ``"add"``
            (activation += value) or ``"zero"``.
        positions: where along the sequence (default ``"all"`` real tokens after BOS).
        site: ``mlp_post`` (the neurons); any other site with a feature axis works too.
    """

    kind = "NeuronClamp"

    def __init__(
        self,
        neurons: Mapping[int, Sequence[int] | Int[Tensor, " k"]],
        values: float | Mapping[int, Sequence[float] | Float[Tensor, " k"]] = 0.0,
        mode: str = "set",
        *,
        positions: PositionSpec = "all",
        site: str = "mlp_post",
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        if mode not in _CLAMP_MODES:
            raise InterventionError(f"unknown clamp mode {mode!r}; use one of {_CLAMP_MODES}")
        if not neurons:
            raise InterventionError("NeuronClamp needs at least one layer with neurons")
        self.mode = mode
        self.site = canonical_site(site)
        refuse_pattern(self.site, "a NeuronClamp")
        self.positions = check_positions(positions)
        self.meta = dict(meta or {})
        self.neurons: dict[int, Tensor] = {}
        self.values: dict[int, Tensor] = {}
        flat: Tensor | None = None  # one value per neuron over all layers, in the given order
        if not isinstance(values, Mapping) and not isinstance(values, (int, float)):
            flat = torch.as_tensor(values, dtype=torch.float32).reshape(-1)
            total = sum(torch.as_tensor(i).numel() for i in neurons.values())
            if flat.numel() == 1:
                values, flat = float(flat), None
            elif flat.numel() != total:
                raise InterventionError(
                    f"{total} neurons but {flat.numel()} values; give one value per neuron "
                    "(in layer order), one number, or {layer: values}"
                )
        offset = 0
        for layer, idx in neurons.items():
            if not isinstance(layer, int) or isinstance(layer, bool):
                raise InterventionError(f"layer keys must be ints, got {layer!r}")
            ids = torch.as_tensor(idx, dtype=torch.long).reshape(-1)
            if ids.numel() == 0:
                raise InterventionError(f"no neurons given for layer {layer}")
            if bool((ids < 0).any()):
                raise InterventionError(f"negative neuron index at layer {layer}")
            if ids.unique().numel() != ids.numel():
                uniq, counts = ids.unique(return_counts=True)
                raise InterventionError(
                    f"neuron {int(uniq[counts > 1][0])} appears more than once at layer {layer}; "
                    "with two values one would silently win: list each neuron once"
                )
            self.neurons[layer] = ids
            if mode == "zero":
                val = torch.zeros(ids.numel())
            elif flat is not None:
                val = flat[offset : offset + ids.numel()]
                offset += ids.numel()
            elif isinstance(values, Mapping):
                if layer not in values:
                    raise InterventionError(f"no values given for layer {layer}")
                val = torch.as_tensor(values[layer], dtype=torch.float32).reshape(-1)
                if val.numel() == 1:
                    val = val.expand(ids.numel()).clone()
            else:
                val = torch.full((ids.numel(),), float(values))
            if val.numel() != ids.numel():
                raise InterventionError(
                    f"layer {layer}: {ids.numel()} neurons but {val.numel()} values"
                )
            check_finite(val, f"NeuronClamp values at layer {layer}")
            self.values[layer] = val.float()

    def fwd_hooks(self, model: Model) -> list[tuple[str, HookFn]]:
        check_model(self.meta.get("model"), model, what=repr(self))
        hooks: list[tuple[str, HookFn]] = []
        bos = prepends_bos(model)
        for layer in sorted(self.neurons):
            site = site_for(model, self.site, layer, "NeuronClamp")
            ids = self.neurons[layer]
            if int(ids.max()) >= site.width:
                raise InterventionError(
                    f"NeuronClamp: neuron {int(ids.max())} at layer {layer} is out of range "
                    f"({site.name} has {site.width} neurons)"
                )
            hooks.append((site.hook_name, self._hook(ids, self.values[layer], bos)))
        return hooks

    def _hook(self, ids_cpu: Tensor, vals_cpu: Tensor, bos: bool) -> HookFn:
        mode, positions = self.mode, self.positions

        def clamp(t: Tensor, hook: Any) -> Tensor:
            ids = ids_cpu.to(t.device)
            vals = vals_cpu.to(device=t.device, dtype=t.dtype)
            old = t[..., ids]
            if mode == "set":
                new = vals.expand_as(old)
            elif mode == "scale":
                new = old * vals
            elif mode == "add":
                new = old + vals
            else:
                new = torch.zeros_like(old)
            out = t.clone()
            out[..., ids] = torch.where(mask_for(positions, t, bos), new, old)
            return out

        return clamp

    def _tensors(self) -> dict[str, Tensor]:
        out = {}
        for layer in self.neurons:
            out[f"neurons.{layer}"] = self.neurons[layer]
            out[f"values.{layer}"] = self.values[layer]
        return out

    def _config(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "site": self.site,
            "layers": sorted(self.neurons),
            "positions": positions_to_json(self.positions, "this NeuronClamp"),
        }

    @classmethod
    def _restore(cls, tensors: dict[str, Tensor], config: dict[str, Any]) -> NeuronClamp:
        layers = config["layers"]
        return cls(
            {lay: tensors[f"neurons.{lay}"] for lay in layers},
            {lay: tensors[f"values.{lay}"] for lay in layers},
            config["mode"],
            positions=config["positions"],
            site=config["site"],
        )

    def _fields(self) -> dict[str, str]:
        per_layer = ", ".join(f"{lay}: {self.neurons[lay].numel()}" for lay in sorted(self.neurons))
        return {
            "mode": self.mode,
            "site": self.site,
            "neurons per layer": "{" + per_layer + "}",
            "positions": positions_text(self.positions),
        }
