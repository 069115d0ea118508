"""The external stage: the repair stage's vectors and the configuration dev chose on the
card's facts, applied unchanged to a benchmark's facts (``--external``) and scored by the
benchmark's own metric; its rows (each vector's gain in the gold share, or 0/1 without
candidate scores, against its own condition's random population)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from mechlingo.analyses.recall import dev_grid, steer_eval, steering
from mechlingo.analyses.recall.steering import SteeringConfig
from mechlingo.card import claims as C
from mechlingo.card.claims import LU
from mechlingo.card.clustered_tests import paired_test
from mechlingo.card.population import population_gain_test, rank_population_test
from mechlingo.card.repair_items import (
    item_records,
)
from mechlingo.card.rules import make_row
from mechlingo.card.stages.base import (
    Budget,
    Context,
    ReportLike,
    Stage,
    check,
    data_section,
    scoring_seconds,
)
from mechlingo.card.stages.data import external_facts, repair_split
from mechlingo.card.stages.repair import logprob_extra, logprob_gain, paired_values, repair_settings
from mechlingo.core.errors import InputError
from mechlingo.core.types import Model
from mechlingo.data import Fact

if TYPE_CHECKING:
    from mechlingo.card.stages import CardSettings


def choice_from(sweep: Mapping[str, Any]) -> dev_grid.Choice:
    """The dev choice stored in the repair stage's ``sweep``."""
    pair = None if sweep.get("pair") is None else SteeringConfig(**sweep["pair"])
    return dev_grid.Choice(SteeringConfig(**sweep["config"]), sweep["selected"],
                           sweep["dev_effect"], sweep["dev_test"], sweep["dev_score"], pair,
                           sweep.get("best_single"))  # fmt: skip


def stage_external(
    model: Model,
    bundled: list[Fact],
    external: list[Fact],
    metric: str,
    repair_data: Mapping[str, Any],
    settings: CardSettings,
    progress: bool,
) -> dict[str, Any]:
    """Rebuild the repair vectors on the bundled build split (the same facts and settings give
    the same vectors), take the configuration dev chose, and score ``external`` under every
    condition with the benchmark's ``metric``."""
    r = settings.budget.repair
    build, _, _ = repair_split(bundled, settings)
    building, _, scoring = repair_settings(settings, int(model.cfg.n_layers), progress)
    vectors = steering.build_steering_vectors(model, build, building, progress=progress)
    facts = external_facts(external, settings)
    pool = None
    if metric == "klar":  # KLAR's demonstrations: the benchmark's facts that are not scored
        scored = {f.id for f in facts}
        pool = [f for f in external if f.id not in scored]
        if not pool:
            raise InputError(
                "klar needs demonstrations that are not scored: the benchmark "
                "has no facts beyond external.per_lang ids per language",
                fix="lower external.per_lang in --settings",
            )
    res = steer_eval.evaluate_test(
        model,
        vectors,
        choice_from(repair_data["sweep"]),
        facts,
        lowest_language=None,
        pool=pool,
        options=steer_eval.SteerEvalOptions(
            seeds=r.seeds, scoring=replace(scoring, metric=metric), controls="each"
        ),
    )
    return {
        "metric": metric,
        "populations": steer_eval.population_names(
            res.choice.selected, "both_pair" in res.results, "each"
        ),
        "items": item_records(res.results),
        "config": repair_data["sweep"]["config"],
        "n_facts": len(facts),
    }


def external_outcome(items: Mapping[str, list[dict]]) -> str:
    """The external rows' judged outcome, as the repair rows': ``"share"`` (the gold answer's
    probability share among the candidates) where every item of every condition has one (a
    ranking metric: BMLAMA), else ``"correct"`` (0/1 under the benchmark's metric: KLAR)."""
    ok = all(r.get("share") is not None for v in items.values() for r in v)
    return "share" if ok and any(items.values()) else "correct"


def _population(data: Mapping[str, Any], cond: str) -> list[str]:
    """The conditions of ``cond``'s random population, in seed order (``random_s<seed>`` in a
    result stored before populations were drawn per condition)."""
    prefix = (data.get("populations") or {}).get(cond, "random_s")
    pat = re.compile(re.escape(prefix) + r"(\d+)$")
    found = [(int(m.group(1)), c) for c in data["items"] if (m := pat.match(c))]
    return [c for _, c in sorted(found)]


def rows_external(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each vector's gain on the benchmark in its judged outcome (:func:`external_outcome`),
    against its own condition's random population (its rank among the draws); clustered by
    fact id: a benchmark's ids number its rows within a relation (``P17/0``), so the key after
    the relation names no subject and facts of two relations sharing it are unrelated."""
    if "untestable" in data:
        return [make_row(c, None, untestable=data["untestable"])
                for c in (C.EXTERNAL_TASK, C.EXTERNAL_DIFF, C.EXTERNAL_BOTH)]  # fmt: skip
    items = data["items"]
    key = external_outcome(items)
    name = {"share": "gold share", "correct": "accuracy"}[key]
    rows = []
    for claim, cond in ((C.EXTERNAL_TASK, "task"), (C.EXTERNAL_DIFF, "diff"),
                        (C.EXTERNAL_BOTH, "both")):  # fmt: skip
        base, new, ids = paired_values(items, "orig", cond, key)
        pop = _population(data, cond)
        runs = [paired_values(items, "orig", s, key) for s in pop]
        if not base or not runs:
            rows.append(make_row(claim, None, untestable="no benchmark items scored"))
            continue
        draws = [x[1] for x in runs]
        rows.append(make_row(
            claim, paired_test(base, new, ids), control=population_gain_test(base, draws, ids),
            vs_control=rank_population_test(new, draws, ids, base=base, direction=claim.direction),
            details=f"outcome: {name}; {len(set(ids))} benchmark facts, metric {data['metric']}; "
            f"vectors and configuration from the card's facts; control: {len(pop)} random "
            f"vectors at the layer and scale of '{cond}'",
            extra={"outcome": name, **logprob_extra(logprob_gain(items, cond, subjects={}))},
        ))  # fmt: skip
    return rows


def _external(report: ReportLike, data: Mapping[str, Any]) -> None:
    acc = []
    for cond, items in data["items"].items():
        ne = [x["correct"] for x in items if x["lang"] != "en"]
        acc.append({"condition": cond, "non-English accuracy": round(float(np.mean(ne)), 3)
                    if ne else None, "items": len(ne)})  # fmt: skip
    c = data.get("config") or {}
    report.add_text(f"{data.get('n_facts')} benchmark facts scored by {data['metric']}, with the "
                    f"configuration chosen on the card's facts (task layer {c.get('task_layer')} "
                    f"x {c.get('task_alpha')}, diff layer {c.get('diff_layer')} x "
                    f"{c.get('diff_alpha')}).")  # fmt: skip
    report.add_table(acc)


@dataclass(frozen=True)
class ExternalBudget(Budget):
    """``per_lang``: benchmark ids per language scored, shared by the benchmark's relations,
    in at most as many languages as ``lu_langs``
    (:func:`~mechlingo.card.stages.data.external_facts`)."""

    per_lang: int | None

    def __post_init__(self) -> None:
        check(self.per_lang is None or self.per_lang >= 1, "external.per_lang",
              "must be at least 1")  # fmt: skip


QUICK = ExternalBudget(per_lang=24)
FULL = ExternalBudget(per_lang=40)


def run(ctx: Context) -> dict[str, Any]:
    """The external stage's result (``{"untestable": ...}`` without a benchmark)."""
    if ctx.external is None:
        return {"untestable": "no benchmark given (--external DIR with a BMLAMA or KLAR "
                "folder adds these rows)"}  # fmt: skip
    if not ctx.checkpoints.done("repair"):
        raise InputError("the repair stage did not finish: its choice is what transfers")
    return stage_external(ctx.model, ctx.lu_facts("repair"), list(ctx.external[0]),
                          ctx.external[1], ctx.checkpoints.load("repair"), ctx.settings, ctx.progress)  # fmt: skip


#: Accuracy per condition on the benchmark.
report = data_section(
    "external",
    "fig-external",
    "External transfer: the bundled data's vectors on a benchmark",
    _external,
)


def cost(settings: CardSettings, sizes: Mapping[str, Any], unit: Mapping[str, float]) -> float:
    """CPU seconds: the benchmark's items (``sizes["external_items"]``, none without a
    benchmark) under orig, task, diff and both and each draw of the three random populations
    (``repair.seeds`` each), at the repair stage's per-item cost."""
    conds = 4 + 3 * len(settings.budget.repair.seeds)
    return conds * int(sizes.get("external_items", 0)) * scoring_seconds(settings, unit)


STAGE = Stage(
    name="external",
    paper=LU,
    needs=("repair",),
    run=run,
    rows=(rows_external,),
    report=report,
    section="external",
    budget=ExternalBudget,
    cost=cost,
)
