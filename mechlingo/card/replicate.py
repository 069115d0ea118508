"""``replicate``: the papers' claims checked on one model, in one call.

:func:`replicate` runs the stages of :mod:`mechlingo.card.stages` (one module per stage:
trace, repair, the two transfer matrices, decoders, conversion, external, experts and align,
each with its typed budget section, its row builders and its report section), in the order
their declared needs give, after the metric stage (the metric rule decides on dev) and the
planner.

Each stage's result is stored (JSON, atomically) in a work folder under a key made of the
model's fingerprint, the data and the settings (:class:`mechlingo.core.checkpoints.Checkpoints`): a rerun
reuses checkpoints, and a stopped run resumes after the last finished one. A stage that
fails becomes the rows of its claims, each carrying the error; the other stages still run.
The rows are computed from the stored results only, so a resumed run gives the same card as
an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from mechlingo.analyses.experts.align import embed_parallel
from mechlingo.card import stages as card_stages
from mechlingo.card.metric_rule import METRIC_RULE
from mechlingo.card.plan import Plan, annotate_rows, plan_card
from mechlingo.card.rules import (
    LU,
    SUNDAR,
    ClaimsCard,
    error_row,
    finalize,
)
from mechlingo.card.stages import (
    BUDGETS,
    BUDGETS_HASH,
    BY_NAME,
    PAPERS,
    CardSettings,
    budget_settings,
    circuits,
    estimate_seconds,
)
from mechlingo.card.stages.base import Context, Stage, run_order
from mechlingo.card.stages.data import (
    bundled_texts,
    cap_facts,
    external_facts,
    lu_facts,
    repair_split,
    scope_of,
    vector_facts,
)
from mechlingo.core.checkpoints import Checkpoints
from mechlingo.core.defaults import PROGRESS
from mechlingo.core.describe import model_info
from mechlingo.core.distributed import dist_info, is_main
from mechlingo.core.errors import InputError
from mechlingo.core.types import Model
from mechlingo.core.version import __version__
from mechlingo.data import Fact
from mechlingo.data.natural_parallel import split_by_documents
from mechlingo.scoring.scorers import METRICS

__all__ = [
    "BUDGETS",
    "BUDGETS_HASH",
    "PAPERS",
    "STAGES",
    "CardData",
    "CardOptions",
    "budget_settings",
    "cap_facts",
    "claim_rows",
    "replicate",
]

#: Bumped when a stage computes or stores something different: old stored results are not
#: reused.
#: 7: the align stage stores its per-sentence means under ``intervals.measures``;
#: 6: a random population per condition (repair, external), a population of random draws
#: per transfer cell, gold shares in the transfer cells;
#: 5: a user's facts scoped by the budget (languages, transfer relations, shared caps);
#: 4: the clamp measured against a population of random clamps, the align stage's details of
#: every random-neuron draw;
#: 3: the metric stage, gold share and lenient outcomes, random populations, documents;
#: 2: fact ids per outcome, per-item transfer outcomes, the clamp measured on
#: fresh samples, AUROC tests at the clamp's k, per-sentence alignment values.
STAGE_VERSION = 7
#: Every stage's name, each paper's in run order (the metric stage first).
STAGES = (*PAPERS[LU], *PAPERS[SUNDAR])


def _hash(obj: Any) -> str:
    text = json.dumps(obj, sort_keys=True, ensure_ascii=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def weights_fingerprint(model: Model) -> str:
    """A short hash of every parameter's name, shape and a strided sample of its values: two
    models that share an unembedding (tied embeddings, a fine-tune of the blocks) still differ.
    """
    h = hashlib.sha256()
    named = getattr(model, "named_parameters", None)
    for name, p in named() if callable(named) else []:
        flat = p.detach().reshape(-1)
        sample = flat[:: max(1, flat.numel() // 256)][:256].float().cpu().contiguous()
        h.update(f"{name}{tuple(p.shape)}".encode())
        h.update(sample.numpy().tobytes())
    return h.hexdigest()[:16]


def _facts_hash(facts: Sequence[Fact] | None) -> str | None:
    return None if facts is None else _hash([dataclasses.asdict(f) for f in facts])


def claim_rows(stages: Mapping[str, Any], papers: Sequence[str]) -> list[dict[str, Any]]:
    """Every claim's rows of ``papers`` from the stages' stored results (``{"error": ...}``
    for a failed stage), in the order of :func:`~mechlingo.card.stages.card_claims` (a claim
    judged in several readings has one row per reading, each with its ``variant``), after
    :func:`~mechlingo.card.rules.finalize` (each family adjusted, then the verdicts). A
    row builder that fails on a result also becomes an error row (the claims of its stage
    not built yet; the other builders of the stage keep theirs)."""
    built: dict[str, list[dict[str, Any]]] = {}
    for stage in card_stages.STAGES:
        data = stages.get(stage.name)
        if data is None or "error" in data:
            continue
        for fn in stage.rows:
            try:
                for row in fn(data):
                    built.setdefault(row["id"], []).append(row)
            except Exception as err:  # a result this code cannot read: the rows say so
                for c in stage.claims:
                    if c.id not in built:
                        built[c.id] = [error_row(c, f"reading the {stage.name} result: {err!r}")]
    rows = []
    for c in card_stages.card_claims():
        if c.paper not in papers:
            continue
        if c.id in built:
            rows += built[c.id]
        else:
            err = (stages.get(c.stage) or {}).get("error", "the stage did not run")
            rows.append(error_row(c, err))
    return finalize(rows)


# --------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------


def _papers(paper: str) -> list[str]:
    if paper == "all":
        return [LU, SUNDAR]
    if paper not in PAPERS:
        raise InputError(f"paper must be one of {[*PAPERS, 'all']}, got {paper!r}")
    return [paper]


@dataclass(frozen=True)
class CardOptions:
    """What :func:`replicate` checks and how (its defaults are these), checked when made.

    Attributes:
        paper: ``"lu2025"``, ``"sundar2025"`` or ``"all"``.
        budget: ``"quick"`` (about 10 minutes on the embedded model on 2 CPU cores) or
            ``"full"`` (about 45); the sample sizes of :data:`BUDGETS`.
        settings: overrides of the budget's settings (:func:`budget_settings`).
        metric: how the Lu stages score facts: ``None`` (the default): the metric rule
            decides on dev before any test item is scored
            (:mod:`mechlingo.card.metric_rule`: greedy generation above its floor, candidate
            ranking otherwise); ``"generate"``, ``"rank"`` (P@1 of candidate ranking;
            bundled facts get BMLAMA-style candidates) or ``"klar"`` override the rule, and
            the card says so (``claims.json["metric_decision"]``).
    """

    paper: str = "all"
    budget: str = "quick"
    settings: Mapping[str, Any] | None = None
    metric: str | None = None

    def __post_init__(self) -> None:
        _papers(self.paper)
        if self.metric is not None and self.metric not in METRICS:
            raise InputError(f"metric must be one of {list(METRICS)}, got {self.metric!r}")


@dataclass(frozen=True)
class CardData:
    """The data :func:`replicate` checks the claims on (``None``: the bundled data).

    Attributes:
        facts: the facts of the Lu stages (default: the bundled natural stems); a
            benchmark's facts (:func:`mechlingo.data.load_benchmark`) run the same families,
            with ``CardOptions(metric=...)`` its own metric (what ``--facts DIR`` does).
        parallel: ``{lang: [sentence, ...]}`` line-aligned, for the Sundar stages (default:
            the bundled parallel sentences).
        documents: the document id of every ``parallel`` line (the split never cuts a
            document; alignment rows resample documents).
        external: a benchmark's facts for the external-transfer rows (vectors and settings
            chosen on ``facts``, applied unchanged), scored with ``external_metric``.
    """

    facts: Sequence[Fact] | None = None
    parallel: Mapping[str, Sequence[str]] | None = None
    documents: Sequence[str] | None = None
    external: Sequence[Fact] | None = None
    external_metric: str = "rank"

    def __post_init__(self) -> None:
        if self.external_metric not in METRICS:
            raise InputError(
                f"external_metric must be one of {list(METRICS)}, got {self.external_metric!r}"
            )


def _run_stage(checkpoints: Checkpoints, stage: Stage, ctx: Context) -> tuple:
    """``(result or {"error": ...}, {"seconds", "cpu_seconds"}, cached)``; only ``Exception`` is caught (Ctrl-C
    and SIGTERM stop the run; checkpoints stay stored)."""
    cached = checkpoints.done(stage.name)
    t0, c0 = time.perf_counter(), time.process_time()
    fn: Callable[..., Any] = (lambda tmp: stage.run(ctx, tmp)) if stage.folder else (
        lambda: stage.run(ctx))  # fmt: skip
    try:
        data = checkpoints.run(stage.name, fn, folder=stage.folder)
    except Exception as err:
        tb = traceback.format_exception_only(type(err), err)[-1].strip()
        data = {"error": tb}
    secs = {"seconds": round(time.perf_counter() - t0, 1),
            "cpu_seconds": round(time.process_time() - c0, 1)}  # fmt: skip
    return data, secs, cached


def replicate(
    model: Model,
    options: CardOptions | None = None,
    data: CardData | None = None,
    *,
    work: str | Path | None = None,
    progress: bool = PROGRESS,
    fresh: bool = False,
    agree: Callable[[bool], bool] | None = None,
    plan: bool = False,
) -> ClaimsCard | Plan:
    """Check the papers' claims on ``model``: one row per claim with the paper's number,
    mechlingo's number (n, 95% interval), a verdict by a fixed rule and the figure.

    Args:
        model: a TransformerLens model.
        options: the paper, budget, settings and metric (:class:`CardOptions`; its defaults
            when ``None``).
        data: the facts, parallel sentences, their documents and an external benchmark
            (:class:`CardData`; ``None``: the bundled data).
        work: the work folder where checkpoints are kept (a rerun with the same model,
            data and settings reuses them; a stopped run resumes). ``None``: a temporary
            folder, removed at the end.
        progress: show a progress bar over the stages and each analysis's own bars.
        fresh: remove checkpoints of this key first (start over).
        agree: under torchrun, how the ranks agree that a stage is finished everywhere
            (:func:`mechlingo.cli.work.all_ranks_have`); each rank then keeps its own stages.
        plan: only plan (:func:`mechlingo.card.plan.plan_card`): score the dev split, print
            and return the :class:`~mechlingo.card.plan.Plan` (the data and draws each
            primary row needs, the CPU time); no test item is scored. A normal run prints the
            plan's time estimate before it starts and stores the plan in the card.

    Returns:
        A :class:`ReplicationCard` (``plan=False``) or a :class:`~mechlingo.card.plan.Plan`.
    """
    opt = CardOptions() if options is None else options
    d = CardData() if data is None else data
    facts, parallel, documents, external = d.facts, d.parallel, d.documents, d.external
    budget, metric, papers = opt.budget, opt.metric, _papers(opt.paper)
    cfg = budget_settings(budget, {**dict(opt.settings or {}), "metric": metric or "rule"})
    key = {
        "model": {**model_info(model), "weights_fingerprint": weights_fingerprint(model)},
        "data": {"facts": _facts_hash(facts), "parallel": None if parallel is None else
                 _hash([parallel, documents]),
                 "external": None if external is None else [_facts_hash(external),
                                                            d.external_metric]},
        "settings": cfg, "stage_version": STAGE_VERSION,
    }  # fmt: skip
    tmp = None if work is not None else tempfile.mkdtemp(prefix="mechlingo-replicate-")
    if agree is not None:
        key["rank"] = [dist_info().rank, dist_info().world_size]
    store = Checkpoints(work if work is not None else tmp, key, agree=agree)  # type: ignore[arg-type]
    if fresh:
        store.clear()
    ext = None if external is None else (list(external), d.external_metric)
    ctx = Context(model, facts, parallel, CardSettings.of(cfg), store, progress, ext, documents)
    try:
        results: dict[str, Any] = {}
        timing: dict[str, Any] = {}
        decision, order = None, run_order(BY_NAME, [s for p in papers for s in PAPERS[p]])
        for name in (n for n in order if BY_NAME[n].decides):  # the metric stage: before the plan
            results[name], timing[name], decision = _decide(store, BY_NAME[name], ctx, cfg, metric)
        cost = {}
        if SUNDAR in papers:
            cost = store.run("embed_cost", lambda: _embed_cost(ctx))
        if "metric" in results:  # measured seconds: the plan's, not a result (they vary)
            results["metric"] = dict(results["metric"])
            cost = {**results["metric"].pop("seconds_per_item", {}), **cost}
        settings = ctx.settings  # under the metric the rule chose
        avail = _available(d, settings, papers, key, results.get("metric"))
        the_plan = plan_card(settings, papers, results.get("metric"), avail, cost,
                             estimate_seconds(settings, papers, avail, cost))  # fmt: skip
        if plan:
            if is_main():  # under torchrun every rank has the plan; one prints it
                print(f"{the_plan}{_per_process()}")
            return the_plan
        if is_main() and facts is not None and LU in papers:
            sc = scope_of(facts, settings)
            if sc["left_out_langs"]:
                print(f"replicate: the {budget} budget reads {len(sc['lu_langs'])} of your "
                      f"facts' {len(sc['lu_langs']) + len(sc['left_out_langs'])} languages "
                      f"({', '.join(sc['lu_langs'])}); choose them with --settings "
                      """'{"lu_langs": [...]}'""")  # fmt: skip
        if is_main():
            print(f"replicate: the planner's estimate for this card: {the_plan.card_minutes:.1f} "
                  f"CPU-minutes{_per_process()} (see the plan in claims.json)")  # fmt: skip
        names = [n for n in order if n not in results]
        bar = tqdm(names, desc="replicate", disable=not progress, unit="stage")
        for name in bar:
            bar.set_postfix_str(name)
            results[name], secs, cached = _run_stage(store, BY_NAME[name], ctx)
            timing[name] = {**secs, "cached": cached, "error": results[name].get("error")}
        rows = annotate_rows(claim_rows(results, papers), the_plan)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    meta = {"model": key["model"]["model_name"], "budget": budget, "papers": papers,
            "rules_hash": card_stages.card_rules_hash(), "budgets_hash": card_stages.BUDGETS_HASH,
            "mechlingo": __version__, "settings": cfg, "stages": timing,
            "work": None if work is None else str(store.folder),
            "metric_rule": METRIC_RULE, "metric_decision": decision,
            "plan": the_plan.to_json(),
            "facts_scope": None if facts is None else scope_of(facts, settings)}  # fmt: skip
    return ReplicationCard(rows, results, meta)


def _per_process() -> str:
    """Under torchrun, what the estimate counts: the per-item seconds are measured on this
    process's share of the metric and embedding passes, and every stage shares its scoring,
    lens reads, k-curve arms and embedding batches out, so the estimate is per process."""
    world = dist_info().world_size
    return f", per process of {world} under torchrun" if world > 1 else ""


class ReplicationCard(ClaimsCard):
    """A :class:`~mechlingo.card.rules.ClaimsCard` whose ``claims.json`` also opens with the
    metric rule, its decision (with its inputs) and the power plan (from ``meta``)."""

    def to_json(self) -> dict[str, Any]:
        """``claims.json``: the metric rule and decision, the plan, then the card's JSON."""
        top = {k: self.meta[k] for k in ("metric_rule", "metric_decision", "plan")
               if self.meta.get(k) is not None}  # fmt: skip
        return {**top, **super().to_json()}


def _decide(checkpoints: Checkpoints, stage: Stage, ctx: Context, cfg: dict[str, Any],
            given: str | None) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:  # fmt: skip
    """A stage that ``decides`` (the metric stage: dev scored both ways, stored like any
    stage) and its decision; ``cfg["metric"]`` (and the context's settings' metric) becomes
    the card's metric."""
    data, secs, cached = _run_stage(checkpoints, stage, ctx)
    secs = {**secs, "cached": cached, "error": data.get("error")}
    assert stage.decides is not None
    decision = stage.decides(data, given)
    cfg["metric"] = decision["metric"]
    ctx.settings = ctx.settings.with_metric(decision["metric"])
    return data, secs, decision


def _available(d: CardData, settings: CardSettings, papers: Sequence[str],
               key: Mapping[str, Any], metric_data: Mapping[str, Any] | None) -> dict[str, Any]:  # fmt: skip
    """:func:`_data_available` of the card's data ``d``, and under ``circuits`` (a Lu card)
    the pools and found rates the circuits stage's cost counts its facts by
    (:func:`mechlingo.card.stages.circuits.plan_sizes`: from the model the card's ``key``
    names and the metric stage's ``metric_data``)."""
    out = _data_available(d.facts, d.parallel, d.documents, settings, papers, d.external)
    if LU in papers:
        name = key["model"]["model_name"]
        out["circuits"] = circuits.plan_sizes(d.facts, settings, name, metric_data)
    return out


def _data_available(facts: Sequence[Fact] | None, parallel: Mapping[str, Sequence[str]] | None,
                    documents: Sequence[str] | None, settings: CardSettings,
                    papers: Sequence[str], external: Sequence[Fact] | None = None,
                    ) -> dict[str, Any]:  # fmt: skip
    """The sizes the planner simulates each row at: test and dev fact ids per language (the
    fewest of the non-English languages, after the budget's caps; ``*_uncapped`` before
    them), the evaluation part's documents and sentences as the stage reads them (at most
    ``n_eval``; ``*_uncapped``: every line left after the finding and held-out lines), the
    languages; and
    what the stages read (their cost models'): the trace, transfer and external items, the
    repair stage's build, dev and test items, the Lu languages, the transfer's relations and
    languages; and the processes the card runs in (``processes``: torchrun's world size,
    which the cost models of the stages that every process runs whole multiply by)."""
    out: dict[str, Any] = {"processes": dist_info().world_size}
    if LU in papers:
        out["trace_items"] = len(lu_facts(facts, settings, "trace"))
        out["transfer_items"] = len(lu_facts(facts, settings, "transfer"))
        out["external_items"] = len(external_facts(external, settings)) if external else 0
        all_facts = lu_facts(facts, settings.with_metric("generate"), "repair")
        r = settings.budget.repair
        uncapped = dataclasses.replace(r, dev_per_lang=None, test_per_lang=None)
        _, dev, test = uncapped.split_settings().parts(all_facts)
        out["dev_ids_uncapped"], out["test_ids_uncapped"] = _fewest(dev), _fewest(test)
        build, dev, test = repair_split(all_facts, settings)  # what the repair stage reads
        out["dev_ids"], out["test_ids"] = _fewest(dev), _fewest(test)
        out["build_items"] = len(vector_facts(build, settings))
        out["dev_items"], out["test_items"] = len(dev), len(test)
        out["lu_langs"] = len({f.lang for f in all_facts})
        moved = lu_facts(facts, settings.with_metric("generate"), "transfer")
        out["transfer_scope"] = [len({f.relation for f in moved}), len({f.lang for f in moved})]
    if SUNDAR in papers:
        texts, docs = (bundled_texts() if parallel is None
                       else (dict(parallel), documents))  # fmt: skip
        n = len(next(iter(texts.values()), []))
        docs = list(docs) if docs is not None and len(docs) == n else [str(i) for i in range(n)]
        e = settings.budget.experts
        try:
            for tag, size in (("_uncapped", n), ("", e.n_eval)):  # what the stage reads
                parts = split_by_documents(docs, [e.n_find, e.n_heldout, size], e.eval_caps())
                out[f"eval_docs{tag}"] = len({docs[i] for i in parts[2]})
                out[f"eval_sentences{tag}"] = len(parts[2])
        except InputError:
            out["eval_docs"] = out["eval_sentences"] = 0
        out["langs"] = len(texts)
    return out


def _fewest(part: Sequence[Fact]) -> int:
    """The fewest fact ids of a non-English language in ``part``."""
    per: dict[str, set[str]] = {}
    for f in part:
        per.setdefault(f.lang, set()).add(f.id)
    return min((len(v) for lg, v in per.items() if lg != "en"), default=0)


def _embed_cost(ctx: Context) -> dict[str, float]:
    """``{"embed": CPU seconds per sentence and language}`` of one embedding pass over the
    first 8 evaluation lines (no intervention), after an untimed pass over one line (the
    first call's one-time costs are not a per-item cost): the planner's per-item cost of
    alignment, in process CPU time (every thread of this process; another job on the
    machine does not add to it)."""
    model, texts = ctx.model, ctx.texts()["eval"]
    lines = {lg: v[:8] for lg, v in texts.items()}
    kw: dict[str, Any] = {
        "layers": "all",
        "batch_size": ctx.settings.batch(),
        "max_tokens": ctx.budget.experts.max_tokens,
    }
    embed_parallel(model, {lg: v[:1] for lg, v in lines.items()}, **kw)  # warm-up: not timed
    c0 = time.process_time()
    embed_parallel(model, lines, **kw)
    n = sum(len(v) for v in lines.values())
    return {"embed": round((time.process_time() - c0) / max(1, n), 4)}
