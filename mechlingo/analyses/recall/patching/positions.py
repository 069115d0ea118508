"""Patching inputs and positions: token batches, subject spans and aligned grid positions.

When source and target differ in length (an English prompt and a French one), each target
position must be told which source position it takes its activation from: an *alignment*.
``"last"`` aligns positions counted back from each prompt's last real token (``-1`` to ``-1``,
``-2`` to ``-2``, ...); ``"subject"`` additionally aligns the subject span:
``"subject_first"`` and ``"subject_last"`` are the first and last token of each prompt's
subject (from :attr:`Fact.subject_span` character offsets), so when the two subjects take a
different number of tokens the first subject token maps to the first and the last to the last;
a dict ``{target_pos: source_pos}`` gives the map explicitly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from mechlingo.analyses.recall.patching.errors import PatchingError
from mechlingo.core.tokens import TokenBatch, chat_prefix_length, encode
from mechlingo.core.types import Model

__all__ = [
    "PositionLabel",
    "Positions",
    "Spans",
    "alignment_kind",
    "as_batch",
    "check_spans",
    "resolve_positions",
    "subject_token_span",
]

PositionLabel = int | str
#: Inclusive ``(first, last)`` subject token positions per row, or ``None`` when unknown.
Spans = list[tuple[int, int]] | None


def subject_token_span(
    model: Model, prompt: str, span: tuple[int, int], *, has_bos: bool | None = None
) -> tuple[int, int]:
    """Token positions ``(first, last)`` (inclusive, in the :func:`~mechlingo.core.tokens.encode`
    batch, BOS counted) of the tokens overlapping the character span ``span`` of ``prompt``.

    Raises:
        PatchingError: an empty or out-of-range span, or one no token overlaps.
    """
    start, end = int(span[0]), int(span[1])
    if not 0 <= start < end <= len(prompt):
        raise PatchingError(
            f"subject span {span} is empty or outside the prompt {prompt!r} (length "
            f"{len(prompt)}); give (start, end) character offsets with start < end"
        )
    bos = bool(getattr(model.cfg, "default_prepend_bos", True)) if has_bos is None else has_bos
    shift = (1 if bos else 0) + chat_prefix_length(model, prompt)  # chat template before it
    ids = [int(i) for i in model.to_tokens(prompt, prepend_bos=False, truncate=False)[0]]
    tok = model.tokenizer
    offsets = None
    if getattr(tok, "is_fast", False):  # only fast tokenizers report character offsets
        enc = tok(prompt, add_special_tokens=False, return_offsets_mapping=True)
        if [int(i) for i in enc["input_ids"]] == ids:  # else the model tokenizes differently
            offsets = [tuple(o) for o in enc["offset_mapping"]]
    if offsets is None:  # no usable offsets: count the tokens of prefixes
        # without the space before the subject: BPE tokenizers attach it to the subject's
        # first token, so "of " alone would count one token too many
        head = prompt[:start].rstrip()
        first = len(model.to_tokens(head, prepend_bos=False)[0]) if head else 0
        last = len(model.to_tokens(prompt[:end], prepend_bos=False)[0]) - 1
        return first + shift, max(first, last) + shift
    hit = [i for i, (a, b) in enumerate(offsets) if a < end and b > start]
    if not hit:
        raise PatchingError(f"no token of {prompt!r} overlaps the subject span {span}")
    return hit[0] + shift, hit[-1] + shift


def as_batch(model: Model, x: Any, what: str) -> tuple[TokenBatch, Spans]:
    """A TokenBatch and, for facts, each row's subject token span."""
    if isinstance(x, TokenBatch):
        return x, None
    if isinstance(x, str):
        x = [x]
    items = list(x)
    if not items:
        raise PatchingError(f"the {what} inputs are empty")
    if all(isinstance(i, str) for i in items):
        return encode(model, items), None
    if all(hasattr(i, "prompt") and hasattr(i, "subject_span") for i in items):
        batch = encode(model, [f.prompt for f in items])
        spans = [
            subject_token_span(model, f.prompt, f.subject_span, has_bos=batch.has_bos)
            for f in items
        ]
        return batch, spans
    raise PatchingError(f"the {what} inputs must be prompts (str), Facts or a TokenBatch")


def check_spans(spans: Any, batch: TokenBatch, what: str) -> Spans:
    """User-given inclusive subject token spans, checked against the batch (``None`` passes)."""
    if spans is None:
        return None
    spans = [(int(a), int(b)) for a, b in spans]
    if len(spans) != batch.batch_size:
        raise PatchingError(f"{len(spans)} {what} subject spans for {batch.batch_size} rows")
    for i, (a, b) in enumerate(spans):
        if not 0 <= a <= b < int(batch.lengths[i]):
            raise PatchingError(
                f"{what} subject token span {(a, b)} of row {i} is empty or outside the prompt "
                f"({int(batch.lengths[i])} tokens); spans are inclusive (first, last) positions"
            )
    return spans


@dataclass
class Positions:
    """The grid's positions: a label per position and the token index it resolves to in
    each target and source row (``[position, row]``)."""

    labels: list[str]
    target: Int[Tensor, "position row"]
    source: Int[Tensor, "position row"]


def alignment_kind(alignment: Any) -> str:
    """How positions were aligned, as results record it: ``"same"``, ``"last"``,
    ``"subject"`` or ``"map"``."""
    if isinstance(alignment, Mapping):
        return "map"
    return "same" if alignment is None else str(alignment)


def _resolve_one(spec: PositionLabel, lengths: Tensor, spans: Spans, what: str) -> Tensor:
    if isinstance(spec, str):
        if spec == "last":
            return lengths - 1
        if spec in ("subject_first", "subject_last"):
            if spans is None:
                raise PatchingError(
                    f"position {spec!r} needs the {what} subject spans: pass Facts, or "
                    f"{what}_subject=[(first, last) token positions per row]"
                )
            k = 0 if spec == "subject_first" else 1
            return torch.tensor([s[k] for s in spans], dtype=torch.long)
        raise PatchingError(
            f"unknown position {spec!r}; use ints (negative = from each row's last token), "
            "'last', 'subject_first' or 'subject_last'"
        )
    p = int(spec)
    return lengths - 1 + 1 + p if p < 0 else torch.full_like(lengths, p)


Pairs = list[tuple[PositionLabel, PositionLabel]]


def _same_shape_pairs(
    positions: Sequence[PositionLabel] | None, src: TokenBatch, tgt: TokenBatch
) -> Pairs:
    """Without an alignment: the same positions in source and target, which must have the
    same token lengths (default: every position of the shortest row)."""
    src_len, tgt_len = src.lengths.cpu(), tgt.lengths.cpu()
    same = tuple(src.tokens.shape) == tuple(tgt.tokens.shape) and torch.equal(src_len, tgt_len)
    if not same:
        raise PatchingError(
            "source and target have different token lengths "
            f"(source {src_len.tolist()}, target {tgt_len.tolist()}); pass "
            "alignment='last' (positions counted back from each last token), "
            "alignment='subject' (subject span to subject span; needs Facts or subject "
            "spans) or alignment={target_pos: source_pos}"
        )
    if positions is None:
        positions = list(range(int(tgt_len.min())))
    return [(p, p) for p in positions]


def _aligned_pairs(positions: Sequence[PositionLabel] | None, alignment: str) -> Pairs:
    """Under ``alignment="last"`` or ``"subject"``: relative positions and subject labels."""
    if positions is None:
        positions = [-1] if alignment == "last" else ["subject_first", "subject_last", -1]
    pairs: Pairs = []
    for p in positions:
        if isinstance(p, int) and p >= 0:
            raise PatchingError(
                f"absolute position {p} has no counterpart under alignment={alignment!r}: "
                "use negative positions (counted back from each last token), subject "
                "labels, or an explicit alignment map {target_pos: source_pos}"
            )
        if alignment == "last" and isinstance(p, str) and p.startswith("subject"):
            raise PatchingError(f"position {p!r} needs alignment='subject'")
        pairs.append((p, p))
    return pairs


def _position_pairs(
    positions: Sequence[PositionLabel] | None, alignment: Any, src: TokenBatch, tgt: TokenBatch
) -> Pairs:
    """``(target spec, source spec)`` of every grid position."""
    if isinstance(alignment, Mapping):
        if positions is not None:
            raise PatchingError("with an explicit alignment map, leave positions=None")
        if not alignment:
            raise PatchingError("the alignment map is empty")
        return list(alignment.items())
    if alignment is None:
        return _same_shape_pairs(positions, src, tgt)
    if alignment in ("last", "subject"):
        return _aligned_pairs(positions, alignment)
    raise PatchingError(
        f"unknown alignment {alignment!r}; use None, 'last', 'subject' or a dict "
        "{target_pos: source_pos}"
    )


def _check_in_range(pos: Tensor, lengths: Tensor, what: str, spec: PositionLabel) -> None:
    bad = (pos < 0) | (pos >= lengths)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise PatchingError(
            f"{what} position {spec!r} is out of range in row {i} (that prompt has "
            f"{int(lengths[i])} tokens, positions 0..{int(lengths[i]) - 1}; negative "
            "positions count back from the last token)"
        )


def resolve_positions(
    positions: Sequence[PositionLabel] | None,
    alignment: Any,
    src: TokenBatch,
    tgt: TokenBatch,
    src_spans: Spans,
    tgt_spans: Spans,
) -> Positions:
    """The grid positions resolved to token indices of every target and source row.

    Raises:
        PatchingError: an unknown alignment or position label, an absolute position under a
            relative alignment, different lengths without an alignment, a subject label
            without subject spans, or a position outside a prompt.
    """
    pairs = _position_pairs(positions, alignment, src, tgt)
    if not pairs:
        raise PatchingError("the position selection is empty")
    if alignment is None:  # same-shape inputs: one side's spans serve both
        src_spans = tgt_spans if src_spans is None else src_spans
        tgt_spans = src_spans if tgt_spans is None else tgt_spans
    src_len, tgt_len = src.lengths.cpu(), tgt.lengths.cpu()
    labels, t_rows, s_rows = [], [], []
    for tp, sp in pairs:
        t = _resolve_one(tp, tgt_len, tgt_spans, "target")
        s = _resolve_one(sp, src_len, src_spans, "source")
        _check_in_range(t, tgt_len, "target", tp)
        _check_in_range(s, src_len, "source", sp)
        labels.append(str(tp) if tp == sp or not isinstance(alignment, Mapping) else f"{tp}<-{sp}")
        t_rows.append(t)
        s_rows.append(s)
    return Positions(labels, torch.stack(t_rows), torch.stack(s_rows))
