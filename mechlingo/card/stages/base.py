"""What every stage of the claims card declares, and the order the card runs them in.

A :class:`Stage` is one measurement of the card: its name (the key of its stored result),
its paper, the stages whose results it reads (``needs``), the budget section it reads and
that section's typed settings (a :class:`Budget` dataclass, checked when it is built), its
run function, its row builders (from its stored result to the rows of its claims) and its
report section. :func:`run_order` orders any selection of stages from their declared needs.
"""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from mechlingo.card.claims import CLAIMS, Claim
from mechlingo.card.stages.data import lu_facts, parallel_parts
from mechlingo.core.checkpoints import Checkpoints
from mechlingo.core.defaults import PROGRESS
from mechlingo.core.errors import InputError
from mechlingo.core.types import Model
from mechlingo.data import Fact

if TYPE_CHECKING:
    from mechlingo.card.stages import CardBudget, CardSettings

__all__ = [
    "Budget",
    "Context",
    "CostModel",
    "ReportLike",
    "Stage",
    "check",
    "data_section",
    "failed",
    "heading",
    "run_order",
    "settings_fields",
]

B = TypeVar("B", bound="Budget")


def check(ok: bool, where: str, what: str) -> None:
    """Raise a one-line :class:`~mechlingo.core.errors.InputError` for a budget setting."""
    if not ok:
        raise InputError(f"budget setting {where}: {what}", fix="correct it in --settings")


def _plain(value: Any) -> Any:
    """Tuples as lists, recursively (the JSON form the stage key and the hash read)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def settings_fields(cls: type[Budget] | Budget) -> list[dataclasses.Field]:
    """The fields of a budget that are settings (a field marked ``metadata={"setting":
    False}`` holds something else: :class:`~mechlingo.card.stages.CardBudget`'s sections of
    registered stages)."""
    return [f for f in dataclasses.fields(cls) if f.metadata.get("setting", True)]


def _frozen(value: Any) -> Any:
    """Lists as tuples, recursively (a frozen budget holds no mutable list)."""
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


@dataclass(frozen=True)
class Budget:
    """The typed settings of one budget section. Subclasses are frozen dataclasses that check
    their values in ``__post_init__``; ``NESTED`` names fields that are budgets themselves."""

    NESTED: ClassVar[Mapping[str, type[Budget]]] = {}

    @classmethod
    def from_mapping(cls: type[B], values: Mapping[str, Any], where: str) -> B:
        """The section ``where`` from JSON-like ``values``: an unknown or a missing key is a
        one-line :class:`~mechlingo.core.errors.InputError`."""
        if not isinstance(values, Mapping):
            raise InputError(f"budget section {where} must be a JSON object, got {values!r}",
                             fix="pass an object in --settings")  # fmt: skip
        fields = {f.name: f for f in settings_fields(cls)}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise InputError(f"budget section {where}: unknown setting(s) {unknown}",
                             fix=f"use {sorted(fields)}")  # fmt: skip
        missing = sorted(n for n, f in fields.items() if n not in values
                         and f.default is dataclasses.MISSING
                         and f.default_factory is dataclasses.MISSING)  # fmt: skip
        if missing:
            raise InputError(f"budget section {where}: missing setting(s) {missing}",
                             fix="give them in --settings")  # fmt: skip
        kw = {}
        for k, v in values.items():
            sub = cls.NESTED.get(k)
            kw[k] = sub.from_mapping(v, f"{where}.{k}") if sub else _frozen(v)
        return cls(**kw)

    def to_dict(self) -> dict[str, Any]:
        """The settings as the stages read them (plain JSON: lists, not tuples)."""
        return {f.name: (getattr(self, f.name).to_dict() if f.name in self.NESTED
                         else _plain(getattr(self, f.name)))
                for f in settings_fields(self)}  # fmt: skip


class ReportLike(Protocol):
    """What a stage's report section writes to (:class:`mechlingo.report.page.Report`)."""

    parts: list[str]

    def add_text(self, text: str, note: bool = False) -> Any: ...

    def add_figure(self, fig: Any) -> Any: ...

    def add_table(self, rows: Any) -> Any: ...


def heading(report: ReportLike, anchor: str, title: str) -> None:
    """A section heading with the anchor that the card's rows link to."""
    report.parts.append(f"<h2 id='{html.escape(anchor)}'>{html.escape(title)}</h2>")


def failed(report: ReportLike, data: Mapping[str, Any] | None, name: str) -> bool:
    """Whether stage ``name`` left nothing to draw (absent, or failed: then a note says so)."""
    if data is None:
        return True
    if "error" in data:
        report.add_text(f"The {name} stage failed: {data['error']}", note=True)
        return True
    return False


@dataclass
class Context:
    """What a stage's run function reads: the model, the data, the typed settings
    (``settings``: the budget, the card's metric, the batch size), checkpoints and a
    cache shared by the stages of one run (``shared``: data loaded once, build statistics
    reused)."""

    model: Model
    facts: Sequence[Fact] | None
    parallel: Mapping[str, Sequence[str]] | None
    settings: CardSettings
    checkpoints: Checkpoints
    progress: bool = PROGRESS
    external: tuple[Sequence[Fact], str] | None = None
    documents: Sequence[str] | None = None
    shared: dict[str, Any] = field(default_factory=dict)

    @property
    def budget(self) -> CardBudget:
        """The typed budget (:class:`~mechlingo.card.stages.CardBudget`)."""
        return self.settings.budget

    def lu_facts(self, section: str) -> list[Fact]:
        """The facts of one Lu stage (:func:`mechlingo.card.stages.data.lu_facts`)."""
        return lu_facts(self.facts, self.settings, section)

    def texts(self) -> dict[str, Any]:
        """The parallel sentences split into find / held-out / eval parts, loaded once
        (:func:`mechlingo.card.stages.data.parallel_parts`)."""
        if "texts" not in self.shared:
            self.shared["texts"] = parallel_parts(self.parallel, self.settings, self.documents)
        return self.shared["texts"]

    def stored(self, name: str) -> Mapping[str, Any] | None:
        """The stored result of stage ``name`` when it finished, else ``None``."""
        return self.checkpoints.load(name) if self.checkpoints.done(name) else None


RowBuilder = Callable[[Mapping[str, Any]], list[dict[str, Any]]]
#: ``(settings, sizes, unit) -> CPU seconds`` of one stage (see :class:`Stage`).
CostModel = Callable[["CardSettings", Mapping[str, Any], Mapping[str, float]], float]
SectionWriter = Callable[[ReportLike, Mapping[str, Any]], None]


@dataclass(frozen=True, kw_only=True)
class Stage:
    """One stage of the card, declared with keywords.

    ``run(ctx)`` (``run(ctx, folder)`` with ``folder``: the stage also leaves files there)
    returns the JSON-able result that is stored under ``name``; ``rows`` read only that
    stored result; ``report(report, results)`` writes the stage's section from every stage's
    result (``None``: the section of another stage shows it). ``budget``: the section of the
    settings it reads (``section``) as its typed class. ``cost(settings, sizes, unit)``: the
    stage's estimated CPU seconds from the sizes of its data (the planner's) and the
    measured per-item seconds ``unit`` (``rank``, ``generate``, ``embed``), for the planner.
    ``decides(result, given)``: the stage runs before the planner and its result decides the
    card's metric (``given``: the user's, or ``None``); it returns the decision, whose
    ``"metric"`` the later stages read (the metric stage).

    A stage that brings its own budget section and claims declares them here too, so that
    the stage is one module (:func:`~mechlingo.card.stages.register_stage` adds them to the
    card): ``quick`` and ``full``, its section's values in each budget (instances of
    ``budget``; the stage reads them as ``ctx.budget.<section>``, ``--settings`` overrides
    them), and ``own_claims``, its :class:`~mechlingo.card.claims.Claim` records (``stage``:
    this stage's name), judged by the same rules as the shipped ones. The shipped stages
    leave them empty: their sections are fields of
    :class:`~mechlingo.card.stages.CardBudget` and their claims are in
    :data:`~mechlingo.card.claims.CLAIMS`.
    """

    name: str
    paper: str
    needs: tuple[str, ...] = ()
    run: Callable[..., Any]
    rows: tuple[RowBuilder, ...] = ()
    report: SectionWriter | None = None
    section: str | None = None
    budget: type[Budget] | None = None
    folder: bool = False
    cost: CostModel | None = None
    decides: Callable[[Mapping[str, Any], str | None], dict[str, Any]] | None = None
    quick: Budget | None = None
    full: Budget | None = None
    own_claims: tuple[Claim, ...] = ()

    @property
    def claims(self) -> tuple[Claim, ...]:
        """The claims whose rows this stage's result gives (the shipped ones, then its own)."""
        return (*(c for c in CLAIMS if c.stage == self.name), *self.own_claims)


def run_order(stages: Mapping[str, Stage], names: Sequence[str]) -> list[str]:
    """``names`` ordered so that every stage runs after the stages it needs (a topological
    sort; among stages that are ready, the first in ``names`` runs first). A need outside
    ``names`` does not run (the stage reads what it finds); an unknown name or a cycle is a
    one-line :class:`~mechlingo.core.errors.InputError`."""
    for n in names:
        if n not in stages:
            raise InputError(f"unknown stage {n!r}", fix=f"use one of {sorted(stages)}")
        for m in stages[n].needs:
            if m not in stages:
                raise InputError(f"stage {n!r} needs an unknown stage {m!r}",
                                 fix=f"declare needs among {sorted(stages)}")  # fmt: skip
    chosen = list(dict.fromkeys(names))
    waiting = {n: {m for m in stages[n].needs if m in chosen} for n in chosen}
    order: list[str] = []
    while waiting:
        ready = [n for n in chosen if n in waiting and not waiting[n]]
        if not ready:
            raise InputError(f"the stages {sorted(waiting)} need each other (a cycle)",
                             fix="remove a need from one of them")  # fmt: skip
        order.append(ready[0])
        del waiting[ready[0]]
        for deps in waiting.values():
            deps.discard(ready[0])
    return order


def has_data(report: ReportLike, data: Mapping[str, Any] | None, name: str) -> bool:
    """Whether stage ``name`` left data to show; when not, a note says why (not run, failed,
    or not testable)."""
    if data is None:
        report.add_text(f"The {name} stage did not run.", note=True)
        return False
    if "error" in data:
        report.add_text(f"The {name} stage failed: {data['error']}", note=True)
        return False
    if "untestable" in data:
        report.add_text(str(data["untestable"]), note=True)
        return False
    return True


def data_section(key: str, anchor: str, title: str, draw: SectionWriter) -> SectionWriter:
    """A stage's report section: when the results hold ``key``, a heading (``anchor``,
    ``title``), then ``draw`` of that stage's data, or the note :func:`has_data` writes."""

    def report(rep: ReportLike, results: Mapping[str, Any]) -> None:
        if key in results:
            heading(rep, anchor, title)
            data = results[key]
            if has_data(rep, data, key):
                draw(rep, data)

    return report


def scoring_seconds(settings: CardSettings, unit: Mapping[str, float]) -> float:
    """Measured CPU seconds of scoring one item under the card's metric (``rank`` when the
    metric has no measurement of its own, e.g. ``klar``)."""
    return float(unit.get(settings.metric, unit.get("rank", 0.0)))


def token_seconds(unit: Mapping[str, float], new_tokens: int) -> float:
    """Measured CPU seconds of one generated token: a greedy answer's seconds over its
    ``new_tokens`` (without a generation measurement: 0.3 embedding passes, the ratio on the
    embedded model)."""
    if "generate" in unit:
        return float(unit["generate"]) / max(1, new_tokens)
    return 0.3 * float(unit.get("embed", 0.0))


def processes(sizes: Mapping[str, Any]) -> int:
    """The processes the card runs in (``sizes["processes"]``: torchrun's world size, 1 when
    absent). The measured per-item seconds are one process's share of sharded scoring, so
    work that every process does whole (patching, circuits, a warm-up) costs ``processes``
    times the per-item seconds per item."""
    return max(1, int(sizes.get("processes", 1) or 1))
