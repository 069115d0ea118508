"""The repair-vector protocol: choose on dev, report on test, say how sure it is.

:func:`run_steer_eval` is what ``mechlingo steer eval`` runs (:class:`SteerEvalResult`); a
notebook can call its steps one by one: headroom
(:func:`mechlingo.analyses.recall.dev_grid.headroom`: zero-shot and k-shot accuracy per
language), the dev sweep (:func:`mechlingo.analyses.recall.dev_grid.choose_on_dev`, which also
fixes the lowest language), and test (:func:`evaluate_test`, :class:`SteerTestResult`:
``orig``, ``task``, ``diff``, ``both`` and norm-matched ``random`` over at least 3 seeds, with
Wilson intervals, exact McNemar tests and paired bootstrap intervals of the gains).

Every step scores with the same ``metric``; fact ids are split once by a hash and
:func:`mechlingo.analyses.recall.dev_grid.check_disjoint` runs before every step, so no test
id builds a vector, draws a demonstration or chooses a setting. The protocol in full:
``docs/methods/repair-vectors.md`` (``docs/methods/scoring.md`` for the metrics)."""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mechlingo.analyses.recall import dev_grid, steering
from mechlingo.analyses.recall.dev_grid import Choice, DevSearch
from mechlingo.analyses.recall.settings import (
    BuildSettings,
    DevGrid,
    MatrixSettings,
    ScoringOptions,
    SplitSettings,
)
from mechlingo.analyses.recall.steering import (
    CONTROLS,
    SteeringConfig,
    SteeringPair,
    population_names,
    protocol_conditions,
)
from mechlingo.analyses.results import WritesFolder
from mechlingo.core.checkpoints import Checkpoints
from mechlingo.core.defaults import CONTROL_SEEDS, PROGRESS, STEER_BATCH_SIZE, check_seeds
from mechlingo.core.errors import InputError
from mechlingo.core.jsonable import jsonable
from mechlingo.core.types import Model
from mechlingo.data import Fact
from mechlingo.interventions import Intervention
from mechlingo.kernels.significance import mcnemar, paired_gain, wilson
from mechlingo.scoring.evaluate import EvalResult
from mechlingo.scoring.scorers import as_scorer
from mechlingo.scoring.side_effects import SideEffectOptions, SideEffects, side_effects
from mechlingo.viz.steer import accuracy_ci_figure, headroom_figure

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = [
    "SteerEvalOptions",
    "SteerTestResult",
    "evaluate_test",
    "SteerEvalResult",
    "SplitResult",
    "run_steer_eval",
    "checkpointer",
    "population_names",
]

MIN_TEST_FACTS = 30


@dataclass
class SteerTestResult:
    """Test accuracies of every condition, with the statistics of the protocol.

    ``results[condition]`` is the :class:`~mechlingo.scoring.evaluate.EvalResult`; conditions are
    ``orig``, ``task``, ``diff``, ``both`` and ``random_s<seed>`` (norm-matched random
    directions at the places of ``choice.selected``)."""

    results: dict[str, EvalResult]
    choice: Choice
    lowest_language: str | None
    headroom: dict[str, Any]
    seeds: list[int]
    unit: str = "resid"
    facts: list[Fact] = field(default_factory=list)
    interventions: dict[str, Intervention | None] = field(default_factory=dict)
    lowest_rule: dict[str, Any] = field(default_factory=dict)

    def accuracy(self) -> dict[str, dict[str, float]]:
        """``{condition: {lang: accuracy}}``, with ``random`` the mean over seeds."""
        acc = {c: r.accuracy() for c, r in self.results.items()}
        rand = [acc[c] for c in acc if c.startswith("random_s")]
        if rand:
            acc["random"] = {lg: float(np.mean([a[lg] for a in rand])) for lg in rand[0]}
        return acc

    def summary(self) -> dict[str, Any]:
        """JSON-ready statistics (see the module docstring)."""
        orig = self.results["orig"]
        o_all = dev_grid.outcomes(orig)
        sel = self.choice.selected if self.choice.selected in self.results else "both"
        out: dict[str, Any] = {
            "accuracy": self.accuracy(),
            "intervals": {
                c: {lg: wilson(sum(v), len(v)).to_json() for lg, v in dev_grid.by_lang(r).items()}
                for c, r in self.results.items()
            },
            "non_english_mean": {c: dev_grid.non_english_mean(r) for c, r in self.results.items()},
            "selected": sel,
            "dev_effect": self.choice.dev_effect,
            "config": self.choice.config.to_json(),
            "alpha_unit": self.unit,
            "random_seeds": self.seeds,
            "metric": orig.meta.get("metric", {"metric": "generate"}),
            "skipped": dict(orig.skipped),
        }
        if orig.scorer.metric != "generate":
            out["metric_summary"] = {c: r.metric_summary() for c, r in self.results.items()}
        vs_orig, vs_random, gains = {}, {}, {}
        randoms = [c for c in self.results if c.startswith("random_s")]
        for c, r in self.results.items():
            if c == "orig":
                continue
            o = dev_grid.outcomes(r)
            vs_orig[c] = mcnemar(o_all, o)
            gains[c] = paired_gain(o_all, o).to_json()
            if not c.startswith("random_"):
                vs_random[c] = {
                    rc: mcnemar(dev_grid.outcomes(self.results[rc]), o) for rc in randoms
                }
        out["mcnemar_vs_orig"] = vs_orig
        out["mcnemar_vs_random"] = vs_random
        out["non_english_gain"] = gains
        out.update(self._lowest_summary())
        hr = {k: v for k, v in self.headroom.items() if k != "results"}
        out["headroom"] = hr
        n = {lg: len(v) for lg, v in dev_grid.by_lang(orig).items()}
        out["n_test_facts"] = n
        out["warnings"] = [
            f"{lg}: only {k} test facts (fewer than {MIN_TEST_FACTS}); intervals are wide"
            for lg, k in n.items()
            if k < MIN_TEST_FACTS
        ]
        return jsonable(out)

    def _gains_in(self, langs: str | Sequence[str] | None) -> dict[str, Any]:
        """Per condition, the paired gain over ``orig`` on the pooled items of ``langs``."""
        langs = [langs] if isinstance(langs, str) else list(langs or [])
        if not langs:
            return {}
        by = {c: dev_grid.by_lang(r) for c, r in self.results.items()}
        base = [x for lg in langs for x in by["orig"].get(lg, [])]
        return {
            c: paired_gain(base, [x for lg in langs for x in v.get(lg, [])]).to_json()
            for c, v in by.items()
            if c != "orig"
        }

    def _lowest_summary(self) -> dict[str, Any]:
        """The lowest language by the headroom rule and by the literal rule (each a tie when
        several languages share the lowest dev zero-shot accuracy: their items pooled), their
        gains, and the headline: both vectors together at the dev-chosen pair next to the
        best single vector (gain in points with a bootstrap interval, relative where orig > 0)."""
        rule = self.lowest_rule
        low, lit = self.lowest_language, rule.get("literal")
        lows = rule.get("languages") or ([low] if low else [])
        lits = rule.get("literal_languages") or ([lit] if lit else [])
        both = "both_pair" if "both_pair" in self.results else "both"
        single = self.choice.best_single or "task"
        out: dict[str, Any] = {
            "lowest_language": low,
            "lowest_languages": lows,
            "lowest_language_rule": rule.get("rule") or "given (not chosen by a rule)",
            "lowest_language_literal": lit,
            "lowest_languages_literal": lits,
            "lowest_language_literal_rule": rule.get("literal_rule"),
            "lowest_language_excluded": rule.get("excluded", []),
            "lowest_language_tests": rule.get("tests", {}),
        }
        if lows:
            out["lowest_language_gain"] = self._gains_in(lows)
        if lits:
            out["lowest_language_literal_gain"] = self._gains_in(lits)
        head: dict[str, Any] = {"both_condition": both, "best_single": single}
        for name, langs in (("headroom_rule", lows), ("literal_rule", lits)):
            g = self._gains_in(langs)
            head[name] = {
                "language": "+".join(langs) or None,
                "languages": langs,
                "both": g.get(both),
                "best_single": g.get(single),
            }
        if low is None and rule:
            head["note"] = "no non-English language has headroom on dev: the claim is untestable"
        out["headline"] = head
        return out


def evaluate_test(
    model: Model,
    vectors: SteeringPair,
    choice: Choice,
    test_facts: Sequence[Fact],
    *,
    lowest_language: str | None,
    lowest_rule: dict[str, Any] | None = None,
    pool: Sequence[Fact] | None = None,
    k_shot: int = 3,
    options: SteerEvalOptions | None = None,
    checkpoint: Callable[[str, Callable[[], Any]], Any] | None = None,
) -> SteerTestResult:
    """Score every condition on ``test_facts`` with ``metric`` (see the module docstring),
    and the test headroom (zero-shot vs k-shot with demonstrations from ``pool``).
    ``options``: the random controls' ``seeds`` and how every item is ``scoring``ed
    (:class:`SteerEvalOptions`; its defaults when ``None``; the others of its settings do not
    enter here). ``lowest_rule`` is
    :func:`~mechlingo.analyses.recall.dev_grid.lowest_language_rule` on dev (its literal-rule language is
    reported too); when dev chose a pair other than ``choice.config``, ``both_pair`` scores
    both vectors at that pair (the headline condition).

    ``checkpoint(name, fn)``, when given, runs each condition's scoring (``name`` = the condition)
    and the headroom (``"headroom"``) and returns ``fn()`` or a stored equal result (a
    resumable checkpoint, :class:`mechlingo.core.checkpoints.Checkpoints`; the CLI's ``--resume``).

    Raises:
        InputError: no seed, or ``klar`` without a ``pool`` (its demonstrations would be
            test facts)."""
    opts = SteerEvalOptions() if options is None else options
    scoring, seeds = opts.scoring, opts.seeds
    scorer = as_scorer(scoring.metric)
    if scorer.metric == "klar" and pool is None:
        raise InputError(
            "klar on test needs pool= (the build split): its demonstrations may not be test facts"
        )
    kw = scoring.kw()
    cfg = choice.config
    conds = protocol_conditions(vectors, cfg, pair=choice.pair, selected=choice.selected,
                                seeds=seeds, controls=opts.controls)  # fmt: skip
    mkw = dev_grid.metric_options(scorer, pool)
    results = dev_grid.score_all(model, test_facts, conds, store=checkpoint, **kw, **mkw)
    run = checkpoint or (lambda name, fn: fn())
    hr: dict[str, Any] = {}
    if pool is not None:
        hr = run(
            "headroom",
            lambda: dev_grid.headroom(
                model,
                test_facts,
                pool,
                k_shot=k_shot,
                zero_shot=results["orig"],
                metric=scorer,
                **kw,
            ),
        )
    return SteerTestResult(
        results,
        choice,
        lowest_language,
        hr,
        [int(s) for s in seeds],
        vectors.unit,
        list(test_facts),
        conds,
        dict(lowest_rule or {}),
    )


def condition_interventions(result: SteerTestResult) -> dict[str, Intervention | None]:
    """The intervention of every condition of a :class:`SteerTestResult`."""
    return dict(result.interventions)


def repeat_summary(summaries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Mean and sd over re-split repeats of the non-English mean per condition and of the
    selected condition's gain."""
    conds = summaries[0]["non_english_mean"].keys()
    out: dict[str, Any] = {"n": len(summaries), "non_english_mean": {}}
    for c in conds:
        vals = [s["non_english_mean"].get(c) for s in summaries]
        vals = [v for v in vals if v is not None]
        out["non_english_mean"][c] = {
            "mean": float(np.mean(vals)) if vals else None,
            "sd": float(np.std(vals, ddof=1)) if len(vals) > 1 else None,
            "values": vals,
        }
    out["dev_effect"] = [s["dev_effect"] for s in summaries]
    out["selected"] = [s["selected"] for s in summaries]
    return out


# --------------------------------------------------------------------------------------
# Figures and tables for the report
# --------------------------------------------------------------------------------------


def fig_accuracy_ci(intervals: dict[str, dict[str, dict[str, Any]]]) -> go.Figure:
    """Grouped bars of accuracy per language and condition with Wilson error bars
    (:func:`mechlingo.viz.steer.accuracy_ci_figure`)."""
    return accuracy_ci_figure(intervals)


def fig_headroom(hr: dict[str, Any]) -> go.Figure:
    """Zero-shot vs k-shot accuracy per language with Wilson error bars
    (:func:`mechlingo.viz.steer.headroom_figure`)."""
    return headroom_figure(hr)


def gain_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per condition: non-English gain over orig with its CI, fixed/broken, McNemar p
    against orig, and the lowest language's gain."""
    rows = []
    low = summary.get("lowest_language")
    for c, g in summary["non_english_gain"].items():
        m = summary["mcnemar_vs_orig"][c]
        lg = summary.get("lowest_language_gain", {}).get(c, {})
        rows.append(
            {
                "condition": c,
                "non-en mean": _r(summary["non_english_mean"].get(c)),
                "gain": _r(g.get("estimate")),
                "95% CI": f"[{_r(g.get('lo'))}, {_r(g.get('hi'))}]",
                "fixed/broken": f"{m['fixed']}/{m['broken']}",
                "McNemar p": f"{m['p']:.3g}",
                f"gain in {low}": _r(lg.get("estimate")),
                f"{low} CI": f"[{_r(lg.get('lo'))}, {_r(lg.get('hi'))}]",
            }
        )
    return rows


def _r(x: Any) -> Any:
    return None if x is None else round(float(x), 3)


# --------------------------------------------------------------------------------------
# The whole protocol: what `mechlingo steer eval` runs
# --------------------------------------------------------------------------------------


@dataclass
class SplitResult:
    """One split of the facts through the protocol: its ``summary`` (the keys of
    :meth:`SteerTestResult.summary` plus ``split``, ``sweep`` and the leak notes in
    ``warnings``), the ``test`` result and the dev ``search`` (``None`` with a fixed
    ``config``)."""

    summary: dict[str, Any]
    test: SteerTestResult
    search: DevSearch | None = None


@dataclass
class SteerEvalResult(WritesFolder):
    """The repair protocol on one set of facts (:func:`run_steer_eval`).

    ``splits[0]`` is the reported split; ``splits[1:]`` the re-splits of ``repeats`` (their
    mean and sd are in ``summary()["repeats"]``). ``side_effects`` (set by
    :meth:`add_side_effects`) and ``transfer`` (the JSON of
    :func:`mechlingo.analyses.recall.transfer.transfer_matrices`) are optional parts of the summary.
    """

    splits: list[SplitResult]
    side_effects: SideEffects | None = None
    transfer: dict[str, Any] | None = None

    @property
    def test(self) -> SteerTestResult:
        """The test result of the reported split."""
        return self.splits[0].test

    @property
    def search(self) -> DevSearch | None:
        """The dev search of the reported split (``None`` with a fixed ``config``)."""
        return self.splits[0].search

    def summary(self, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        """What ``steer eval`` writes to ``summary.json`` (``meta``, when given, last)."""
        out = dict(self.splits[0].summary)
        if len(self.splits) > 1:
            out["repeats"] = repeat_summary([s.summary for s in self.splits])
        if self.transfer is not None:
            out["transfer"] = self.transfer
        if self.side_effects is not None:
            out["side_effects"] = self.side_effects.to_json()
        if meta is not None:
            out["meta"] = meta
        return out

    def records(self) -> list[dict[str, Any]]:
        """Every scored test record of the reported split, with its ``condition``."""
        return [{"condition": c, **r} for c, er in self.test.results.items() for r in er.records]

    def files(self, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        """``{"summary.json": ..., "generations.jsonl": ...}`` as ``steer eval`` writes them."""
        lines = "\n".join(json.dumps(r, ensure_ascii=False) for r in self.records()) + "\n"
        return {"summary.json": self.summary(meta), "generations.jsonl": lines}

    def test_langs(self) -> list[str]:
        """The languages of the reported split's test records (sorted)."""
        return sorted({r["lang"] for r in self.test.results["orig"].records})

    def add_side_effects(
        self,
        model: Model,
        lines: Mapping[str, Sequence[str]],
        *,
        batch_size: int = STEER_BATCH_SIZE,
        progress: bool = PROGRESS,
        checkpoints: Checkpoints | None = None,
    ) -> SideEffects:
        """Side effects of the selected test condition (``both`` when none was chosen) on its
        test facts and ``lines`` (per language), against a norm-matched random control
        (:func:`mechlingo.scoring.side_effects.side_effects`, seed 0); the checkpoint
        ``side-effects`` of ``checkpoints``. Sets and returns :attr:`side_effects`."""
        test = self.test
        iv = condition_interventions(test)[
            test.choice.selected if test.choice.selected != "none" else "both"
        ]

        def measure() -> dict[str, Any]:
            return side_effects(
                model,
                iv,
                test.facts,
                lines,
                control="random",
                options=SideEffectOptions(seed=0, batch_size=batch_size, progress=progress),
            ).to_json()

        with _checkpoints_or_temp(checkpoints) as st:
            d = st.run("side-effects", measure)
        self.side_effects = SideEffects(
            rows=d["rows"], langs=d["langs"], meta=d["meta"], examples=d["examples"]
        )
        return self.side_effects


@contextlib.contextmanager
def _checkpoints_or_temp(checkpoints: Checkpoints | None) -> Iterator[Checkpoints]:
    """``checkpoints``, or checkpoints in a temporary folder removed afterwards: every result goes
    through the same store either way, so a run with and without ``--work`` is the same."""
    if checkpoints is not None:
        yield checkpoints
        return
    with tempfile.TemporaryDirectory(prefix="mechlingo-protocol-") as tmp:
        yield Checkpoints(tmp, {"temporary": True})


def _eval_to_json(res: EvalResult | dict[str, Any]) -> dict[str, Any]:
    if isinstance(res, EvalResult):
        return {"eval": {"records": res.records, "meta": res.meta, "skipped": res.skipped}}
    return {"dict": {k: v for k, v in res.items() if k != "results"}}  # headroom


def _eval_from_json(data: Mapping[str, Any]) -> Any:
    if "eval" in data:
        return EvalResult(**data["eval"])
    return data["dict"]


def checkpointer(checkpoints: Checkpoints, prefix: str) -> Callable[[str, Callable[[], Any]], Any]:
    """The ``checkpoint`` of :func:`evaluate_test`: each test condition (and the test headroom)
    is the checkpoint ``{prefix}{name}`` of ``checkpoints``."""

    def run(name: str, fn: Callable[[], Any]) -> Any:
        return _eval_from_json(checkpoints.run(f"{prefix}{name}", lambda: _eval_to_json(fn())))

    return run


def _staged_vectors(
    checkpoints: Checkpoints, name: str, build: Callable[[], SteeringPair], model: Model
) -> SteeringPair:
    """Repair vectors built once (``build()``), saved in checkpoint ``name`` and loaded from there."""

    def fn(tmp: Path) -> dict[str, Any]:
        build().save(tmp / "vectors", model)
        return {"saved": "vectors"}

    checkpoints.run(name, fn, folder=True)
    return SteeringPair.load(checkpoints.path(name) / "vectors", model)


@dataclass(frozen=True)
class SteerEvalOptions:
    """Every setting of :func:`run_steer_eval` (``mechlingo steer eval``) that changes a
    number, checked when made, and the transfer matrix's ``matrix`` sizes.

    Attributes:
        split, grid, scoring: the id split, the dev search and how every item is scored
            (:mod:`mechlingo.analyses.recall.settings`).
        config: a fixed setting instead of the dev search (labelled as not chosen on dev;
            the dev headroom still fixes the lowest language).
        seeds: the random controls' seeds on test (``--control-seeds``).
        repeats: > 1 re-splits with the salts ``{salt}#repeat{r}`` and rebuilds the vectors
            with the given vectors' build settings (they serve the first split only).
        matrix: the transfer matrix's sizes (``steer eval --transfer``).
        controls: ``"selected"`` (one population of random controls, matched to the
            condition dev selected: ``random_s<seed>``) or ``"each"`` (one per condition:
            random task, random diff, random both, :func:`population_names`).

    Raises:
        InputError: ``repeats`` < 1, no seed, or ``controls`` that is neither.
    """

    split: SplitSettings = SplitSettings()
    grid: DevGrid = DevGrid()
    scoring: ScoringOptions = ScoringOptions()
    config: SteeringConfig | None = None
    seeds: tuple[int, ...] = CONTROL_SEEDS
    repeats: int = 1
    matrix: MatrixSettings = MatrixSettings()
    controls: str = "selected"

    def __post_init__(self) -> None:
        if self.controls not in CONTROLS:
            raise InputError(f"controls must be one of {list(CONTROLS)}, got {self.controls!r}")
        if self.repeats < 1:
            raise InputError(f"repeats must be at least 1, got {self.repeats}", where="--repeats")
        object.__setattr__(self, "seeds", tuple(check_seeds(self.seeds, what="--control-seeds")))


def run_steer_eval(
    model: Model,
    facts: Sequence[Fact],
    vectors: SteeringPair,
    options: SteerEvalOptions | None = None,
    *,
    checkpoints: Checkpoints | None = None,
) -> SteerEvalResult:
    """The repair protocol end to end, as ``mechlingo steer eval`` runs it: split by id, choose
    on dev, score every condition on test (:class:`SteerEvalResult`).

    Args:
        options: every setting (:class:`SteerEvalOptions`; ``None``: its defaults).
        checkpoints: keeps every finished step so a stopped run resumes (the CLI's ``--work``);
            without it a temporary folder, so the numbers are those of the CLI. A store, not
            a setting: it changes no number.

    Side effects and the transfer matrix are added afterwards
    (:meth:`SteerEvalResult.add_side_effects`,
    :func:`mechlingo.analyses.recall.transfer.transfer_matrices`).

    Raises:
        InputError: a split that is empty.
        LeakError: the vectors' recorded build ids overlap dev or test.
    """
    opt = SteerEvalOptions() if options is None else options
    opt = replace(opt, grid=replace(opt.grid, screen_ids=opt.grid.screen_ids or None),
                  scoring=replace(opt.scoring, metric=as_scorer(opt.scoring.metric)))  # fmt: skip
    splits = []
    with _checkpoints_or_temp(checkpoints) as st:
        for r in range(opt.repeats):
            salt = opt.split.salt if r == 0 else f"{opt.split.salt}#repeat{r}"
            splits.append(_one_split(model, facts, salt, vectors, r > 0, opt, st, f"r{r}-"))
    return SteerEvalResult(splits)


def _one_split(
    model: Model,
    facts: Sequence[Fact],
    salt: str,
    given: SteeringPair,
    rebuild: bool,
    opt: SteerEvalOptions,
    checkpoints: Checkpoints,
    prefix: str,
) -> SplitResult:
    """Choose on dev and score on test for one split of the facts (``salt``), with the
    ``given`` vectors or (``rebuild``: a re-split) vectors rebuilt on this split's build facts
    with the given vectors' build settings (k-shot, unit, zero-shot subtraction, translation
    shots); each step a checkpoint named ``{prefix}build``, ``{prefix}sweep``... of ``checkpoints``."""
    build, dev, test = opt.split.parts(facts, salt)
    if not test or not dev or not build:
        raise InputError(
            "a split is empty (build, dev or test)",
            fix="use more facts (--limit) or other fractions (--split)",
        )
    built = replace(BuildSettings.of(given.build), batch_size=opt.scoring.batch_size)
    k_shot = built.k_shot
    vectors = given
    if rebuild:
        vectors = _staged_vectors(
            checkpoints,
            f"{prefix}build",
            lambda: steering.build_steering_vectors(model, build, built),
            model,
        )
    notes = []
    if "fact_ids" in vectors.build:
        dev_grid.check_disjoint("building the vectors", vectors.build["fact_ids"], test)
        dev_grid.check_disjoint("building the vectors", vectors.build["fact_ids"], dev)
    else:
        notes.append(
            "the vectors record no build fact ids: their disjointness from test is unchecked"
        )
    dev_grid.check_disjoint("the few-shot demonstrations", build, test)
    choice, lowest, rule, searched = _dev_step(
        model, vectors, dev, build, test, k_shot, opt, checkpoints, prefix
    )
    search = None if searched is None else DevSearch.from_json(searched, vectors.unit)
    test_res = evaluate_test(
        model,
        vectors,
        choice,
        test,
        lowest_language=lowest,
        lowest_rule=rule,
        pool=build,
        k_shot=k_shot,
        options=opt,
        checkpoint=checkpointer(checkpoints, f"{prefix}test-"),
    )
    summary = test_res.summary()
    summary["warnings"] = summary.get("warnings", []) + notes
    summary["split"] = {
        "fractions": list(opt.split.fractions),
        "salt": salt,
        "n_ids": {
            k: len({f.id for f in v}) for k, v in (("build", build), ("dev", dev), ("test", test))
        },
    }
    if searched is not None:
        summary["sweep"] = searched
    return SplitResult(summary, test_res, search)


def _dev_step(
    model: Model,
    vectors: SteeringPair,
    dev: list[Fact],
    build: list[Fact],
    test: list[Fact],
    k_shot: int,
    opt: SteerEvalOptions,
    checkpoints: Checkpoints,
    prefix: str,
) -> tuple[Choice, str | None, dict[str, Any], dict[str, Any] | None]:
    """The dev step of one split: the search (checkpoint ``{prefix}sweep``; its JSON returned
    last) or, with a fixed ``config``, only the dev headroom that fixes the lowest language
    (checkpoint ``{prefix}dev-headroom``; ``None`` last). Returns the choice, the lowest
    language, the lowest-language rule and the search's JSON."""
    fixed = opt.config is not None
    searched = checkpoints.run(  # a fixed config: only the dev headroom's lowest-language rule
        f"{prefix}dev-headroom" if fixed else f"{prefix}sweep",
        lambda: dev_grid.lowest_language_rule(
            *dev_grid.headroom_pairs(
                dev_grid.headroom(model, dev, build, k_shot=k_shot, metric=opt.scoring.metric,
                                  **opt.scoring.kw())
            ),
            p_threshold=opt.grid.p_threshold,
        )
        if fixed
        else dev_grid.choose_on_dev(model, vectors, dev, grid=opt.grid, scoring=opt.scoring,
                                    pool=build, k_shot=k_shot, test_ids=test).to_json(),
    )  # fmt: skip
    if opt.config is not None:
        choice = Choice(opt.config, "both", "not measured (--config)", {}, {})
        return choice, searched["language"], searched, None
    search = DevSearch.from_json(searched, vectors.unit)
    return search.choice, search.lowest_language, search.lowest_rule, searched
