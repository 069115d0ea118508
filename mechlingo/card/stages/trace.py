"""The trace stage: greedy (or ranked) answers and the logit lens of every repair test item
(:func:`mechlingo.analyses.recall.trace.trace_recall`), the latent-English and the
recall-failure rows, and the latent curves and pipeline classes of the report."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mechlingo.analyses.recall.classes import failure_records
from mechlingo.analyses.recall.trace import trace_recall
from mechlingo.card import claims as C
from mechlingo.card.claims import LU
from mechlingo.card.clustered_tests import mean_test, paired_test
from mechlingo.card.repair_items import clustered_by, item_clusters, subject_keys
from mechlingo.card.rules import make_row
from mechlingo.card.stages.base import (
    Budget,
    Context,
    ReportLike,
    Stage,
    check,
    failed,
    heading,
)
from mechlingo.core.answers import normalize
from mechlingo.core.types import Model
from mechlingo.data import Fact
from mechlingo.viz.lens import latent_curves_figure
from mechlingo.viz.trace import class_fractions_figure

_TRACE_FIELDS = ("id", "lang", "relation", "answer", "answer_en", "correct", "class",
                 "first_en_layer", "first_answer_layer", "first_mismatch_en_layer",
                 "gold_rank", "shared_form", "continues_prompt", "echoes_subject")  # fmt: skip

if TYPE_CHECKING:
    from mechlingo.card.stages import CardSettings


def stage_trace(model: Model, facts: list[Fact], settings: CardSettings, progress: bool) -> dict:
    t = settings.budget.trace
    metric = "rank" if settings.metric == "rank" else "generate"
    tr = trace_recall(
        model, facts, max_rank=t.max_rank, max_new_tokens=t.max_new_tokens,
        batch_size=settings.batch(), progress=progress, metric=metric,
    )  # fmt: skip
    curves = tr.lens.latent_curves()
    return {
        "records": [{k: r[k] for k in _TRACE_FIELDS} for r in tr.records],
        "counts": tr.counts(),
        "latent_curves": curves.to_dict("records"),
        "n_layers": tr.n_layers,
        "max_rank": tr.max_rank,
        "mid_layers": tr.mid_layers,
        "metric": metric,
        "mismatch_rule": "another fact's English answer: the next id of the same relation",
        "subjects": subject_keys(facts),
    }


def _first(x: int, a: int) -> bool:
    """Whether an answer first decodable at layer ``x`` (-1: never) comes strictly before
    the L answer's ``a``."""
    return x >= 0 and (a < 0 or x < a)


def rows_trace(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``latent_english`` and ``recall_failures``: 0/1 shares against 1/2, clustered by
    subject (:func:`~mechlingo.card.repair_items.item_clusters` of the records' fact ids and
    the stored ``subjects``: the fact id where no subject is shared across relations; a
    result stored without ``subjects``: the subject each id names, else the fact id).

    ``latent_english`` reads the English-first share on the queries where the English or the
    L answer is decodable (distinct words, no tie); its control, the mismatched fact's
    English answer, is compared with it on one symmetric item set, the queries where the
    English, the mismatched English or the L answer is decodable (English first and
    mismatched English first each strictly before the L answer): a filter on the real
    English answer alone would select against the control."""
    recs = [r for r in data["records"] if r["lang"] != "en"]
    order, ids, real, ctl, pair_ids = [], [], [], [], []
    has_ctl = bool(recs) and all("first_mismatch_en_layer" in r for r in recs)
    for r in recs:
        if r["answer_en"] and normalize(r["answer_en"]) == normalize(r["answer"]):
            continue  # the English and the L answer are the same word: no order to see
        e, a = r["first_en_layer"], r["first_answer_layer"]
        if (e >= 0 or a >= 0) and e != a:
            order.append(float(_first(e, a)))
            ids.append(r["id"])
        m = r.get("first_mismatch_en_layer", -1)
        if has_ctl and (e >= 0 or m >= 0 or a >= 0):
            real.append(float(_first(e, a)))
            ctl.append(float(_first(m, a)))
            pair_ids.append(r["id"])
    c1 = C.LATENT_ENGLISH
    subjects = data.get("subjects")
    cl, pair_cl = item_clusters(ids, subjects), item_clusters(pair_ids, subjects)
    t1 = mean_test(order, cl, null=c1.null_value) if order else None
    vs = c = None
    missing = ("the trace records have no first_mismatch_en_layer: the mismatched-fact control "
               "(another fact's English answer under the same decoder) is missing")  # fmt: skip
    if has_ctl and order:
        c = mean_test(ctl, pair_cl, null=c1.null_value)
        vs, missing = paired_test(ctl, real, pair_cl), ""
    row1 = make_row(
        c1, t1, c, vs_control=vs, missing_control=missing or None,
        untestable=None if order else "no non-English query whose English or L answer "
        "becomes decodable (rank <= max_rank) with distinct words",
        details=f"{int(sum(order))} of {len(order)} queries: English first"
        + (f"; on the {len(real)} queries where the English, the mismatched English or the L "
           f"answer is decodable: English first {int(sum(real))}, mismatched-fact English "
           f"first {int(sum(ctl))}" if vs is not None else "")
        + f"; {clustered_by(ids, cl)}",
    )  # fmt: skip
    fails = failure_records(recs)  # the trace headline's rule: flagged answers left out
    n_flagged = len(failure_records(recs, keep_flagged=True)) - len(fails)
    n_shared = sum(r["class"] == "shared_form" for r in recs)
    rf = [float(r["class"] == "recall_failure") for r in fails]
    errors = sum(not r["correct"] for r in recs)
    c2 = C.RECALL_FAILURES
    fail_ids = [r["id"] for r in fails]
    fail_cl = item_clusters(fail_ids, subjects)
    t2 = mean_test(rf, fail_cl, null=c2.null_value) if fails else None
    row2 = make_row(
        c2, t2, untestable=None if fails else "no recall or translation failures among the "
        "non-English queries",
        details=f"of {errors} non-English errors: {int(sum(rf))} recall failures, "
        f"{len(rf) - int(sum(rf))} translation failures, "
        f"{errors - len(rf) - n_flagged - n_shared} other (wrong language or L-only)"
        + (f", {n_shared} shared forms (no translation needed)" if n_shared else "")
        + (f", {n_flagged} flagged (no attempt at the answer) left out" if n_flagged else "")
        + f"; {clustered_by(fail_ids, fail_cl)}",
    )  # fmt: skip
    return [row1, row2]


@dataclass(frozen=True)
class TraceBudget(Budget):
    """``max_new_tokens`` of the greedy answer; ``max_rank``: the lens rank at which an answer
    counts as decodable. The tracer's facts are the repair stage's test items (their classes
    split the repair rows), so their number is the repair section's ``test_per_lang``."""

    max_new_tokens: int
    max_rank: int

    def __post_init__(self) -> None:
        check(self.max_new_tokens >= 1, "trace.max_new_tokens", "must be at least 1")
        check(self.max_rank >= 1, "trace.max_rank", "must be at least 1")


QUICK = TraceBudget(max_new_tokens=8, max_rank=10)
FULL = TraceBudget(max_new_tokens=8, max_rank=10)


def run(ctx: Context) -> dict[str, Any]:
    """The trace stage's result (the records, class counts and latent curves)."""
    return stage_trace(ctx.model, ctx.lu_facts("trace"), ctx.settings, ctx.progress)


def report(rep: ReportLike, results: Mapping[str, Any]) -> None:
    """The latent-language curves and the tracer's classes per language."""
    import pandas as pd

    data = results.get("trace")
    heading(rep, "fig-latent", "Latent-language curves (logit lens)")
    if data is None or failed(rep, data, "trace"):
        return
    rep.add_figure(
        latent_curves_figure(pd.DataFrame(data["latent_curves"]), n_layers=data["n_layers"])
    )
    heading(rep, "fig-classes", "Recall pipeline classes per language (the tracer)")
    rep.add_figure(class_fractions_figure(data["counts"]))


#: The logit lens of one item, in items scored under ``rank`` (measured on the embedded model).
LENS_PER_ITEM = 1.06


def cost(settings: CardSettings, sizes: Mapping[str, Any], unit: Mapping[str, float]) -> float:
    """CPU seconds: every trace item scored under the card's metric (``rank``, else greedy)
    and read by the logit lens."""
    s = unit.get("rank", 0.0) if settings.metric == "rank" else unit.get("generate", 0.0)
    return int(sizes.get("trace_items", 0)) * (s + LENS_PER_ITEM * unit.get("rank", 0.0))


STAGE = Stage(
    name="trace",
    paper=LU,
    run=run,
    rows=(rows_trace,),
    report=report,
    section="trace",
    budget=TraceBudget,
    cost=cost,
)
