"""The transfer stages (``transfer_relation`` and ``transfer_lang``): the transfer matrix by
relation and by language (:func:`mechlingo.analyses.recall.transfer.transfer_matrix`), and the
independence rows: the pooled held-out gain of vectors built without R, tested on R, and the
share of the in-pool gain that they retain."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from mechlingo.analyses.recall import transfer
from mechlingo.analyses.recall.settings import (
    MatrixSettings,
)
from mechlingo.card import claims as C
from mechlingo.card.claims import LU, Claim
from mechlingo.card.clustered_tests import Test, paired_test, ratio_test
from mechlingo.card.population import population_gain_test, rank_population_test
from mechlingo.card.repair_items import (
    cluster_note,
    clustered_by,
    item_clusters,
    subject_keys,
)
from mechlingo.card.rules import RETAINED_SHARE, make_row
from mechlingo.card.stages.base import (
    Budget,
    Context,
    ReportLike,
    Stage,
    check,
    failed,
    heading,
    scoring_seconds,
)
from mechlingo.card.stages.data import FactScope
from mechlingo.card.stages.repair import RepairBudget
from mechlingo.core.sites import layers_at
from mechlingo.core.types import Model
from mechlingo.data import Fact

if TYPE_CHECKING:
    from mechlingo.card.stages import CardSettings


def stage_transfer(
    model: Model,
    facts: list[Fact],
    settings: CardSettings,
    by: str,
    progress: bool,
    built: dict[str, Any],
) -> dict:
    """The transfer matrix (:func:`mechlingo.analyses.recall.transfer.transfer_matrix`).

    ``built`` carries what one matrix shares with the other within a run
    (:class:`~mechlingo.analyses.recall.transfer.MatrixShared`: the build statistics of the
    same facts and split, and the dev choices of equal rows); a resumed run that has only one
    of the two rebuilds."""
    t = settings.budget.transfer
    tm = transfer.transfer_matrix(
        model,
        facts,
        by=by,
        matrix=t.matrix.settings(int(model.cfg.n_layers)),
        scoring=RepairBudget.scoring(settings, t.max_new_tokens, progress),
        stats=built.setdefault("shared", transfer.MatrixShared()),
    )
    out = tm.to_json()
    out = json.loads(out) if isinstance(out, str) else out
    cells = list(out.get("cells", tm.cells))
    return {"by": by, "matrix": {k: v for k, v in out.items() if k != "cells"}, "cells": cells,
            "subjects": subject_keys(facts)}  # fmt: skip


def cell_outcome(cells: Sequence[Mapping[str, Any]]) -> str:
    """The judged outcome of the transfer rows, as the repair rows': ``"share"`` (the gold
    answer's probability share among the candidates) where every cell stored one for every
    item (a ranking metric), else ``"correct"`` (0/1 correctness)."""
    return "share" if cells and all("share" in c["items"] for c in cells) else "correct"


def _items(cell: Mapping[str, Any], key: str, outcome: str = "correct") -> list[float]:
    if outcome == "share":
        sh = cell["items"]["share"]
        return [float(x) for x in (sh["controls"][0] if key == "control" else sh[key])]
    return [float(x) for x in cell["items"][key]]


def _cell_draws(cell: Mapping[str, Any], outcome: str) -> list[list[float]]:
    """A cell's random population: every draw's outcomes (one draw, ``control``, in a cell
    stored before the matrix drew a population)."""
    if outcome == "share":
        return [[float(x) for x in d] for d in cell["items"]["share"]["controls"]]
    draws = cell["items"].get("controls") or [cell["items"]["control"]]
    return [[float(x) for x in d] for d in draws]


def pooled_draws(held: Sequence[Mapping[str, Any]], outcome: str) -> list[list[float]]:
    """The held-out cells' populations pooled: draw i is every cell's draw i, concatenated in
    the order of the cells' items (the population of the pooled gain); as many draws as the
    smallest cell has."""
    per = [_cell_draws(c, outcome) for c in held]
    m = min(len(d) for d in per)
    return [[x for d in per for x in d[i]] for i in range(m)]


def rows_transfer(claim: Claim, data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Independence in two readings: the pooled held-out gain (every ``all_but_R`` cell's
    items on R, clustered by subject (the stored ``subjects``; the fact id where no subject
    is shared across relations), against its population of random draws, by the
    effect's rank among them) and the retained share (the held-out gain over the in-pool
    ``all`` gain on the same items, > 0.5); both in the gold share where every cell has
    one (:func:`cell_outcome`)."""
    held = [c for c in data["cells"] if str(c.get("row", "")).startswith("all_but_")
            and c.get("items")]  # fmt: skip
    if not held:
        why = ("the transfer matrix has no held-out (all_but_R) cell with per-item outcomes "
               "(too few relations or languages)")  # fmt: skip
        return [make_row(claim, None, untestable=why, extra={"variant": v})
                for v in ("held-out gain", "retained share")]  # fmt: skip
    key = cell_outcome([c for c in data["cells"] if c.get("items")])
    name = {"share": "gold share", "correct": "accuracy"}[key]
    fact_ids = [i for c in held for i in c["items"]["ids"]]
    ids = item_clusters(fact_ids, data.get("subjects"))
    by = clustered_by(fact_ids, ids).replace("by fact", "by fact id")
    orig = [x for c in held for x in _items(c, "orig", key)]
    new = [x for c in held for x in _items(c, "steered", key)]
    draws = pooled_draws(held, key)
    per = "; ".join(f"{c['col']}: {paired_test(_items(c, 'orig', key), _items(c, 'steered', key)).estimate.format(2)}"
                    for c in held)  # fmt: skip
    vs = rank_population_test(new, draws, ids, base=orig, direction=claim.direction)
    extra = {"variant": "held-out gain", "outcome": name}
    row1 = make_row(claim, paired_test(orig, new, ids), population_gain_test(orig, draws, ids),
                    vs_control=vs, extra=extra,
                    details=f"outcome: {name}; {len(held)} held-out cells pooled, "
                    f"{by} ({per}); control: a population of {len(draws)} norm-matched "
                    "random vectors per cell at the row's chosen place, judged by the "
                    "effect's rank among them")  # fmt: skip
    return [row1, _retained_row(claim, data["cells"], held, key, data.get("subjects"))]


def _retained_row(claim: Claim, cells: Sequence[Mapping[str, Any]],
                  held: Sequence[Mapping[str, Any]], key: str = "correct",
                  subjects: Mapping[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    share = replace(claim, threshold=RETAINED_SHARE)
    extra = {"variant": "retained share", "outcome": "gold share" if key == "share" else "accuracy"}
    num, den, ids, per = [], [], [], []
    for c in held:
        full = next((a for a in cells if a.get("row") == "all" and a.get("col") == c["col"]
                     and a.get("items")), None)  # fmt: skip
        if full is None or full["items"]["ids"] != c["items"]["ids"]:
            continue
        o = np.array(_items(c, "orig", key))
        dn, dd = np.array(_items(c, "steered", key)) - o, np.array(_items(full, "steered", key)) - o
        num += list(dn)
        den += list(dd)
        ids += c["items"]["ids"]
        r = ratio_test(dn, dd, item_clusters(c["items"]["ids"], subjects))
        per.append(
            f"{c['col']}: {r.estimate.format(2) if r.estimate.estimate is not None else 'n/a'}"
        )
    if not num:
        why = "no held-out column also has an in-pool (all) cell on the same items"
        return make_row(share, None, untestable=why, extra=extra)
    cl = item_clusters(ids, subjects)
    t, gain_all, why = retained_test(num, den, cl)
    details = (f"share of the in-pool gain kept without R, pooled over {len(per)} columns "
               f"({'; '.join(per)}); in-pool gain {gain_all.estimate.format(3)}, p = "
               f"{gain_all.p:.3g}; rule: > {RETAINED_SHARE:g}{cluster_note(ids, cl)}")  # fmt: skip
    return make_row(share, t, untestable=why, details=details, extra=extra)


def retained_test(num: Sequence[float], den: Sequence[float], ids: Sequence[Any] | None
                  ) -> tuple[Test | None, Test, str | None]:  # fmt: skip
    """The retained-share reading as the card judges it: the ratio of sums ``sum(num) /
    sum(den)`` (held-out over in-pool gain, per item) against :data:`RETAINED_SHARE`, the
    in-pool gain's own test, and why the row is not testable (``None`` when it is): an
    in-pool gain not shown above 0 (interval above 0 and p < 0.05) leaves nothing to keep."""
    gain_all = paired_test([0.0] * len(den), den, ids)
    if not (gain_all.estimate.above(0.0) and gain_all.p is not None and gain_all.p < 0.05):
        why = ("the in-pool (all) gain on the held-out columns is not above 0: there is no gain "
               "to retain")  # fmt: skip
        return None, gain_all, why
    return ratio_test(num, den, ids, null=RETAINED_SHARE), gain_all, None


@dataclass(frozen=True)
class MatrixBudget(Budget):
    """The transfer matrix's settings
    (:class:`~mechlingo.analyses.recall.settings.MatrixSettings`; ``layer_fractions`` of the
    model's depth as its layers); a setting left out takes the settings class's default."""

    cells: str | None = None
    build_ids: int | None = None
    dev_ids: int | None = None
    test_ids: int | None = None
    screen_ids: int | None = None
    layer_fractions: tuple[float, ...] | None = None
    alphas: tuple[float, ...] | None = None
    top_k: int | None = None
    en_tolerance: float | None = None
    p_threshold: float | None = None
    seed: int | None = None
    layers: tuple[int, ...] | None = None
    controls: int | None = None

    #: Settings that a budget leaves out unless given (they are not in the budgets' hash).
    OPTIONAL: ClassVar[tuple[str, ...]] = ("top_k", "en_tolerance", "p_threshold", "seed",
                                            "layers", "controls")  # fmt: skip

    def __post_init__(self) -> None:
        check(self.cells in (None, "full", "diagonal"), "transfer.matrix.cells",
              "must be 'full' or 'diagonal'")  # fmt: skip
        for name in ("build_ids", "dev_ids", "test_ids", "screen_ids", "top_k", "controls"):
            v = getattr(self, name)
            check(v is None or v >= 1, f"transfer.matrix.{name}", "must be at least 1")
        check(self.layer_fractions is None or all(0 <= x <= 1 for x in self.layer_fractions),
              "transfer.matrix.layer_fractions", "must lie in [0, 1]")  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """The settings given (the optional ones only when set)."""
        out = super().to_dict()
        return {k: v for k, v in out.items() if not (k in self.OPTIONAL and v is None)}

    def settings(self, n_layers: int) -> MatrixSettings:
        """As :class:`~mechlingo.analyses.recall.settings.MatrixSettings` for a model of
        ``n_layers`` (``layer_fractions`` as layers, :func:`~mechlingo.core.sites.layers_at`;
        a setting left out takes the class's default)."""
        given = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                 if getattr(self, f.name) is not None and f.name != "layer_fractions"}  # fmt: skip
        if self.layer_fractions is not None:
            given["layers"] = tuple(layers_at(list(self.layer_fractions), n_layers))
        return MatrixSettings(**given)


@dataclass(frozen=True)
class TransferBudget(Budget):
    """The relations and languages of the transfer facts, ``limit`` ids per relation, the
    answers' ``max_new_tokens`` and the matrix's settings."""

    relations: tuple[str, ...]
    limit: int | None
    langs: tuple[str, ...]
    max_new_tokens: int
    matrix: MatrixBudget

    NESTED: ClassVar[Mapping[str, type[Budget]]] = {"matrix": MatrixBudget}

    def __post_init__(self) -> None:
        check(len(self.relations) > 0, "transfer.relations", "must not be empty")
        check(len(self.langs) > 0, "transfer.langs", "must not be empty")
        check(self.limit is None or self.limit >= 1, "transfer.limit", "must be at least 1")
        check(self.max_new_tokens >= 1, "transfer.max_new_tokens", "must be at least 1")

    def scope(self) -> FactScope:
        """The transfer facts: its relations and languages, ``limit`` ids per relation."""
        return FactScope(self.langs, self.relations, self.limit)


QUICK = TransferBudget(
    relations=("capital", "currency"), limit=24, langs=("en", "fr", "es"), max_new_tokens=6,
    matrix=MatrixBudget(cells="diagonal", build_ids=4, dev_ids=4, test_ids=4, screen_ids=2,
                        layer_fractions=(0.55,), alphas=(0.28, 0.6), controls=5),
)  # fmt: skip
FULL = TransferBudget(
    relations=("capital", "currency", "language"), limit=40, langs=("en", "fr", "es"),
    max_new_tokens=6,
    matrix=MatrixBudget(cells="diagonal", build_ids=12, dev_ids=8, test_ids=12, screen_ids=3,
                        layer_fractions=(0.35, 0.55), alphas=(0.28, 0.6), controls=20),
)  # fmt: skip


def _run(ctx: Context, by: str) -> dict[str, Any]:
    built = ctx.shared.setdefault("transfer_stats", {})
    return stage_transfer(
        ctx.model, ctx.lu_facts("transfer"), ctx.settings, by, ctx.progress, built
    )


def run_relation(ctx: Context) -> dict[str, Any]:
    """The transfer matrix by relation."""
    return _run(ctx, "relation")


def run_lang(ctx: Context) -> dict[str, Any]:
    """The transfer matrix by language (the relation matrix's build statistics reused)."""
    return _run(ctx, "lang")


def rows_relations(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Independence of relations."""
    return rows_transfer(C.INDEPENDENT_RELATIONS, data)


def rows_languages(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Independence of languages."""
    return rows_transfer(C.INDEPENDENT_LANGUAGES, data)


def report(rep: ReportLike, results: Mapping[str, Any]) -> None:
    """Both transfer matrices, one table row per cell."""
    heading(rep, "fig-transfer", "Transfer matrix (vectors built with / without R)")
    for name in ("transfer_relation", "transfer_lang"):
        data = results.get(name)
        if data is None or failed(rep, data, name):
            continue
        rows = []
        for c in data["cells"]:
            g = c.get("gain") or {}
            rows.append({"by": data["by"], "row": c.get("row"), "col": c.get("col"),
                         "n": c.get("n"), "gain": g.get("estimate"), "lo": g.get("lo"),
                         "hi": g.get("hi"), "p": c.get("p"),
                         "control gain": (c.get("control_gain") or {}).get("estimate"),
                         "control p": c.get("control_p")})  # fmt: skip
        rep.add_table(rows)


def matrix_item_conditions(by: str, m: MatrixBudget, rels: int, langs: int, *,
                           all_row_searched: bool = True) -> int:  # fmt: skip
    """The items times conditions one transfer matrix scores with ``rels`` relations and
    ``langs`` languages (English among them): each distinct row's dev search (the screen's
    ``screen_ids`` ids under no intervention and both vectors at every layer and scale, then
    ``dev_ids`` ids under no intervention, each vector's ``top_k`` finalists and their pairs)
    and each cell's test items (steered and each of the ``controls`` random draws, the
    unsteered items once per column).
    Rows equal in vectors and dev facts search once (with two relations ``all_but_A`` is
    ``only_B``); ``all_row_searched=False``: the ``all`` row's search came from the other
    matrix of the same run. One item-condition costs the metric's measured seconds per item
    (the quick card's measurement: docs/benchmarks.md, "Timings behind the card's cost
    model")."""
    top, grid = int(m.top_k or 1), len(m.layer_fractions or (0,)) * len(m.alphas or (0, 0))
    screen, dev, test = int(m.screen_ids or 0), int(m.dev_ids or 0), int(m.test_ids or 0)
    other = langs - 1  # the non-English languages

    def search(row_langs: int) -> int:
        return row_langs * (screen * (1 + 2 * grid) + dev * (1 + 2 * top + top * top))

    full = m.cells == "full"
    if by == "relation":
        singles = rels if rels == 2 else 2 * rels  # all_but_R and only_A rows
        searches = (all_row_searched + singles) * search(langs)
        cells = rels + rels + rels * (rels if full else 1)  # all, all_but_R, only_A
        per_cell = test * other
    else:
        searches = all_row_searched * search(langs) + other * search(langs - 1)
        cells = 2 * other
        per_cell = test * rels
    cols = rels if by == "relation" else other
    draws = int(m.controls or 1)
    return searches + (1 + draws) * cells * per_cell + cols * per_cell


def _cost(by: str) -> Any:
    def cost(settings: CardSettings, sizes: Mapping[str, Any], unit: Mapping[str, float]) -> float:
        """CPU seconds of one matrix (:func:`matrix_item_conditions` over the relations and
        languages of the data, else the budget's; the ``all`` row searched by the relation
        matrix): the build statistics are a few seconds and not counted."""
        t = settings.budget.transfer
        rels, langs = sizes.get("transfer_scope") or (len(t.relations), len(t.langs))
        n = matrix_item_conditions(by, t.matrix, int(rels), int(langs),
                                   all_row_searched=by == "relation")  # fmt: skip
        return n * scoring_seconds(settings, unit)

    return cost


STAGE_RELATION = Stage(
    name="transfer_relation",
    paper=LU,
    run=run_relation,
    rows=(rows_relations,),
    report=report,
    section="transfer",
    budget=TransferBudget,
    cost=_cost("relation"),
)
STAGE_LANG = Stage(
    name="transfer_lang",
    paper=LU,
    run=run_lang,
    rows=(rows_languages,),
    report=report,
    section="transfer",
    budget=TransferBudget,
    cost=_cost("lang"),
)
