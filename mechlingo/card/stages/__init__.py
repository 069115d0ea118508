"""The claims card built by stage: one module per stage, each declaring its name, the stages
it needs, its typed budget section (quick and full instances), its run function, its row
builders and its report section (:class:`~mechlingo.card.stages.base.Stage`).

:data:`STAGES` lists every stage in declaration order (the metric stage first: it
``decides`` the card's metric before the planner runs); :data:`PAPERS` the stages of each
paper; :func:`~mechlingo.card.stages.base.run_order` orders a selection from the declared
needs. :class:`CardBudget` holds a whole budget (the shared Lu settings and every section);
:data:`BUDGETS` and :data:`BUDGETS_HASH` are computed from its quick and full instances, and
:func:`budget_settings` merges ``--settings`` overrides into a budget and checks the result.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from mechlingo.card.claims import CLAIMS, LU, SUNDAR, Claim
from mechlingo.card.rules import RULES_HASH, rules_hash
from mechlingo.card.stages import (
    align,
    circuits,
    conversion,
    decoders,
    experts,
    external,
    metric,
    repair,
    trace,
    transfer,
)
from mechlingo.card.stages.base import Budget, Stage, check, run_order, settings_fields
from mechlingo.core.defaults import BATCH_SIZE
from mechlingo.core.errors import InputError
from mechlingo.core.languages import is_lang_code
from mechlingo.data import LANGS

__all__ = [
    "ADDED_SECTIONS",
    "BUDGETS",
    "BUDGETS_HASH",
    "BY_NAME",
    "FULL",
    "PAPERS",
    "QUICK",
    "STAGES",
    "CardBudget",
    "CardSettings",
    "budget_settings",
    "card_claims",
    "card_rules_hash",
    "estimate_seconds",
    "metric",
    "register_stage",
    "run_order",
    "unregister_stage",
]

#: Every stage, in the order the card declares (and, their needs allowing, runs) them.
STAGES: tuple[Stage, ...] = (
    metric.STAGE,
    trace.STAGE,
    repair.STAGE,
    transfer.STAGE_RELATION,
    transfer.STAGE_LANG,
    decoders.STAGE,
    conversion.STAGE,
    external.STAGE,
    circuits.STAGE,
    experts.STAGE,
    align.STAGE,
)
BY_NAME: dict[str, Stage] = {s.name: s for s in STAGES}
#: Each paper's stages in run order.
PAPERS: dict[str, tuple[str, ...]] = {
    p: tuple(run_order(BY_NAME, [s.name for s in STAGES if s.paper == p])) for p in (LU, SUNDAR)
}


#: The budget sections that registered stages declared (``{section: its Budget class}``):
#: :class:`CardBudget` reads and checks them beside its own fields.
ADDED_SECTIONS: dict[str, type[Budget]] = {}


def register_stage(stage: Stage) -> None:
    """Add ``stage`` to the card: a new stage is one module that declares its
    :class:`~mechlingo.card.stages.base.Stage` and registers it (its paper's run order follows
    its needs; a new paper is a new ``--paper`` choice). A stage that declares its own budget
    section (``section``, ``budget``, ``quick``, ``full``) adds it to :data:`QUICK`,
    :data:`FULL` and :data:`BUDGETS` (so ``--settings`` overrides it and
    :data:`BUDGETS_HASH` covers it); its ``own_claims`` join :func:`card_claims` (their rows,
    verdicts and report as the shipped claims', and :func:`card_rules_hash`). A name, section
    or claim id already taken, or a budget declared in part, is a one-line
    :class:`~mechlingo.core.errors.InputError`."""
    global STAGES
    if stage.name in BY_NAME:
        raise InputError(f"a card stage named {stage.name!r} exists", fix="choose another name")
    _check_own(stage)
    if stage.quick is not None and stage.full is not None and stage.section is not None:
        ADDED_SECTIONS[stage.section] = type(stage.quick)
        _set_section(stage.section, stage.quick, stage.full)
    STAGES = (*STAGES, stage)
    BY_NAME[stage.name] = stage
    _order_paper(stage.paper)


def unregister_stage(name: str) -> None:
    """Remove the stage ``name`` that :func:`register_stage` added, with its budget section
    and its claims (a paper left with no stage is removed too)."""
    global STAGES
    stage = BY_NAME.pop(name)
    STAGES = tuple(s for s in STAGES if s.name != name)
    if stage.section is not None and stage.quick is not None:
        ADDED_SECTIONS.pop(stage.section, None)
        _set_section(stage.section, None, None)
    _order_paper(stage.paper)


def _check_own(stage: Stage) -> None:
    """A new stage's own budget section and claims are whole and their names are free."""
    if (stage.quick is None) != (stage.full is None):
        raise InputError(f"stage {stage.name!r} declares one of quick and full",
                         fix="declare both budgets' values of its section, or neither")  # fmt: skip
    if stage.quick is not None:
        taken = {f.name for f in settings_fields(CardBudget)} | set(ADDED_SECTIONS) | set(RUN_KEYS)
        if stage.section is None or stage.budget is None:
            raise InputError(f"stage {stage.name!r} declares budget values without a section",
                             fix="give section= and budget= (its Budget class)")  # fmt: skip
        if stage.section in taken:
            raise InputError(f"a budget section named {stage.section!r} exists",
                             fix="choose another section name")  # fmt: skip
        if not (isinstance(stage.quick, stage.budget) and isinstance(stage.full, stage.budget)):
            raise InputError(f"stage {stage.name!r}: quick and full must be {stage.budget.__name__}",
                             fix="build both from the stage's budget class")  # fmt: skip
    ids = {c.id for c in card_claims()}
    for c in stage.own_claims:
        if c.stage != stage.name:
            raise InputError(f"claim {c.id!r} names stage {c.stage!r}, not {stage.name!r}",
                             fix="set the claim's stage to the stage that measures it")  # fmt: skip
        if c.id in ids:
            raise InputError(f"a claim named {c.id!r} exists", fix="choose another claim id")
        ids.add(c.id)


def _set_section(section: str, quick: Budget | None, full: Budget | None) -> None:
    """The registered ``section`` set to ``quick`` / ``full`` in :data:`QUICK`, :data:`FULL`,
    :data:`BUDGETS` and :data:`BUDGETS_HASH` (``None``: removed)."""
    global QUICK, FULL, BUDGETS_HASH
    for which, value in (("quick", quick), ("full", full)):
        whole = QUICK if which == "quick" else FULL
        added = {k: v for k, v in whole.added.items() if k != section}
        if value is not None:
            added[section] = value
            BUDGETS[which][section] = value.to_dict()
        else:
            BUDGETS[which].pop(section, None)
        if which == "quick":
            QUICK = replace(whole, added=added)
        else:
            FULL = replace(whole, added=added)
    BUDGETS_HASH = _budgets_hash()


def card_claims() -> tuple[Claim, ...]:
    """Every claim the card checks: :data:`~mechlingo.card.claims.CLAIMS`, then the claims
    of the registered stages (:func:`register_stage`), in their order."""
    return (*CLAIMS, *(c for s in STAGES for c in s.own_claims))


def card_rules_hash() -> str:
    """The rules' hash over :func:`card_claims`: the frozen
    :data:`~mechlingo.card.rules.RULES_HASH` while no registered stage adds a claim."""
    claims = card_claims()
    return RULES_HASH if len(claims) == len(CLAIMS) else rules_hash(claims)


def _order_paper(paper: str) -> None:
    """``PAPERS[paper]`` in run order again (removed when it has no stage)."""
    names = [s.name for s in STAGES if s.paper == paper]
    if names:
        PAPERS[paper] = tuple(run_order(BY_NAME, names))
    else:
        PAPERS.pop(paper, None)


#: Keys of the settings that are options of the run, not of a budget: the card's metric
#: (set by ``replicate``), the budget's name and the batch size of every analysis.
RUN_KEYS = ("budget", "metric", "batch_size")


@dataclass(frozen=True)
class CardBudget(Budget):
    """A whole budget: the Lu stages' languages (``lu_langs``), the cap of fact ids per
    language of a user's facts (``max_ids_per_lang``, shared by the relations), the
    candidates per fact under ``rank`` and one section per stage (the transfer stages share
    ``transfer``, the Sundar stages ``experts``)."""

    lu_langs: tuple[str, ...]
    max_ids_per_lang: int | None
    candidates: int
    trace: trace.TraceBudget
    repair: repair.RepairBudget
    transfer: transfer.TransferBudget
    experts: experts.ExpertsBudget
    decoders: decoders.DecodersBudget
    conversion: conversion.ConversionBudget
    external: external.ExternalBudget
    circuits: circuits.CircuitsBudget
    #: The sections of registered stages (:data:`ADDED_SECTIONS`), read as attributes too.
    added: Mapping[str, Budget] = field(default_factory=dict, metadata={"setting": False})

    NESTED: ClassVar[Mapping[str, type[Budget]]] = {
        "trace": trace.TraceBudget,
        "repair": repair.RepairBudget,
        "transfer": transfer.TransferBudget,
        "experts": experts.ExpertsBudget,
        "decoders": decoders.DecodersBudget,
        "conversion": conversion.ConversionBudget,
        "external": external.ExternalBudget,
        "circuits": circuits.CircuitsBudget,
    }

    def __post_init__(self) -> None:
        check(len(self.lu_langs) > 0 and all(is_lang_code(lg) for lg in self.lu_langs),
              "lu_langs", "must be language codes (en, sv, swh_Latn, ...)")  # fmt: skip
        check(self.max_ids_per_lang is None or self.max_ids_per_lang >= 4, "max_ids_per_lang",
              "must be at least 4 (or null)")  # fmt: skip
        check(self.candidates >= 2, "candidates", "must be at least 2")

    def __getattr__(self, name: str) -> Any:
        """A registered stage's section (``budget.<section>``), as its own typed budget."""
        added = self.__dict__.get("added") or {}
        if name in added:
            return added[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], where: str) -> CardBudget:
        """The whole budget from JSON-like ``values``: its own sections as
        :meth:`Budget.from_mapping` reads them, then every registered section
        (:data:`ADDED_SECTIONS`) by its own class."""
        if not isinstance(values, Mapping):
            return super().from_mapping(values, where)
        missing = sorted(set(ADDED_SECTIONS) - set(values))
        if missing:
            raise InputError(f"budget section {where}: missing setting(s) {missing}",
                             fix="give them in --settings")  # fmt: skip
        own = super().from_mapping({k: v for k, v in values.items() if k not in ADDED_SECTIONS},
                                   where)  # fmt: skip
        added = {k: sec.from_mapping(values[k], f"{where}.{k}")
                 for k, sec in ADDED_SECTIONS.items()}  # fmt: skip
        return replace(own, added=added) if added else own

    def to_dict(self) -> dict[str, Any]:
        """The settings as the stages read them, the registered sections among them."""
        return {**super().to_dict(), **{k: v.to_dict() for k, v in self.added.items()}}


@dataclass(frozen=True)
class CardSettings:
    """What a card's stages read, typed: the checked ``budget`` (:class:`CardBudget`), the
    budget's ``name``, the card's ``metric`` (``generate``, ``rank`` or ``klar``; ``rule``
    before the metric rule decides) and the ``batch_size`` of every analysis (``None``: each
    analysis's own default, :meth:`batch`). Built once from
    the plain settings (:func:`budget_settings`) by :meth:`of`; it travels to every stage."""

    budget: CardBudget
    name: str = "quick"
    metric: str = "generate"
    batch_size: int | None = None

    @classmethod
    def of(cls, cfg: Mapping[str, Any]) -> CardSettings:
        """The typed settings of the plain ``cfg`` (checked as :func:`budget_settings` does)."""
        budget = CardBudget.from_mapping({k: v for k, v in cfg.items() if k not in RUN_KEYS},
                                         "settings")  # fmt: skip
        return cls(budget, str(cfg.get("budget", "quick")), str(cfg.get("metric", "generate")),
                   cfg.get("batch_size"))  # fmt: skip

    def batch(self, default: int = BATCH_SIZE) -> int:
        """The batch size of an analysis whose own default is ``default``."""
        return default if self.batch_size is None else int(self.batch_size)

    def with_metric(self, metric: str) -> CardSettings:
        """These settings under another card metric."""
        return replace(self, metric=metric)


def _budget(which: str) -> CardBudget:
    """The quick or the full budget from each stage module's instances."""

    def pick(mod: Any) -> Any:
        return getattr(mod, which.upper())

    return CardBudget(
        lu_langs=("en", "fr", "es", "ru", "ja", "hi") if which == "quick" else tuple(LANGS),
        max_ids_per_lang=128 if which == "quick" else 256, candidates=4,
        trace=pick(trace), repair=pick(repair), transfer=pick(transfer),
        experts=pick(experts), decoders=pick(decoders), conversion=pick(conversion),
        external=pick(external), circuits=pick(circuits),
    )  # fmt: skip


QUICK = _budget("quick")
FULL = _budget("full")
#: The settings of each budget as the stages read them (see ``docs/replicate.md`` for the
#: measured run times).
BUDGETS: dict[str, dict[str, Any]] = {"quick": QUICK.to_dict(), "full": FULL.to_dict()}


def _budgets_hash() -> str:
    return hashlib.sha256(json.dumps(BUDGETS, sort_keys=True).encode()).hexdigest()[:16]


#: sha256 (16 hex digits) of :data:`BUDGETS`, written into ``claims.json`` beside the rules'
#: hash: a change of either after a card was seen is logged in ``docs/replicate.md`` (a
#: registered stage's own section changes it while it is registered: :func:`register_stage`).
BUDGETS_HASH = _budgets_hash()


def _merge(cfg: dict[str, Any], overrides: Mapping[str, Any]) -> None:
    """``overrides`` merged into ``cfg`` in place, section by section at every depth (a
    nested section such as ``transfer.matrix`` keeps the keys an override leaves out)."""
    for k, v in overrides.items():
        if isinstance(v, Mapping) and isinstance(cfg.get(k), dict):
            _merge(cfg[k], v)
        else:
            cfg[k] = copy.deepcopy(v)


def budget_settings(budget: str, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The settings of ``budget`` (``quick`` or ``full``) with ``overrides`` merged in (at
    every depth: ``{"experts": {"ks": [3, 5]}}`` changes only ``ks``, and
    ``{"transfer": {"matrix": {"test_ids": 6}}}`` only the matrix's ``test_ids``), checked by
    :class:`CardBudget` (an unknown key or a bad value is a one-line
    :class:`~mechlingo.core.errors.InputError`). The result is the plain dict that the
    stages read and that enters the stage key."""
    if budget not in BUDGETS:
        raise InputError(f"budget must be one of {sorted(BUDGETS)}, got {budget!r}")
    cfg = copy.deepcopy(BUDGETS[budget])
    _merge(cfg, overrides or {})
    bs = cfg.get("batch_size")
    check(bs is None or (isinstance(bs, int) and bs >= 1), "batch_size", "must be at least 1")
    CardBudget.from_mapping({k: v for k, v in cfg.items() if k not in RUN_KEYS}, "settings")
    cfg["budget"] = budget
    return cfg


def estimate_seconds(settings: CardSettings, papers: Sequence[str], sizes: Mapping[str, Any],
                     unit: Mapping[str, float]) -> dict[str, float]:  # fmt: skip
    """Each stage's estimated CPU seconds (in each paper's run order), from
    its declared cost model, the data's ``sizes`` and the measured per-item seconds ``unit``
    (see ``docs/replicate.md`` for the estimate against measured cards)."""
    out: dict[str, float] = {}
    for name in (n for p in papers for n in PAPERS[p]):
        cost = BY_NAME[name].cost
        out[name] = round(float(cost(settings, sizes, unit)), 1) if cost else 0.0
    return out
