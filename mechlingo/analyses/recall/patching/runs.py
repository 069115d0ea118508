"""The passes a patching analysis reads: source and target runs that stop at the final
residual stream and keep only the activations the grid needs."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from mechlingo.activations.runs import StopForward, final_resid_name, run_batch
from mechlingo.core.sites import resolve_site
from mechlingo.core.tokens import TokenBatch
from mechlingo.core.types import Model

__all__ = ["read_run", "repeat_batch", "site_hook"]


def site_hook(model: Model, site: str, layer: int) -> str:
    """The hook a patching site reads and writes (``"head"``: the layer's ``attn_z``)."""
    return resolve_site(model, "attn_z" if site == "head" else site, layer).hook_name


def read_run(
    model: Model,
    batch: TokenBatch,
    reads: Mapping[str, Tensor],
    fwd_hooks: Sequence[tuple[str, Callable]] = (),
) -> tuple[dict[str, Tensor], Tensor]:
    """Run ``batch``; for each hook in ``reads`` keep ``act[row, positions[row, :]]``
    (``[row, P, ...]``) and the final residual at each last real token; stop there."""
    final = final_resid_name(model)
    out: dict[str, Tensor] = {}
    rows = torch.arange(batch.batch_size)

    def reader(name: str, pos: Tensor) -> Callable:
        def hook(t: Tensor, hook: Any) -> None:
            out[name] = t[rows.to(t.device)[:, None], pos.to(t.device)].detach().float()

        return hook

    def final_hook(t: Tensor, hook: Any) -> None:
        last = batch.last_index.to(t.device)
        out["__final__"] = t[rows.to(t.device), last].detach()
        raise StopForward

    fwd_hooks = list(fwd_hooks) + [(n, reader(n, p)) for n, p in reads.items()]
    fwd_hooks.append((final, final_hook))
    run_batch(model, batch, fwd_hooks)
    missing = [n for n in reads if n not in out]
    if "__final__" not in out or missing:
        raise RuntimeError(f"hooks {missing or [final]} did not fire during the forward pass")
    return out, out.pop("__final__")


def repeat_batch(batch: TokenBatch, copies: int) -> TokenBatch:
    """``copies`` copies of the whole batch, one after the other."""
    return TokenBatch(
        batch.tokens.repeat(copies, 1),
        batch.lengths.repeat(copies),
        batch.pad_id,
        batch.has_bos,
        batch.prompt_lengths.repeat(copies),
    )
