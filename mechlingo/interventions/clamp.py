"""Neuron clamps: set, scale or add to chosen MLP neurons (``mlp_post``) of some layers.

Zeroing is not a clamp mode: replacing a site's activation by zero (or by a mean) is an
:class:`~mechlingo.interventions.ablation.Ablation`, the one owner of zeroing. A clamp writes
values you choose into chosen neurons; ``NeuronClamp(neurons, 0.0)`` sets them to 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from mechlingo.core.errors import InterventionError
from mechlingo.core.sites import Site
from mechlingo.core.tokens import PositionSpec
from mechlingo.core.types import Model
from mechlingo.interventions.base import (
    MAX_LAYER,
    EditFn,
    SiteEdit,
    check_finite,
    check_index,
    register_kind,
)

_CLAMP_MODES = ("set", "scale", "add")


@register_kind
class NeuronClamp(SiteEdit):
    """Set, scale or add to chosen MLP neurons (``mlp_post``) of one or more layers.

    The where (site, layers, positions, the model check) is :class:`SiteEdit`'s; the edit
    writes into the chosen neurons only. Zeroing a whole site is an
    :class:`~mechlingo.interventions.ablation.Ablation` (the one owner of zeroing): a clamp
    has no ``"zero"`` mode, ``NeuronClamp(neurons, 0.0)`` sets chosen neurons to 0.

    Args:
        neurons: ``{layer: neuron indices}``.
        values: one number for every chosen neuron, a flat sequence with one value per chosen
            neuron (layers in the order of ``neurons``), or ``{layer: one value per neuron}``.
        mode: ``"set"`` (activation := value), ``"scale"`` (activation *= value) or ``"add"``
            (activation += value).
        positions: where along the sequence (default ``"all"`` real tokens after BOS).
        site: ``mlp_post`` (the neurons); any other site with a feature axis works too.
    """

    kind = "NeuronClamp"
    one_layer = False

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
            hint = (
                " (zeroing is an Ablation: Ablation(site, layer) zeroes a site; "
                "NeuronClamp(neurons, 0.0) sets chosen neurons to 0)"
                if mode == "zero"
                else ""
            )
            raise InterventionError(f"unknown clamp mode {mode!r}; use one of {_CLAMP_MODES}{hint}")
        if not neurons:
            raise InterventionError("NeuronClamp needs at least one layer with neurons")
        self.mode = mode
        super().__init__(site=site, positions=positions, meta=meta)
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
            if isinstance(layer, bool) or not hasattr(layer, "__index__"):
                raise InterventionError(f"NeuronClamp layers are ints, got {layer!r}")
            check_index(int(layer), MAX_LAYER, "a layer")
            ids = _neuron_ids(layer, idx)
            self.neurons[layer] = ids
            if flat is not None:
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

    @property
    def layers(self) -> tuple[int, ...]:
        """The clamped layers, in increasing order."""
        return tuple(sorted(self.neurons))

    def edit(self, model: Model, site: Site, layer: int) -> EditFn:
        ids_cpu = self.neurons[layer]
        if int(ids_cpu.max()) >= site.width:
            raise InterventionError(
                f"NeuronClamp: neuron {int(ids_cpu.max())} at layer {layer} is out of range "
                f"({site.name} has {site.width} neurons)"
            )
        vals_cpu, mode = self.values[layer], self.mode

        def clamp(t: Tensor, mask: Tensor) -> Tensor:
            ids = ids_cpu.to(t.device)
            vals = vals_cpu.to(device=t.device, dtype=t.dtype)
            old = t[..., ids]
            if mode == "set":
                new = vals.expand_as(old)
            elif mode == "scale":
                new = old * vals
            else:
                new = old + vals
            out = t.clone()
            out[..., ids] = torch.where(mask, new, old)
            return out

        return clamp

    def _tensors(self) -> dict[str, Tensor]:
        out = {}
        for layer in self.neurons:
            out[f"neurons.{layer}"] = self.neurons[layer]
            out[f"values.{layer}"] = self.values[layer]
        return out

    def _own_config(self) -> dict[str, Any]:
        return {"mode": self.mode}

    @classmethod
    def _restore(cls, tensors: dict[str, Tensor], config: dict[str, Any]) -> NeuronClamp:
        layers = config["layers"]
        # A clamp saved with the removed mode "zero" holds zero values: it is a set to 0.
        mode = "set" if config["mode"] == "zero" else config["mode"]
        return cls(
            {lay: tensors[f"neurons.{lay}"] for lay in layers},
            {lay: tensors[f"values.{lay}"] for lay in layers},
            mode,
            **cls._where(config),
        )

    def _fields(self) -> dict[str, str]:
        per_layer = ", ".join(f"{lay}: {self.neurons[lay].numel()}" for lay in self.layers)
        return {
            "mode": self.mode,
            "site": self.site,
            "neurons per layer": "{" + per_layer + "}",
            "positions": self._where_fields()["positions"],
        }


def _neuron_ids(layer: object, idx: Sequence[int] | Tensor) -> Tensor:
    """The neuron indices of one layer as a 1-D long tensor, checked."""
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
    return ids
