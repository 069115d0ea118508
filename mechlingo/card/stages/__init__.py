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
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from mechlingo.card.claims import LU, SUNDAR
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
from mechlingo.card.stages.base import Budget, Stage, check, run_order
from mechlingo.core.defaults import BATCH_SIZE
from mechlingo.core.errors import InputError
from mechlingo.core.languages import is_lang_code
from mechlingo.data import LANGS

__all__ = [
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


def register_stage(stage: Stage) -> None:
    """Add ``stage`` to the card: a new stage is one module that declares its
    :class:`~mechlingo.card.stages.base.Stage` and registers it (its paper's run order follows
    its needs; a new paper is a new ``--paper`` choice of the library call). A name already
    taken is a one-line :class:`~mechlingo.core.errors.InputError`."""
    global STAGES
    if stage.name in BY_NAME:
        raise InputError(f"a card stage named {stage.name!r} exists", fix="choose another name")
    STAGES = (*STAGES, stage)
    BY_NAME[stage.name] = stage
    _order_paper(stage.paper)


def unregister_stage(name: str) -> None:
    """Remove the stage ``name`` that :func:`register_stage` added (a paper left with no
    stage is removed too)."""
    global STAGES
    stage = BY_NAME.pop(name)
    STAGES = tuple(s for s in STAGES if s.name != name)
    _order_paper(stage.paper)


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
#: sha256 (16 hex digits) of :data:`BUDGETS`, written into ``claims.json`` beside the rules'
#: hash: a change of either after a card was seen is logged in ``docs/replicate.md``.
BUDGETS_HASH = hashlib.sha256(json.dumps(BUDGETS, sort_keys=True).encode()).hexdigest()[:16]


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
