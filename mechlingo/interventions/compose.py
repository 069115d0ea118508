"""Several interventions as one (``a + b``), applied in order."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import Tensor

from mechlingo.core.describe import check_model
from mechlingo.core.errors import InterventionError
from mechlingo.core.sites import carries_first
from mechlingo.core.types import HookFn, Model
from mechlingo.interventions.base import (
    Intervention,
    register_kind,
    restore_any,
)


@register_kind
class Compose(Intervention):
    """Several interventions applied together, as one.

    Hooks are returned in list order; at a shared hook point TransformerLens runs them in
    that order, so each one sees the result of those before it. Nested compositions are
    flattened (``(a + b) + c == Compose([a, b, c])``).
    """

    kind = "Compose"

    def __init__(
        self, parts: Sequence[Intervention], *, meta: Mapping[str, Any] | None = None
    ) -> None:
        flat: list[Intervention] = []
        for p in parts:
            if not isinstance(p, Intervention):
                raise InterventionError(f"Compose takes interventions, got a {type(p).__name__}")
            flat.extend(p.parts if isinstance(p, Compose) else [p])
        self.parts: list[Intervention] = flat
        self.meta = dict(meta or {})

    def fwd_hooks(self, model: Model) -> list[tuple[str, HookFn]]:
        check_model(self.meta.get("model"), model, what="this Compose")
        hooks: list[tuple[str, HookFn]] = []
        for p in self.parts:
            hooks.extend(p.fwd_hooks(model))
        return carries_first(hooks)

    def _tensors(self) -> dict[str, Tensor]:
        out = {}
        for i, p in enumerate(self.parts):
            out.update({f"{i}.{k}": v for k, v in p._tensors().items()})
        return out

    def _config(self) -> dict[str, Any]:
        return {
            "parts": [{"kind": p.kind, "config": p._config(), "meta": p.meta} for p in self.parts]
        }

    @classmethod
    def _restore(cls, tensors: dict[str, Tensor], config: dict[str, Any]) -> Compose:
        parts = []
        for i, spec in enumerate(config["parts"]):
            prefix = f"{i}."
            sub = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
            part = restore_any(spec["kind"], sub, spec["config"])
            part.meta = dict(spec.get("meta") or {})
            parts.append(part)
        return cls(parts)

    def save(self, path: str | Path, model: Model | None = None) -> Path:
        if model is None and "model" not in self.meta:
            infos = [p.meta.get("model") for p in self.parts if p.meta.get("model")]
            if infos:
                self.meta["model"] = infos[0]
        return super().save(path, model)

    def __repr__(self) -> str:
        return " + ".join(repr(p) for p in self.parts) if self.parts else "Compose([])"

    def _repr_html_(self) -> str:
        inner = "".join(f"<li>{p._repr_html_()}</li>" for p in self.parts)
        return f"<b>Compose</b> (applied in this order)<ol>{inner}</ol>"
