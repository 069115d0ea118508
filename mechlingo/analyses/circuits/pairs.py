"""Clean/corrupted prompt pairs for circuits, their position groups and their readout.

A *subject pair* corrupts the subject: the clean prompt is a fact's, the corrupted prompt
another fact's of the same relation and language, with a different answer and the same
number of tokens (edges are compared position by position, so lengths must match; a fact
with no such partner is left out and counted). A *cross-language pair* takes the corrupted
fact from another language (the same relation, a different answer, the same length).

Position groups (``positions="roles"``): every real token is in one of ``start`` (before
the subject), ``subject`` (the subject but its last token), ``subject_last``, ``relation``
(between the subject and the last token) and ``last`` (the token the answer is read at), from
the clean prompt's subject span (:func:`~mechlingo.analyses.recall.patching.subject_token_span`);
``positions="all"``: one group of every real token (position-summed edges).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float
from torch import Tensor

from mechlingo.analyses.recall.patching import answer_logprob, logit_diff, subject_token_span
from mechlingo.analyses.recall.patching.readouts import AnswerReadout
from mechlingo.core.errors import InputError
from mechlingo.core.tokens import TokenBatch, encode
from mechlingo.core.types import Model

if TYPE_CHECKING:
    from mechlingo.data import Fact

__all__ = ["ROLES", "Pairs", "make_pairs", "position_roles"]

ROLES = ("start", "subject", "subject_last", "relation", "last")


@dataclass
class Pairs:
    """Clean/corrupted rows (equal token lengths row by row) and what reads them.

    Attributes:
        clean, corrupted: the facts of each row.
        clean_batch, corrupted_batch: their token batches.
        roles: ``[row, pos, group]`` 0/1 position groups; ``labels`` their names.
        readout: the readout (answer log-probability, or the clean answer's log mass
            minus the corrupted answer's).
        skipped: facts left out for want of a partner of equal length.
    """

    clean: list[Fact]
    corrupted: list[Fact]
    clean_batch: TokenBatch
    corrupted_batch: TokenBatch
    roles: Float[Tensor, "row pos group"]
    labels: list[str]
    readout: AnswerReadout
    skipped: int

    @property
    def fact_ids(self) -> list[str]:
        return [f.id for f in self.clean]


def _length(model: Model, prompt: str) -> int:
    return int(encode(model, [prompt]).lengths[0])


def _partners(
    model: Model, facts: Sequence[Fact], pool: Sequence[Fact], cross: bool
) -> list[tuple[Fact, Fact]]:
    """Each fact with the next fact of ``pool`` (cyclically, from its own place) of the same
    relation, a language as asked, another answer and the same token length."""
    lengths: dict[tuple[str, str], int] = {}

    def n(f: Fact) -> int:
        key = (f.lang, f.prompt)
        if key not in lengths:
            lengths[key] = _length(model, f.prompt)
        return lengths[key]

    out = []
    for i, f in enumerate(facts):
        order = list(pool[i:]) + list(pool[:i]) if len(pool) else []
        for g in order:
            same_lang = g.lang == f.lang
            if g.relation != f.relation or same_lang == cross or g.id == f.id:
                continue
            if g.answer_en == f.answer_en or g.answer == f.answer:
                continue
            if n(g) == n(f):
                out.append((f, g))
                break
    return out


def position_roles(
    model: Model, facts: Sequence[Fact], batch: TokenBatch, positions: str
) -> tuple[Tensor, list[str]]:
    """``([row, pos, group] 0/1, group names)`` for ``positions="roles"`` or ``"all"``."""
    B, T = batch.tokens.shape
    real = torch.arange(T)[None, :] < batch.lengths[:, None]
    if positions == "all":
        return real.float()[:, :, None], ["all"]
    if positions != "roles":
        raise InputError(f"positions must be 'roles' or 'all', got {positions!r}")
    out = torch.zeros(B, T, len(ROLES))
    for b, f in enumerate(facts):
        first, last_s = subject_token_span(model, f.prompt, f.subject_span, has_bos=batch.has_bos)
        last = int(batch.lengths[b]) - 1
        for t in range(last + 1):
            role = 0 if t < first else 1 if t < last_s else 2 if t == last_s else 3
            out[b, t, 4 if t == last else role] = 1
    return out, list(ROLES)


def make_pairs(
    model: Model,
    facts: Sequence[Fact],
    *,
    pool: Sequence[Fact] | None = None,
    cross_language: bool = False,
    readout: str = "logprob",
    positions: str = "roles",
) -> Pairs:
    """Subject pairs (or cross-language pairs) of ``facts`` with partners from ``pool``
    (default: ``facts``), the position groups and the readout (``"logprob"``: the clean
    answer's log-probability; ``"logit_diff"``: clean answer minus corrupted answer, each
    as an answer set in the clean prompt's language).

    Raises:
        InputError: no fact has a partner, or an unknown readout or positions.
    """
    if readout not in ("logprob", "logit_diff"):
        raise InputError(f"readout must be 'logprob' or 'logit_diff', got {readout!r}")
    pairs = _partners(model, list(facts), list(pool if pool is not None else facts), cross_language)
    if not pairs:
        raise InputError(
            "no fact has a partner of the same relation, another answer and the same token "
            "length: give more facts (or a larger pool=)"
        )
    clean = [p[0] for p in pairs]
    corrupted = [p[1] for p in pairs]
    cb = encode(model, [f.prompt for f in clean])
    xb = encode(model, [f.prompt for f in corrupted])
    roles, labels = position_roles(model, clean, cb, positions)
    langs = [f.lang for f in clean]
    answers = [f.answer for f in clean]
    if readout == "logprob":
        m = answer_logprob(model, answers, langs, name="answer_logprob")
    else:
        other = [g.answer for g in corrupted]
        m = logit_diff(model, answers, other, langs, name="logit_diff")
    return Pairs(clean, corrupted, cb, xb, roles, labels, m, len(facts) - len(pairs))
