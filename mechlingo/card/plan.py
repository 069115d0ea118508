"""The claims card's power planner: each primary row's power, simulated through its verdict.

For each primary row of a paper (:data:`PRIMARY`) :func:`plan_card` builds a
:class:`~mechlingo.card.power.Scenario` at the units the configured budget will have after
every cap (test facts per language x languages, evaluation documents x sentences, BOS
samples, languages, the random draws of its control), with the outcome's mean, spread and
intra-cluster correlation from the dev split where it gives them (else stated bounds), and
:func:`~mechlingo.card.power.simulate_power` runs that row's own tests and verdict at the
planned effect (:data:`EFFECTS`): the planned power is the rate of ``holds``, with its Monte
Carlo SE. :func:`~mechlingo.card.power.minimum_detectable` gives the effect that reaches 80%
at those units, and the clusters the planned effect needs follow from it (an MDE shrinks
as one over the square root of the clusters); :func:`annotate_rows` adds the plan and the achieved minimum detectable effect to the
card's rows and marks a row whose achieved MDE exceeds its planned effect.
``docs/replicate.md`` ("Planning a card") has the bounds, the method and a measured plan.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from mechlingo.card.claims import CLAIMS, claim_by_id
from mechlingo.card.claims import PRIMARY as CLAIMS_PRIMARY
from mechlingo.card.population import draws_needed
from mechlingo.card.power import POWER, Scenario, minimum_detectable, simulate_power
from mechlingo.card.rules import LU, SUNDAR

if TYPE_CHECKING:
    from mechlingo.card.stages import CardSettings

__all__ = ["EFFECTS", "PRIMARY", "Plan", "PlanRow", "annotate_rows", "dev_icc", "plan_card"]

#: The primary rows of each paper (one family each): the claims' pre-registered families.
PRIMARY: dict[str, tuple[str, ...]] = {p: CLAIMS_PRIMARY[p] for p in (LU, SUNDAR)}
#: ``{row: (effect, where it comes from)}``: the true effect each row is planned for, beyond
#: its threshold in the claim's direction, in the judged outcome's units (each primary
#: claim's own :class:`~mechlingo.card.claims.PlanFacts`).
EFFECTS: dict[str, tuple[float, str]] = {
    c.id: (c.plan.effect, c.plan.source) for c in CLAIMS if c.plan is not None
}
#: Stated bounds where no split measures a row's outcome before the run: the SD of one
#: unit, the intra-cluster correlation, the baseline (the claims' own).
BOUNDS: dict[str, dict[str, float]] = {
    c.id: dict(c.plan.bounds) for c in CLAIMS if c.plan is not None and c.plan.bounds
}
ALPHA = 0.05
#: The draws a population row of each paper's primary family needs to be decidable at
#: Holm's first step (:func:`~mechlingo.card.population.draws_needed`: 20 x the family).
MIN_DRAWS = {p: draws_needed(len(PRIMARY[p]), ALPHA) for p in PRIMARY}


def dev_icc(items: Sequence[Mapping[str, Any]], key: str = "correct") -> float:
    """The one-way ANOVA intra-class correlation of ``key`` across the languages of a fact
    (clusters = fact ids), clipped to [0, 1]; 0 with fewer than 2 clusters or no variance."""
    groups: dict[str, list[float]] = {}
    for r in items:
        if r.get(key) is not None:
            groups.setdefault(str(r["id"]), []).append(float(r[key]))
    gs = [np.asarray(v) for v in groups.values() if len(v) >= 1]
    n, k = sum(len(g) for g in gs), len(gs)
    if k < 2 or n <= k:
        return 0.0
    grand = np.concatenate(gs).mean()
    msb = sum(len(g) * (g.mean() - grand) ** 2 for g in gs) / (k - 1)
    msw = sum(((g - g.mean()) ** 2).sum() for g in gs) / (n - k)
    m0 = (n - sum(len(g) ** 2 for g in gs) / n) / (k - 1)
    den = msb + (m0 - 1) * msw
    return float(min(1.0, max(0.0, (msb - msw) / den))) if den > 0 else 0.0


@dataclass
class PlanRow:
    """One primary row's plan: the planned ``effect``; the ``available`` clusters (``unit``:
    facts, documents, BOS samples, languages, random draws) the budget's capped data has, of
    ``per`` items each; ``draws`` against ``draws_needed``; the simulated ``power`` at the
    planned effect with its Monte Carlo ``power_se`` over ``power_reps`` rows; ``mde``: the
    effect with 80% power at these units (``None``: none reaches it); ``needed``: the
    clusters the planned effect needs (``None``: no number does); the CPU seconds at the
    planned size; ``limit``/``fix`` when the row is planned below 80%; ``scenario``: what the
    simulation assumed."""

    paper: str
    id: str
    unit: str
    effect: float
    effect_source: str
    available: int
    per: int
    draws: int | None
    draws_needed: int | None
    power: float
    power_se: float
    power_reps: int
    mde: float | None
    needed: int | None
    cpu_seconds: float
    scenario: dict[str, Any] = field(default_factory=dict)
    limit: str | None = None
    fix: str | None = None

    @property
    def decidable(self) -> bool:
        """Whether the row is planned at 80% power or more."""
        return self.limit is None


@dataclass
class Plan:
    """The power plan of a card: its rows, the family levels, the inputs read, and the
    estimated CPU minutes of the card as configured (``card_minutes``)."""

    rows: list[PlanRow]
    alpha: dict[str, float]
    card_minutes: float
    inputs: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """JSON: rows (with ``decidable``), levels, inputs, and under ``seconds`` what was
        measured (the per-item CPU costs and the card's estimate: they vary from run to run)."""
        rows = [{**asdict(r), "decidable": r.decidable} for r in self.rows]
        measured = ("cost_seconds_per_item", "stage_seconds")
        inputs = {k: v for k, v in self.inputs.items() if k not in measured}
        seconds = {"card": round(60 * self.card_minutes, 1),
                   "per_item": self.inputs.get("cost_seconds_per_item", {}),
                   "stages": self.inputs.get("stage_seconds", {})}  # fmt: skip
        return {"rows": rows, "alpha": self.alpha, "power": POWER, "method": METHOD,
                "inputs": inputs, "seconds": seconds}  # fmt: skip

    def __str__(self) -> str:
        head = (f"{'row':<22} {'unit':<12} {'effect':>6} {'have':>9} {'draws':>7} "
                f"{'power (SE, reps)':>19} {'MDE':>6} {'need':>5} {'CPU min':>7}  decidable")  # fmt: skip
        lines = [f"power plan (simulated through each row's verdict; power {POWER:g}; levels "
                 + ", ".join(f"{p} {a:.4f}" for p, a in self.alpha.items()) + ")", head]  # fmt: skip
        for r in self.rows:
            draws = "" if r.draws_needed is None else f"{r.draws}/{r.draws_needed}"
            have = f"{r.available}x{r.per}" if r.per > 1 else str(r.available)
            pw = f"{r.power:.2f} ({r.power_se:.2f}, {r.power_reps})"
            lines.append(
                f"{r.id:<22} {r.unit:<12} {r.effect:>6.3g} {have:>9} {draws:>7} {pw:>19} "
                f"{_num(r.mde):>6} {'-' if r.needed is None else r.needed:>5} "
                f"{r.cpu_seconds / 60:>7.1f}  "
                + ("yes" if r.decidable else f"no: {r.limit}; pass {r.fix}")
            )
        per = self.inputs.get("stage_seconds") or {}
        if per:
            lines.append("estimated CPU minutes per stage: " + ", ".join(
                f"{n} {v / 60:.1f}" for n, v in per.items()))  # fmt: skip
        lines.append(f"estimated CPU time of this card as configured: {self.card_minutes:.1f} min")
        return "\n".join(lines)


#: How the plan's numbers are made (stored with the plan).
METHOD = ("power: the rate of 'holds' of the row's own tests and verdict on simulated data "
          "at the budget's capped units and the planned effect (Monte Carlo SE at most 0.02); "
          "mde: the effect reaching 80% by bisection on the same simulation; needed: the "
          "clusters at which that MDE shrinks to the planned effect (MDE ~ 1 / sqrt(clusters))")  # fmt: skip


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _lu_inputs(metric_data: Mapping[str, Any] | None, metric: str) -> dict[str, Any]:
    """Dev outcome mean, variance and ICC (non-English items) under the card's metric, the
    dev accuracy, and the lowest language's mean and variance."""
    items = [r for r in (metric_data or {}).get("items", {}).get(metric, []) if r["lang"] != "en"]
    key = "share" if metric == "rank" and items and items[0].get("share") is not None else "correct"
    vals = np.asarray([float(r[key]) for r in items]) if items else np.asarray([0.0])
    acc = float(np.mean([float(r["correct"]) for r in items])) if items else 0.0
    by: dict[str, list[float]] = {}
    for r in items:
        by.setdefault(r["lang"], []).append(float(r[key]))
    lows = {lg: float(np.mean(v)) for lg, v in by.items() if np.mean(v) > 0}
    low = min(lows, key=lambda lg: lows[lg]) if lows else None
    return {"outcome": "gold share" if key == "share" else "accuracy", "key": key,
            "mean": float(vals.mean()), "var": float(vals.var(ddof=1)) if len(vals) > 1 else 0.25,
            "icc": dev_icc(items, key), "accuracy": acc, "lowest": low,
            "lowest_mean": lows.get(low, 0.0) if low else 0.0,
            "lowest_var": float(np.var(by[low], ddof=1)) if low and len(by[low]) > 1 else 0.25,
            "n_items": len(items)}  # fmt: skip


def _planned(paper: str, sc: Scenario, cpu_per_cluster: float, fix_data: str,
             fix_draws: str) -> PlanRow:  # fmt: skip
    """A row's simulated plan at ``sc`` (its power, MDE and the clusters it needs)."""
    eff, src = EFFECTS[sc.row]
    pw = simulate_power(sc, eff)
    mde = minimum_detectable(sc)
    needed = None if mde is None else max(2, math.ceil(sc.g * (mde / eff) ** 2))
    need_draws = None if sc.draws is None else draws_needed(sc.k, ALPHA)
    row = PlanRow(paper, sc.row, sc.unit, eff, src, sc.g, sc.per, sc.draws, need_draws,
                  round(pw["power"], 4), round(pw["se"], 4), int(pw["reps"]),
                  None if mde is None else round(mde, 4), needed,
                  round((needed or sc.g) * cpu_per_cluster, 1), sc.to_json())  # fmt: skip
    if pw["power"] >= POWER:
        return row
    if sc.draw_limited:
        row.limit = (f"needs {need_draws} random draws for its rank p to reach the primary "
                     f"family's first Holm step, the budget has {sc.draws}")  # fmt: skip
        row.fix = fix_draws
    else:
        more = "" if needed is None else f"; {needed} {sc.unit} reach it"
        row.limit = f"power {pw['power']:.2f} at the {sc.g} {sc.unit} the budget reads{more}"
        row.fix = fix_data
    return row


def _design(rid: str) -> str:
    """The design of the primary claim ``rid``'s test (its :class:`~mechlingo.card.claims.PlanFacts`)."""
    plan = claim_by_id(rid).plan
    if plan is None:
        raise ValueError(f"the primary claim {rid!r} declares no planning facts (plan=...)")
    return plan.design


def _lu_rows(settings: CardSettings, inp: Mapping[str, Any], avail: Mapping[str, Any],
             cost: Mapping[str, float]) -> list[PlanRow]:  # fmt: skip
    b = settings.budget
    m = max(1, len([lg for lg in b.lu_langs if lg != "en"]))
    draws = len(b.repair.seeds)
    k = float(len(PRIMARY[LU]))
    s_item = cost.get(settings.metric, cost.get("rank", 0.0))
    g = int(avail.get("test_ids", 0))
    binary = inp["key"] == "correct"
    sd = math.sqrt(max(inp["var"], 1e-6))
    common = {"k": k, "binary": binary, "icc": inp["icc"], "base": inp["mean"], "sd": sd}
    p0 = min(max(inp["accuracy"], 0.0), 0.999)
    err_facts = max(2, round(g * (1 - p0**m)))
    err_per = max(1, round(m * (1 - p0) / max(1e-3, 1 - p0**m)))
    seeds = f'--settings \'{{"repair": {{"seeds": [0, ..., {MIN_DRAWS[LU] - 1}]}}}}\''
    facts = (
        f"more test facts: --facts with more facts per language, or --settings "
        f'\'{{"repair": {{"test_per_lang": N}}}}\' (now {b.repair.test_per_lang})'
    )
    # the vectors' conditions, a random population per condition (task, diff, both: each of
    # ``draws`` vectors) and the population matched to dev's choice, scored in one call
    conds = 4 + 3 * draws + 3
    out = []
    for rid in PRIMARY[LU]:
        design = _design(rid)
        if design == "english_first":
            sc = Scenario(rid, "share", "facts", max(2, g), m, None, k, True, 0.5, icc=inp["icc"])
            per_cluster = m * s_item
        elif design == "failure_share":
            sc = Scenario(rid, "share", "facts", err_facts, err_per, None, k, True, 0.5,
                          icc=inp["icc"])  # fmt: skip
            per_cluster = m * s_item * g / err_facts
        elif design == "relative_gain":
            sd_low = math.sqrt(max(inp["lowest_var"], 1e-6))
            sc = Scenario(rid, "relative", "facts", max(2, g), 1, draws,
                          **{**common, "base": inp["lowest_mean"], "sd": sd_low, "icc": 0.0})  # fmt: skip
            per_cluster = conds * s_item
        elif design == "cell_population":
            mx = b.transfer.matrix
            held = int(mx.test_ids or 0) * len(b.transfer.relations)
            cell_draws = int(mx.controls or 1)
            sc = Scenario(rid, "population", "facts", max(2, held), 1, cell_draws,
                          **{**common, "icc": 0.0})  # fmt: skip
            out.append(_planned(LU, sc, (2 + cell_draws) * s_item, facts,
                                "more random draws per transfer cell: --settings "
                                '\'{"transfer": {"matrix": {"controls": N}}}\''))  # fmt: skip
            continue
        else:
            sc = Scenario(rid, "population", "facts", max(2, g), m, draws, **common)
            per_cluster = m * conds * s_item
        out.append(_planned(LU, sc, per_cluster, facts, seeds))
    return out


def _sundar_rows(settings: CardSettings, avail: Mapping[str, Any],
                 cost: Mapping[str, float]) -> list[PlanRow]:  # fmt: skip
    e = settings.budget.experts
    draws = int(e.random_sets)
    k = float(len(PRIMARY[SUNDAR]))
    n_langs = int(avail.get("langs", 12))
    docs = int(avail.get("eval_docs", 0))
    per_doc = max(1, int(avail.get("eval_sentences", 0)) // max(1, docs)) if docs else 1
    s_sent = cost.get("embed", 0.0) * n_langs
    sets = f'--settings \'{{"experts": {{"random_sets": {MIN_DRAWS[SUNDAR]}}}}}\''
    more_docs = ("--parallel with more documents in the evaluation part, and --settings "
                 f'\'{{"experts": {{"n_eval": N}}}}\' (now {e.n_eval})')  # fmt: skip
    out = []
    for rid in PRIMARY[SUNDAR]:
        b, design = BOUNDS.get(rid, {}), _design(rid)
        if design == "draw_rank":
            sc = Scenario(rid, "rank", "draws", max(1, draws), 1, draws, k, False, sd=b["sd"])
            secs, fix = s_sent, sets
        elif design == "language_overlap":
            sc = Scenario(rid, "overlap", "languages", n_langs, 1, None, k, False, sd=b["sd"])
            secs, fix = s_sent, "--parallel with more languages"
        elif design == "bos_population":
            sc = Scenario(rid, "population", "BOS samples", int(e.samples), 1, draws, k, True,
                          b["base"], clustered=False)  # fmt: skip
            secs, fix = s_sent * (2 + draws), '--settings \'{"experts": {"samples": N}}\''
        else:
            sc = Scenario(rid, "population", "documents", max(2, docs), per_doc, draws, k, False,
                          b["base"], b["sd"], b["icc"])  # fmt: skip
            secs, fix = per_doc * s_sent * (2 + draws), more_docs
        out.append(_planned(SUNDAR, sc, secs, fix, sets))
    return out


def plan_card(
    settings: CardSettings,
    papers: Sequence[str],
    metric_data: Mapping[str, Any] | None,
    available: Mapping[str, Any],
    cost: Mapping[str, float] | None = None,
    stage_seconds: Mapping[str, float] | None = None,
) -> Plan:
    """The :class:`Plan` of a card with ``settings`` on ``papers``: ``metric_data`` is the
    metric stage's result (dev items and per-item CPU seconds), ``available`` the capped
    data's sizes (``test_ids``: test facts per language after the budget's cap, ``eval_docs``
    and ``eval_sentences`` the evaluation part's, ``langs``), ``cost`` more per-item CPU
    seconds (``embed``: one sentence in one language through the model), ``stage_seconds``
    each stage's estimated CPU seconds (:func:`mechlingo.card.stages.estimate_seconds`):
    their sum is the card's estimate."""
    cost = {**dict((metric_data or {}).get("seconds_per_item", {})), **dict(cost or {})}
    alpha = {p: ALPHA / len(PRIMARY[p]) for p in papers if p in PRIMARY}
    rows: list[PlanRow] = []
    inputs: dict[str, Any] = {"cost_seconds_per_item": cost, "available": dict(available),
                              "stage_seconds": dict(stage_seconds or {})}  # fmt: skip
    if LU in papers:
        inp = _lu_inputs(metric_data, settings.metric)
        inputs["lu_dev"] = inp
        rows += _lu_rows(settings, inp, available, cost)
    if SUNDAR in papers:
        inputs["bounds"] = BOUNDS
        rows += _sundar_rows(settings, available, cost)
    return Plan(rows, alpha, sum((stage_seconds or {}).values()) / 60, inputs)


def annotate_rows(rows: list[dict[str, Any]], plan: Plan) -> list[dict[str, Any]]:
    """Each primary row of a finished card gets its plan (``plan``: planned power, its SE
    and reps, the planned effect and MDE), its achieved minimum detectable effect
    (``mde_achieved``: from the row's achieved SE, t on its df at its adjusted level, the
    verdict's own ``mde``; ``None`` when its random draws cannot reach the adjusted level,
    whatever the effect) and ``underpowered``: a sentence when that MDE exceeds the planned
    effect (or no effect is detectable), else ``None`` (the card marks such a row).
    Returns ``rows`` (changed in place)."""
    by = {(r.paper, r.id): r for r in plan.rows}
    for row in rows:
        pr = by.get((row.get("paper", ""), row.get("id", "")))
        if pr is None or row.get("family") != "primary":
            continue
        row["plan"] = {"power": pr.power, "power_se": pr.power_se, "reps": pr.power_reps,
                       "effect": pr.effect, "mde": pr.mde, "needed": pr.needed}  # fmt: skip
        mde, how = _achieved_mde(row, pr)
        row["mde_achieved"], row["mde_how"] = mde, how
        if row.get("value") is None and mde is None and how == "no test":
            row["underpowered"] = None
        elif mde is None or mde > pr.effect:
            row["underpowered"] = ("no effect is detectable with 80% power: " + how
                                   if mde is None else f"achieved MDE {mde:.3g} > planned "
                                   f"effect {pr.effect:.3g}")  # fmt: skip
        else:
            row["underpowered"] = None
    return rows


def _achieved_mde(row: Mapping[str, Any], pr: PlanRow) -> tuple[float | None, str]:
    """The row's achieved MDE and how it was found."""
    vs = row.get("vs_control") or {}
    x = vs.get("extra") or {}
    k = float((row.get("adjustment") or {}).get("multiplier") or 1.0)
    if x.get("decides") == "rank" and x.get("draws") is not None:
        m = int(x["draws"])
        if m < draws_needed(k, ALPHA):
            return None, (f"its rank p among {m} random draws is at least 1/{m + 1}, above the "
                          f"adjusted level {ALPHA / k:.3g}")  # fmt: skip
    if row.get("value") is None:
        return None, "no test"
    mde = row.get("mde")
    if mde is None or not math.isfinite(float(mde)):
        return None, "its achieved SE gives no minimum detectable effect (too few clusters)"
    return round(float(mde), 4), "from the achieved SE (t on its df)"
