"""The dev grid of the steering evaluation: every setting scored on dev, one chosen.

:func:`choose_on_dev` scores both vectors at every second layer from about 20% to about 90%
of the depth (:func:`mechlingo.analyses.recall.settings.every_second_layer`), alpha on a log grid from 0.03 to 0.6 (residual-norm
units, :data:`mechlingo.analyses.recall.settings.ALPHA_GRID`), on a *screen* subset of the dev facts; the best few settings of
each vector are re-scored on the whole dev split, and the best few task x diff pairs are
combined. The objective is the mean accuracy over the non-English languages; English is a
constraint (it may not drop by more than ``en_tolerance``). "No intervention" is a
candidate: a setting is *chosen* only if it beats it on the dev non-English items by an
exact McNemar test at ``p < 0.1``; otherwise ``dev_effect`` is ``"none found"`` and test
still scores the best candidate, labelled as such. The lowest language is fixed here too,
on dev (:func:`mechlingo.analyses.recall.headroom.lowest_language_rule`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mechlingo.analyses.recall import headroom as hm
from mechlingo.analyses.recall.settings import DevGrid, ScoringOptions
from mechlingo.analyses.recall.steering import SteeringConfig, SteeringPair
from mechlingo.core.types import Model
from mechlingo.data import Fact
from mechlingo.data.splits import hash_fraction
from mechlingo.interventions import Intervention
from mechlingo.kernels.significance import mcnemar
from mechlingo.scoring.evaluate import EvalResult
from mechlingo.scoring.scorers import as_scorer
from mechlingo.viz.steer import sweep_heatmap

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = ["Choice", "DevSearch", "choose_on_dev"]

# Dev sweep
# --------------------------------------------------------------------------------------


@dataclass
class Choice:
    """What dev chose: the best single setting of each vector, the best pair (``config``),
    which candidate is ``selected`` (``"task"``, ``"diff"``, ``"both"``, or the best one when
    none beat no intervention), and the dev evidence."""

    config: SteeringConfig
    selected: str
    dev_effect: str
    dev_test: dict[str, Any]
    dev_score: dict[str, float]
    pair: SteeringConfig | None = None
    best_single: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "config": self.config.to_json(),
            "selected": self.selected,
            "dev_effect": self.dev_effect,
            "dev_test": self.dev_test,
            "dev_score": self.dev_score,
            "pair": None if self.pair is None else self.pair.to_json(),
            "best_single": self.best_single,
        }


@dataclass
class DevSearch:
    """Every dev score of the sweep.

    ``rows``: one dict per scored setting: ``stage`` (``"screen"`` or ``"dev"``), ``vector``
    (``task``/``diff``/``both``), ``layer``/``alpha`` (or ``task_layer``... for ``both``),
    ``score`` (mean non-English accuracy), ``en`` (English accuracy or ``None``), ``n``
    (items), ``en_ok`` (English within tolerance of no intervention). ``baseline``: dev
    accuracy per language without intervention; ``choice``: the :class:`Choice`;
    ``lowest_language``: fixed on dev (:func:`mechlingo.analyses.recall.headroom.lowest_language_rule`)."""

    rows: list[dict[str, Any]]
    baseline: dict[str, float]
    choice: Choice
    lowest_language: str | None
    headroom: dict[str, Any] = field(default_factory=dict)
    unit: str = "resid"
    n_dev: int = 0
    n_screen: int = 0
    metric: dict[str, Any] = field(default_factory=lambda: {"metric": "generate"})
    skipped: dict[str, int] = field(default_factory=dict)
    lowest_rule: dict[str, Any] = field(default_factory=dict)

    @property
    def best(self) -> SteeringConfig:
        return self.choice.config

    def to_json(self) -> dict[str, Any]:
        hr = {k: v for k, v in self.headroom.items() if k != "results"}
        return {
            "rows": self.rows,
            "dev_baseline": self.baseline,
            "n_dev_items": self.n_dev,
            "n_screen_items": self.n_screen,
            "lowest_language": self.lowest_language,
            "lowest_language_rule": self.lowest_rule,
            "headroom": hr,
            "metric": self.metric,
            "skipped": self.skipped,
            **self.choice.to_json(),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any], unit: str) -> DevSearch:
        """The inverse of :meth:`to_json` (``unit``: the vectors' unit, not stored there)."""
        pair = None if d.get("pair") is None else SteeringConfig(**d["pair"])
        choice = Choice(
            SteeringConfig(**d["config"]),
            d["selected"],
            d["dev_effect"],
            d["dev_test"],
            d["dev_score"],
            pair,
            d.get("best_single"),
        )
        return cls(
            rows=list(d["rows"]),
            baseline=d["dev_baseline"],
            choice=choice,
            lowest_language=d["lowest_language"],
            headroom=d["headroom"],
            unit=unit,
            n_dev=d["n_dev_items"],
            n_screen=d["n_screen_items"],
            metric=d["metric"],
            skipped=d["skipped"],
            lowest_rule=d.get("lowest_language_rule") or {},
        )

    def fig_heatmap(self, vector: str) -> go.Figure:
        """Screen-stage mean non-English accuracy over layer x alpha for one vector alone
        (:func:`mechlingo.viz.steer.sweep_heatmap`)."""
        return sweep_heatmap(self.rows, vector=vector, unit=self.unit)


def _screen_subset(facts: Sequence[Fact], n_ids: int) -> list[Fact]:
    """``n_ids`` fact ids (by a hash), spread evenly over the relations (round robin)."""
    by_rel: dict[str, set[str]] = {}
    for f in facts:
        by_rel.setdefault(f.relation, set()).add(f.id)
    order = [
        sorted(v, key=lambda i: hash_fraction(f"screen|{i}")) for _, v in sorted(by_rel.items())
    ]
    keep: set[str] = set()
    for depth in range(max((len(v) for v in order), default=0)):
        for ids in order:
            if depth < len(ids) and len(keep) < n_ids:
                keep.add(ids[depth])
    return [f for f in facts if f.id in keep]


def _en(res: EvalResult) -> float | None:
    return res.accuracy().get("en")


def choose_on_dev(
    model: Model,
    vectors: SteeringPair,
    dev_facts: Sequence[Fact],
    *,
    grid: DevGrid | None = None,
    scoring: ScoringOptions | None = None,
    pool: Sequence[Fact] | None = None,
    k_shot: int = 3,
    test_ids: Sequence[Fact] = (),
    **score_kw: Any,
) -> DevSearch:
    """The dev stage of the protocol (see the module docstring).

    Args:
        dev_facts: every selected language, English included (its accuracy is the
            constraint).
        grid: what is tried and how it is decided
            (:class:`~mechlingo.analyses.recall.settings.DevGrid`: the layers and alphas of
            each vector, ``top_k``, ``screen_ids``, ``en_tolerance``, ``p_threshold``; ``None``: its
            defaults).
        scoring: how every setting is scored
            (:class:`~mechlingo.analyses.recall.settings.ScoringOptions`; see the module
            docstring for the metrics); under ``klar`` the demonstrations come from ``pool``
            (the dev facts themselves without one).
        pool: the build split, for the few-shot headroom on dev (and the tie-break of the
            lowest language); ``None`` skips it.
        k_shot: demonstrations of the few-shot headroom.
        test_ids: the test facts, only to check that none is used here.
        **score_kw: passed to every scoring call.
    """
    grid = grid or DevGrid()
    scoring = scoring or ScoringOptions()
    dev_facts = list(dev_facts)
    hm.check_disjoint("the dev sweep", dev_facts, test_ids)
    scorer = as_scorer(scoring.metric)
    kw = {**scoring.kw(), **score_kw}
    task_layers, diff_layers = grid.layers(int(model.cfg.n_layers))
    search_grid = {
        "task": (task_layers, list(grid.task_alphas)),
        "diff": (diff_layers, list(grid.diff_alphas)),
    }
    screen_ids, top_k, p_threshold = grid.screen_ids, grid.top_k, grid.p_threshold
    screen = _screen_subset(dev_facts, screen_ids) if screen_ids else dev_facts
    sw = _DevSearch(model, {**kw, **hm.metric_options(scorer, pool)}, grid.en_tolerance)
    base_screen = sw.screen(vectors, search_grid, screen)
    results, finalists, base = sw.finalists(
        vectors, dev_facts, base_screen if screen is dev_facts else None, top_k
    )
    results.update(sw.pairs(vectors, finalists, dev_facts, base))
    choice = _choose(results, finalists, base, p_threshold)
    hr: dict[str, Any] = {}
    rule: dict[str, Any] = {}
    if pool is not None:
        hr = hm.headroom(model, dev_facts, pool, k_shot=k_shot, zero_shot=base, metric=scorer, **kw)
        rule = hm.lowest_language_rule(*hm.headroom_pairs(hr), p_threshold=p_threshold)
    return DevSearch(
        sw.rows,
        base.accuracy(),
        choice,
        rule.get("language"),
        hr,
        vectors.unit,
        n_dev=len(dev_facts),
        n_screen=len(screen),
        metric=scorer.to_json(),
        skipped=base.skipped,
        lowest_rule=rule,
    )


def _rank(r: dict[str, Any]) -> tuple:
    """Sweep rows best first: English within tolerance, then the higher score, then the
    smaller alpha and the earlier layer."""
    return (not r["en_ok"], -r["score"], r.get("alpha", 0.0), r.get("layer", 0))


class _DevSearch:
    """The stages of :func:`choose_on_dev`; every scored setting is appended to ``rows``."""

    def __init__(self, model: Model, kw: dict[str, Any], en_tolerance: float) -> None:
        self.model = model
        self.kw = kw
        self.en_tolerance = en_tolerance
        self.rows: list[dict[str, Any]] = []

    def score(self, facts: Sequence[Fact], iv: Intervention | None) -> EvalResult:
        return hm.score(self.model, facts, iv, **self.kw)

    def score_all(
        self, facts: Sequence[Fact], conds: dict[Any, Intervention | None]
    ) -> dict[Any, EvalResult]:
        """Every condition of ``conds`` on ``facts`` at once (:func:`mechlingo.analyses.recall.headroom.score_all`)."""
        named = {str(i): iv for i, iv in enumerate(conds.values())}
        got = hm.score_all(self.model, facts, named, **self.kw)
        return {key: got[str(i)] for i, key in enumerate(conds)}

    def row(self, stage: str, setting: dict[str, Any], res: EvalResult, ref: EvalResult) -> dict:
        """Record one setting's scores (``en_ok``: English within tolerance of ``ref``)."""
        en, en0 = _en(res), _en(ref)
        ok = en is None or en0 is None or en >= en0 - self.en_tolerance - 1e-9
        r = {"stage": stage, **setting, "score": hm.non_english_mean(res), "en": en, "en_ok": ok}
        r["n"] = len(res.records)
        self.rows.append(r)
        return r

    def screen(
        self,
        vectors: SteeringPair,
        grid: dict[str, tuple[list[int], list[float]]],
        facts: Sequence[Fact],
    ) -> EvalResult:
        """Every layer x alpha of each vector alone on the screen subset, scored together
        with no intervention (returned: the reference of the screen rows)."""
        settings = []
        conds: dict[Any, Intervention | None] = {"base": None}
        for name, stack in (("task", vectors.task), ("diff", vectors.diff)):
            layers, alphas = grid[name]
            for layer in layers:
                for alpha in alphas:
                    conds[len(settings)] = stack.at(layer, alpha)
                    settings.append({"vector": name, "layer": layer, "alpha": alpha})
        got = self.score_all(facts, conds)
        ref = got["base"]
        for i, setting in enumerate(settings):
            self.row("screen", setting, got[i], ref)
        return ref

    def finalists(
        self,
        vectors: SteeringPair,
        facts: Sequence[Fact],
        base: EvalResult | None,
        top_k: int,
    ) -> tuple[dict[str, tuple[dict, EvalResult]], dict[str, list[dict]], EvalResult]:
        """The best ``top_k`` screen settings of each vector re-scored on the whole dev split
        (with no intervention, unless ``base`` already holds it): ``{key: (row, result)}``,
        each vector's re-scored rows, best first, and the no-intervention result."""
        stacks = {"task": vectors.task, "diff": vectors.diff}
        cand = {
            name: sorted((r for r in self.rows if r["vector"] == name), key=_rank)[:top_k]
            for name in stacks
        }
        conds: dict[Any, Intervention | None] = {} if base is not None else {"base": None}
        for name, rows in cand.items():
            for j, c in enumerate(rows):
                conds[(name, j)] = stacks[name].at(c["layer"], c["alpha"])
        got = self.score_all(facts, conds)
        base = base if base is not None else got["base"]
        results: dict[str, tuple[dict, EvalResult]] = {}
        finalists: dict[str, list[dict]] = {}
        for name, rows in cand.items():
            scored = []
            for j, c in enumerate(rows):
                res = got[(name, j)]
                setting = {"vector": name, "layer": c["layer"], "alpha": c["alpha"]}
                r = self.row("dev", setting, res, base)
                results[f"{name}:{c['layer']}:{c['alpha']}"] = (r, res)
                scored.append(r)
            finalists[name] = sorted(scored, key=_rank)
        return results, finalists, base

    def pairs(
        self,
        vectors: SteeringPair,
        finalists: dict[str, list[dict]],
        facts: Sequence[Fact],
        base: EvalResult,
    ) -> dict[str, tuple[dict, EvalResult]]:
        """Every task x diff pair of finalists, both vectors applied, on the whole dev split."""
        cfgs = [
            SteeringConfig(t["layer"], t["alpha"], d["layer"], d["alpha"])
            for t in finalists["task"]
            for d in finalists["diff"]
        ]
        conds: dict[Any, Intervention | None] = {
            i: vectors.task.at(cfg.task_layer, cfg.task_alpha)
            + vectors.diff.at(cfg.diff_layer, cfg.diff_alpha)
            for i, cfg in enumerate(cfgs)
        }
        got = self.score_all(facts, conds) if conds else {}
        results: dict[str, tuple[dict, EvalResult]] = {}
        for i, cfg in enumerate(cfgs):
            r = self.row("dev", {"vector": "both", **cfg.to_json()}, got[i], base)
            results[f"both:{cfg}"] = (r, got[i])
        return results


def _choose(
    results: dict[str, tuple[dict, EvalResult]],
    finalists: dict[str, list[dict]],
    base: EvalResult,
    p_threshold: float,
) -> Choice:
    def rank(item: tuple[str, tuple[dict, EvalResult]]) -> tuple:
        r = item[1][0]
        return (not r["en_ok"], -r["score"], item[0])

    best_key, (best_row, best_res) = min(results.items(), key=rank)
    both = [(k, v) for k, v in results.items() if k.startswith("both:")]
    pair_row = min(both, key=rank)[1][0] if both else None
    t, d = finalists["task"][0], finalists["diff"][0]
    if best_row["vector"] == "both":
        cfg = SteeringConfig(
            best_row["task_layer"],
            best_row["task_alpha"],
            best_row["diff_layer"],
            best_row["diff_alpha"],
        )
    elif pair_row is not None:
        cfg = SteeringConfig(
            pair_row["task_layer"],
            pair_row["task_alpha"],
            pair_row["diff_layer"],
            pair_row["diff_alpha"],
        )
    else:
        cfg = SteeringConfig(t["layer"], t["alpha"], d["layer"], d["alpha"])
    if best_row["vector"] == "task":
        cfg = SteeringConfig(best_row["layer"], best_row["alpha"], cfg.diff_layer, cfg.diff_alpha)
    elif best_row["vector"] == "diff":
        cfg = SteeringConfig(cfg.task_layer, cfg.task_alpha, best_row["layer"], best_row["alpha"])
    test = mcnemar(hm.outcomes(base), hm.outcomes(best_res))
    found = test["p"] < p_threshold and test["fixed"] > test["broken"] and bool(best_row["en_ok"])
    pair = None
    if pair_row is not None:
        pair = SteeringConfig(
            pair_row["task_layer"],
            pair_row["task_alpha"],
            pair_row["diff_layer"],
            pair_row["diff_alpha"],
        )
    single = min(
        (v for v in ("task", "diff") if finalists.get(v)),
        key=lambda v: _rank(finalists[v][0]),
        default=None,
    )
    return Choice(
        cfg,
        best_row["vector"],
        "found" if found else "none found",
        {**test, "threshold": p_threshold, "candidate": best_key},
        {"none": hm.non_english_mean(base), "selected": best_row["score"]},
        pair,
        single,
    )


# --------------------------------------------------------------------------------------
# Test
# --------------------------------------------------------------------------------------
