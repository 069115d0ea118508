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
from mechlingo.analyses.pipeline import CLASSES, trace_recall
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
from mechlingo.core.jsonable import finite_or_none
from mechlingo.core.tokens import encode
from mechlingo.core.types import Model
from mechlingo.kernels.significance import wilson
from mechlingo.report import Report, write_outputs
from mechlingo.viz.common import accuracy_bars
from mechlingo.viz.pipeline import circuit_figure, pipeline_stages

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


def _parse_range(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        if "-" in text:
            a, b = (int(x) for x in text.split("-", 1))
            return list(range(a, b + 1))
        return [int(x) for x in text.split(",")]
    except ValueError as err:
        raise UsageError(f"--mid-layers {text!r}: use 'A-B' or a comma-separated list") from err


def _patch_language(model: Model, trace: Any, facts: list[Any], lang: str, args: Any) -> Any:
    """Corrupted-subject sweep and knockout for one language (``None`` if too few facts)."""

    by_id = {f.id: f for f in facts if f.lang == lang}
    recs = [r for r in trace.records if r["lang"] == lang]
    ordered = [r["id"] for r in recs if r["correct"]] + [r["id"] for r in recs if not r["correct"]]
    if len(ordered) < 2:
        return None
    clean = [by_id[i] for i in ordered[: args.patch_prompts]]
    pool = [by_id[r["id"]] for r in recs]
    corrupt = []
    for k, f in enumerate(clean):
        others = [g for g in pool if g.answer != f.answer and g.id != f.id]
        corrupt.append(others[(k * 7) % len(others)] if others else pool[(k + 1) % len(pool)])
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
        extra["atp"] = atp
        if sweep is not None:
            extra["comparison"] = compare_sweeps(atp, sweep)
            extra["seconds"] = {"exact": sweep.meta["seconds"], "atp": atp.meta["seconds"]}
        if args.verify_heads > 0:
            extra["verified_heads"] = verify_top_cells(
                model, clean, corrupt, atp, k=args.verify_heads, **kw
            )
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
    return sweep if sweep is not None else atp, knock, clean, extra


def _token_labels(model: Model, sweep: Any, clean: list[Any]) -> list[str]:

    # label each grid position with the clean (source) prompt's token there
    batch = encode(model, [clean[0].prompt])
    ids = batch.tokens[0].tolist()
    labels = []
    for p, label in enumerate(sweep.position_labels):
        tok = model.tokenizer.decode([ids[int(sweep.source_positions[p, 0])]])
        labels.append(f"{label}<br>{tok!r}")
    return labels


@command("trace", "recall pipeline tracer: correct / translation / recall failures", _trace_args)
def cmd_trace(args: Any) -> int:

    if args.patch_prompts < 0:
        raise UsageError("--patch-prompts must be >= 0")
    facts = load_selected_facts(args)
    mid = _parse_range(args.mid_layers)
    model = load_cli_model(args)
    t0 = time.time()
    try:
        trace = trace_recall(
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
    t_trace = time.time() - t0
    patching: dict[str, Any] = {}
    figures: list[tuple[str, Any]] = []
    if args.patch_prompts > 0:
        for lang in trace.langs:
            try:
                res = _patch_language(model, trace, facts, lang, args)
            except PatchingError as err:
                raise UsageError(f"patching {lang}: {err}") from err
            if res is None:
                continue
            sweep, knock, clean, extra = res
            patching[lang] = {
                "method": args.method,
                "sweep": sweep.summary(),
                "cells": sweep.to_dataframe().to_dict(orient="records"),
                "knockout": knock.to_dataframe().to_dict(orient="records"),
            }
            atp = extra.get("atp")
            if atp is not None and atp is not sweep:
                patching[lang]["atp_sweep"] = atp.summary()
                patching[lang]["atp_cells"] = atp.to_dataframe().to_dict(orient="records")
            for key in ("comparison", "seconds", "verified_heads"):
                if key in extra:
                    patching[lang][key] = extra[key]
            stages = pipeline_stages(sweep, trace, lang)
            patching[lang]["stages"] = stages
            drawn = atp if atp is not None else sweep
            how = "attribution patching, heads shown" if atp is not None else "patching"
            figures.append(
                (
                    f"Circuit ({lang})",
                    circuit_figure(
                        drawn,
                        stages=stages,
                        token_labels=_token_labels(model, drawn, clean),
                        heads=atp is not None,
                        verified=extra.get("verified_heads"),
                        title=f"{lang}: components that restore the clean answer "
                        f"(corrupted-subject {how})",
                    ),
                )
            )
            if "comparison" in extra:
                figures.append(
                    (
                        f"AtP vs exact patching ({lang})",
                        [
                            {
                                "site": site,
                                **v,
                                **{f"seconds_{k}": t for k, t in extra["seconds"].items()},
                            }
                            for site, v in extra["comparison"].items()
                        ],
                    )
                )
            if "verified_heads" in extra:
                figures.append(
                    (f"Top heads by AtP, verified exactly ({lang})", extra["verified_heads"])
                )
            figures.append((f"Patching heatmaps ({lang})", sweep.fig_heatmap()))
            if atp is not None and atp is not sweep:
                figures.append((f"Attribution patching heatmaps ({lang})", atp.fig_heatmap()))
            figures.append((f"Attention knockout ({lang})", knock.fig()))
    summary = trace.summary()

    summary["classification_ci"] = {  # Wilson 95% interval of each class's fraction
        lg: {c: wilson(n, sum(cnt.values())) for c, n in cnt.items()}
        for lg, cnt in summary["classification"].items()
    }
    summary["meta"] = run_meta(
        model,
        args,
        n_facts=len(facts),
        seconds_trace=round(t_trace, 1),
        seconds=round(time.time() - t0, 1),
    )
    report = Report("mechlingo: recall pipeline tracer", summary["meta"])
    report.add_text(
        "Each query is classified from its greedy answer and the logit lens on the same prompt: "
        "correct; wrong language (the right answer in English or another language); "
        f"translation failure (wrong, but the English answer reached rank <= {args.max_rank} "
        "mid-network); recall failure (neither the English nor the prompt-language answer did); "
        f"other. Mid-network = lens entries {summary['mid_layers']}.",
        note=True,
    )
    report.add_heading("Classes per language")
    report.add_figure(trace.fig_class_fractions())
    report.add_table(
        [{"lang": lg, **c} for lg, c in summary["classification"].items()], ["lang", *CLASSES]
    )

    cls_ci = summary["classification_ci"]
    report.add_figure(
        accuracy_bars(
            {c: {lg: v[c]["p"] for lg, v in cls_ci.items()} for c in CLASSES},
            "Class fractions per language (Wilson 95% intervals)",
            {c: {lg: v[c] for lg, v in cls_ci.items()} for c in CLASSES},
            y_title="fraction of queries",
        )
    )
    report.add_table([{"lang": lg, **v} for lg, v in summary["layers"].items()])
    report.add_heading("Latent-language curves per class")
    report.add_figure(trace.fig_profiles())
    for heading, fig in figures:
        report.add_heading(heading)
        if isinstance(fig, list):  # a table (AtP against exact patching)
            report.add_table(finite_or_none(fig))
        else:
            report.add_figure(fig)
    report.add_heading("Queries")
    report.add_table(
        trace.records[:300],
        ["lang", "id", "answer", "generation", "class", "first_en_layer", "first_answer_layer"],
    )
    keep = [
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
    ]
    write_outputs(
        args.out,
        {
            "trace.json": [{k: r[k] for k in keep} for r in trace.records],
            "patching.json": finite_or_none(patching),
            "summary.json": finite_or_none(summary),
            "report.html": report,
        },
    )
    for lg, c in summary["classification"].items():
        print(lg, " ".join(f"{k}={v}" for k, v in c.items()))
    for lg, res in patching.items():
        for site, v in res.get("comparison", {}).items():
            print(
                f"{lg} AtP vs exact, {site}: spearman {v['spearman']:.2f}, "
                f"top-{v['k']} agreement {v['top_k']:.2f} ({v['n_cells']} cells)"
            )
    print(f"wrote {args.out}/trace.json, patching.json, summary.json and report.html")
    return 0
