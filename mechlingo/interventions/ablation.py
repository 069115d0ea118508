"""Ablations: replace a site's activation by zero or by a mean."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from mechlingo.core.describe import check_model
from mechlingo.core.errors import InterventionError
from mechlingo.core.sites import canonical_site, edit_hooks
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


@register_kind
class Ablation(Intervention):
    """Replace the activation at ``site``/``layer`` by zero or by a mean, at ``positions``.

    Args:
        site: any site except ``attn_pattern``.
        layer: block index.
        mode: ``"zero"`` or ``"mean"`` (stored as ``.mode``, like :class:`NeuronClamp`'s
            mode; the keyword ``kind=`` and the attribute ``.ablation`` still work for one
            release, with a DeprecationWarning).
        mean: the replacement for ``kind="mean"``: ``[width]`` (e.g. a mean last-token
            activation from :func:`mechlingo.activations.means.last_token_means`).
        positions: default ``"all"``.
    """

    kind = "Ablation"

    def __init__(
        self,
        site: str,
        layer: int,
        mode: str = "zero",
        *,
        kind: str | None = None,
        mean: Float[Tensor, " width"] | None = None,
        positions: PositionSpec = "all",
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        if kind is not None:
            warnings.warn(
                "Ablation(kind=...) is now Ablation(mode=...); kind= is removed in 0.2",
                DeprecationWarning,
                stacklevel=2,
            )
            mode = kind
        if mode not in ("zero", "mean"):
            raise InterventionError(f"ablation mode must be 'zero' or 'mean', got {mode!r}")
        if mode == "mean" and mean is None:
            raise InterventionError("a mean ablation needs mean= (a [width] tensor)")
        if not isinstance(layer, int) or isinstance(layer, bool):
            raise InterventionError(f"layer must be an int, got {layer!r}")
        self.site = canonical_site(site)
        refuse_pattern(self.site, "an Ablation")
        self.layer = layer
        self.mode = mode
        self.mean = None if mean is None else torch.as_tensor(mean).detach().float()
        if self.mean is not None:
            check_finite(self.mean, "the ablation mean")
        self.positions = check_positions(positions)
        self.meta = dict(meta or {})

    def fwd_hooks(self, model: Model) -> list[tuple[str, HookFn]]:
        check_model(self.meta.get("model"), model, what=repr(self))
        site = site_for(model, self.site, self.layer, "Ablation")
        mean = self.mean
        if mean is not None and mean.shape[-1] != site.width:
            raise InterventionError(
                f"Ablation mean has size {mean.shape[-1]} but {site.name} has width {site.width}"
            )
        positions = self.positions
        bos = prepends_bos(model)

        def ablate(t: Tensor, hook: Any) -> Tensor:
            fill = (
                torch.zeros((), device=t.device, dtype=t.dtype)
                if mean is None
                else mean.to(device=t.device, dtype=t.dtype)
            )
            return torch.where(mask_for(positions, t, bos), fill, t)

        return edit_hooks(model, site.hook_name, ablate)

    @property
    def ablation(self) -> str:
        """Deprecated name of :attr:`mode` (removed in 0.2)."""
        warnings.warn("Ablation.ablation is now Ablation.mode", DeprecationWarning, stacklevel=2)
        return self.mode

    def _tensors(self) -> dict[str, Tensor]:
        return {} if self.mean is None else {"mean": self.mean}

    def _config(self) -> dict[str, Any]:
        return {
            "site": self.site,
            "layer": self.layer,
            "mode": self.mode,
            "positions": positions_to_json(self.positions, "this Ablation"),
        }

    @classmethod
    def _restore(cls, tensors: dict[str, Tensor], config: dict[str, Any]) -> Ablation:
        return cls(
            config["site"],
            config["layer"],
            config.get("mode", config.get("kind")),  # "kind" in files saved before 0.1.0
            mean=tensors.get("mean"),
            positions=config["positions"],
        )

    def _fields(self) -> dict[str, str]:
        return {
            "site": self.site,
            "layer": str(self.layer),
            "mode": self.mode,
            "positions": positions_text(self.positions),
        }
