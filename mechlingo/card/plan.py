"""The claims card's power planner: what each primary row needs to be decided, before any
test item is scored.

For each primary row of a paper (:data:`PRIMARY`) :func:`plan_card` takes the effect to detect
(:data:`EFFECTS`: the paper's, or a stated smallest effect of interest), the family-wise level
and 80% power, and a standard deviation per unit (from the dev split where it exists, else a
stated bound), and gives the units needed (:func:`units_needed`, with the design effect of
:func:`dev_icc`), the random draws a population row needs (:data:`MIN_DRAWS`) and the CPU
time; a :class:`PlanRow` the data cannot decide names its limit and what to pass.
``docs/replicate.md`` ("Planning a card") has the bounds, the formula and a measured plan.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from mechlingo.card.claims import LOWEST_LANGUAGE, SESOI_GAIN
from mechlingo.card.claims import PRIMARY as CLAIMS_PRIMARY
from mechlingo.card.population import draws_needed
from mechlingo.card.rules import LU, SUNDAR

__all__ = ["EFFECTS", "PRIMARY", "Plan", "PlanRow", "dev_icc", "plan_card", "units_needed"]

#: The primary rows of each paper (one family each): the claims' pre-registered families.
PRIMARY: dict[str, tuple[str, ...]] = {p: CLAIMS_PRIMARY[p] for p in (LU, SUNDAR)}
#: The true relative gain the planner plans ``lowest_language`` for: twice the paper's
#: threshold. The verdict needs the interval above +35%, so a true gain of +35% is found
#: with probability alpha, never with 80% power; the test's effect is this minus 0.35.
LOWEST_PLANNED = 2 * LOWEST_LANGUAGE.threshold
#: ``{row: (effect, where it comes from)}``; ``lowest_language``'s is relative (x baseline).
EFFECTS: dict[str, tuple[float, str]] = {
    "latent_english": (0.15, "smallest effect of interest: English first in 65% (null 50%)"),
    "recall_failures": (0.15, "smallest effect of interest: 65% of errors (null 50%)"),
    "task_vector": (SESOI_GAIN, "smallest effect of interest: +0.05 in the gold share"),
    "diff_vector": (SESOI_GAIN, "smallest effect of interest: +0.05 in the gold share"),
    "lowest_language": (
        LOWEST_PLANNED - LOWEST_LANGUAGE.threshold,
        "a true gain of +70% relative (twice the paper's threshold) against the threshold +35%",
    ),
    "independent_relations": (SESOI_GAIN, "smallest effect of interest: +0.05 held out"),
    "independent_languages": (SESOI_GAIN, "smallest effect of interest: +0.05 held out"),
    "retrieval_gain_max": (0.5, "standardised: d = 0.5 (a maximum over pairs: no closed form)"),
    "experts_exist": (0.10, "smallest effect of interest: AUROC 0.10 above random neurons"),
    "clamp_steers": (0.10, "smallest effect of interest: +0.10 target-language rate"),
    "clamp_closer": (0.5, "standardised: paired d = 0.5 (no dev variance before the clamp)"),
    "retrieval_improves": (0.5, "standardised: paired d = 0.5 (no dev variance before the clamp)"),
    "random_neurons": (0.5, "equivalence margin as paired d = 0.5"),
    "experts_disjoint": (0.05, "smallest effect of interest: overlap 0.05 above chance k/N"),
}
#: Rows judged against a random population by the effect's rank among the draws.
POPULATION_ROWS = ("task_vector", "diff_vector", "lowest_language", "independent_relations",
                   "independent_languages", "experts_exist", "clamp_steers", "clamp_closer",
                   "retrieval_improves", "retrieval_gain_max")  # fmt: skip
ALPHA = 0.05
#: The draws a population row of each paper's primary family needs to be decidable at
#: Holm's first step (:func:`~mechlingo.card.population.draws_needed`: 20 x the family).
MIN_DRAWS = {p: draws_needed(len(PRIMARY[p]), ALPHA) for p in PRIMARY}
POWER = 0.8


def units_needed(effect: float, sd: float, alpha: float, design_effect: float = 1.0,
                 per_cluster: float = 1.0) -> int:  # fmt: skip
    """Units (items) for a two-sided t test at ``alpha`` with :data:`POWER` to detect
    ``effect`` when one unit's outcome has standard deviation ``sd``, times the design
    effect: the quantiles of Student's t on G - 1 df, as the verdict's CR2 intervals use, G
    the clusters (``per_cluster`` units each); at least 2."""
    from scipy import stats as sps

    if effect <= 0:
        return 10**9

    def need(df: float | None) -> int:
        q = (sps.norm.ppf(1 - alpha / 2) + sps.norm.ppf(POWER) if df is None
             else sps.t.ppf(1 - alpha / 2, df) + sps.t.ppf(POWER, df))  # fmt: skip
        return max(2, math.ceil((float(q) * sd / effect) ** 2 * design_effect))

    n = need(None)  # the normal approximation: a lower bound; t's quantiles only add
    for _ in range(1000):  # the smallest n that t on its own clusters' df accepts
        more = need(max(1.0, math.ceil(n / per_cluster) - 1))
        if more <= n:
            break
        n = more
    return n


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
    """One primary row's plan: ``needed`` units (``unit``: facts, documents, BOS samples or
    languages) against ``available``, ``draws_needed`` against ``draws``, the CPU seconds at
    the needed size, and ``limit``/``fix`` when the data given cannot decide it."""

    paper: str
    id: str
    unit: str
    effect: float
    effect_source: str
    sd: float
    design_effect: float
    needed: int
    available: int
    draws_needed: int | None
    draws: int | None
    cpu_seconds: float
    limit: str | None = None
    fix: str | None = None

    @property
    def decidable(self) -> bool:
        """Whether the data and draws given reach the planned power."""
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
        measured (the per-item costs and the card's estimate: they vary from run to run)."""
        rows = [{**asdict(r), "decidable": r.decidable} for r in self.rows]
        measured = ("cost_seconds_per_item", "stage_seconds")
        inputs = {k: v for k, v in self.inputs.items() if k not in measured}
        seconds = {"card": round(60 * self.card_minutes, 1),
                   "per_item": self.inputs.get("cost_seconds_per_item", {}),
                   "stages": self.inputs.get("stage_seconds", {})}  # fmt: skip
        return {"rows": rows, "alpha": self.alpha, "power": POWER, "inputs": inputs,
                "seconds": seconds}  # fmt: skip

    def __str__(self) -> str:
        head = (f"{'row':<20} {'unit':<10} {'effect':>7} {'sd':>6} {'deff':>5} {'need':>6} "
                f"{'have':>6} {'draws':>9} {'CPU min':>8}  decidable")  # fmt: skip
        lines = [f"power plan (power {POWER:g}; levels " + ", ".join(
            f"{p} {a:.4f}" for p, a in self.alpha.items()) + ")", head]  # fmt: skip
        for r in self.rows:
            draws = "" if r.draws_needed is None else f"{r.draws}/{r.draws_needed}"
            lines.append(
                f"{r.id:<20} {r.unit:<10} {r.effect:>7.3g} {r.sd:>6.3f} {r.design_effect:>5.2f} "
                f"{r.needed:>6} {r.available:>6} {draws:>9} {r.cpu_seconds / 60:>8.1f}  "
                + ("yes" if r.decidable else f"no: {r.limit}; pass {r.fix}")
            )
        per = self.inputs.get("stage_seconds") or {}
        if per:
            lines.append("estimated CPU minutes per stage: " + ", ".join(
                f"{n} {v / 60:.1f}" for n, v in per.items()))  # fmt: skip
        lines.append(f"estimated CPU time of this card as configured: {self.card_minutes:.1f} min")
        return "\n".join(lines)


def _lu_inputs(metric_data: Mapping[str, Any] | None, metric: str) -> dict[str, Any]:
    """Dev outcome mean, variance and ICC (non-English items) under the card's metric."""
    items = [r for r in (metric_data or {}).get("items", {}).get(metric, []) if r["lang"] != "en"]
    key = "share" if metric == "rank" and items and items[0].get("share") is not None else "correct"
    vals = np.asarray([float(r[key]) for r in items]) if items else np.asarray([0.0])
    by: dict[str, list[float]] = {}
    for r in items:
        by.setdefault(r["lang"], []).append(float(r[key]))
    lows = {lg: float(np.mean(v)) for lg, v in by.items() if np.mean(v) > 0}
    low = min(lows, key=lambda lg: lows[lg]) if lows else None
    return {"outcome": "gold share" if key == "share" else "accuracy", "key": key,
            "mean": float(vals.mean()), "var": float(vals.var(ddof=1)) if len(vals) > 1 else 0.25,
            "icc": dev_icc(items, key), "lowest": low,
            "lowest_mean": lows.get(low, 0.0) if low else 0.0,
            "lowest_var": float(np.var(by[low], ddof=1)) if low and len(by[low]) > 1 else 0.25,
            "n_items": len(items)}  # fmt: skip


def _lu_rows(cfg: Mapping[str, Any], inp: Mapping[str, Any], avail: Mapping[str, Any],
             cost: Mapping[str, float], alpha: float) -> list[PlanRow]:  # fmt: skip
    m = max(1, len([lg for lg in cfg["lu_langs"] if lg != "en"]))
    deff = 1 + (m - 1) * inp["icc"]
    draws = len(cfg["repair"]["seeds"])
    need_draws = MIN_DRAWS[LU]
    conds = 4 + draws
    s_item = cost.get(str(cfg.get("metric")), cost.get("rank", 0.0))
    test_ids = int(avail.get("test_ids", 0))
    out = []
    p0 = inp["mean"]
    for rid in PRIMARY[LU]:
        eff, src = EFFECTS[rid]
        if rid in ("latent_english", "recall_failures"):
            sd, share = 0.5, (1.0 if rid == "latent_english" else max(1e-3, 1 - p0))
            items = units_needed(eff, sd, alpha, deff, m) / share
            needed, per, n_conds = math.ceil(items / m), m, 1
        elif rid in ("task_vector", "diff_vector", "independent_relations",
                     "independent_languages"):  # fmt: skip
            sd = _paired_sd(inp, p0, eff)
            needed, per, n_conds = math.ceil(units_needed(eff, sd, alpha, deff, m) / m), m, conds
        else:
            base = inp["lowest_mean"]
            eff = eff * base
            sd = _paired_sd({**inp, "var": inp["lowest_var"]}, base, LOWEST_PLANNED * base)
            needed, per, n_conds = units_needed(eff, sd, alpha), 1, conds
        row = PlanRow(LU, rid, "facts", eff, src, sd, deff if per > 1 else 1.0, needed, test_ids,
                      need_draws if rid in POPULATION_ROWS else None,
                      draws if rid in POPULATION_ROWS else None,
                      needed * per * n_conds * s_item)  # fmt: skip
        if rid.startswith("independent_"):
            _transfer_limits(row, cfg)
        else:
            _limits(row, f"--facts with at least {needed} test facts per language (about "
                    f"{math.ceil(needed / 0.4)} per relation and language before the split)",
                    f'--settings \'{{"repair": {{"seeds": [0, ..., {need_draws - 1}]}}}}\'')  # fmt: skip
        out.append(row)
    return out


def _transfer_limits(row: PlanRow, cfg: Mapping[str, Any]) -> None:
    """An independence row: its facts are the transfer matrix's held-out test ids (about
    ``test_ids`` per relation), and its control is one random vector per cell, a population
    of one draw whose rank p (0.5) no budget setting can lower."""
    t = cfg.get("transfer") or {}
    m = t.get("matrix") or {}
    row.available = int(m.get("test_ids", 0)) * len(t.get("relations") or ())
    row.draws = 1
    row.limit = ("its control is one random vector per transfer cell: the rank p is at "
                 "least 0.5")  # fmt: skip
    row.fix = "a transfer matrix with a population of random vectors per cell (no budget has it)"


def _paired_sd(inp: Mapping[str, Any], p0: float, eff: float) -> float:
    """A paired difference's SD bound: ``sqrt(2 var)`` of a continuous outcome (correlation
    >= 0), ``sqrt(p0 (1 - p0) + p1 (1 - p1))`` of a 0/1 one."""
    if inp["key"] == "share":
        return math.sqrt(2 * max(inp["var"], 1e-6))
    p1 = min(1.0, p0 + eff)
    return math.sqrt(max(p0 * (1 - p0) + p1 * (1 - p1), 1e-6))


def _limits(row: PlanRow, fix_data: str, fix_draws: str) -> None:
    if row.available < row.needed:
        row.limit, row.fix = (f"needs {row.needed} {row.unit}, the data has {row.available}",
                              fix_data)  # fmt: skip
    elif row.draws_needed is not None and (row.draws or 0) < row.draws_needed:
        row.limit = (f"needs {row.draws_needed} random draws for its rank p to reach the "
                     f"primary family's first Holm step, the budget has {row.draws}")  # fmt: skip
        row.fix = fix_draws


def _sundar_rows(cfg: Mapping[str, Any], avail: Mapping[str, Any], cost: Mapping[str, float],
                 alpha: float) -> list[PlanRow]:  # fmt: skip
    e = cfg["experts"]
    draws = int(e.get("random_sets", 1))
    need_draws = MIN_DRAWS[SUNDAR]
    n_langs = int(avail.get("langs", 12))
    docs = int(avail.get("eval_docs", 0))
    per_doc = int(e.get("eval_per_doc") or 1)
    s_sent = cost.get("embed", 0.0) * n_langs
    out = []
    for rid in PRIMARY[SUNDAR]:
        eff, src = EFFECTS[rid]
        unit, have, sd = "documents", docs, 1.0
        if rid == "experts_exist":
            sd = math.sqrt(1 / max(1, n_langs - 1))  # Hanley-McNeil at 0.5, one positive
        elif rid == "clamp_steers":
            unit, have, sd = "BOS samples", int(e["samples"]), math.sqrt(0.5)
        elif rid == "experts_disjoint":
            unit, have, sd = "languages", n_langs, 0.05  # overlap SD across pairs (a bound)
        needed = units_needed(eff, sd, alpha)
        arms = 2 + draws
        secs = needed * (per_doc * s_sent * arms if unit == "documents" else s_sent)
        row = PlanRow(SUNDAR, rid, unit, eff, src, sd, 1.0, needed, have,
                      need_draws if rid in POPULATION_ROWS else None,
                      draws if rid in POPULATION_ROWS else None, secs)  # fmt: skip
        fix = {"documents": f"--parallel with at least {needed} documents in the evaluation "
               f'part, and --settings \'{{"experts": {{"n_eval": {needed * per_doc}}}}}\'',
               "BOS samples": f'--settings \'{{"experts": {{"samples": {needed}}}}}\'',
               "languages": f"--parallel with {needed} languages"}[unit]  # fmt: skip
        _limits(row, fix, f'--settings \'{{"experts": {{"random_sets": {need_draws}}}}}\'')
        out.append(row)
    return out


def plan_card(
    cfg: Mapping[str, Any],
    papers: Sequence[str],
    metric_data: Mapping[str, Any] | None,
    available: Mapping[str, Any],
    cost: Mapping[str, float] | None = None,
    stage_seconds: Mapping[str, float] | None = None,
) -> Plan:
    """The :class:`Plan` of a card with settings ``cfg`` on ``papers``: ``metric_data`` is the
    metric stage's result (dev items and per-item seconds), ``available`` the data's sizes
    (``test_ids``, ``dev_ids``, ``eval_docs``, ``langs``), ``cost`` more per-item seconds
    (``embed``: one sentence in one language through the model), ``stage_seconds`` each
    stage's estimated CPU seconds (:func:`mechlingo.card.stages.estimate_seconds`): their
    sum is the card's estimate."""
    cost = {**dict((metric_data or {}).get("seconds_per_item", {})), **dict(cost or {})}
    alpha = {p: ALPHA / len(PRIMARY[p]) for p in papers}
    rows: list[PlanRow] = []
    inputs: dict[str, Any] = {"cost_seconds_per_item": cost, "available": dict(available),
                              "stage_seconds": dict(stage_seconds or {})}  # fmt: skip
    if LU in papers:
        inp = _lu_inputs(metric_data, str(cfg.get("metric")))
        inputs["lu_dev"] = inp
        rows += _lu_rows(cfg, inp, available, cost, alpha[LU])
    if SUNDAR in papers:
        rows += _sundar_rows(cfg, available, cost, alpha[SUNDAR])
    return Plan(rows, alpha, sum((stage_seconds or {}).values()) / 60, inputs)
