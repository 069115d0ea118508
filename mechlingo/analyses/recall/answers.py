"""The answers a traced query is read against: the gold candidate's rank, each fact's answers in
other languages, and the mismatched-fact control (another fact's English answer, tracked by the
same lens, so latent English can be told from any English word reaching the top).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from mechlingo.analyses.decoders.lens import LensResult, fact_answers, logit_lens
from mechlingo.core.tokens import prepends_bos
from mechlingo.core.types import Model
from mechlingo.data import load_facts
from mechlingo.scoring.evaluate import evaluate_facts
from mechlingo.scoring.scorers import normalize, skip_reason

if TYPE_CHECKING:
    from mechlingo.data import Fact

__all__ = ["gold_ranks", "lens_with_mismatch", "mismatched_english", "other_answers"]


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


def lens_with_mismatch(
    model: Model, facts: list[Fact], pool: Sequence[Fact] | None, batch_size: int, progress: bool
) -> tuple[LensResult, list[str | None]]:
    """The logit lens tracking each fact's answer, its English answer and (track
    ``mismatch_en``) another fact's English answer (:func:`mismatched_english`; the fact's own
    where there is none), with the mismatched words."""
    answers = fact_answers(facts, ("en",), pool)
    mismatch = mismatched_english(facts, answers["en"])
    answers["mismatch_en"] = [m if m is not None else e for m, e in zip(mismatch, answers["en"],
                                                                        strict=True)]  # fmt: skip
    lens = logit_lens(model, [f.prompt for f in facts], answers, langs=[f.lang for f in facts],
                      ids=[f.id for f in facts], batch_size=batch_size, progress=progress)  # fmt: skip
    return lens, mismatch


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


def gold_ranks(
    model: Model, facts: Sequence[Fact], batch_size: int, progress: bool
) -> dict[tuple[str, str], int]:
    """The gold candidate's rank under candidate ranking of every fact that has candidates
    (``{(id, lang): rank}``; empty when none has)."""
    bos = prepends_bos(model)
    ranked = [f for f in facts if skip_reason(f, "rank", bos=bos) is None]
    if not ranked:
        return {}
    res = evaluate_facts(model, ranked, metric="rank", batch_size=batch_size, progress=progress)
    return {(r["id"], r["lang"]): int(r["gold_rank"]) for r in res.records}
