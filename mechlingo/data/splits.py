"""Deterministic splits of facts by a hash of their id.

:func:`hash_fraction` maps a key to a number in ``[0, 1)`` (the first 8 bytes of its
SHA-256); the same key gives the same number in every run and on every machine. The repair
protocol uses it to put each fact id into build, dev or test (:func:`split_facts`: the same id
lands in the same split in every language, so no fact seen while building or choosing is scored
on test) and to pick the same ids in every language (:func:`take_per_lang`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence

from mechlingo.core.errors import InputError
from mechlingo.data.facts import Fact

__all__ = [
    "SPLITS",
    "hash_fraction",
    "scope_facts",
    "split_facts",
    "split_of",
    "take_per_lang",
    "take_shared",
]

SPLITS = ("build", "dev", "test")


def hash_fraction(key: str) -> float:
    """A number in ``[0, 1)`` from the SHA-256 of ``key`` (uniform over keys, stable)."""
    h = hashlib.sha256(key.encode("utf-8")).digest()
    return int.from_bytes(h[:8], "big") / 2**64


def split_of(fact_id: str, fractions: Sequence[float] = (0.3, 0.2, 0.5), salt: str = "") -> str:
    """``"build"``, ``"dev"`` or ``"test"`` for a fact id, from a hash of the id (the same
    fact goes to the same split in every language and every run)."""
    if len(fractions) != 3 or min(fractions) < 0 or abs(sum(fractions) - 1) > 1e-9:
        raise InputError(f"fractions must be three non-negative numbers summing to 1: {fractions}")
    u = hash_fraction(f"{salt}|{fact_id}")
    if u < fractions[0]:
        return "build"
    if u < fractions[0] + fractions[1]:
        return "dev"
    return "test"


def split_facts(
    facts: Iterable[Fact], fractions: Sequence[float] = (0.3, 0.2, 0.5), salt: str = ""
) -> dict[str, list[Fact]]:
    """Split facts into build/dev/test by a hash of the fact id (deterministic; a fact id is
    never in two splits, so no fact seen while building or choosing is scored on test)."""
    out: dict[str, list[Fact]] = {s: [] for s in SPLITS}
    for f in facts:
        out[split_of(f.id, fractions, salt)].append(f)
    return out


def take_per_lang(facts: Sequence[Fact], n: int | None | Mapping[str, int]) -> list[Fact]:
    """At most ``n`` fact ids per (relation, language), the same ids in every language (those
    with the smallest :func:`hash_fraction`); ``n`` a mapping: per relation; ``None`` keeps
    all."""
    if n is None:
        return list(facts)
    ids_by_rel: dict[str, list[str]] = {}
    for f in facts:
        ids = ids_by_rel.setdefault(f.relation, [])
        if f.id not in ids:
            ids.append(f.id)
    cap = n if isinstance(n, Mapping) else dict.fromkeys(ids_by_rel, n)
    keep = {
        i for r, ids in ids_by_rel.items() for i in sorted(ids, key=hash_fraction)[: cap.get(r, 0)]
    }
    return [f for f in facts if f.id in keep]


def take_shared(facts: Sequence[Fact], n: int | None, minimum: int = 1) -> list[Fact]:
    """At most ``n`` fact ids per language, shared evenly by the relations: each relation
    keeps ``n // relations`` ids and the first ``n % relations`` of them (by name) one more,
    at least ``minimum`` each, the same ids in every language (:func:`take_per_lang`), so a
    file of many relations costs what one relation does. ``None`` keeps all."""
    facts = list(facts)
    if n is None or not facts:
        return facts
    rels = sorted({f.relation for f in facts})
    base, extra = divmod(int(n), len(rels))
    return take_per_lang(facts, {r: max(minimum, base + (i < extra)) for i, r in enumerate(rels)})


def scope_facts(
    facts: Sequence[Fact], langs: Sequence[str], relations: Sequence[str] | None = None
) -> list[Fact]:
    """At most ``len(langs)`` languages (those of ``langs`` first, in its order, then the
    others in the order they first appear) and, when ``relations`` is given, at most
    ``len(relations)`` relations chosen the same way: a budget's languages and relations
    bound what any facts file costs, and a file without them still gets as many of its own."""

    def pick(have: list[str], wanted: Sequence[str]) -> set[str]:
        order = [x for x in wanted if x in have] + [x for x in have if x not in wanted]
        return set(order[: len(wanted)])

    facts = list(facts)
    keep_langs = pick(list(dict.fromkeys(f.lang for f in facts)), langs)
    keep_rels = (None if relations is None
                 else pick(list(dict.fromkeys(f.relation for f in facts)), relations))  # fmt: skip
    return [f for f in facts
            if f.lang in keep_langs and (keep_rels is None or f.relation in keep_rels)]  # fmt: skip
