"""Patching readouts: numbers read from the next-token distribution at each row's last token.

A :class:`AnswerReadout` is the log-probability (or probability) of an answer token set (see
:func:`mechlingo.core.answers.answer_tokens`), or the difference of two sets' log masses (for
single-token sets exactly the logit difference). :func:`evaluate_readouts` reads every readout
of a batch of final-residual rows in one chunked readout.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float, Int
from torch import Tensor

from mechlingo.analyses.recall.patching.errors import PatchingError
from mechlingo.core.answers import AnswerTokens, answer_tokens, pack_token_sets
from mechlingo.core.types import Model
from mechlingo.kernels.readout import read_logits

if TYPE_CHECKING:
    from mechlingo.data import Fact

__all__ = [
    "AnswerReadout",
    "PackedReadouts",
    "answer_logprob",
    "evaluate_readouts",
    "fact_readouts",
    "logit_diff",
    "pack_readouts",
]

#: ``(token ids [row, track, member], primary ids [row, track], each readout's track slice)``
PackedReadouts = tuple[Int[Tensor, "row track member"], Int[Tensor, "row track"], list[slice]]


@dataclass(frozen=True)
class AnswerReadout:
    """A per-example number read from the next-token distribution at the last real token.

    Attributes:
        name: label used in tables and figures.
        kind: ``"logprob"`` (log of the answer set's probability mass), ``"prob"`` (the mass)
            or ``"logit_diff"`` (log mass of set A minus log mass of set B).
        sets: per example, the answer set (and for ``logit_diff`` the second set).
    """

    name: str
    kind: str
    sets: tuple[tuple[AnswerTokens, ...], ...]

    def __post_init__(self) -> None:
        want = 2 if self.kind == "logit_diff" else 1
        if self.kind not in ("logprob", "prob", "logit_diff"):
            raise PatchingError(
                f"unknown readout kind {self.kind!r}; use logprob, prob, logit_diff"
            )
        if not self.sets:
            raise PatchingError(f"readout {self.name!r} has no examples")
        if any(len(s) != want for s in self.sets):
            raise PatchingError(
                f"readout kind {self.kind!r} needs {want} answer set(s) per example"
            )

    @property
    def n_examples(self) -> int:
        return len(self.sets)

    def combine(self, set_logprob: Float[Tensor, "row track"]) -> Float[Tensor, " row"]:
        """The readout from the log masses of this readout's tracks."""
        if self.kind == "logprob":
            return set_logprob[:, 0]
        if self.kind == "prob":
            return set_logprob[:, 0].exp()
        return set_logprob[:, 0] - set_logprob[:, 1]


def _sets(model: Model, words: Sequence[str], langs: Sequence[str] | None) -> list[AnswerTokens]:
    langs = list(langs) if langs is not None else [None] * len(words)  # type: ignore[list-item]
    if len(langs) != len(words):
        raise PatchingError(f"{len(langs)} languages for {len(words)} answers")
    return [answer_tokens(model, w, lang=lg) for w, lg in zip(words, langs, strict=True)]


def answer_logprob(
    model: Model,
    answers: Sequence[str],
    langs: Sequence[str] | None = None,
    *,
    name: str = "answer_logprob",
    prob: bool = False,
) -> AnswerReadout:
    """Log-probability (``prob=True``: probability) of each example's answer token set."""
    sets = _sets(model, answers, langs)
    return AnswerReadout(name, "prob" if prob else "logprob", tuple((s,) for s in sets))


def logit_diff(
    model: Model,
    answers_a: Sequence[str],
    answers_b: Sequence[str],
    langs: Sequence[str] | None = None,
    *,
    name: str = "logit_diff",
) -> AnswerReadout:
    """Log mass of answer A minus log mass of answer B per example (positive = prefers A)."""
    if len(answers_a) != len(answers_b):
        raise PatchingError(f"{len(answers_a)} answers A for {len(answers_b)} answers B")
    a, b = _sets(model, answers_a, langs), _sets(model, answers_b, langs)
    return AnswerReadout(name, "logit_diff", tuple(zip(a, b, strict=True)))


def fact_readouts(
    model: Model, facts: Sequence[Fact], *, prob: bool = False
) -> list[AnswerReadout]:
    """The two standard readouts for facts read in their own language: the log-probability of
    the answer in the prompt's language (``"answer_logprob"``) and of the English answer
    (``"en_logprob"``, continuing the same prompt)."""
    facts = list(facts)
    langs = [f.lang for f in facts]
    return [
        answer_logprob(model, [f.answer for f in facts], langs, name="answer_logprob", prob=prob),
        answer_logprob(
            model, [f.answer_en or f.answer for f in facts], langs, name="en_logprob", prob=prob
        ),
    ]


def pack_readouts(readouts: Sequence[AnswerReadout], n_rows: int) -> PackedReadouts:
    """The token sets of every readout for every example, packed for one readout."""
    for m in readouts:
        if m.n_examples != n_rows:
            raise PatchingError(
                f"readout {m.name!r} has {m.n_examples} examples but the batch has {n_rows} rows"
            )
    rows = [[s for m in readouts for s in m.sets[i]] for i in range(n_rows)]
    ids, primary = pack_token_sets(rows)
    slices, k = [], 0
    for m in readouts:
        width = len(m.sets[0])
        slices.append(slice(k, k + width))
        k += width
    return ids, primary, slices


def evaluate_readouts(
    model: Model,
    resid: Float[Tensor, "row d_model"],
    readouts: Sequence[AnswerReadout],
    packed: PackedReadouts,
    example: Int[Tensor, " row"],
) -> Float[Tensor, "readout row"]:
    """Every readout of final-residual rows; row ``r`` belongs to example ``example[r]``."""
    ids, primary, slices = packed
    ex = example.to(ids.device)
    # no top-k and no ranks: the streamed readout, whose memory is rows x 4,096 logits; the
    # unembedding is read once per chunk of rows, so the chunks are large (2,048 rows: 32 MB)
    r = read_logits(model, resid, ids[ex], primary[ex], top_k=0, ranks=False, chunk_rows=2048)
    return torch.stack(
        [m.combine(r.set_logprob[:, s]) for m, s in zip(readouts, slices, strict=True)]
    )
