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
from types import TracebackType

import torch
from jaxtyping import Int
from torch import Tensor

from mechlingo.activations.runs import hooked
from mechlingo.core.errors import InterventionError
from mechlingo.core.tokens import PositionSpec, TokenBatch
from mechlingo.core.types import FwdHooks, HookFn, Model
from mechlingo.interventions.base import Compose, Gated, Intervention, SiteEdit

__all__ = ["Intervening", "first_edit", "intervene", "intervention_hooks"]


def intervene(
    model: Model, intervention: Intervention | None, *, batch: TokenBatch | None = None
) -> Intervening:
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

    Returns:
        An :class:`Intervening` block: ``with`` it yields ``model``, with the intervention's
        hooks on. One block object may be used again after it exits, never inside itself
        (an :class:`~mechlingo.core.errors.InterventionError`). Hooks belong to the model,
        not to a thread: while one thread is inside, another thread's ``intervene`` (or any
        mechlingo run) on the same model is refused with an ``InterventionError``
        (:func:`mechlingo.activations.runs.hooked`), and these hooks leave other threads'
        forward passes alone. Different blocks nest in one thread as before.
    """
    return Intervening(model, intervention, batch)


class Intervening:
    """The block :func:`intervene` returns (a context manager that yields the model)."""

    def __init__(
        self, model: Model, intervention: Intervention | None, batch: TokenBatch | None
    ) -> None:
        self.model, self.intervention, self.batch = model, intervention, batch
        self._stack: contextlib.ExitStack | None = None

    def __enter__(self) -> Model:
        if self._stack is not None:
            raise InterventionError(
                "this intervene(...) block is already active: one block cannot be entered "
                "inside itself",
                fix="use a new block, mechlingo.intervene(model, iv), for a nested one",
            )
        iv, model = self.intervention, self.model
        if iv is None:
            fwd_hooks: list[tuple[str, HookFn]] = []
        elif self.batch is not None:
            fwd_hooks = iv.fwd_hooks_for(model, self.batch)
        else:
            fwd_hooks = iv.fwd_hooks(model)
        stack = contextlib.ExitStack()
        stack.enter_context(hooked(model, fwd_hooks))
        self._stack = stack
        return model

    def __exit__(
        self,
        kind: type[BaseException] | None,
        err: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()


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
