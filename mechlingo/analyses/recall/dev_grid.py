"""The choices the steering evaluation makes on dev data, and what all its steps share.

* :func:`check_disjoint` (:class:`LeakError`): no test fact id is ever used to build a vector,
  to draw a demonstration or to choose a setting; called before every stage.
* :func:`score`: the one scoring call of the dev grid, the test conditions and the transfer
  matrix (one condition, or many at once through one shared-prefix pass).
* :func:`headroom`: per language, zero-shot accuracy (the floor) and k-shot accuracy (what
  engaging recall can reach), each with a Wilson interval.
* :func:`lowest_language_rule`: the lowest-performing language by the headroom rule and by
  the literal rule (ties pooled), the one rule ``steer eval``, ``replicate`` and the reports use.
* :func:`choose_on_dev` (:class:`DevSearch`, :class:`Choice`): the dev grid (both vectors,
  every second layer, a log grid of alphas; :class:`~mechlingo.analyses.recall.settings.DevGrid`)
  scored on dev and one setting chosen only if it beats "no intervention" by an exact McNemar
  test. The grid and the rules: ``docs/methods/repair-vectors.md``."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from mechlingo.analyses.recall.settings import DevGrid, ScoringOptions
from mechlingo.analyses.recall.steering import SteeringConfig, SteeringPair
from mechlingo.core.errors import InputError, MechlingoError
from mechlingo.core.types import Model
from mechlingo.data import Fact, few_shot_prompt
from mechlingo.data.splits import hash_fraction
from mechlingo.interventions import Intervention
from mechlingo.kernels.significance import mcnemar, wilson
from mechlingo.scoring.evaluate import EvalResult, evaluate_conditions, evaluate_facts
from mechlingo.scoring.scorers import Scorer, as_scorer
from mechlingo.viz.steer import sweep_heatmap

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = [
    "HEADROOM_RULE",
    "LITERAL_RULE",
    "Choice",
    "DevSearch",
    "LeakError",
    "by_lang",
    "check_disjoint",
    "choose_on_dev",
    "few_shot_prefix",
    "headroom",
    "headroom_pairs",
    "lowest_language_dev",
    "lowest_language_rule",
    "metric_options",
    "non_english_mean",
    "outcomes",
    "score",
    "score_all",
]


class LeakError(MechlingoError, AssertionError):
    """A test fact id reached building, demonstrations or choosing."""


def check_disjoint(
    stage: str, used: Sequence[Fact] | Sequence[str], test: Sequence[Fact] | Sequence[str]
) -> None:
    """Raise :class:`LeakError` when a fact id of ``test`` is among ``used`` (facts or ids)."""
    leaked = {getattr(f, "id", f) for f in used} & {getattr(f, "id", f) for f in test}
    if leaked:
        raise LeakError(f"{len(leaked)} test fact id(s) reached {stage}: {sorted(leaked)[:5]}")


def _key(r: dict[str, Any]) -> tuple[str, str]:
    return (r["id"], r["lang"])


def outcomes(res: EvalResult, non_english: bool = True) -> list[bool]:
    """Correctness per item in a fixed (id, lang) order, non-English items only by default."""
    rows = sorted(res.records, key=_key)
    return [bool(r["correct"]) for r in rows if not non_english or r["lang"] != "en"]


def by_lang(res: EvalResult) -> dict[str, list[bool]]:
    out: dict[str, list[bool]] = {}
    for r in sorted(res.records, key=_key):
        out.setdefault(r["lang"], []).append(bool(r["correct"]))
    return out


def non_english_mean(res: EvalResult) -> float:
    """Mean over non-English languages of the per-language accuracy (``nan`` if none)."""
    acc = {lg: x for lg, x in res.accuracy().items() if lg != "en"}
    return sum(acc.values()) / len(acc) if acc else float("nan")


def score(
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


def score_all(
    model: Model,
    facts: Sequence[Fact],
    conds: Mapping[str, Intervention | None],
    *,
    store: Callable[[str, Callable[[], Any]], Any] | None = None,
    **kw: Any,
) -> dict[str, EvalResult]:
    """Every condition of ``conds`` on ``facts`` at once (:func:`score` with a mapping).

    ``store(name, fn)``, when given, keeps each condition's result (``name`` = the condition;
    it returns ``fn()`` or a stored equal result: a resumable checkpoint,
    :func:`mechlingo.analyses.recall.steer_eval.checkpointer`): the first condition that is not
    stored scores itself and every later one at once, so a fresh run makes one shared-prefix
    call and a resumed one loads what is stored."""
    if store is None:
        return score(model, facts, dict(conds), **kw)
    done: dict[str, EvalResult] = {}
    results: dict[str, EvalResult] = {}

    def fn(c: str) -> EvalResult:
        if c not in done:
            todo = {d: iv for d, iv in conds.items() if d not in results}
            done.update(score(model, facts, todo, **kw))
        return done[c]

    for c in conds:
        results[c] = store(c, lambda c=c: fn(c))
    return results


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
            zero_shot if zero_shot is not None else score(model, facts, None, metric=scorer, **kw)
        )
        few = EvalResult([])
        if kept and scorer.metric == "rank":
            few = score(model, kept, None, metric=scorer, prefixes=texts, **kw)
        elif kept:
            prompts = [t + f.prompt for t, f in zip(texts, kept, strict=True)]
            few = score(model, kept, None, metric=scorer, prompts=prompts, **kw)
    outcomes = {"zero_shot": by_lang(zero), "k_shot": by_lang(few)}
    return {
        "k": k_shot,
        **{
            name: {lg: wilson(sum(v), len(v)).to_json() for lg, v in per.items()}
            for name, per in outcomes.items()
        },
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
    zero = score(model, facts, None, metric=replace(scorer, klar_shots=0), **kw)
    if scored is not None and scorer.klar_shots == k_shot:
        return zero, scored
    few_scorer = replace(scorer, klar_shots=k_shot)
    return zero, score(model, facts, None, metric=few_scorer, pool=list(pool), **kw)


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
    return _representative(tied, {lg: few.get(lg, {}).get("estimate") for lg in tied})


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
        tests[lg] = {
            "zero_shot": sum(z) / len(z),
            "few_shot": sum(f) / len(f),
            "k": sum(z),
            **m,
            "headroom": ok,
        }
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


def metric_options(scorer: Scorer, pool: Sequence[Fact] | None) -> dict[str, Any]:
    """The scoring options of every stage: the metric, and under ``klar`` the pool its
    demonstrations come from (the build split)."""
    out: dict[str, Any] = {"metric": scorer}
    if scorer.metric == "klar" and pool is not None:
        out["pool"] = list(pool)
    return out


# --------------------------------------------------------------------------------------
# The dev grid
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
    ``lowest_language``: fixed on dev (:func:`lowest_language_rule`)."""

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
    check_disjoint("the dev sweep", dev_facts, test_ids)
    scorer = as_scorer(scoring.metric)
    kw = {**scoring.kw(), **score_kw}
    task_layers, diff_layers = grid.layers(int(model.cfg.n_layers))
    search_grid = {
        "task": (task_layers, list(grid.task_alphas)),
        "diff": (diff_layers, list(grid.diff_alphas)),
    }
    screen_ids, top_k, p_threshold = grid.screen_ids, grid.top_k, grid.p_threshold
    screen = _screen_subset(dev_facts, screen_ids) if screen_ids else dev_facts
    sw = _DevSearch(model, {**kw, **metric_options(scorer, pool)}, grid.en_tolerance)
    base_screen = sw.screen(vectors, search_grid, screen)
    results, finalists, base, both = sw.finalists(
        vectors, dev_facts, base_screen if screen is dev_facts else None, top_k
    )
    results.update(sw.pairs(finalists, both, base))
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
        metric=scorer.to_json(),
        skipped=base.skipped,
        lowest_rule=rule,
    )


def _rank(r: dict[str, Any]) -> tuple:
    """Sweep rows best first: English within tolerance, then the higher score, then the
    smaller alpha and the earlier layer."""
    return (not r["en_ok"], -r["score"], r.get("alpha", 0.0), r.get("layer", 0))


class _DevSearch:
    """The steps of :func:`choose_on_dev`; every scored setting is appended to ``rows``."""

    def __init__(self, model: Model, kw: dict[str, Any], en_tolerance: float) -> None:
        self.model = model
        self.kw = kw
        self.en_tolerance = en_tolerance
        self.rows: list[dict[str, Any]] = []

    def score(self, facts: Sequence[Fact], iv: Intervention | None) -> EvalResult:
        return score(self.model, facts, iv, **self.kw)

    def score_all(
        self, facts: Sequence[Fact], conds: dict[Any, Intervention | None]
    ) -> dict[Any, EvalResult]:
        """Every condition of ``conds`` on ``facts`` at once (:func:`score_all`)."""
        named = {str(i): iv for i, iv in enumerate(conds.values())}
        got = score_all(self.model, facts, named, **self.kw)
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
    ) -> tuple[
        dict[str, tuple[dict, EvalResult]],
        dict[str, list[dict]],
        EvalResult,
        dict[SteeringConfig, EvalResult],
    ]:
        """The best ``top_k`` screen settings of each vector re-scored on the whole dev split
        (with no intervention, unless ``base`` already holds it): ``{key: (row, result)}``,
        each vector's re-scored rows, best first, the no-intervention result, and every task
        x diff pair of those settings, both vectors applied (scored in the same call, for
        :meth:`pairs`)."""
        stacks = {"task": vectors.task, "diff": vectors.diff}
        cand = {
            name: sorted((r for r in self.rows if r["vector"] == name), key=_rank)[:top_k]
            for name in stacks
        }
        conds: dict[Any, Intervention | None] = {} if base is not None else {"base": None}
        for name, rows in cand.items():
            for j, c in enumerate(rows):
                conds[(name, j)] = stacks[name].at(c["layer"], c["alpha"])
        # the pairs stage tries every task x diff pair of these settings whatever their dev
        # order, so its conditions join this call: one prefix pass over the dev split
        for t in cand["task"]:
            for d in cand["diff"]:
                cfg = SteeringConfig(t["layer"], t["alpha"], d["layer"], d["alpha"])
                conds[("both", cfg)] = _both(vectors, cfg)
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
        both = {k[1]: v for k, v in got.items() if k[0] == "both"}
        return results, finalists, base, both

    def pairs(
        self,
        finalists: dict[str, list[dict]],
        both: dict[SteeringConfig, EvalResult],
        base: EvalResult,
    ) -> dict[str, tuple[dict, EvalResult]]:
        """The rows of every task x diff pair of finalists (``both``: their results from
        :meth:`finalists`), in the finalists' dev order."""
        results: dict[str, tuple[dict, EvalResult]] = {}
        for t in finalists["task"]:
            for d in finalists["diff"]:
                cfg = SteeringConfig(t["layer"], t["alpha"], d["layer"], d["alpha"])
                r = self.row("dev", {"vector": "both", **cfg.to_json()}, both[cfg], base)
                results[f"both:{cfg}"] = (r, both[cfg])
        return results


def _both(vectors: SteeringPair, cfg: SteeringConfig) -> Intervention:
    """Both vectors at their settings of ``cfg``."""
    return vectors.task.at(cfg.task_layer, cfg.task_alpha) + vectors.diff.at(
        cfg.diff_layer, cfg.diff_alpha
    )


def _pair_config(row: dict[str, Any]) -> SteeringConfig:
    """The setting of a ``"both"`` sweep row (both vectors' layer and alpha)."""
    return SteeringConfig(
        row["task_layer"], row["task_alpha"], row["diff_layer"], row["diff_alpha"]
    )


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
    pair = None if pair_row is None else _pair_config(pair_row)
    if best_row["vector"] == "both":
        cfg = _pair_config(best_row)
    elif pair is not None:
        cfg = pair
    else:
        cfg = SteeringConfig(t["layer"], t["alpha"], d["layer"], d["alpha"])
    if best_row["vector"] == "task":
        cfg = SteeringConfig(best_row["layer"], best_row["alpha"], cfg.diff_layer, cfg.diff_alpha)
    elif best_row["vector"] == "diff":
        cfg = SteeringConfig(cfg.task_layer, cfg.task_alpha, best_row["layer"], best_row["alpha"])
    test = mcnemar(outcomes(base), outcomes(best_res))
    found = test["p"] < p_threshold and test["fixed"] > test["broken"] and bool(best_row["en_ok"])
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
        {"none": non_english_mean(base), "selected": best_row["score"]},
        pair,
        single,
    )
