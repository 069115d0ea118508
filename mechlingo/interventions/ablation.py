"""Ablations: replace a site's activation by zero or by a mean.

:class:`Ablation` is the one owner of zeroing in mechlingo: removing what a site carries (zero
ablation) or replacing it by its average (mean ablation) is the same operation with two
fills, the one ablation studies compare. :class:`~mechlingo.interventions.clamp.NeuronClamp`
writes chosen values into chosen neurons and has no zero mode.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from mechlingo.core.errors import InterventionError
from mechlingo.core.sites import Site
from mechlingo.core.tokens import PositionSpec
from mechlingo.core.types import Model
from mechlingo.interventions.base import EditFn, SiteEdit, check_finite, register_kind

_ABLATION_MODES = ("zero", "mean")


@register_kind
class Ablation(SiteEdit):
    """Replace the activation at ``site``/``layer`` by zero or by a mean, at ``positions``.

    The one owner of zeroing (a :class:`~mechlingo.interventions.clamp.NeuronClamp` sets
    chosen neurons to chosen values and has no zero mode). The where (site, layer,
    positions, the model check) is :class:`SiteEdit`'s; the edit is the fill.

    Args:
        site: any site except ``attn_pattern``.
        layer: block index.
        mode: ``"zero"`` (default) or ``"mean"``; stored as ``.mode``.
        mean: the replacement for ``mode="mean"``: ``[width]`` (e.g. a mean last-token
            activation from :func:`mechlingo.activations.runs.last_token_means`).
        positions: default ``"all"``.
    """

    kind = "Ablation"

    def __init__(
        self,
        site: str,
        layer: int,
        mode: str = "zero",
        *,
        mean: Float[Tensor, " width"] | None = None,
        positions: PositionSpec = "all",
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        if mode not in _ABLATION_MODES:
            raise InterventionError(f"ablation mode must be 'zero' or 'mean', got {mode!r}")
        if mode == "mean" and mean is None:
            raise InterventionError("a mean ablation needs mean= (a [width] tensor)")
        super().__init__(site=site, positions=positions, meta=meta, layer=layer)
        self.mode = mode
        self.mean = None if mean is None else torch.as_tensor(mean).detach().float()
        if self.mean is not None:
            check_finite(self.mean, "the ablation mean")

    def edit(self, model: Model, site: Site, layer: int) -> EditFn:
        mean = self.mean
        if mean is not None and mean.shape[-1] != site.width:
            raise InterventionError(
                f"Ablation mean has size {mean.shape[-1]} but {site.name} has width {site.width}"
            )

        def ablate(t: Tensor, mask: Tensor) -> Tensor:
            fill = (
                torch.zeros((), device=t.device, dtype=t.dtype)
                if mean is None
                else mean.to(device=t.device, dtype=t.dtype)
            )
            return torch.where(mask, fill, t)

        return ablate

    def _tensors(self) -> dict[str, Tensor]:
        return {} if self.mean is None else {"mean": self.mean}

    def _own_config(self) -> dict[str, Any]:
        return {"mode": self.mode}

    @classmethod
    def _restore(cls, tensors: dict[str, Tensor], config: dict[str, Any]) -> Ablation:
        return cls(
            config["site"],
            config["layer"],
            config["mode"],
            mean=tensors.get("mean"),
            positions=config["positions"],
        )

    def _fields(self) -> dict[str, str]:
        where = self._where_fields()
        return {
            "site": where["site"],
            "layer": where["layer"],
            "mode": self.mode,
            "positions": where["positions"],
        }
