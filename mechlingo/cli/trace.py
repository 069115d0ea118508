"""The ``mechlingo trace`` subcommand: recall-pipeline classes, patching and knockout.

Writes ``OUT/trace.json`` (per query: class, answer, generation, lens layers),
``OUT/patching.json`` (per language: a corrupted-subject patching sweep and an attention
knockout), ``OUT/circuits.json`` (per language: the measured circuit, EAP-IG edges over
``--circuit-prompts`` correctly answered prompts), ``OUT/summary.json`` and
``OUT/report.html``; ``--method exact|atp|both`` chooses
how the patching cells are measured. Entry points: :func:`cmd_trace` and
:func:`options_from_args`; the run is :func:`mechlingo.analyses.recall.trace.run_trace`.
``docs/methods/recall-pipeline.md`` ("The command and the Python call") has the patching
design, the methods and measured runs.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

from mechlingo.analyses.recall import trace, trace_circuit

# run_trace is called through its module, so that a wrapper set on the module (a test's
# monkeypatch, a user's instrumentation) sees every call.
from mechlingo.analyses.recall.trace_options import TraceOptions
from mechlingo.cli import common, cost
from mechlingo.cli.flags import parse_int_range
from mechlingo.cli.glossary import about
from mechlingo.cli.streams import outputs_written
from mechlingo.core.defaults import CIRCUIT_PROMPTS
from mechlingo.data import Fact
from mechlingo.report.trace import trace_report


def _trace_args(p: argparse.ArgumentParser) -> None:
    common.add_model_args(p)
    common.add_data_args(p)
    common.add_out_arg(p)
    common.add_max_rank_arg(p)
    p.add_argument("--mid-layers", default=None, help=about("--mid-layers", "default: n/3 .. "
                   "n-2"))  # fmt: skip
    common.add_max_new_tokens_arg(p)
    p.add_argument("--patch-prompts", type=int, default=3, help=about("--patch-prompts", "0 = "
                   "skip both"))  # fmt: skip
    p.add_argument("--patch-unanswered", action="store_true", help=about("--patch-unanswered",
                   "by default correctly answered ones only; a language without one gets a "
                   "note instead of a circuit"))  # fmt: skip
    p.add_argument("--circuit-prompts", type=int, default=CIRCUIT_PROMPTS,
                   help=about("--circuit-prompts", "EAP-IG edges; 0 = no measured circuit"))  # fmt: skip
    p.add_argument("--patch-sites", default="attn_out,mlp_out", help=about("--patch-sites",
                   "attn_out,mlp_out are the circuit diagram's components; add resid_pre for "
                   "the residual heatmap"))  # fmt: skip
    p.add_argument("--cells-per-batch", type=int, default=None, help=about("--cells-per-batch",
                   "default: patch_activations's, 256"))  # fmt: skip
    p.add_argument("--method", choices=("exact", "atp", "both"), default="exact",
                   help=about("--method", "atp: every cell and head from one backward pass, "
                   "top heads verified exactly; both: with their correlation per site"))  # fmt: skip
    p.add_argument("--verify-heads", type=int, default=5, help=about("--verify-heads", "with "
                   "--method atp/both; 0 = none"))  # fmt: skip
    cost.add_dry_run_arg(p)


def check_english_answers(facts: Sequence[Fact], args: argparse.Namespace) -> None:
    """The trace tracks every fact's English answer: refuse, before the model loads, facts
    with neither an ``answer_en`` nor an English row of the same id in ``--facts``."""
    english = {f.id for f in facts if f.lang == "en"}
    missing = sorted({f.id for f in facts if not f.answer_en and f.id not in english})
    if missing:
        shown = ", ".join(missing[:5]) + (
            f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        )
        raise common.UsageError(
            f"--facts {args.facts}: {len(missing)} fact(s) have no English answer, which the "
            f"trace tracks ({shown})",
            fix="give their records an 'answer_en' field, or add English rows with the same "
            "id to the file (they are read even when --langs leaves en out)",
        )


def options_from_args(args: argparse.Namespace) -> TraceOptions:
    """``trace``'s flags as :class:`~mechlingo.analyses.recall.trace_options.TraceOptions`
    (checked there)."""
    mid = parse_int_range(args.mid_layers, "--mid-layers")
    return TraceOptions(
        max_rank=args.max_rank, mid_layers=None if mid is None else tuple(mid),
        max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
        patch_prompts=args.patch_prompts,
        patch_sites=tuple(common.split_list(args.patch_sites) or ["resid_pre"]),
        cells_per_batch=args.cells_per_batch, method=getattr(args, "method", "exact"),
        verify_heads=args.verify_heads, progress=not args.quiet,
        unanswered=args.patch_unanswered, circuit_prompts=args.circuit_prompts,
    )  # fmt: skip


@common.command(
    "trace", "recall pipeline tracer: correct / translation / recall failures", _trace_args
)
def cmd_trace(args: argparse.Namespace) -> int:

    if args.patch_prompts < 0:
        raise common.UsageError("--patch-prompts must be >= 0")
    facts = common.load_selected_facts(args)
    check_english_answers(facts, args)
    opts = options_from_args(args)
    plan = cost.plan_trace(facts, max_new_tokens=opts.max_new_tokens,
                           patch_prompts=opts.patch_prompts, sites=opts.patch_sites,
                           method=opts.method, model=args.model,
                           circuit_prompts=opts.circuit_prompts,
                           circuit_passes=trace_circuit.CIRCUIT_PASSES)  # fmt: skip
    if cost.announce(plan, args):
        return 0
    model = common.load_cli_model(args, facts=facts)
    t0 = time.time()
    with common.usage_errors(ValueError):  # a PatchingError names the language
        run = trace.run_trace(model, facts, opts)
    meta = common.run_meta(
        model,
        args,
        n_facts=len(facts),
        seconds_trace=round(run.seconds_trace, 1),
        seconds=round(time.time() - t0, 1),
    )
    summary = run.summary(meta)
    report = trace_report(
        run.trace,
        summary,
        run.patched,
        max_rank=args.max_rank,
        unpatched=run.unpatched,
        circuits=run.circuits,
    )
    run.write(args.out, meta=meta, extra={"report.html": report})
    outputs_written()
    _print_trace(summary, run.patching())
    written = "patching.json, summary.json" + (", circuits.json" if run.circuits else "")
    print(f"wrote {args.out}/trace.json, {written} and report.html")
    return 0


def _print_trace(summary: dict[str, Any], patching: dict[str, Any]) -> None:
    for lg, c in summary["classification"].items():
        print(lg, " ".join(f"{k}={v}" for k, v in c.items()))
    for lg, res in patching.items():
        for site, v in res.get("comparison", {}).items():
            print(
                f"{lg} AtP vs exact, {site}: spearman {v['spearman']:.2f}, "
                f"top-{v['k']} agreement {v['top_k']:.2f} ({v['n_cells']} cells)"
            )
