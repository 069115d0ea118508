"""The ``mechlingo trace`` subcommand: recall-pipeline classes, patching and knockout.

Writes ``OUT/trace.json`` (per query: class, answer, generation, lens layers),
``OUT/patching.json`` (per language: a corrupted-subject patching sweep and an attention
knockout), ``OUT/summary.json`` and ``OUT/report.html``.

The patching is chosen to be cheap on a CPU and still say something: for a few prompts per
language that the model answers correctly (the *clean* runs), the *corrupted* run is the same
template with another fact's subject; the clean activations are patched into the corrupted run
at every layer, at the subject's first and last token and the last two prompt tokens (aligned
by subject span and from the end), and the clean answer's log-probability is read. Cells that
restore it carry the fact.

``--method`` chooses how the cells are measured: ``exact`` activation patching (default),
``atp`` attribution patching (:mod:`mechlingo.analyses.attribution`: every cell and every attention
head from one forward and one backward pass; the top heads are then verified by exact head
patching and the circuit diagram shows heads), or ``both`` (exact and AtP on the same grid;
the report gives their Spearman correlation and top-k agreement per site).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from mechlingo.analyses.attribution import attribution_patch, compare_sweeps, verify_top_cells
from mechlingo.analyses.patching import PatchingError, attention_knockout, fact_metrics, patch_sweep
from mechlingo.analyses.trace import trace_recall
from mechlingo.cli.common import (
    UsageError,
    add_data_args,
    add_model_args,
    add_out_arg,
    command,
    load_cli_model,
    load_selected_facts,
    run_meta,
    split_list,
)
from mechlingo.cli.flags import parse_int_range
from mechlingo.core.jsonable import finite_or_none
from mechlingo.core.tokens import encode
from mechlingo.core.types import Model
from mechlingo.kernels.significance import wilson
from mechlingo.report import write_outputs
from mechlingo.report.trace import LanguagePatching, trace_report
from mechlingo.viz.pipeline import pipeline_stages

PATCH_POSITIONS: list[int | str] = ["subject_first", "subject_last", -2, -1]


def _trace_args(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_data_args(p, default_langs="en,fr,de,es")
    add_out_arg(p)
    p.add_argument(
        "--max-rank",
        type=int,
        default=10,
        help="rank at or below which an answer counts as decodable by the lens (default 10)",
    )
    p.add_argument(
        "--mid-layers",
        default=None,
        help="lens entries counted as mid-network, 'A-B' inclusive (default: n/3 .. n-2)",
    )
    p.add_argument(
        "--max-new-tokens", type=int, default=8, help="greedy tokens to generate (default 8)"
    )
    p.add_argument(
        "--patch-prompts",
        type=int,
        default=3,
        help="prompts per language for patching and knockout (default 3; 0 = skip both)",
    )
    p.add_argument(
        "--patch-sites",
        default="attn_out,mlp_out",
        help="sites of the corrupted-subject sweep (default attn_out,mlp_out, the circuit "
        "diagram's components; add resid_pre for the residual heatmap)",
    )
    p.add_argument(
        "--cells-per-batch",
        type=int,
        default=None,
        help="patched copies per forward pass (default: patch_sweep's, 256)",
    )
    p.add_argument(
        "--method",
        choices=("exact", "atp", "both"),
        default="exact",
        help="exact activation patching (default), attribution patching (atp: every cell and "
        "head from one backward pass; top heads verified exactly), or both (with their "
        "correlation per site)",
    )
    p.add_argument(
        "--verify-heads",
        type=int,
        default=5,
        help="with --method atp/both: the top heads (by AtP) verified by exact head patching "
        "(default 5; 0 = none)",
    )


TRACE_FIELDS = (
    "id",
    "lang",
    "prompt",
    "answer",
    "answer_en",
    "generation",
    "correct",
    "class",
    "answered_in",
    "first_en_layer",
    "first_answer_layer",
    "en_decodable_mid",
    "answer_decodable_mid",
    "best_en_rank_mid",
    "best_en_layer_mid",
    "final_answer_rank",
    "gold_rank",
)


@command("trace", "recall pipeline tracer: correct / translation / recall failures", _trace_args)
def cmd_trace(args: Any) -> int:

    if args.patch_prompts < 0:
        raise UsageError("--patch-prompts must be >= 0")
    facts = load_selected_facts(args)
    mid = parse_int_range(args.mid_layers, "--mid-layers")
    model = load_cli_model(args)
    t0 = time.time()
    trace = _trace(model, facts, mid, args)
    t_trace = time.time() - t0
    patched = _patch_languages(model, trace, facts, args) if args.patch_prompts > 0 else []
    summary = _trace_summary(trace)
    summary["meta"] = run_meta(
        model,
        args,
        n_facts=len(facts),
        seconds_trace=round(t_trace, 1),
        seconds=round(time.time() - t0, 1),
    )
    patching = {p.lang: p.to_json() for p in patched}
    write_outputs(
        args.out,
        {
            "trace.json": [{k: r[k] for k in TRACE_FIELDS} for r in trace.records],
            "patching.json": finite_or_none(patching),
            "summary.json": finite_or_none(summary),
            "report.html": trace_report(trace, summary, patched, max_rank=args.max_rank),
        },
    )
    _print_trace(summary, patching)
    print(f"wrote {args.out}/trace.json, patching.json, summary.json and report.html")
    return 0


def _trace(model: Model, facts: list[Any], mid: list[int] | None, args: Any) -> Any:
    """The recall trace of every fact (greedy answer, lens, class)."""
    try:
        return trace_recall(
            model,
            facts,
            max_rank=args.max_rank,
            mid_layers=mid,
            max_new_tokens=args.max_new_tokens,
            batch_size=args.batch_size,
            progress=not args.quiet,
        )
    except ValueError as err:
        raise UsageError(str(err)) from err


def _trace_summary(trace: Any) -> dict[str, Any]:
    """The trace's summary with the Wilson 95% interval of each class's fraction."""
    summary = trace.summary()
    summary["classification_ci"] = {
        lg: {c: wilson(n, sum(cnt.values())) for c, n in cnt.items()}
        for lg, cnt in summary["classification"].items()
    }
    return summary


def _patch_languages(
    model: Model, trace: Any, facts: list[Any], args: Any
) -> list[LanguagePatching]:
    """The patching of every language with enough facts (see :func:`_patch_language`)."""
    out = []
    for lang in trace.langs:
        try:
            res = _patch_language(model, trace, facts, lang, args)
        except PatchingError as err:
            raise UsageError(f"patching {lang}: {err}") from err
        if res is not None:
            out.append(res)
    return out


def _corrupted_pairs(trace: Any, facts: list[Any], lang: str, n: int) -> Any:
    """Up to ``n`` clean facts of ``lang`` (correctly answered ones first) and, for each, a
    corrupted fact: another subject with another answer. ``None`` with fewer than two facts."""
    by_id = {f.id: f for f in facts if f.lang == lang}
    recs = [r for r in trace.records if r["lang"] == lang]
    ordered = [r["id"] for r in recs if r["correct"]] + [r["id"] for r in recs if not r["correct"]]
    if len(ordered) < 2:
        return None
    clean = [by_id[i] for i in ordered[:n]]
    pool = [by_id[r["id"]] for r in recs]
    corrupt = []
    for k, f in enumerate(clean):
        others = [g for g in pool if g.answer != f.answer and g.id != f.id]
        corrupt.append(others[(k * 7) % len(others)] if others else pool[(k + 1) % len(pool)])
    return clean, corrupt


def _measure(model: Model, clean: list[Any], corrupt: list[Any], args: Any) -> tuple:
    """The sweep(s) of ``--method``: ``(exact or None, atp or None, extras)``; the extras
    are AtP's ``comparison`` with exact and ``seconds`` (both), and ``verified_heads``."""
    sites = split_list(args.patch_sites) or ["resid_pre"]
    kw = {
        "positions": PATCH_POSITIONS,
        "metric": fact_metrics(model, clean),
        "alignment": "subject",
    }
    method = getattr(args, "method", "exact")
    sweep = atp = None
    if method in ("exact", "both"):
        t0 = time.perf_counter()
        # with both methods, the exact grid has the heads too (compared per site)
        grid = list(dict.fromkeys([*sites, "head"])) if method == "both" else sites
        sweep = patch_sweep(model, clean, corrupt, grid, cells_per_batch=args.cells_per_batch, **kw)
        sweep.meta["seconds"] = round(time.perf_counter() - t0, 4)
    extra: dict[str, Any] = {}
    if method in ("atp", "both"):
        atp = attribution_patch(model, clean, corrupt, list(dict.fromkeys([*sites, "head"])), **kw)
        if sweep is not None:
            extra["comparison"] = compare_sweeps(atp, sweep)
            extra["seconds"] = {"exact": sweep.meta["seconds"], "atp": atp.meta["seconds"]}
        if args.verify_heads > 0:
            extra["verified_heads"] = verify_top_cells(
                model, clean, corrupt, atp, k=args.verify_heads, **kw
            )
    return sweep, atp, extra


def _patch_language(
    model: Model, trace: Any, facts: list[Any], lang: str, args: Any
) -> LanguagePatching | None:
    """Corrupted-subject sweep and knockout for one language (``None`` if too few facts)."""

    pairs = _corrupted_pairs(trace, facts, lang, args.patch_prompts)
    if pairs is None:
        return None
    clean, corrupt = pairs
    sweep, atp, extra = _measure(model, clean, corrupt, args)
    for sw in (sweep, atp):
        if sw is not None:
            sw.meta.update(
                {
                    "clean": [f.prompt for f in clean],
                    "corrupted": [f.prompt for f in corrupt],
                    "answers": [f.answer for f in clean],
                }
            )
    knock = attention_knockout(model, clean)
    main = sweep if sweep is not None else atp
    return LanguagePatching(
        lang=lang,
        method=getattr(args, "method", "exact"),
        sweep=main,
        knockout=knock,
        stages=pipeline_stages(main, trace, lang),
        token_labels=_token_labels(model, atp if atp is not None else main, clean),
        atp=atp,
        **extra,
    )


def _token_labels(model: Model, sweep: Any, clean: list[Any]) -> list[str]:
    """Each grid position's label with the clean (source) prompt's token there."""
    batch = encode(model, [clean[0].prompt])
    ids = batch.tokens[0].tolist()
    labels = []
    for p, label in enumerate(sweep.position_labels):
        tok = model.tokenizer.decode([ids[int(sweep.source_positions[p, 0])]])
        labels.append(f"{label}<br>{tok!r}")
    return labels


def _print_trace(summary: dict[str, Any], patching: dict[str, Any]) -> None:
    for lg, c in summary["classification"].items():
        print(lg, " ".join(f"{k}={v}" for k, v in c.items()))
    for lg, res in patching.items():
        for site, v in res.get("comparison", {}).items():
            print(
                f"{lg} AtP vs exact, {site}: spearman {v['spearman']:.2f}, "
                f"top-{v['k']} agreement {v['top_k']:.2f} ({v['n_cells']} cells)"
            )
