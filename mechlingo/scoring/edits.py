"""Where an intervention first edits a sequence, from its position rules.

A causal model computes every position before the first one an intervention edits exactly as
it does without the intervention; shared-prefix scoring
(:func:`mechlingo.scoring.evaluate.evaluate_conditions`, candidate ranking) computes those
positions once for every condition and candidate. :func:`first_edit` says where that prefix
ends for each row of a batch.
"""

from __future__ import annotations

import torch
from jaxtyping import Int
from torch import Tensor

from mechlingo.core.tokens import PositionSpec, TokenBatch
from mechlingo.interventions.base import Compose, Gated, Intervention, SiteEdit

__all__ = ["first_edit"]


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
