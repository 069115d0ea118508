"""The data of the card's stages: the facts of each Lu stage (the user's or the bundled natural
stems, capped per language, with candidates under ``rank``), the repair split, and the parallel
sentences of the Sundar stages split by document."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mechlingo.analyses.experts.align import drop_empty_lines
from mechlingo.analyses.recall.settings import SplitSettings
from mechlingo.core.errors import InputError
from mechlingo.data import LANGS, Fact, load_facts
from mechlingo.data.candidates import with_candidates
from mechlingo.data.natural_parallel import bundled_documents, bundled_parallel, split_by_documents
from mechlingo.data.splits import scope_facts, take_per_lang, take_shared

if TYPE_CHECKING:
    from mechlingo.card.stages import CardSettings

__all__ = [
    "bundled_texts",
    "cap_facts",
    "FactScope",
    "external_facts",
    "lu_facts",
    "metric_of",
    "parallel_parts",
    "prepare_facts",
    "repair_caps",
    "repair_split",
    "scope_of",
    "scoped_facts",
    "vector_facts",
]


def metric_of(settings: CardSettings) -> str:
    """The card's metric (``generate``, ``rank`` or ``klar``)."""
    return settings.metric


def prepare_facts(facts: list[Fact], settings: CardSettings) -> list[Fact]:
    """Under ``rank``, facts without candidates get the budget's ``candidates`` of them."""
    if settings.metric != "rank" or all(f.candidates for f in facts):
        return facts
    return with_candidates(facts, int(settings.budget.candidates))


def repair_split(facts: list[Fact], settings: CardSettings) -> tuple[list, list, list]:
    """``(build, dev, test)`` of the repair stage: the hash split, then at most about
    ``dev_per_lang`` and ``test_per_lang`` ids per language, shared by the relations
    (:func:`~mechlingo.data.splits.take_shared`). The whole build part is the pool of the
    few-shot demonstrations; the vectors are built on :func:`vector_facts` of it."""
    return repair_caps(settings).parts(facts)


def repair_caps(settings: CardSettings) -> SplitSettings:
    """The repair stage's split settings (its fractions, the caps per language shared by the
    relations): what :func:`repair_split` and the stage's ``steer eval`` call both use."""
    return settings.budget.repair.split_settings()


def vector_facts(build: Sequence[Fact], settings: CardSettings) -> list[Fact]:
    """The build facts the repair stage's vectors are built on: at most about
    ``repair.build_per_lang`` ids per language, shared by the relations (``None``: all of
    ``build``); the demonstrations of the few-shot headroom still come from all of ``build``."""
    return take_shared(build, settings.budget.repair.build_per_lang)


def lu_facts(facts: Sequence[Fact] | None, settings: CardSettings, section: str) -> list[Fact]:
    """The facts of one Lu stage, with BMLAMA-style candidates under ``metric = "rank"``:
    the bundled natural stems, or the user's scoped to the budget (at most as many languages
    as the section's ``langs`` or ``lu_langs``, preferring those, and as many relations as a
    section's ``relations``: :func:`~mechlingo.data.splits.scope_facts`; at most ``limit`` ids
    per relation; :func:`cap_facts`). The trace reads the repair test items."""
    if section == "trace":  # the tracer reads the repair stage's test items (their classes)
        return repair_split(lu_facts(facts, settings, "repair"), settings)[2]
    scope = settings.budget.transfer.scope() if section == "transfer" else FactScope()
    return scoped_facts(facts, settings, scope)


@dataclass(frozen=True)
class FactScope:
    """The facts a Lu stage reads: its ``langs`` (``None`` or empty: the budget's ``lu_langs``), its
    ``relations`` (``None``: every relation of a user's facts, the capitals of the bundled
    ones) and at most ``limit`` ids per relation (``None``: all)."""

    langs: tuple[str, ...] | None = None
    relations: tuple[str, ...] | None = None
    limit: int | None = None


def scoped_facts(facts: Sequence[Fact] | None, settings: CardSettings,
                 scope: FactScope) -> list[Fact]:  # fmt: skip
    """The facts of ``scope`` (:func:`lu_facts`): the bundled natural stems, or the user's
    scoped to it and capped (:func:`cap_facts`), with candidates under ``rank``."""
    langs = list(scope.langs or settings.budget.lu_langs)
    rels = None if scope.relations is None else list(scope.relations)
    if facts is not None:
        capped = cap_facts(take_per_lang(scope_facts(facts, langs, rels), scope.limit), settings)
        return prepare_facts(capped, settings)
    loaded = load_facts(langs=langs, relations=rels or ["capital"], limit=scope.limit,
                        templates="natural")  # fmt: skip
    return prepare_facts(loaded, settings)


def external_facts(external: Sequence[Fact], settings: CardSettings) -> list[Fact]:
    """The benchmark facts the external rows score: at most as many languages as
    ``lu_langs`` (those first, :func:`~mechlingo.data.splits.scope_facts`) and at most
    ``external.per_lang`` ids per language, shared by the benchmark's relations."""
    scoped = scope_facts(external, list(settings.budget.lu_langs))
    return take_shared(scoped, settings.budget.external.per_lang)


def scope_of(facts: Sequence[Fact], settings: CardSettings) -> dict[str, Any]:
    """What the budget reads of a user's facts (:func:`lu_facts`): the Lu languages, the
    transfer's relations and languages, and what the file has that they leave out."""
    file_langs = list(dict.fromkeys(f.lang for f in facts))
    file_rels = list(dict.fromkeys(f.relation for f in facts))
    b = settings.budget
    lu = {f.lang for f in scope_facts(facts, list(b.lu_langs))}
    t = b.transfer
    moved = scope_facts(facts, list(t.langs or b.lu_langs), list(t.relations))
    t_langs, t_rels = {f.lang for f in moved}, {f.relation for f in moved}
    return {
        "lu_langs": [lg for lg in file_langs if lg in lu],
        "left_out_langs": [lg for lg in file_langs if lg not in lu],
        "transfer_langs": [lg for lg in file_langs if lg in t_langs],
        "transfer_relations": [r for r in file_rels if r in t_rels],
        "relations": file_rels,
    }


def cap_facts(facts: Sequence[Fact], settings: CardSettings) -> list[Fact]:
    """At most about ``max_ids_per_lang`` fact ids per language, shared evenly by the
    relations (each keeps at least 4, :func:`~mechlingo.data.splits.take_shared`): a user's
    facts file of many relations costs the card what the bundled one does. ``None`` keeps
    all."""
    return take_shared(facts, settings.budget.max_ids_per_lang, minimum=4)


def bundled_texts() -> tuple[dict[str, list[str]], list[str]]:
    """The bundled parallel lines of every language and their document ids."""
    return bundled_parallel(list(LANGS)), bundled_documents()


def parallel_parts(
    parallel: Mapping[str, Sequence[str]] | None,
    settings: CardSettings,
    docs: Sequence[str] | None = None,
) -> dict:
    """The parallel sentences of the Sundar stages, split into the lines that find the
    experts, the held-out lines of the k curve, and the evaluation lines (alignment and the
    held-out AUROC), in this order, never overlapping and never sharing a document
    (:func:`mechlingo.data.natural_parallel.split_by_documents`; the evaluation part takes at
    most ``experts.eval_per_doc`` lines per document, so that it spans more documents). Default: the bundled natural
    NTREX-128 lines with their document ids; a user's ``parallel`` without ``docs``: every
    line its own document. ``"docs"`` holds each part's document ids."""
    e = settings.budget.experts
    if parallel is None:
        parallel, docs = bundled_parallel(list(LANGS)), bundled_documents()
    texts = drop_empty_lines(parallel)
    n = len(next(iter(texts.values()), []))
    if docs is None or len(docs) != n:  # no ids, or empty lines were dropped
        docs = [str(i) for i in range(n)]
    if e.n_find < 2:
        raise InputError(f"the experts need at least 2 finding lines, got {e.n_find}")
    sizes = [e.n_find, e.n_heldout, e.n_eval]
    parts = split_by_documents(list(docs), sizes, e.eval_caps())
    if len(parts[2]) < 2:
        raise InputError(
            f"the parallel data has {n} lines; the experts need {sizes[0]} + {sizes[1]} + at "
            "least 2 evaluation lines per language, in separate documents",
            fix="pass more lines with --parallel, or a smaller budget",
        )
    out: dict[str, Any] = {}
    for part, idx in zip(("find", "heldout", "eval"), parts, strict=True):
        out[part] = {lg: [s[i] for i in idx] for lg, s in texts.items()}
    out["docs"] = {part: [docs[i] for i in idx]
                   for part, idx in zip(("find", "heldout", "eval"), parts, strict=True)}  # fmt: skip
    return out
