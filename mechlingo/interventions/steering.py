"""Steering vectors: add ``alpha * v`` to a site at a layer, and random controls of
the same norm."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from mechlingo.core.defaults import SEED
from mechlingo.core.errors import InterventionError
from mechlingo.core.sites import Site
from mechlingo.core.tokens import PositionSpec
from mechlingo.core.types import Model
from mechlingo.interventions.base import (
    EditFn,
    SiteEdit,
    check_finite,
    register_kind,
)


@register_kind
class SteeringVector(SiteEdit):
    """Add ``alpha * v`` to the activation at ``site`` of ``layer``, at ``positions``.

    The where (site, layer, positions, the model check) is :class:`SiteEdit`'s; the edit is
    ``x + alpha * v`` at the chosen positions.

    Args:
        vector: ``[width]``, or ``[n_layers, width]`` (one vector per layer, as built by
            :mod:`mechlingo.analyses.recall.steering`; ``layer`` picks the row).
        layer: block index (negative from the end). ``None`` is allowed for a per-layer stack
            that has not been placed yet: choose with :meth:`at`.
        alpha: scale; 0 changes nothing.
        site: a residual site (``resid_pre`` by default), ``mlp_post`` or ``attn_z`` (a
            ``[d_head]`` vector is added to every head).
        positions: ``"last"`` (default: each row's last prompt token), ``"all"``,
            ``"last+generated"``, ints, or a callable.
        meta: metadata saved with the vector (see :class:`Intervention`).
    """

    kind = "SteeringVector"
    optional_layer = True

    def __init__(
        self,
        vector: Float[Tensor, " width"] | Float[Tensor, "n_layers width"],
        layer: int | None = None,
        alpha: float = 1.0,
        *,
        site: str = "resid_pre",
        positions: PositionSpec = "last",
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        vector = torch.as_tensor(vector)
        if vector.ndim not in (1, 2) or not vector.is_floating_point():
            raise InterventionError(
                f"a steering vector must be a float tensor [width] or [n_layers, width], got "
                f"{vector.dtype} of shape {tuple(vector.shape)}"
            )
        if not bool(torch.isfinite(vector).all()):
            raise InterventionError("the steering vector has NaN or infinite entries")
        self.vector = vector.detach()
        self.alpha = float(alpha)
        check_finite(self.alpha, "the steering alpha")
        super().__init__(site=site, positions=positions, meta=meta, layer=layer)

    def at(self, layer: int, alpha: float | None = None, **kw: Any) -> SteeringVector:
        """The same vector (stack) placed at ``layer`` with scale ``alpha`` (default: the
        current one); other keyword arguments (``positions=``, ``site=``) override too."""
        args = {"site": self.site, "positions": self.positions, "meta": self.meta} | kw
        return SteeringVector(self.vector, layer, self.alpha if alpha is None else alpha, **args)

    def direction(self, model: Model | None = None) -> Float[Tensor, " width"]:
        """The vector that is added per unit of ``alpha`` (the row of ``layer`` for a stack)."""
        if self.vector.ndim == 1:
            return self.vector
        if self.layer is None:
            raise InterventionError(
                "this SteeringVector holds one vector per layer and has no layer yet; "
                "place it with .at(layer, alpha)"
            )
        n = self.vector.shape[0]
        if model is not None and n != int(model.cfg.n_layers):
            raise InterventionError(
                f"the vector stack has {n} layers but the model has {int(model.cfg.n_layers)}"
            )
        index = self.layer + n if self.layer < 0 else self.layer
        if not 0 <= index < n:
            raise InterventionError(
                f"layer {self.layer} is out of range for a stack of {n} layer vectors"
            )
        return self.vector[index]

    def edit(self, model: Model, site: Site, layer: int) -> EditFn:
        v = self.direction(model)
        if v.shape[-1] != site.width:
            raise InterventionError(
                f"SteeringVector has size {v.shape[-1]} but {site.name} at layer {site.layer} "
                f"has width {site.width} (d_model={int(model.cfg.d_model)})"
            )
        delta_cpu = (self.alpha * v.double()).float()
        if not bool(torch.isfinite(delta_cpu).all()):
            raise InterventionError(
                f"alpha {self.alpha:g} times this vector overflows float32 (a value beyond 3.4e38)",
                fix="give a smaller alpha",
            )
        cache: dict[tuple[torch.device, torch.dtype], Tensor] = {}

        def steer(t: Tensor, mask: Tensor) -> Tensor:
            key = (t.device, t.dtype)
            delta = cache.get(key)
            if delta is None:
                delta = cache[key] = delta_cpu.to(device=t.device, dtype=t.dtype)
            return torch.where(mask, t + delta, t)

        return steer

    def _tensors(self) -> dict[str, Tensor]:
        return {"vector": self.vector.float()}

    def _own_config(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "shape": list(self.vector.shape)}

    @classmethod
    def _restore(cls, tensors: dict[str, Tensor], config: dict[str, Any]) -> SteeringVector:
        alpha = config["alpha"]
        if isinstance(alpha, bool) or not isinstance(alpha, int | float):
            raise InterventionError(f"the saved alpha is {alpha!r}, not a number")
        return cls(tensors["vector"], config["layer"], config["alpha"], **cls._where(config))

    def _fields(self) -> dict[str, str]:
        where = self._where_fields()
        out = {
            "site": where["site"],
            "layer": where["layer"],
            "alpha": f"{self.alpha:g}",
            "positions": where["positions"],
            "shape": "x".join(str(s) for s in self.vector.shape),
        }
        with contextlib.suppress(InterventionError):
            out["norm"] = f"{float(self.direction().norm()):.3g}"
        name = self.meta.get("name")
        if name:
            out = {"name": str(name)} | out
        return out


def random_like(vector: Float[Tensor, " width"], seed: int = SEED) -> Float[Tensor, " width"]:
    """A random direction with the same norm as ``vector`` (a control for steering), drawn on
    the CPU with a fixed seed so that it is the same on every device."""
    gen = torch.Generator().manual_seed(seed)
    r = torch.randn(vector.shape, generator=gen, dtype=torch.float64)
    norm = float(vector.double().norm())
    if not math.isfinite(norm):
        raise InterventionError("cannot match the norm of a non-finite vector")
    return (r / r.norm() * norm).to(vector.dtype)
