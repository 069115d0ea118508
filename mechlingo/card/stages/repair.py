"""The repair stage: the two vectors of Lu et al. built on the build split, then ``steer eval``
(the dev search, and test with a population of norm-matched random vectors per condition:
random task, random diff, random both), and the rows of its test items: the two vectors, the lowest language (literal and headroom rules), the
random-vector null, the English gap, consistency, the own failure class and both against the
better single vector. Each item stores its fact id, and the result the subject of each fact
(``subjects``); the rows cluster the items by subject (one fact in several languages, and the
facts of several relations on one subject, are one cluster; the fact id where no subject is
shared across relations) and read only the stored result."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from mechlingo.analyses.recall import steer_eval, steering
from mechlingo.analyses.recall.settings import (
    BuildSettings,
    DevGrid,
    ScoringOptions,
    SplitSettings,
)
from mechlingo.card import claims as C
from mechlingo.card.claims import LU, Claim
from mechlingo.card.clustered_tests import (
    Test,
    cluster_bootstrap,
    group_difference_test,
    paired_test,
)
from mechlingo.card.population import pool_controls
from mechlingo.card.repair_items import (
    cluster_note,
    clustered_by,
    condition_outcomes,
    item_clusters,
    item_records,
    subject_keys,
)
from mechlingo.card.rules import make_row
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
from mechlingo.card.stages.data import repair_split, vector_facts
from mechlingo.card.stages.repair_controls import (  # noqa: F401  (the stage's rows, re-exported)
    OUTCOME_NAMES,
    outcome_key,
    repair_floor,
    rows_lowest,
    rows_repair,
)
from mechlingo.core.checkpoints import Checkpoints
from mechlingo.core.defaults import PROGRESS
from mechlingo.core.errors import InputError
from mechlingo.core.sites import layers_at
from mechlingo.core.types import Model
from mechlingo.data import Fact
from mechlingo.scoring.scorers import rankc_fact
from mechlingo.viz.steer import accuracy_ci_figure, headroom_figure

if TYPE_CHECKING:
    from mechlingo.card.stages import CardSettings


def repair_settings(
    settings: CardSettings, n_layers: int, progress: bool = PROGRESS
) -> tuple[BuildSettings, DevGrid, ScoringOptions]:
    """The repair stage's settings from a budget (section ``repair``, :class:`RepairBudget`)
    for a model of ``n_layers``: how the vectors are built, the dev grid and how items are
    scored; what a budget leaves out takes the settings classes' defaults."""
    r = settings.budget.repair
    return (r.build_settings(settings), r.grid(n_layers),
            r.scoring(settings, r.max_new_tokens, progress))  # fmt: skip


def stage_repair(model: Model, facts: list[Fact], settings: CardSettings, progress: bool) -> dict:
    """``steer build`` + ``steer eval`` on the repair facts: the vectors built on the build
    split with the budget's build settings, then
    :func:`mechlingo.analyses.recall.steer_eval.run_steer_eval` (the call of ``steer eval``)
    with its split, dev grid and scoring (:func:`repair_settings`)."""
    r = settings.budget.repair
    build, dev, test = repair_split(facts, settings)
    if not (build and dev and test):
        raise InputError(
            "a split of the repair facts is empty (build, dev or test)",
            fix="give more facts (a larger budget or more ids per relation)",
        )
    build_settings, grid, scoring = repair_settings(settings, int(model.cfg.n_layers), progress)
    on = vector_facts(build, settings)  # the demonstrations' pool stays the whole build part
    vectors = steering.build_steering_vectors(model, on, build_settings, progress=progress)
    options = steer_eval.SteerEvalOptions(split=r.split_settings(), grid=grid, scoring=scoring,
                                          seeds=tuple(r.seeds), controls="each")  # fmt: skip
    run = steer_eval.run_steer_eval(model, facts, vectors, options)
    res, sw = run.test, run.search
    if sw is None:  # a dev search runs whenever no config is fixed
        raise RuntimeError("the repair stage ran no dev search")
    sweep = sw.to_json()
    per = condition_outcomes(res.results, facts)
    pool = [("pool", build)] if len(on) < len(build) else []  # the demonstrations' ids
    n_ids = {k: len({f.id for f in v})
             for k, v in (("build", on), *pool, ("dev", dev), ("test", test))}  # fmt: skip
    return {
        "summary": res.summary(),
        "sweep": {k: v for k, v in sweep.items() if k != "rows"},
        "sweep_rows": [x for x in sweep["rows"] if x["stage"] == "dev"],
        "lowest": sw.lowest_rule,
        **per,
        "random_draws": len(r.seeds),
        "populations": steer_eval.population_names(
            res.choice.selected, "both_pair" in res.results, "each"
        ),
        "p_floor": 1 / (len(r.seeds) + 1),
        "subjects": subject_keys(facts),
        "items": item_records(res.results),
        "n_ids": n_ids,
    }


def trace_classes(checkpoints: Checkpoints) -> dict[str, Any]:
    """``{"classes": {"<id>|<lang>": tracer class}}`` of the finished trace stage (the repair
    test items on the unsteered model), or ``{}`` when it did not finish."""
    if not checkpoints.done("trace"):
        return {}
    recs = checkpoints.load("trace")["records"]
    return {"classes": {f"{r['id']}|{r['lang']}": r["class"] for r in recs}}


def paired_values(items: Mapping[str, list[dict]], a: str, b: str, key: str = "correct",
            non_english: bool = True, langs: list | None = None,
            ) -> tuple[list[float], list[float], list[str]]:  # fmt: skip
    """Values of ``key`` of conditions ``a`` and ``b`` on their common items, with fact ids
    (and each item's language appended to ``langs`` when given)."""
    ib = {(r["id"], r["lang"]): r for r in items[b]}
    base, new, ids = [], [], []
    for r in items[a]:
        other = ib.get((r["id"], r["lang"]))
        if other is None or (non_english and r["lang"] == "en"):
            continue
        if r.get(key) is None or other.get(key) is None:
            continue
        base.append(float(r[key]))
        new.append(float(other[key]))
        ids.append(r["id"])
        if langs is not None:
            langs.append(r["lang"])
    return base, new, ids


def logprob_gain(items: Mapping[str, list[dict]], cond: str,
                 langs: Sequence[str] | None = None,
                 subjects: Mapping[str, str] | None = None) -> Test | None:  # fmt: skip
    """The paired, subject-clustered gain of the gold log-share of ``cond`` over ``orig`` on
    the non-English items (only those of ``langs`` when given); rank only (``None``
    otherwise). Random conditions are pooled over seeds first. ``subjects``:
    :func:`~mechlingo.card.repair_items.item_clusters`' (``{}``: by fact id)."""
    if not items.get("orig") or items["orig"][0].get("logshare") is None:
        return None
    if langs is not None:
        keep = set(langs)
        items = {c: [r for r in v if r["lang"] in keep] for c, v in items.items()}
        if not items["orig"]:
            return None
    if cond == "random":
        seeds = [c for c in items if c.startswith("random_s")]
        runs = [paired_values(items, "orig", s, "logshare") for s in seeds]
        if not runs:
            return None
        base, _, ids = runs[0]
        return paired_test(base, pool_controls([r[1] for r in runs]), item_clusters(ids, subjects))
    if cond not in items:
        return None
    base, new, ids = paired_values(items, "orig", cond, "logshare")
    return paired_test(base, new, item_clusters(ids, subjects)) if base else None


def _row_gap(items: Mapping[str, list[dict]],
             subjects: Mapping[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """English minus each other language on the same facts (test, no intervention)."""
    en = {r["id"]: float(r["correct"]) for r in items["orig"] if r["lang"] == "en"}
    pairs = [(float(r["correct"]), en[r["id"]], r["id"]) for r in items["orig"]
             if r["lang"] != "en" and r["id"] in en]  # fmt: skip
    claim = C.ENGLISH_GAP
    if not pairs:
        return make_row(claim, None, untestable="no test fact in English and another language")
    base, new, ids = (list(x) for x in zip(*pairs, strict=True))
    cl = item_clusters(ids, subjects)
    t = paired_test(base, new, cl)
    return make_row(claim, t, details=f"English accuracy {np.mean(new):.3f} vs the others' "
                    f"{np.mean(base):.3f} on the same {len(set(ids))} facts"
                    + cluster_note(ids, cl))  # fmt: skip


def _consistency_values(items: Mapping[str, list[dict]], cond: str) -> tuple[dict, str]:
    """Per (fact, language) consistency with English under ``cond``: RankC of the two
    rankings (rank), else agreement terms for CLC (``(both right, either right)``)."""
    recs = items[cond]
    en = {r["id"]: r for r in recs if r["lang"] == "en"}
    out: dict[tuple[str, str], Any] = {}
    ranked = bool(recs) and recs[0].get("ranking") is not None
    for r in recs:
        e = en.get(r["id"])
        if r["lang"] == "en" or e is None:
            continue
        if ranked:
            if len(r["ranking"]) == len(e["ranking"]):
                out[(r["id"], r["lang"])] = rankc_fact(e["ranking"], r["ranking"])
        else:
            out[(r["id"], r["lang"])] = (float(r["correct"] and e["correct"]),
                                         float(r["correct"] or e["correct"]))  # fmt: skip
    return out, "RankC" if ranked else "CLC"


def _clc(m: np.ndarray) -> float:
    """CLC of ``[item, (both right, either right)]`` rows: a ratio of sums."""
    s = m.sum(0)
    return float(s[0] / max(s[1], 1e-12))


def _clc_null(m: np.ndarray, arm: int) -> float:
    """The CLC that independent correctness gives at the rows' per-language accuracies
    (columns 4 + 2 arm: the L item right, 5 + 2 arm: English right, 8: the language code):
    sum of p_L p_en over the sum of p_L + p_en - p_L p_en."""
    num = den = 0.0
    for lg in np.unique(m[:, 8]):
        sub = m[m[:, 8] == lg]
        pl, pe = float(sub[:, 4 + 2 * arm].mean()), float(sub[:, 5 + 2 * arm].mean())
        num += len(sub) * pl * pe
        den += len(sub) * (pl + pe - pl * pe)
    return num / den if den > 0 else 0.0


def clc_excess(m: np.ndarray) -> float:
    """The CLC gain (post - pre) minus the gain that the accuracies alone give (a null model
    of independent correctness at the observed per-language accuracies before and after)."""
    return _clc(m[:, 2:4]) - _clc(m[:, :2]) - (_clc_null(m, 1) - _clc_null(m, 0))


def _clc_table(items: Mapping[str, list[dict]], both: str, keys: Sequence[tuple]) -> np.ndarray:
    """``[item, 9]``: (both right, either right) before and after, the L item and English
    right before and after, and the language's code, for the (fact, language) ``keys``."""

    def right(cond: str) -> dict[tuple[str, str], float]:
        return {(r["id"], r["lang"]): float(r["correct"]) for r in items[cond]}

    pre, post = right("orig"), right(both)
    codes = {lg: i for i, lg in enumerate(sorted({k[1] for k in keys}))}
    rows = []
    for fid, lg in keys:
        a, b, ea, eb = pre[(fid, lg)], post[(fid, lg)], pre[(fid, "en")], post[(fid, "en")]
        rows.append([a * ea, max(a, ea), b * eb, max(b, eb), a, ea, b, eb, codes[lg]])
    return np.array(rows, dtype=float)


def row_consistency(items: Mapping[str, list[dict]], both: str,
                    subjects: Mapping[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """The consistency row: the gain of consistency with English under ``both`` (RankC per
    fact and language under ``rank``, else the CLC change beyond what accuracy alone gives)."""
    claim = C.CONSISTENCY
    pre, name = _consistency_values(items, "orig")
    post, _ = _consistency_values(items, both)
    keys = sorted(set(pre) & set(post))
    if not keys:
        return make_row(claim, None, untestable="no test fact scored in English and another "
                        "language under both conditions")  # fmt: skip
    ids = [k[0] for k in keys]
    if name == "RankC":
        return _rankc_net(claim, items, both, keys, pre, post, subjects)
    else:
        a = _clc_table(items, both, keys)
        cl = item_clusters(ids, subjects)
        t = cluster_bootstrap(a, cl, clc_excess, method="CLC (Jaccard with English) after "
                              "minus before, minus the change accuracy alone gives")  # fmt: skip
        txt = (f"CLC (Jaccard of the right answers with English's) change "
               f"{_clc(a[:, 2:4]) - _clc(a[:, :2]):+.3f}, of which accuracy "
               f"alone (independent answers) {_clc_null(a, 1) - _clc_null(a, 0):+.3f}")  # fmt: skip
    return make_row(claim, t, details=f"{name}: {txt}; 'both' vs no intervention on "
                    f"{len(set(ids))} test facts{cluster_note(ids, cl)}",
                    extra={"consistency": name})  # fmt: skip


def _rankc_net(claim: Claim, items: Mapping[str, list[dict]], both: str,
               keys: Sequence[tuple[str, str]], pre: Mapping[tuple[str, str], float],
               post: Mapping[tuple[str, str], float],
               subjects: Mapping[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """The RankC change net of accuracy: the paired RankC change on the (fact, language)
    items whose correctness in L and in English is the same before and after (an item that
    became right moves its ranking toward English's by that alone); the raw change beside."""

    def right(cond: str) -> dict[tuple[str, str], bool]:
        return {(r["id"], r["lang"]): bool(r["correct"]) for r in items[cond]}

    a, b = right("orig"), right(both)
    same = [k for k in keys if a.get(k) == b.get(k) and a.get((k[0], "en")) == b.get((k[0], "en"))]  # fmt: skip
    raw = np.mean([post[k] for k in keys]) - np.mean([pre[k] for k in keys])
    txt = (f"RankC with English {np.mean([pre[k] for k in keys]):.3f} -> "
           f"{np.mean([post[k] for k in keys]):.3f} (raw change {raw:+.3f} on {len(keys)} "
           f"items); net of accuracy: the {len(same)} items whose correctness in L and in "
           "English does not change")  # fmt: skip
    extra = {"consistency": "RankC"}
    if not same:
        why = "every item's correctness changes: no consistency change net of accuracy"
        return make_row(claim, None, untestable=why, details=txt, extra=extra)
    ids = [k[0] for k in same]
    cl = item_clusters(ids, subjects)
    t = paired_test([pre[k] for k in same], [post[k] for k in same], cl)
    return make_row(claim, t, details=f"{txt}; 'both' vs no intervention{cluster_note(ids, cl)}",
                    extra=extra)  # fmt: skip


def _row_own_failure(items: Mapping[str, list[dict]], classes: Mapping[str, str] | None,
                     claim: Claim, cond: str, rival: str, own: str, other: str,
                     subjects: Mapping[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """A difference in differences: ``cond``'s gain minus the ``rival`` vector's gain on the
    ``own`` failure class, minus the same on the ``other`` class (classes from the tracer on
    the unsteered model, test items; CR2 by subject). A class that every vector fixes alike
    (the fixable items) shows no difference."""
    if not classes:
        return make_row(claim, None, untestable="no tracer classes of the test items (the "
                        "trace stage did not run on them)")  # fmt: skip
    langs: list[str] = []
    base, new, ids = paired_values(items, "orig", cond, langs=langs)
    _, rv, rid = paired_values(items, "orig", rival)
    if rid != ids:
        return make_row(claim, None, untestable=f"'{cond}' and '{rival}' are not scored on the "
                        "same test items")  # fmt: skip
    groups = [classes.get(f"{i}|{lg}") for i, lg in zip(ids, langs, strict=True)]
    n_own, n_other = groups.count(own), groups.count(other)
    if n_own < 2 or n_other < 2:
        return make_row(claim, None, untestable=f"too few test items of each class ({own}: "
                        f"{n_own}, {other}: {n_other}; at least 2 each)")  # fmt: skip
    diff = [a - b for a, b in zip(new, rv, strict=True)]  # cond's gain minus the rival's
    cl = item_clusters(ids, subjects)
    t = group_difference_test(diff, groups, cl, own, other)

    def gain(x: Sequence[float], cls: str) -> float:
        return float(np.mean([b - a for a, b, c in zip(base, x, groups, strict=True) if c == cls]))

    return make_row(claim, t, details=f"gain on {n_own} {own} items: {cond} "
                    f"{gain(new, own):+.3f}, {rival} {gain(rv, own):+.3f}; on {n_other} {other} "
                    f"items: {cond} {gain(new, other):+.3f}, {rival} {gain(rv, other):+.3f}; "
                    f"difference in differences, {clustered_by(ids, cl)}")  # fmt: skip


def _row_both_better(items: Mapping[str, list[dict]], best_single: str | None, both: str,
                     subjects: Mapping[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    claim = C.BOTH_BEAT_SINGLE
    single = best_single if best_single in ("task", "diff") else "task"
    base, new, ids = paired_values(items, single, both)
    if not base:
        return make_row(claim, None, untestable="no test items")
    cl = item_clusters(ids, subjects)
    t = paired_test(base, new, cl)
    lp = None
    if items["orig"] and items["orig"][0].get("logshare") is not None:
        b2, n2, i2 = paired_values(items, single, both, "logshare")
        lp = paired_test(b2, n2, item_clusters(i2, subjects))
    return make_row(claim, t, details=f"'{both}' vs the better single vector on dev "
                    f"('{single}'){cluster_note(ids, cl)}", extra=logprob_extra(lp))  # fmt: skip


def logprob_extra(t: Test | None) -> dict[str, Any]:
    return {} if t is None else {"logprob_gain": t.to_json()}


def rows_repair_extra(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The further rows of the repair stage (baseline gap, consistency, own failure classes,
    both vs the better one) from its stored ``items`` (and ``classes``)."""
    items = data.get("items")
    if not items:
        raise InputError("the repair result has no per-item records (an old stage result)")
    both = "both_pair" if "both_pair" in items else "both"
    classes = data.get("classes")
    sweep = data.get("sweep") or {}
    subjects = data.get("subjects")
    return [
        _row_gap(items, subjects),
        row_consistency(items, both, subjects),
        _row_own_failure(items, classes, C.TASK_REPAIRS_RECALL, "task", "diff",
                         "recall_failure", "translation_failure", subjects),
        _row_both_better(items, sweep.get("best_single"), both, subjects),
    ]  # fmt: skip


def attach_logprob(rows: list[dict[str, Any]], data: Mapping[str, Any]) -> None:
    """Under ``rank``, add the gold log-share gain (``logprob_gain``) to the accuracy rows of
    the repair stage in place: task, diff, random, and both in the lowest language's rows
    (their ``langs``)."""
    items = data.get("items") or {}
    both = "both_pair" if "both_pair" in items else "both"
    for row in rows:
        cond = {"task_vector": "task", "diff_vector": "diff", "random_vector": "random",
                "lowest_language": both}.get(row.get("id", ""))  # fmt: skip
        langs = row.get("langs") if row.get("id") == "lowest_language" else None
        if row.get("id") == "lowest_language" and not langs:
            continue
        t = logprob_gain(items, cond, langs, data.get("subjects")) if cond else None
        if t is not None:
            row["logprob_gain"] = t.to_json()
            row["details"] = (row.get("details") or "") + (
                f"; gold log-share gain {t.estimate.format(3, signed=True)}"
            )


def rows_repair_all(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    rows = rows_repair(data)
    attach_logprob(rows, data)
    return rows


_NAMES = {"task": "the recall-engagement (task) vector", "diff": "the back-translation (diff) "
          "vector", "both": "both vectors together"}  # fmt: skip


def config_sentence(summary: Mapping[str, Any], n_ids: Mapping[str, Any] | None = None) -> str:
    """What dev chose, in words: ``"Dev chose both vectors together (better than no
    intervention on dev): the task vector at layer 12 with alpha 0.28 and the back-translation
    vector at layer 12 with alpha 0.13 (residual-norm units) ..."``."""
    c = summary.get("config") or {}
    sel = summary.get("selected", "?")
    unit = summary.get("alpha_unit", "resid")
    unit_txt = "residual-norm units" if unit == "resid" else f"{unit} units"
    effect = summary.get("dev_effect", "")
    head = f"Dev chose {_NAMES.get(sel, repr(sel))}"
    head += f" ({effect} on dev)" if effect else ""
    parts = [
        f"the task vector at layer {c.get('task_layer')} with alpha {c.get('task_alpha')}",
        f"the back-translation vector at layer {c.get('diff_layer')} with alpha "
        f"{c.get('diff_alpha')}",
    ]
    ids = ""
    if n_ids:
        ids = (f"; built on {n_ids.get('build')} fact ids, chosen on {n_ids.get('dev')}, "
               f"tested on {n_ids.get('test')}")  # fmt: skip
    metric = (summary.get("metric") or {}).get("metric", "generate")
    return f"{head}: {parts[0]} and {parts[1]} ({unit_txt}); scored by {metric}{ids}."


@dataclass(frozen=True)
class RepairBudget(Budget):
    """The repair stage's split (build, dev, test fractions of the fact ids), the per-language
    caps of dev and test and of the build ids the vectors are built on (``build_per_lang``,
    ``None``: all; the few-shot demonstrations come from every build id), the build settings
    (``k_shot``, ``translation_shots``), the dev grid (``layer_fractions`` of the model's
    depth, ``alphas``, ``top_k``, ``screen_ids``), the random population's ``seeds`` (one
    norm-matched random vector each) and the answers' ``max_new_tokens``."""

    split: tuple[float, float, float]
    dev_per_lang: int | None
    test_per_lang: int | None
    k_shot: int
    translation_shots: int
    layer_fractions: tuple[float, ...] | None
    alphas: tuple[float, ...]
    top_k: int
    screen_ids: int
    seeds: tuple[int, ...]
    max_new_tokens: int
    build_per_lang: int | None = None

    def __post_init__(self) -> None:
        check(len(self.split) == 3 and all(x >= 0 for x in self.split)
              and abs(sum(self.split) - 1) < 1e-6, "repair.split",
              "must be three fractions (build, dev, test) that sum to 1")  # fmt: skip
        for name in ("dev_per_lang", "test_per_lang", "build_per_lang"):
            v = getattr(self, name)
            check(v is None or v >= 1, f"repair.{name}", "must be at least 1 (or null)")
        check(self.layer_fractions is None or all(0 <= x <= 1 for x in self.layer_fractions),
              "repair.layer_fractions", "must lie in [0, 1]")  # fmt: skip
        check(len(self.alphas) > 0, "repair.alphas", "must not be empty")
        check(len(self.seeds) > 0, "repair.seeds", "must name at least one random draw")
        for name in ("k_shot", "top_k", "screen_ids", "max_new_tokens"):
            check(getattr(self, name) >= 1, f"repair.{name}", "must be at least 1")
        check(self.translation_shots >= 0, "repair.translation_shots", "must be at least 0")

    def split_settings(self) -> SplitSettings:
        """The split (its fractions, the caps per language shared by the relations): what
        :func:`~mechlingo.card.stages.data.repair_split` and ``steer eval`` both use."""
        return SplitSettings(self.split, "", self.dev_per_lang, self.test_per_lang, shared=True)

    def build_settings(self, settings: CardSettings) -> BuildSettings:
        """How the vectors are built (the few-shot and translation prompts)."""
        return BuildSettings(k_shot=self.k_shot, translation_shots=self.translation_shots,
                             batch_size=settings.batch(BuildSettings.batch_size))  # fmt: skip

    def grid(self, n_layers: int) -> DevGrid:
        """The dev grid: ``layer_fractions`` as layers of a model of ``n_layers``
        (:func:`~mechlingo.core.sites.layers_at`, both vectors), the scales, the ``top_k``."""
        fr = self.layer_fractions
        layers = None if fr is None else tuple(layers_at(list(fr), n_layers))
        return DevGrid(task_layers=layers, diff_layers=layers, task_alphas=self.alphas,
                       diff_alphas=self.alphas, top_k=self.top_k,
                       screen_ids=self.screen_ids)  # fmt: skip

    @staticmethod
    def scoring(settings: CardSettings, max_new_tokens: int,
                progress: bool = PROGRESS) -> ScoringOptions:  # fmt: skip
        """How items are scored under the card's metric."""
        return ScoringOptions(metric=settings.metric, max_new_tokens=max_new_tokens,
                              batch_size=settings.batch(ScoringOptions.batch_size),
                              progress=progress)  # fmt: skip


QUICK = RepairBudget(
    split=(0.4, 0.2, 0.4), dev_per_lang=10, test_per_lang=20, k_shot=3, translation_shots=2,
    layer_fractions=(0.5, 0.67), alphas=(0.13, 0.28), top_k=1, screen_ids=4,
    seeds=(0, 1, 2, 3, 4), max_new_tokens=6, build_per_lang=20,
)  # fmt: skip
FULL = RepairBudget(
    split=(0.4, 0.2, 0.4), dev_per_lang=16, test_per_lang=40, k_shot=3, translation_shots=2,
    layer_fractions=(0.33, 0.5, 0.67, 0.83), alphas=(0.13, 0.28), top_k=2, screen_ids=6,
    seeds=tuple(range(20)), max_new_tokens=6,
)  # fmt: skip


def run(ctx: Context) -> dict[str, Any]:
    """The repair stage's result, with the tracer's classes of its test items when the trace
    stage finished."""
    out = stage_repair(ctx.model, ctx.lu_facts("repair"), ctx.settings, ctx.progress)
    return {**out, **trace_classes(ctx.checkpoints)}


def report(rep: ReportLike, results: Mapping[str, Any]) -> None:
    """The repair vectors on test, the headroom and the lowest-performing language."""
    data = results.get("repair")
    heading(rep, "fig-repair", "Repair vectors on test (Wilson 95% intervals)")
    if data is None or failed(rep, data, "repair"):
        return
    s = data["summary"]
    rep.add_text(config_sentence(s, data.get("n_ids")))
    per_condition = ("random_task_s", "random_diff_s", "random_both_s")  # the rows give them
    rep.add_figure(accuracy_ci_figure({c: v for c, v in s["intervals"].items()
                                       if not c.startswith(per_condition)}))  # fmt: skip
    heading(rep, "fig-headroom", "Headroom and the lowest-performing language")
    low = data["lowest"]
    rep.add_text(
        f"Literal rule ({low['literal_rule']}) -> {'+'.join(low['literal_languages']) or 'none'}. "
        f"Headroom rule ({low['rule']}) -> {'+'.join(low['languages']) or 'none'}. The card "
        "judges the claim on each rule's languages (tied languages pooled), relative and in points."
    )
    rep.add_table([{"lang": lg, **t} for lg, t in low["tests"].items()])
    if s.get("headroom"):
        rep.add_figure(headroom_figure(s["headroom"]))


#: Measured CPU seconds of the repair stage's scoring over its scored items x conditions x
#: the card's per-item seconds (the shared prompt prefixes make a condition cheaper than an
#: item), and of building over its build items x the per-item seconds: fitted on a measured
#: quick card (docs/benchmarks.md, "Timings behind the card's cost model").
REPAIR_FACTOR = 0.667
#: Random populations the repair stage scores on test: one per condition (task, diff, both).
POPULATIONS = 3
BUILD_FACTOR = 1.44


def cost(settings: CardSettings, sizes: Mapping[str, Any], unit: Mapping[str, float]) -> float:
    """CPU seconds: the test items under every condition (orig, task, diff, both, each draw of
    the three random populations (task, diff, both), the format control and the two lenient
    readings), the dev items under the grid
    (both vectors at every layer and scale, then the ``top_k`` pairs), and the build items'
    prompts (few-shot, zero-shot and translation: :data:`BUILD_FACTOR` scored items each)."""
    r = settings.budget.repair
    langs = len(settings.budget.lu_langs)

    def items(key: str, ids: str, cap: int | None) -> int:
        per = min(int(sizes.get(ids, 0)), int(cap or 10**9))
        return int(sizes.get(key, per * langs))

    test = items("test_items", "test_ids", r.test_per_lang)
    dev = items("dev_items", "dev_ids", r.dev_per_lang)
    build = items("build_items", "test_ids", r.build_per_lang)  # build ~ test fraction
    grid = 2 * len(r.layer_fractions or (0,)) * len(r.alphas) + 2 * r.top_k**2
    scored = test * (4 + POPULATIONS * len(r.seeds) + 3) + dev * grid
    return (REPAIR_FACTOR * scored + BUILD_FACTOR * build) * scoring_seconds(settings, unit)


STAGE = Stage(
    name="repair",
    paper=LU,
    needs=("trace",),
    run=run,
    rows=(rows_repair_all, rows_repair_extra),
    report=report,
    section="repair",
    budget=RepairBudget,
    cost=cost,
)
