"""The repair-vector protocol: choose on dev, report on test, say how sure it is.

This is what ``mechlingo steer eval`` runs (and what a notebook can call step by step):

1. **Headroom** (:func:`headroom`): per language, zero-shot accuracy (the floor) and k-shot
   accuracy (what engaging recall can reach: the same queries after ``k`` solved
   demonstrations from the build split), each with a Wilson interval. A prompt family that
   already engages recall (tuned templates) leaves little room between the two, and a repair
   effect can only be as large as that room.
2. **Dev sweep** (:func:`choose_on_dev`): both vectors at every second layer from about 20% to about
   90% of the depth, alpha on a log grid from 0.03 to 0.6 (residual-norm units), on a
   *screen* subset of the dev facts; the best few settings of each vector are re-scored on
   the whole dev split, and the best few task x diff pairs are combined. The objective is the
   mean accuracy over the non-English languages; English is a constraint (it may not drop by
   more than ``en_tolerance``). "No intervention" is a candidate: a setting is *chosen* only
   if it beats it on the dev non-English items by an exact McNemar test at ``p < 0.1``;
   otherwise ``dev_effect`` is ``"none found"`` and test still scores the best candidate,
   labelled as such. The lowest language is fixed here, on dev, by the headroom rule
   (:func:`lowest_language_rule`): among the non-English languages whose few-shot accuracy
   beats their zero-shot accuracy (exact McNemar, ``p < 0.1``), those with the lowest
   zero-shot accuracy; the literal rule (the lowest zero-shot accuracy over the non-English
   languages) is reported next to it, with the languages excluded for lack of headroom.
   Tied languages are kept together and their test items pooled.
3. **Test** (:func:`evaluate_test`): ``orig``, ``task``, ``diff``, ``both`` and ``random``
   (norm-matched random directions at the selected candidate's places, one per seed, at least
   3 seeds); Wilson intervals per language and condition; fixed/broken counts with exact
   McNemar p against ``orig`` and against each random seed; paired bootstrap intervals of the
   non-English mean gain and of the lowest language's gain (relative where its ``orig`` > 0).

**Metrics.** Every stage scores with the same ``metric`` (``generate``, the default; ``rank``
or ``klar``, see :mod:`mechlingo.scoring.scorers`), passed to :func:`_score`. Under ``rank``
the k-shot headroom condition puts the demonstrations before the filled query sentence and
scores the query's tokens only; under ``klar``, whose prompts already carry demonstrations
(drawn from the build split, never from dev or test), headroom compares KLAR's rule with 0
demonstrations (``zero_shot``) and with ``k`` (``k_shot``).

Fact ids are split once by a hash (:func:`mechlingo.data.splits.split_facts`): no test id is
ever used to build a vector, to draw a demonstration or to choose a setting
(:func:`check_disjoint` is called before every stage; a test fails if one leaks).
"""

from __future__ import annotations

import contextlib
import json
import math
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mechlingo.analyses.recall import steering
from mechlingo.analyses.recall.steering import SteeringConfig, SteeringPair
from mechlingo.analyses.results import WritesFolder
from mechlingo.core.errors import InputError, MechlingoError
from mechlingo.core.faults import derive_seed
from mechlingo.core.stages import Stages
from mechlingo.core.types import Model
from mechlingo.data import Fact, few_shot_prompt
from mechlingo.data.splits import hash_fraction, split_facts, take_per_lang
from mechlingo.interventions import Compose, Intervention, SteeringVector, random_like
from mechlingo.kernels.significance import mcnemar, paired_gain, wilson
from mechlingo.scoring.evaluate import EvalResult, evaluate_conditions, evaluate_facts
from mechlingo.scoring.scorers import Scorer, as_scorer
from mechlingo.scoring.side_effects import SideEffects, side_effects
from mechlingo.viz.steer import accuracy_ci_figure, headroom_figure, sweep_heatmap

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = [
    "ALPHA_GRID",
    "Choice",
    "LeakError",
    "DevSearch",
    "SteerTestResult",
    "check_disjoint",
    "default_layers",
    "evaluate_test",
    "headroom",
    "lowest_language_dev",
    "lowest_language_rule",
    "headroom_pairs",
    "choose_on_dev",
    "SteerEvalResult",
    "SplitResult",
    "run_steer_eval",
    "stage_cache",
]

#: alpha grid in residual-norm units: a log scale from 0.03 to 0.6
ALPHA_GRID = (0.03, 0.063, 0.13, 0.28, 0.6)
MIN_TEST_FACTS = 30


class LeakError(MechlingoError, AssertionError):
    """A test fact id reached building, demonstrations or choosing."""


def check_disjoint(
    stage: str, used: Sequence[Fact] | Sequence[str], test: Sequence[Fact] | Sequence[str]
) -> None:
    """Raise :class:`LeakError` when a fact id of ``test`` is among ``used`` (facts or ids)."""
    leaked = {getattr(f, "id", f) for f in used} & {getattr(f, "id", f) for f in test}
    if leaked:
        raise LeakError(f"{len(leaked)} test fact id(s) reached {stage}: {sorted(leaked)[:5]}")


def default_layers(n_layers: int) -> list[int]:
    """Every second layer from about 20% to about 90% of the depth (4, 6, ..., 16 of 18)."""
    lo, hi = round(0.2 * n_layers), round(0.9 * n_layers)
    layers = list(range(lo, min(hi, n_layers - 1) + 1, 2))
    return layers or [n_layers // 2]


# --------------------------------------------------------------------------------------
# Scoring helpers
# --------------------------------------------------------------------------------------


def _key(r: dict[str, Any]) -> tuple[str, str]:
    return (r["id"], r["lang"])


def _outcomes(res: EvalResult, non_english: bool = True) -> list[bool]:
    """Correctness per item in a fixed (id, lang) order, non-English items only by default."""
    rows = sorted(res.records, key=_key)
    return [bool(r["correct"]) for r in rows if not non_english or r["lang"] != "en"]


def _by_lang(res: EvalResult) -> dict[str, list[bool]]:
    out: dict[str, list[bool]] = {}
    for r in sorted(res.records, key=_key):
        out.setdefault(r["lang"], []).append(bool(r["correct"]))
    return out


def non_english_mean(res: EvalResult) -> float:
    """Mean over non-English languages of the per-language accuracy (``nan`` if none)."""
    acc = {lg: x for lg, x in res.accuracy().items() if lg != "en"}
    return sum(acc.values()) / len(acc) if acc else float("nan")


def _score(
    model: Model,
    facts: Sequence[Fact],
    iv: Intervention | None | Mapping[str, Intervention | None],
    *,
    metric: str | Scorer = "generate",
    **kw: Any,
) -> Any:
    """Score ``facts`` under ``iv`` with ``metric``: the one scoring call of every stage
    (:func:`mechlingo.scoring.evaluate.evaluate_facts`; ``kw`` are its options). Given a
    mapping ``{name: intervention or None}``, every condition at once: ``{name:
    EvalResult}``, each equal to scoring that condition alone
    (:func:`mechlingo.scoring.evaluate.evaluate_conditions`: one shared prefix pass per batch
    of prompts)."""
    if isinstance(iv, Mapping):
        return evaluate_conditions(model, list(facts), dict(iv), metric=metric, **kw)
    return evaluate_facts(model, list(facts), intervention=iv, metric=metric, **kw)


def _score_all(
    model: Model, facts: Sequence[Fact], conds: Mapping[str, Intervention | None], **kw: Any
) -> dict[str, EvalResult]:
    """Every condition of ``conds`` on ``facts`` at once (:func:`_score` with a mapping)."""
    return _score(model, facts, dict(conds), **kw)


def few_shot_prefix(fact: Fact, pool: Sequence[Fact], k: int) -> str:
    """The demonstrations of :func:`~mechlingo.data.few_shot_prompt` without the query: the
    text placed before the query (its prompt, or under ``rank`` its filled sentence)."""
    text = few_shot_prompt(fact, pool, k=k)
    return text[: len(text) - len(fact.prompt)] if fact.prompt else text


def headroom(
    model: Model,
    facts: Sequence[Fact],
    pool: Sequence[Fact],
    *,
    k_shot: int = 3,
    zero_shot: EvalResult | None = None,
    metric: str | Scorer = "generate",
    **kw: Any,
) -> dict[str, Any]:
    """Zero-shot and ``k_shot``-shot accuracy per language with Wilson intervals, under
    ``metric`` (see the module docstring for ``rank`` and ``klar``).

    Demonstrations come from ``pool`` (the build split), never from ``facts``. Returns
    ``{"zero_shot": {lang: wilson}, "k_shot": {lang: wilson}, "k": k_shot, "results":
    {"zero_shot": EvalResult, "k_shot": EvalResult}}`` (``results`` is not JSON)."""
    facts = list(facts)
    scorer = as_scorer(metric)
    check_disjoint("few-shot demonstrations", pool, facts)
    if scorer.metric == "klar":
        zero, few = _klar_headroom(model, facts, pool, scorer, k_shot, zero_shot, kw)
    else:
        kept, texts = [], []
        for f in facts:
            try:
                texts.append(few_shot_prefix(f, pool, k_shot))
                kept.append(f)
            except ValueError:
                continue
        zero = (
            zero_shot if zero_shot is not None else _score(model, facts, None, metric=scorer, **kw)
        )
        few = EvalResult([])
        if kept and scorer.metric == "rank":
            few = _score(model, kept, None, metric=scorer, prefixes=texts, **kw)
        elif kept:
            prompts = [t + f.prompt for t, f in zip(texts, kept, strict=True)]
            few = evaluate_facts(model, kept, prompts=prompts, **kw)
    return {
        "k": k_shot,
        "zero_shot": {lg: wilson(sum(v), len(v)) for lg, v in _by_lang(zero).items()},
        "k_shot": {lg: wilson(sum(v), len(v)) for lg, v in _by_lang(few).items()},
        "results": {"zero_shot": zero, "k_shot": few},
    }


def _klar_headroom(
    model: Model,
    facts: list[Fact],
    pool: Sequence[Fact],
    scorer: Scorer,
    k_shot: int,
    scored: EvalResult | None,
    kw: dict[str, Any],
) -> tuple[EvalResult, EvalResult]:
    """KLAR's rule with no demonstrations and with ``k_shot`` from ``pool`` (``scored``, the
    objective's baseline, is reused when it has ``k_shot`` demonstrations)."""
    kw = {k: v for k, v in kw.items() if k != "pool"}
    zero = _score(model, facts, None, metric=replace(scorer, klar_shots=0), **kw)
    if scored is not None and scorer.klar_shots == k_shot:
        return zero, scored
    few_scorer = replace(scorer, klar_shots=k_shot)
    return zero, _score(model, facts, None, metric=few_scorer, pool=list(pool), **kw)


def _tied_lowest(acc: Mapping[str, tuple[int, int]]) -> list[str]:
    """The languages whose accuracy ``k / n`` is the lowest of ``acc`` (exact ties: every
    language at that accuracy), sorted by code; English and empty languages never count."""
    langs = [lg for lg, (_, n) in acc.items() if lg != "en" and n]
    if not langs:
        return []
    low = min(Fraction(acc[lg][0], acc[lg][1]) for lg in langs)
    return sorted(lg for lg in langs if Fraction(acc[lg][0], acc[lg][1]) == low)


def _representative(tied: Sequence[str], few: Mapping[str, float | None]) -> str | None:
    """One language of a tie, for display only (the lower few-shot accuracy, then the code):
    the claim is judged on every tied language's pooled items."""
    if not tied:
        return None
    return min(tied, key=lambda lg: (2.0 if few.get(lg) is None else few[lg], lg))  # type: ignore[operator]


def lowest_language_dev(zero: dict[str, dict], few: dict[str, dict]) -> str | None:
    """The literal rule on Wilson dicts (``{lang: {"k", "n", "p"}}``): the non-English
    language with the lowest dev zero-shot accuracy (of a tie, the one with the lower dev
    few-shot accuracy, then the code; :func:`lowest_language_rule` gives the whole tie).
    ``None`` when there is no non-English language. Never English, never chosen on test."""
    tied = _tied_lowest({lg: (int(w["k"]), int(w["n"])) for lg, w in zero.items()})
    return _representative(tied, {lg: few.get(lg, {}).get("p") for lg in tied})


HEADROOM_RULE = (
    "headroom rule, fixed on dev: among the non-English languages whose dev few-shot accuracy "
    "beats their zero-shot accuracy (exact McNemar, p < {p:g}, more fixed than broken), those "
    "with the lowest dev zero-shot accuracy (a tie keeps every tied language; the claim is "
    "judged on their pooled test items)"
)
LITERAL_RULE = (
    "literal rule, fixed on dev: the non-English languages with the lowest dev zero-shot "
    "accuracy (a tie keeps every tied language; the claim is judged on their pooled test items)"
)


def headroom_pairs(hr: dict[str, Any]) -> tuple[dict[str, list[bool]], dict[str, list[bool]]]:
    """Paired per-language outcomes ``(zero_shot, few_shot)`` of a :func:`headroom` result:
    the items scored both ways, in (id, lang) order."""
    res = hr["results"]
    zero = {_key(r): bool(r["correct"]) for r in res["zero_shot"].records}
    few = {_key(r): bool(r["correct"]) for r in res["k_shot"].records}
    z: dict[str, list[bool]] = {}
    f: dict[str, list[bool]] = {}
    for k in sorted(set(zero) & set(few)):
        z.setdefault(k[1], []).append(zero[k])
        f.setdefault(k[1], []).append(few[k])
    return z, f


def lowest_language_rule(
    zero: dict[str, Sequence[bool]], few: dict[str, Sequence[bool]], *, p_threshold: float = 0.1
) -> dict[str, Any]:
    """The lowest-performing language by the two rules of the card, each written once here
    and used by the protocol, ``mechlingo replicate`` and the reports.

    ``zero[lang]`` and ``few[lang]`` are paired dev outcomes (the same items zero-shot and
    few-shot). A language has *headroom* when its few-shot accuracy beats its zero-shot
    accuracy by an exact McNemar test (more fixed than broken, ``p < p_threshold``): only
    there can a vector that does what the demonstrations do show a gain.

    Returns ``languages`` (the headroom rule: the non-English languages with headroom and
    the lowest dev zero-shot accuracy; several when tied, empty when none has headroom),
    ``literal_languages`` (the literal rule, the paper's wording: the non-English languages
    with the lowest dev zero-shot accuracy), ``language`` and ``literal`` (one of each tie
    for display: the lower few-shot accuracy, then the code; ``None`` when empty),
    ``excluded`` (the non-English languages without headroom), ``tests`` (per language:
    zero-shot and few-shot accuracy, n, fixed, broken, p, ``headroom``), ``rule`` and
    ``literal_rule`` (the rules in words).

    Raises:
        InputError: outcomes that are not paired or empty.
    """
    tests: dict[str, dict[str, Any]] = {}
    for lg in sorted(zero):
        z, f = list(zero[lg]), list(few.get(lg, []))
        if not z or len(z) != len(f):
            raise InputError(f"{lg}: zero-shot and few-shot outcomes must be paired and non-empty")
        m = mcnemar(z, f)
        ok = m["fixed"] > m["broken"] and m["p"] < p_threshold
        tests[lg] = {"zero_shot": sum(z) / len(z), "few_shot": sum(f) / len(f), "k": sum(z),
                     **m, "headroom": ok}  # fmt: skip
    counts = {lg: (t["k"], t["n"]) for lg, t in tests.items()}
    fs = {lg: t["few_shot"] for lg, t in tests.items()}
    literal = _tied_lowest(counts)
    head = _tied_lowest({lg: c for lg, c in counts.items() if tests[lg]["headroom"]})
    return {
        "language": _representative(head, fs),
        "languages": head,
        "literal": _representative(literal, fs),
        "literal_languages": literal,
        "excluded": [lg for lg in tests if lg != "en" and not tests[lg]["headroom"]],
        "tests": tests,
        "p_threshold": p_threshold,
        "rule": HEADROOM_RULE.format(p=p_threshold),
        "literal_rule": LITERAL_RULE,
    }


# --------------------------------------------------------------------------------------
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config.to_dict(),
            "selected": self.selected,
            "dev_effect": self.dev_effect,
            "dev_test": self.dev_test,
            "dev_score": self.dev_score,
            "pair": None if self.pair is None else self.pair.to_dict(),
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
    ``lowest_language``: fixed on dev (:func:`lowest_language_dev`)."""

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

    def to_dict(self) -> dict[str, Any]:
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
            **self.choice.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], unit: str) -> DevSearch:
        """The inverse of :meth:`to_dict` (``unit``: the vectors' unit, not stored there)."""
        pair = None if d.get("pair") is None else SteeringConfig(**d["pair"])
        choice = Choice(
            SteeringConfig(**d["config"]), d["selected"], d["dev_effect"], d["dev_test"],
            d["dev_score"], pair, d.get("best_single"),
        )  # fmt: skip
        return cls(
            rows=list(d["rows"]), baseline=d["dev_baseline"], choice=choice,
            lowest_language=d["lowest_language"], headroom=d["headroom"], unit=unit,
            n_dev=d["n_dev_items"], n_screen=d["n_screen_items"], metric=d["metric"],
            skipped=d["skipped"], lowest_rule=d.get("lowest_language_rule") or {},
        )  # fmt: skip

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
    task_layers: Sequence[int] | None = None,
    diff_layers: Sequence[int] | None = None,
    task_alphas: Sequence[float] = ALPHA_GRID,
    diff_alphas: Sequence[float] = ALPHA_GRID,
    top_k: int = 3,
    screen_ids: int | None = 8,
    en_tolerance: float = 0.05,
    p_threshold: float = 0.1,
    pool: Sequence[Fact] | None = None,
    k_shot: int = 3,
    test_ids: Sequence[Fact] = (),
    max_new_tokens: int = 6,
    batch_size: int = 64,
    progress: bool = False,
    metric: str | Scorer = "generate",
    **score_kw: Any,
) -> DevSearch:
    """The dev stage of the protocol (see the module docstring).

    Args:
        dev_facts: every selected language, English included (its accuracy is the
            constraint).
        task_layers, diff_layers, task_alphas, diff_alphas: the grid of each vector (default
            for both: :func:`default_layers` and :data:`ALPHA_GRID`).
        top_k: settings of each vector re-scored on the whole dev split; their best
            ``top_k`` x ``top_k`` pairs are scored as ``both``.
        screen_ids: fact ids (x every language) of the screen subset that scores the whole
            grid (``None``: the whole dev split).
        en_tolerance: largest allowed drop of English accuracy against no intervention.
        p_threshold: a candidate is chosen only if it beats no intervention with exact
            McNemar ``p`` below this, on the dev non-English items.
        pool: the build split, for the few-shot headroom on dev (and the tie-break of the
            lowest language); ``None`` skips it.
        test_ids: the test facts, only to check that none is used here.
        metric: how every setting is scored (see the module docstring); under ``klar`` the
            demonstrations come from ``pool`` (the dev facts themselves without one).
        **score_kw: passed to every scoring call.
    """
    dev_facts = list(dev_facts)
    check_disjoint("the dev sweep", dev_facts, test_ids)
    scorer = as_scorer(metric)
    kw = {"max_new_tokens": max_new_tokens, "batch_size": batch_size, "progress": progress,
          **score_kw}  # fmt: skip
    n_layers = int(model.cfg.n_layers)
    grid = {
        "task": (list(task_layers or default_layers(n_layers)), list(task_alphas)),
        "diff": (list(diff_layers or default_layers(n_layers)), list(diff_alphas)),
    }
    screen = _screen_subset(dev_facts, screen_ids) if screen_ids else dev_facts
    sw = _DevSearch(model, {**kw, **_metric_kw(scorer, pool)}, en_tolerance)
    base_screen = sw.screen(vectors, grid, screen)
    results, finalists, base = sw.finalists(
        vectors, dev_facts, base_screen if screen is dev_facts else None, top_k
    )
    results.update(sw.pairs(vectors, finalists, dev_facts, base))
    choice = _choose(results, finalists, base, p_threshold)
    hr: dict[str, Any] = {}
    rule: dict[str, Any] = {}
    if pool is not None:
        hr = headroom(model, dev_facts, pool, k_shot=k_shot, zero_shot=base, metric=scorer, **kw)
        rule = lowest_language_rule(*headroom_pairs(hr), p_threshold=p_threshold)
    return DevSearch(
        sw.rows,
        base.accuracy(),
        choice,
        rule.get("language"),
        hr,
        vectors.unit,
        n_dev=len(dev_facts),
        n_screen=len(screen),
        metric=scorer.to_dict(),
        skipped=base.skipped,
        lowest_rule=rule,
    )


def _metric_kw(scorer: Scorer, pool: Sequence[Fact] | None) -> dict[str, Any]:
    """The scoring options of every stage: the metric, and under ``klar`` the pool its
    demonstrations come from (the build split)."""
    out: dict[str, Any] = {"metric": scorer}
    if scorer.metric == "klar" and pool is not None:
        out["pool"] = list(pool)
    return out


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
        return _score(self.model, facts, iv, **self.kw)

    def score_all(
        self, facts: Sequence[Fact], conds: dict[Any, Intervention | None]
    ) -> dict[Any, EvalResult]:
        """Every condition of ``conds`` on ``facts`` at once (:func:`_score_all`)."""
        named = {str(i): iv for i, iv in enumerate(conds.values())}
        got = _score_all(self.model, facts, named, **self.kw)
        return {key: got[str(i)] for i, key in enumerate(conds)}

    def row(self, stage: str, setting: dict[str, Any], res: EvalResult, ref: EvalResult) -> dict:
        """Record one setting's scores (``en_ok``: English within tolerance of ``ref``)."""
        en, en0 = _en(res), _en(ref)
        ok = en is None or en0 is None or en >= en0 - self.en_tolerance - 1e-9
        r = {"stage": stage, **setting, "score": non_english_mean(res), "en": en, "en_ok": ok}
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
            r = self.row("dev", {"vector": "both", **cfg.to_dict()}, got[i], base)
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
    test = mcnemar(_outcomes(base), _outcomes(best_res))
    found = test["p"] < p_threshold and test["fixed"] > test["broken"] and bool(best_row["en_ok"])
    pair = None
    if pair_row is not None:
        pair = SteeringConfig(pair_row["task_layer"], pair_row["task_alpha"],
                              pair_row["diff_layer"], pair_row["diff_alpha"])  # fmt: skip
    single = min((v for v in ("task", "diff") if finalists.get(v)),
                 key=lambda v: _rank(finalists[v][0]), default=None)  # fmt: skip
    return Choice(
        cfg,
        best_row["vector"],
        "found" if found else "none found",
        {**test, "threshold": p_threshold, "candidate": best_key},
        {"none": non_english_mean(base), "selected": best_row["score"]},
        pair,
        single,
    )


# --------------------------------------------------------------------------------------
# Test
# --------------------------------------------------------------------------------------


def _random_of(
    vectors: SteeringPair, cfg: SteeringConfig, selected: str, seed: int
) -> Intervention:
    parts = []
    if selected in ("task", "both"):
        v = vectors.task.at(cfg.task_layer, cfg.task_alpha)
        parts.append(
            SteeringVector(
                random_like(v.direction(), derive_seed(seed, "task")),
                cfg.task_layer,
                cfg.task_alpha,
            )
        )
    if selected in ("diff", "both"):
        v = vectors.diff.at(cfg.diff_layer, cfg.diff_alpha)
        parts.append(
            SteeringVector(
                random_like(v.direction(), derive_seed(seed, "diff")),
                cfg.diff_layer,
                cfg.diff_alpha,
            )
        )
    return Compose(parts)


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
        o_all = _outcomes(orig)
        sel = self.choice.selected if self.choice.selected in self.results else "both"
        out: dict[str, Any] = {
            "accuracy": self.accuracy(),
            "intervals": {
                c: {lg: wilson(sum(v), len(v)) for lg, v in _by_lang(r).items()}
                for c, r in self.results.items()
            },
            "non_english_mean": {c: non_english_mean(r) for c, r in self.results.items()},
            "selected": sel,
            "dev_effect": self.choice.dev_effect,
            "config": self.choice.config.to_dict(),
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
            o = _outcomes(r)
            vs_orig[c] = mcnemar(o_all, o)
            gains[c] = paired_gain(o_all, o)
            if not c.startswith("random_s"):
                vs_random[c] = {rc: mcnemar(_outcomes(self.results[rc]), o) for rc in randoms}
        out["mcnemar_vs_orig"] = vs_orig
        out["mcnemar_vs_random"] = vs_random
        out["non_english_gain"] = gains
        out.update(self._lowest_summary())
        hr = {k: v for k, v in self.headroom.items() if k != "results"}
        out["headroom"] = hr
        n = {lg: len(v) for lg, v in _by_lang(orig).items()}
        out["n_test_facts"] = n
        out["warnings"] = [
            f"{lg}: only {k} test facts (fewer than {MIN_TEST_FACTS}); intervals are wide"
            for lg, k in n.items()
            if k < MIN_TEST_FACTS
        ]
        return _json_safe(out)

    def _gains_in(self, langs: str | Sequence[str] | None) -> dict[str, Any]:
        """Per condition, the paired gain over ``orig`` on the pooled items of ``langs``."""
        langs = [langs] if isinstance(langs, str) else list(langs or [])
        if not langs:
            return {}
        by = {c: _by_lang(r) for c, r in self.results.items()}
        base = [x for lg in langs for x in by["orig"].get(lg, [])]
        return {
            c: paired_gain(base, [x for lg in langs for x in v.get(lg, [])])
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
            head[name] = {"language": "+".join(langs) or None, "languages": langs,
                          "both": g.get(both), "best_single": g.get(single)}  # fmt: skip
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
    seeds: Sequence[int] = (0, 1, 2),
    max_new_tokens: int = 6,
    batch_size: int = 64,
    progress: bool = False,
    metric: str | Scorer = "generate",
    cache: Callable[[str, Callable[[], Any]], Any] | None = None,
    **score_kw: Any,
) -> SteerTestResult:
    """Score every condition on ``test_facts`` with ``metric`` (see the module docstring),
    and the test headroom (zero-shot vs k-shot with demonstrations from ``pool``).
    ``lowest_rule`` is :func:`lowest_language_rule` on dev (its literal-rule language is
    reported too); when dev chose a pair other than ``choice.config``, ``both_pair`` scores
    both vectors at that pair (the headline condition).

    ``cache(name, fn)``, when given, runs each condition's scoring (``name`` = the condition)
    and the headroom (``"headroom"``) and returns ``fn()`` or a stored equal result (a
    resumable stage, :class:`mechlingo.core.stages.Stages`; the CLI's ``--resume``).

    Raises:
        InputError: no seed, or ``klar`` without a ``pool`` (its demonstrations would be
            test facts)."""
    if len(seeds) < 1:
        raise InputError("give at least one random-control seed")
    scorer = as_scorer(metric)
    if scorer.metric == "klar" and pool is None:
        raise InputError(
            "klar on test needs pool= (the build split): its demonstrations may not be test facts"
        )
    kw = {"max_new_tokens": max_new_tokens, "batch_size": batch_size, "progress": progress,
          **score_kw}  # fmt: skip
    cfg = choice.config
    task = vectors.task.at(cfg.task_layer, cfg.task_alpha)
    diff = vectors.diff.at(cfg.diff_layer, cfg.diff_alpha)
    conds: dict[str, Intervention | None] = {
        "orig": None,
        "task": task,
        "diff": diff,
        "both": task + diff,
    }
    if choice.pair is not None and choice.pair != cfg:
        conds["both_pair"] = vectors.task.at(choice.pair.task_layer, choice.pair.task_alpha) + (
            vectors.diff.at(choice.pair.diff_layer, choice.pair.diff_alpha)
        )
    sel = choice.selected if choice.selected in ("task", "diff", "both") else "both"
    for s in seeds:
        conds[f"random_s{s}"] = _random_of(vectors, cfg, sel, int(s))
    mkw = _metric_kw(scorer, pool)
    results = _score_conditions(
        cache or (lambda name, fn: fn()), conds, lambda todo: _score_all(
            model, test_facts, todo, **kw, **mkw)
    )  # fmt: skip
    run = cache or (lambda name, fn: fn())
    hr: dict[str, Any] = {}
    if pool is not None:
        hr = run("headroom", lambda: headroom(
            model, test_facts, pool, k_shot=k_shot, zero_shot=results["orig"], metric=scorer, **kw
        ))  # fmt: skip
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


def _score_conditions(
    run: Callable[[str, Callable[[], Any]], Any],
    conds: dict[str, Intervention | None],
    score_all: Callable[[dict[str, Intervention | None]], dict[str, EvalResult]],
) -> dict[str, EvalResult]:
    """Every condition through the stage cache ``run``: the first condition that is not
    stored scores itself and every later one at once (``score_all``), so a fresh run makes
    one shared-prefix call and a resumed one loads what is stored."""
    done: dict[str, EvalResult] = {}
    results: dict[str, EvalResult] = {}

    def fn(c: str) -> EvalResult:
        if c not in done:
            todo = [d for d in conds if d not in results]
            done.update(score_all({d: conds[d] for d in todo}))
        return done[c]

    for c in conds:
        results[c] = run(c, lambda c=c: fn(c))
    return results


def condition_interventions(result: SteerTestResult) -> dict[str, Intervention | None]:
    """The intervention of every condition of a :class:`SteerTestResult`."""
    return dict(result.interventions)


def _json_safe(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, np.generic):
        return _json_safe(x.item())
    return x


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
                "gain": _r(g.get("gain")),
                "95% CI": f"[{_r(g.get('lo'))}, {_r(g.get('hi'))}]",
                "fixed/broken": f"{m['fixed']}/{m['broken']}",
                "McNemar p": f"{m['p']:.3g}",
                f"gain in {low}": _r(lg.get("gain")),
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
        batch_size: int = 64,
        progress: bool = False,
        stages: Stages | None = None,
    ) -> SideEffects:
        """Side effects of the selected test condition (``both`` when none was chosen) on its
        test facts and ``lines`` (per language), against a norm-matched random control
        (:func:`mechlingo.scoring.side_effects.side_effects`, seed 0); the stage
        ``side-effects`` of ``stages``. Sets and returns :attr:`side_effects`."""
        test = self.test
        iv = condition_interventions(test)[
            test.choice.selected if test.choice.selected != "none" else "both"
        ]

        def measure() -> dict[str, Any]:
            return side_effects(model, iv, test.facts, lines, control="random", seed=0,
                                batch_size=batch_size, progress=progress).to_json()  # fmt: skip

        with _stages_or_temp(stages) as st:
            d = st.run("side-effects", measure)
        self.side_effects = SideEffects(
            rows=d["rows"], langs=d["langs"], meta=d["meta"], examples=d["examples"]
        )
        return self.side_effects


@contextlib.contextmanager
def _stages_or_temp(stages: Stages | None) -> Iterator[Stages]:
    """``stages``, or stages in a temporary folder removed afterwards: every result goes
    through the same store either way, so a run with and without ``--work`` is the same."""
    if stages is not None:
        yield stages
        return
    with tempfile.TemporaryDirectory(prefix="mechlingo-protocol-") as tmp:
        yield Stages(tmp, {"temporary": True})


def _eval_to_json(res: EvalResult | dict[str, Any]) -> dict[str, Any]:
    if isinstance(res, EvalResult):
        return {"eval": {"records": res.records, "meta": res.meta, "skipped": res.skipped}}
    return {"dict": {k: v for k, v in res.items() if k != "results"}}  # headroom


def _eval_from_json(data: Mapping[str, Any]) -> Any:
    if "eval" in data:
        return EvalResult(**data["eval"])
    return data["dict"]


def stage_cache(stages: Stages, prefix: str) -> Callable[[str, Callable[[], Any]], Any]:
    """The ``cache`` of :func:`evaluate_test`: each test condition (and the test headroom)
    is the stage ``{prefix}{name}`` of ``stages``."""

    def run(name: str, fn: Callable[[], Any]) -> Any:
        return _eval_from_json(stages.run(f"{prefix}{name}", lambda: _eval_to_json(fn())))

    return run


def _staged_vectors(
    stages: Stages, name: str, build: Callable[[], SteeringPair], model: Model
) -> SteeringPair:
    """Repair vectors built once (``build()``), saved in stage ``name`` and loaded from there."""

    def fn(tmp: Path) -> dict[str, Any]:
        build().save(tmp / "vectors", model)
        return {"saved": "vectors"}

    stages.run(name, fn, folder=True)
    return SteeringPair.load(stages.path(name) / "vectors", model)


@dataclass(frozen=True)
class _Settings:
    """The settings of :func:`run_steer_eval` every split shares."""

    dev_per_lang: int | None
    test_per_lang: int | None
    config: SteeringConfig | None
    grid: dict[str, Any]
    p_threshold: float
    seeds: list[int]
    score: dict[str, Any]


def run_steer_eval(
    model: Model,
    facts: Sequence[Fact],
    vectors: SteeringPair,
    *,
    fractions: Sequence[float] = (0.4, 0.2, 0.4),
    salt: str = "",
    repeats: int = 1,
    dev_per_lang: int | None = None,
    test_per_lang: int | None = None,
    config: SteeringConfig | None = None,
    task_layers: Sequence[int] | None = None,
    diff_layers: Sequence[int] | None = None,
    task_alphas: Sequence[float] = ALPHA_GRID,
    diff_alphas: Sequence[float] = ALPHA_GRID,
    top_k: int = 3,
    screen_ids: int | None = 8,
    en_tolerance: float = 0.05,
    p_threshold: float = 0.1,
    seeds: Sequence[int] = (0, 1, 2),
    max_new_tokens: int = 6,
    batch_size: int = 64,
    progress: bool = False,
    metric: str | Scorer = "generate",
    stages: Stages | None = None,
) -> SteerEvalResult:
    """The repair protocol end to end, as ``mechlingo steer eval`` runs it.

    The facts are split by id (:func:`mechlingo.data.splits.split_facts` with ``fractions``
    and ``salt``; at most ``dev_per_lang``/``test_per_lang`` ids per relation on dev and
    test). On dev, :func:`choose_on_dev` searches the grid (``task_layers`` ... ``top_k``,
    ``screen_ids``: see there) and fixes the lowest language; with ``config`` the search is
    skipped (labelled as not chosen on dev) and only the dev headroom fixes the lowest
    language. On test, :func:`evaluate_test` scores every condition with random controls of
    ``seeds``. ``repeats`` > 1 re-splits with the salts ``{salt}#repeat{r}`` and rebuilds the
    vectors each time, with ``vectors``' build settings (``vectors`` themselves serve the first
    split only).

    ``stages`` (:class:`mechlingo.core.stages.Stages`) keeps every finished step so that a
    stopped run resumes (the CLI's ``--work``/``--resume``); without it they are kept in a
    temporary folder, so the numbers are those of the CLI. Side effects and the transfer
    matrix are added afterwards (:meth:`SteerEvalResult.add_side_effects`,
    :func:`mechlingo.analyses.recall.transfer.transfer_matrices`).

    Raises:
        InputError: ``repeats`` < 1, no seed, or a split that is empty.
        LeakError: the vectors' recorded build ids overlap dev or test.
    """
    if repeats < 1:
        raise InputError(f"repeats must be at least 1, got {repeats}")
    if not seeds:
        raise InputError("give at least one random-control seed (3 or more advised)")
    grid = {"task_layers": task_layers, "diff_layers": diff_layers, "task_alphas": task_alphas,
            "diff_alphas": diff_alphas, "top_k": top_k, "screen_ids": screen_ids or None,
            "en_tolerance": en_tolerance}  # fmt: skip
    score = {"max_new_tokens": max_new_tokens, "batch_size": batch_size, "progress": progress,
             "metric": as_scorer(metric)}  # fmt: skip
    settings = _Settings(dev_per_lang, test_per_lang, config, grid, p_threshold,
                         [int(s) for s in seeds], score)  # fmt: skip
    splits = []
    with _stages_or_temp(stages) as st:
        for r in range(repeats):
            split_salt = salt if r == 0 else f"{salt}#repeat{r}"
            splits.append(_one_split(model, facts, tuple(fractions), split_salt, vectors,
                                     r > 0, settings, st, f"r{r}-"))  # fmt: skip
    return SteerEvalResult(splits)


def _one_split(
    model: Model, facts: Sequence[Fact], fractions: tuple, salt: str,
    given: SteeringPair, rebuild: bool, opt: _Settings, stages: Stages, prefix: str,
) -> SplitResult:  # fmt: skip
    """Choose on dev and score on test for one split of the facts, with the ``given``
    vectors or (``rebuild``: a re-split) vectors rebuilt on this split's build facts with the
    given vectors' build settings (k-shot, unit, zero-shot subtraction, translation shots);
    each step a stage named ``{prefix}build``, ``{prefix}sweep``... of ``stages``."""

    parts = split_facts(facts, fractions, salt=salt)
    build = parts["build"]
    dev = take_per_lang(parts["dev"], opt.dev_per_lang)
    test = take_per_lang(parts["test"], opt.test_per_lang)
    if not test or not dev or not build:
        raise InputError("a split is empty (build, dev or test)",
                         fix="use more facts (--limit) or other fractions (--split)")  # fmt: skip
    built = given.build
    k_shot = int(built.get("k_shot", 3))
    vectors = given
    if rebuild:
        vectors = _staged_vectors(stages, f"{prefix}build", lambda: steering.build_steering_vectors(
            model, build, k_shot=k_shot, unit=str(built.get("unit", "resid")),
            subtract_zero_shot=bool(built.get("subtract_zero_shot", True)),
            translation_shots=int(built.get("translation_shots", 0)),
            batch_size=opt.score["batch_size"],
        ), model)  # fmt: skip
    notes = []
    if "fact_ids" in vectors.build:
        check_disjoint("building the vectors", vectors.build["fact_ids"], test)
        check_disjoint("building the vectors", vectors.build["fact_ids"], dev)
    else:
        notes.append(
            "the vectors record no build fact ids: their disjointness from test is unchecked"
        )
    check_disjoint("the few-shot demonstrations", build, test)
    search, searched = None, None
    if opt.config is not None:
        rule = stages.run(f"{prefix}dev-headroom", lambda: lowest_language_rule(
            *headroom_pairs(headroom(model, dev, build, k_shot=k_shot, **opt.score)),
            p_threshold=opt.p_threshold,
        ))  # fmt: skip
        lowest = rule["language"]
        choice = Choice(opt.config, "both", "not measured (--config)", {}, {})
    else:
        searched = stages.run(f"{prefix}sweep", lambda: choose_on_dev(
            model, vectors, dev, pool=build, k_shot=k_shot, test_ids=test, **opt.grid,
            p_threshold=opt.p_threshold, **opt.score,
        ).to_dict())  # fmt: skip
        search = DevSearch.from_dict(searched, vectors.unit)
        choice, lowest, rule = search.choice, search.lowest_language, search.lowest_rule
    test_res = evaluate_test(
        model, vectors, choice, test, lowest_language=lowest, lowest_rule=rule, pool=build,
        k_shot=k_shot, seeds=opt.seeds, cache=stage_cache(stages, f"{prefix}test-"), **opt.score,
    )  # fmt: skip
    summary = test_res.summary()
    summary["warnings"] = summary.get("warnings", []) + notes
    summary["split"] = {"fractions": list(fractions), "salt": salt,
                        "n_ids": {k: len({f.id for f in v}) for k, v in
                                  (("build", build), ("dev", dev), ("test", test))}}  # fmt: skip
    if searched is not None:
        summary["sweep"] = searched
    return SplitResult(summary, test_res, search)
