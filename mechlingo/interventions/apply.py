"""Applying an intervention to every forward pass inside a ``with`` block."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from mechlingo.activations.runs import hooked
from mechlingo.core.tokens import TokenBatch
from mechlingo.core.types import HookFn, Model
from mechlingo.interventions.base import Intervention


@contextlib.contextmanager
def intervene(
    model: Model, intervention: Intervention | None, *, batch: TokenBatch | None = None
) -> Iterator[Any]:
    """Apply ``intervention`` to every forward pass of ``model`` inside the block; its hooks
    are removed when the block exits, also after an exception. ``None`` applies nothing.

    Args:
        batch: the padded batch (:func:`mechlingo.core.tokens.encode`) the block runs, when it runs
            one of several rows: position rules then use each row's real tokens. Without it,
            a multi-row run is refused for every rule but ``"all"`` (see :func:`mask_for`).
    """

    if intervention is None:
        hooks: list[tuple[str, HookFn]] = []
    elif batch is not None:
        hooks = intervention.fwd_hooks_for(model, batch)
    else:
        hooks = intervention.fwd_hooks(model)
    with hooked(model, hooks):
        yield model
