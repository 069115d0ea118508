"""The answers of a fact beyond its own answer, in one place: its answer in other languages
(:func:`fact_answers`, the tracks a lens follows; :func:`other_answers`, and the language
a wrong answer is given in), another fact's English answer (:func:`mismatched_english`: the
mismatched-fact control, so latent English can be told from any English word reaching the
top), and what a greedy answer did (:func:`answer_flags`: the flags of
:func:`mechlingo.core.answers.generation_flags` and the language of its first word).
:func:`trace_answers` prepares all of them once for the facts a trace reads
(:class:`TraceAnswers`). Matching an answer (the eval rule) is :mod:`mechlingo.core.answers`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mechlingo.core.answers import first_line, generation_flags, is_correct, normalize
from mechlingo.core.errors import InputError
from mechlingo.data.facts import LANGS, Fact
from mechlingo.data.io import load_facts
from mechlingo.data.langid import token_language

__all__ = [
    "TraceAnswers",
    "answer_flags",
    "fact_answers",
    "mismatch_tracks",
    "mismatched_english",
    "other_answers",
    "trace_answers",
]


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
    (:func:`fact_answers`) and (track ``mismatch_en``) another fact's English answer
    (:func:`mismatched_english`; the fact's own where there is none), with the mismatched
    words."""
    tracks = fact_answers(facts, ("en",), pool)
    mismatch = mismatched_english(facts, tracks["en"])
    tracks["mismatch_en"] = [m if m is not None else e for m, e in zip(mismatch, tracks["en"],
                                                                       strict=True)]  # fmt: skip
    return tracks, mismatch


def fact_answers(
    facts: Sequence[Fact], track_langs: Sequence[str], pool: Sequence[Fact] | None = None
) -> dict[str, list[str]]:
    """Answer tracks for facts: ``"answer"`` (own language) and one per language code in
    ``track_langs``, looked up by fact id in ``pool`` (default: ``facts`` themselves, then the
    bundled data); English falls back to each fact's ``answer_en``."""
    by_key = {(f.id, f.lang): f.answer for f in (pool if pool is not None else facts)}
    for f in facts:
        by_key.setdefault((f.id, f.lang), f.answer)
    out: dict[str, list[str]] = {"answer": [f.answer for f in facts]}
    missing_langs = [
        lg for lg in track_langs if any((f.id, lg) not in by_key for f in facts) and lg != "en"
    ]
    missing_langs = [lg for lg in missing_langs if lg in LANGS]  # what the bundled data has
    if missing_langs:
        for g in load_facts(langs=missing_langs):
            by_key.setdefault((g.id, g.lang), g.answer)
    for lg in track_langs:
        words = []
        for f in facts:
            w = by_key.get((f.id, lg))
            if w is None and lg == "en":
                w = f.answer_en or None
            if w is None:
                raise InputError(
                    f"no {lg} answer for fact {f.id!r}: pass a pool of facts that has it, or "
                    f"drop {lg!r} from track_langs"
                )
            words.append(w)
        out[lg] = words
    return out


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


def answer_flags(fact: Fact, continuation: str | None) -> dict[str, Any]:
    """The record fields of what ``fact``'s greedy answer did: the flags of
    :func:`~mechlingo.core.answers.generation_flags` (``shared_form``, ``continues_prompt``,
    ``echoes_subject``, ``decided_at``) and ``generation_lang``, the language of the
    generation's first word for the fact's language and English
    (:func:`~mechlingo.data.langid.token_language`: a code, ``"shared"`` or ``None``), from
    the raw ``continuation`` (``None``: nothing generated, e.g. candidate ranking: the flags
    are ``False``, ``decided_at`` and ``generation_lang`` ``None``)."""
    flags = generation_flags(fact.prompt, fact.subject, fact.lang, fact.answers,
                             fact.answer_en, continuation)  # fmt: skip
    first = "" if continuation is None else first_line(continuation).split(" ")[0][:40]
    return {**flags, "generation_lang": token_language(first, (fact.lang, "en")) if first else None}
