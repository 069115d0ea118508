"""Applying an intervention: :func:`intervene`, the one way to apply one to a TransformerLens
model, and :func:`first_edit`, where it first edits a sequence.

``with intervene(model, iv, batch=b): model(...)`` applies ``iv`` to every forward pass inside
the block and removes its hooks after it; :func:`intervention_hooks` gives the hooks
themselves. For what ``intervene`` does not cover: ``iv.fwd_hooks_for(model, b)`` for a raw
``run_with_hooks`` (:meth:`Intervention.fwd_hooks_for`), and ``with iv.attach(hf_model):``
for a plain transformers model (:mod:`~mechlingo.interventions.hf`).

A causal model computes every position before the first one an intervention edits exactly as
without it, so shared-prefix scoring (:func:`mechlingo.scoring.evaluate.evaluate_conditions`,
candidate ranking) computes those positions once for every condition and candidate;
:func:`first_edit` says where that prefix ends for each row, from the position rules."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from jaxtyping import Int
from torch import Tensor

from mechlingo.activations.runs import hooked
from mechlingo.core.tokens import PositionSpec, TokenBatch
from mechlingo.core.types import FwdHooks, HookFn, Model
from mechlingo.interventions.base import Compose, Gated, Intervention, SiteEdit

__all__ = ["first_edit", "intervene", "intervention_hooks"]


@contextlib.contextmanager
def intervene(
    model: Model, intervention: Intervention | None, *, batch: TokenBatch | None = None
) -> Iterator[Model]:
    """Apply ``intervention`` to every forward pass of ``model`` inside the block; its hooks
    are removed when the block exits, also after an exception. ``None`` applies nothing.

    ::

        b = mechlingo.core.tokens.encode(model, prompts)
        with mechlingo.intervene(model, task + diff, batch=b):
            logits = model(b.tokens, attention_mask=b.attention_mask())

    The intervention is checked against the model (sites, layers, widths, the model it was
    saved for) before anything is attached.

    Args:
        model: the TransformerLens model (a plain transformers model: ``iv.attach(hf_model)``).
        intervention: any intervention, or ``None``.
        batch: the padded batch (:func:`mechlingo.core.tokens.encode`) the block runs, when it
            runs one of several rows: position rules then use each row's real tokens, and a
            language gate (:class:`~mechlingo.interventions.base.Gated`) each row's prompt.
            Without it, a multi-row run is refused for every rule but ``"all"`` (see
            :func:`~mechlingo.interventions.base.mask_for`).

    Yields:
        ``model``, with the intervention's hooks on.
    """

    if intervention is None:
        fwd_hooks: list[tuple[str, HookFn]] = []
    elif batch is not None:
        fwd_hooks = intervention.fwd_hooks_for(model, batch)
    else:
        fwd_hooks = intervention.fwd_hooks(model)
    with hooked(model, fwd_hooks):
        yield model


def intervention_hooks(
    model: Model, intervention: Intervention | None, fwd_hooks: FwdHooks = ()
) -> list:
    """The hook list of a run with ``intervention`` and extra ``fwd_hooks``: the
    intervention's hooks (:meth:`Intervention.fwd_hooks`, every row) first, then
    ``fwd_hooks`` in their order, so the extra hooks see the intervened activations. With
    ``intervention=None``, ``fwd_hooks`` alone (a new list)."""
    hooks = list(fwd_hooks)
    if intervention is not None:
        hooks = list(intervention.fwd_hooks(model)) + hooks
    return hooks


def _first_of_rule(positions: PositionSpec, batch: TokenBatch) -> Int[Tensor, " batch"]:
    """The first prompt position of each row a positions rule edits (its length where
    none); 0 for a rule that may edit anything (``"all"``, callables)."""
    plen = batch.prompt_lengths
    if isinstance(positions, str):
        first = {"last": plen - 1, "last+generated": plen - 1, "generated": plen}
        return first.get(positions, torch.zeros_like(plen))
    if callable(positions):
        return torch.zeros_like(plen)
    idx = [positions] if isinstance(positions, int) else [int(p) for p in positions]
    at = [plen + p if p < 0 else torch.full_like(plen, p) for p in idx]
    return torch.stack(at).min(0).values.clamp_min(0)


def first_edit(iv: Intervention | None, batch: TokenBatch) -> Int[Tensor, " batch"]:
    """The first position of each row of ``batch`` that ``iv`` may edit, from its position
    rules (no intervention: the row's length). A composition takes the earliest of its
    parts, a gate its inner intervention's; a kind whose positions are not known (not a
    :class:`~mechlingo.interventions.base.SiteEdit`) may edit every position: 0. Every
    position before it computes what it computes without ``iv`` (causal attention)."""
    if iv is None:
        return batch.lengths.clone()
    if isinstance(iv, Compose):
        parts = [first_edit(p, batch) for p in iv.parts]
        return torch.stack(parts).min(0).values if parts else batch.lengths.clone()
    if isinstance(iv, Gated):
        return first_edit(iv.inner, batch)
    if isinstance(iv, SiteEdit):
        return _first_of_rule(iv.positions, batch)
    return torch.zeros_like(batch.lengths)
