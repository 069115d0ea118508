"""The answers a traced query is read against, prepared once for the usable facts
(:func:`trace_answers`): the lens tracks with the mismatched-fact control (another fact's
English answer, tracked by the same lens, so latent English can be told from any English word
reaching the top) and each fact's answers in other languages (which one a wrong answer gives);
and what a greedy answer did
(:func:`answer_flags`, from the predicates of :mod:`mechlingo.core.answers`): an answer written
the same in English, a continuation that glues onto the prompt's last word, an answer that
starts by repeating the subject, and the prefix at which the eval rule's verdict was decided.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mechlingo.analyses.decoders.lens import LensResult, fact_answers, logit_lens
from mechlingo.core.answers import (
    continues_prompt,
    decision_prefix,
    echoes_subject,
    is_correct,
    normalize,
    shared_form,
)
from mechlingo.core.types import Model
from mechlingo.data import load_facts
from mechlingo.data.langid import token_language

if TYPE_CHECKING:
    from mechlingo.data import Fact

__all__ = [
    "FLAGS",
    "TraceAnswers",
    "answer_flags",
    "lens_with_mismatch",
    "mismatch_tracks",
    "mismatched_english",
    "other_answers",
    "trace_answers",
]

#: The flags of a greedy answer that is no attempt at the answer (left out of the recall
#: share: :func:`mechlingo.analyses.recall.classes.failure_records`).
FLAGS = ("continues_prompt", "echoes_subject")


@dataclass(frozen=True)
class TraceAnswers:
    """What :func:`~mechlingo.analyses.recall.trace.trace_recall` reads its usable facts
    against, one entry per fact in their order (:func:`trace_answers`).

    Attributes:
        tracks: the lens tracks ``"answer"``, ``"en"`` and ``"mismatch_en"``
            (:func:`mismatch_tracks`).
        mismatch: each fact's mismatched English answer (``None``: its relation has none).
        answered_in: the language whose answer a wrong generation gives (``None``: none, or
            no generation to place).
        flags: what each greedy answer did (:func:`answer_flags`).
    """

    tracks: dict[str, list[str]]
    mismatch: list[str | None]
    answered_in: list[str | None]
    flags: list[dict[str, Any]]


def trace_answers(
    facts: Sequence[Fact],
    wrong: Sequence[str | None],
    pool: Sequence[Fact] | None,
    continuations: Sequence[str | None] | None = None,
) -> TraceAnswers:
    """:class:`TraceAnswers` of ``facts``: ``wrong`` holds each fact's generation where it is
    wrong (``None`` where it is right or not generated), ``pool`` more facts (other languages
    of the same ids; the bundled data is used as well when the ids come from it),
    ``continuations`` each fact's raw greedy continuation (``None``: nothing generated, the
    default for every fact)."""
    tracks, mismatch = mismatch_tracks(facts, pool)
    others = other_answers(facts, pool)
    answered = [
        None if gen is None else _answered_in(gen, f, others.get(f.id, {}))
        for f, gen in zip(facts, wrong, strict=True)
    ]
    raw = [None] * len(facts) if continuations is None else list(continuations)
    if len(raw) != len(facts):
        raise ValueError(f"{len(raw)} continuations for {len(facts)} facts")
    flags = []
    for i, f in enumerate(facts):
        flags.append(answer_flags(f, raw[i]))
    return TraceAnswers(tracks, mismatch, answered, flags)


def mismatch_tracks(
    facts: Sequence[Fact], pool: Sequence[Fact] | None
) -> tuple[dict[str, list[str]], list[str | None]]:
    """The lens tracks of ``facts``: each fact's answer, its English answer
    (:func:`~mechlingo.analyses.decoders.lens.fact_answers`) and (track ``mismatch_en``)
    another fact's English answer (:func:`mismatched_english`; the fact's own where there is
    none), with the mismatched words."""
    tracks = fact_answers(facts, ("en",), pool)
    mismatch = mismatched_english(facts, tracks["en"])
    tracks["mismatch_en"] = [m if m is not None else e for m, e in zip(mismatch, tracks["en"],
                                                                       strict=True)]  # fmt: skip
    return tracks, mismatch


def lens_with_mismatch(
    model: Model, facts: list[Fact], pool: Sequence[Fact] | None, batch_size: int, progress: bool
) -> tuple[LensResult, list[str | None]]:
    """The logit lens tracking :func:`mismatch_tracks`, with the mismatched words."""
    tracks, mismatch = mismatch_tracks(facts, pool)
    lens = logit_lens(model, [f.prompt for f in facts], tracks, langs=[f.lang for f in facts],
                      ids=[f.id for f in facts], batch_size=batch_size, progress=progress)  # fmt: skip
    return lens, mismatch


def other_answers(facts: Sequence[Fact], pool: Sequence[Fact] | None) -> dict[str, dict[str, str]]:
    """``{fact id: {lang: answer}}`` from the facts, the pool and (when they come from it) the
    bundled data; used to detect answers given in another language."""
    out: dict[str, dict[str, str]] = {}
    for f in list(pool or []) + list(facts):
        out.setdefault(f.id, {})[f.lang] = f.answer
    relations = sorted({f.relation for f in facts})
    try:
        ids = {f.id for f in facts}
        for g in load_facts(relations=relations):
            if g.id in ids:
                out.setdefault(g.id, {}).setdefault(g.lang, g.answer)
    except (ValueError, FileNotFoundError):  # custom relations: only the given facts
        pass
    return out


def _answered_in(gen: str, fact: Fact, answers: dict[str, str]) -> str | None:
    """The language whose answer (different from the fact's own) the generation gives."""

    own = {normalize(a) for a in (fact.answer, *fact.aliases)}
    cands = dict(answers)
    if fact.answer_en:
        cands.setdefault("en", fact.answer_en)
    order = ["en"] + sorted(k for k in cands if k != "en")
    for lg in order:
        word = cands.get(lg)
        if lg == fact.lang or not word or normalize(word) in own:
            continue
        if is_correct(gen, [word], lg):
            return lg
    return None


def mismatched_english(facts: Sequence[Fact], english: Sequence[str]) -> list[str | None]:
    """Per fact, the English answer of another fact of its relation: the ids of a relation
    sorted, each takes the answer of the next id (cyclically) whose English answer differs
    from its own (a fixed derangement, the same in every language); ``None`` when the
    relation has no such id. ``english``: each fact's English answer, in order."""
    by_rel: dict[str, dict[str, str]] = {}
    for f, e in zip(facts, english, strict=True):
        by_rel.setdefault(f.relation, {}).setdefault(f.id, e)
    out: list[str | None] = []
    for f, e in zip(facts, english, strict=True):
        ids = sorted(by_rel[f.relation])
        start = ids.index(f.id)
        other = None
        for step in range(1, len(ids)):
            cand = by_rel[f.relation][ids[(start + step) % len(ids)]]
            if normalize(cand) != normalize(e):
                other = cand
                break
        out.append(other)
    return out


# --------------------------------------------------------------------------------------
# What a greedy answer did
# --------------------------------------------------------------------------------------


def answer_flags(fact: Fact, continuation: str | None) -> dict[str, Any]:
    """The record fields of what ``fact``'s greedy answer did
    (:mod:`mechlingo.core.answers`): ``shared_form`` (its answer is written as the English
    one), ``continues_prompt`` (the continuation glues onto the prompt's last word),
    ``echoes_subject`` (the answer starts by repeating the subject), ``decided_at`` (the
    prefix of the first line on which the eval rule's verdict is final,
    :func:`~mechlingo.core.answers.decision_prefix`) and ``generation_lang``, the language of
    the generation's first word for the fact's language and English
    (:func:`~mechlingo.data.langid.token_language`: a code, ``"shared"`` or ``None``), from
    the raw ``continuation`` (``None``: nothing generated, e.g. candidate ranking: the flags
    are ``False``, ``decided_at`` and ``generation_lang`` ``None``)."""
    shared = shared_form(fact.lang, fact.answers, fact.answer_en)
    if continuation is None:
        return {"shared_form": shared, "continues_prompt": False,
                "echoes_subject": False, "decided_at": None, "generation_lang": None}  # fmt: skip
    line = continuation.strip().split("\n")[0] if continuation.strip() else ""
    first = line.split(" ")[0][:40]
    return {
        "shared_form": shared,
        "continues_prompt": continues_prompt(fact.prompt, continuation, fact.lang),
        "echoes_subject": echoes_subject(line, fact.subject, fact.answers, fact.lang),
        "decided_at": decision_prefix(line, fact.answers, fact.lang, fact.answer_en),
        "generation_lang": token_language(first, (fact.lang, "en")) if first else None,
    }
