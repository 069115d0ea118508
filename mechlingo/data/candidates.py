"""Ranking candidates for facts that have none, built the way BMLAMA builds them.

BMLAMA (Qi et al. 2023) ranks, for each fact, its gold object among other objects of the same
relation, written in the query's language, and the candidate lists of one fact are aligned
across languages so that RankC can compare two languages' rankings candidate by candidate.
:func:`with_candidates` does the same for facts without candidates (the bundled ones):

* the distractors of fact ``f`` are the answers of other facts ``g`` of the same relation,
  taken in the order of ``sha256(f.id + "|" + g.id)`` (fixed, independent of the languages and
  of the model);
* a ``g`` is taken only if it exists in every language ``f`` exists in, and in each of them its
  answer differs (stripped, case-folded) from every answer and alias of ``f`` and from the
  distractors already taken, so a candidate is never a second gold and no list repeats itself;
* the list of ``f`` in language ``L`` is the answers in ``L`` of ``f`` and its distractors,
  ordered by fact id: candidate ``i`` is the same object in every language.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence

from mechlingo.core.errors import InputError
from mechlingo.data.facts import Fact

__all__ = ["CANDIDATE_RULE", "with_candidates"]

#: The rule in words (written into the card's settings and ``docs/replicate.md``).
CANDIDATE_RULE = (
    "gold + the answers of other facts of the same relation in the query's language, taken "
    "in sha256(fact id|other id) order, skipping any that is missing in one of the fact's "
    "languages or whose answer equals (case-folded) a gold answer or a distractor there; "
    "ordered by fact id, so candidate i is the same object in every language"
)


def _key(a: str, b: str) -> str:
    return hashlib.sha256(f"{a}|{b}".encode()).hexdigest()


def _fold(text: str) -> str:
    return text.strip().casefold()


def with_candidates(facts: Sequence[Fact], n: int = 4) -> list[Fact]:
    """``facts`` with ``n`` ranking candidates each (the gold among them) by the rule of the
    module docstring; facts that already have candidates are kept as they are.

    Args:
        facts: facts of any relations and languages (the pool of distractors is these facts).
        n: candidates per fact, the gold included (at least 2).

    Raises:
        InputError: ``n < 2``, or a relation has too few distinct objects for ``n`` candidates.
    """
    if n < 2:
        raise InputError(f"a ranking needs at least 2 candidates, got {n}")
    by_id: dict[str, dict[str, Fact]] = {}
    for f in facts:
        by_id.setdefault(f.id, {})[f.lang] = f
    rel_ids: dict[str, list[str]] = {}
    for fid, langs in by_id.items():
        rel_ids.setdefault(next(iter(langs.values())).relation, []).append(fid)
    chosen: dict[str, list[str]] = {}
    for fid, langs in by_id.items():
        if all(f.candidates for f in langs.values()):
            continue
        relation = next(iter(langs.values())).relation
        others = sorted((g for g in rel_ids[relation] if g != fid), key=lambda g: _key(fid, g))
        taken: list[str] = []
        for g in others:
            if len(taken) == n - 1:
                break
            if _usable(langs, by_id[g], [by_id[t] for t in taken]):
                taken.append(g)
        if len(taken) < n - 1:
            raise InputError(
                f"relation {relation!r} has too few distinct objects for {n} candidates "
                f"(fact {fid}: {len(taken) + 1})",
                fix="give more facts of the relation, or fewer candidates",
            )
        chosen[fid] = sorted([fid, *taken])
    out = []
    for f in facts:
        if f.id not in chosen or f.candidates:
            out.append(f)
            continue
        cands = tuple(f.answer if g == f.id else by_id[g][f.lang].answer for g in chosen[f.id])
        out.append(dataclasses.replace(f, candidates=cands))
    return out


def _usable(langs: dict[str, Fact], other: dict[str, Fact], taken: list[dict[str, Fact]]) -> bool:
    for lg, f in langs.items():
        g = other.get(lg)
        if g is None:
            return False
        seen = {_fold(a) for a in f.answers} | {_fold(t[lg].answer) for t in taken}
        if _fold(g.answer) in seen:
            return False
    return True
