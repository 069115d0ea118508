"""The ``mechlingo`` command.

Each subcommand loads a model, runs one analysis, and writes ``--out/summary.json`` (the
headline numbers) and ``--out/report.html`` (one self-contained file with the figures), plus
its own detail files. Outputs are written only when the analysis has succeeded; on bad input
the command prints one line (what is wrong, where, what to do) and exits with status 2,
leaving ``--out`` untouched. Every flag is checked before the model loads
(:func:`mechlingo.validate.validate_args`), what needs the model (layer counts, prompt
lengths against ``n_ctx``) right after it loads and before any computation. An unexpected
exception is a bug: it is reported with its traceback and exit status 1.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from mechlingo.errors import InputError, MechlingoError, format_error

_COMMANDS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[Any], int]]] = {}


class UsageError(InputError):
    """Bad input on the command line; printed as one line, exit status 2."""


def command(
    name: str, help_text: str, add_args: Callable[[argparse.ArgumentParser], None]
) -> Callable:
    """Register a subcommand: the decorated function runs it, ``add_args`` adds its flags.
    Other modules (tracing, steering, experts) register theirs the same way."""

    def wrap(fn: Callable[[Any], int]) -> Callable[[Any], int]:
        fn.help_text = help_text  # type: ignore[attr-defined]
        _COMMANDS[name] = (add_args, fn)
        return fn

    return wrap


def split_list(text: str | None) -> list[str] | None:
    """Comma-separated items (stripped, empty ones dropped); ``None`` when there are none.
    Flags are checked for empty items and repeats first (:func:`mechlingo.validate.parse_list`)."""
    if text is None:
        return None
    items = [x.strip() for x in text.split(",") if x.strip()]
    return items or None


def add_model_args(p: argparse.ArgumentParser) -> None:
    """``--model``, ``--device``, ``--dtype``, ``--compat``."""
    g = p.add_argument_group("model")
    g.add_argument(
        "--model",
        default=None,
        help="model to load: omit for the embedded default (google/gemma-3-270m from PyPI), "
        "or a hub id, a local transformers folder, or a .gguf file",
    )
    g.add_argument(
        "--device", default=None, help="cuda or cpu (default: cuda when available, else cpu)"
    )
    g.add_argument("--dtype", default=None, help="model dtype, e.g. float32 or bfloat16")
    g.add_argument(
        "--compat",
        action="store_true",
        help="fold layer norms (TransformerLens compatibility mode); recorded in artifacts",
    )


def add_data_args(
    p: argparse.ArgumentParser,
    *,
    default_langs: str = "en,fr,de,es,ja",
    default_templates: str = "tuned",
    default_limit: int | None = 50,
) -> None:
    """``--langs``, ``--relation``, ``--limit``, ``--data`` (facts), ``--templates``."""
    g = p.add_argument_group("data")
    g.add_argument(
        "--templates",
        choices=["natural", "tuned"],
        default=None,
        help=f"prompt family of the bundled facts (default {default_templates}): natural = "
        "plain fact-completion stems never tuned on a model ('The capital of France is'); "
        "tuned = the stems measured best zero-shot on the embedded model (docs/data.md). "
        "--data files keep their own prompts",
    )
    p.set_defaults(_templates_default=default_templates)
    g.add_argument(
        "--langs",
        default=default_langs,
        help=f"comma-separated language codes (default {default_langs}); bundled data has "
        "en de fr es it pt ru zh ja ko ar hi",
    )
    g.add_argument(
        "--relation",
        default=None,
        help="comma-separated relations, or 'all' (default: capital for the bundled data, "
        "every relation in the file with --data)",
    )
    g.add_argument(
        "--limit",
        type=int,
        default=default_limit,
        help="at most this many facts per relation, the same facts in every language (default "
        + ("every fact" if default_limit is None else str(default_limit))
        + ")",
    )
    g.add_argument(
        "--data",
        default=None,
        help="your own facts as .jsonl or .tsv (same schema as the bundled data; see docs/data.md)",
    )


def add_out_arg(p: argparse.ArgumentParser) -> None:
    """``--out``, ``--batch-size``, ``--quiet``."""
    p.add_argument("--out", required=True, help="output folder (created; files in it replaced)")
    p.add_argument("--batch-size", type=int, default=16, help="prompts per forward pass")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def load_selected_facts(args: Any) -> list[Any]:
    """The facts selected by ``--data/--langs/--relation/--limit`` (remembered on ``args``
    for the context-length check after the model loads)."""
    from mechlingo.data import RELATIONS, load_facts

    rel = split_list(args.relation)
    if rel == ["all"]:
        rel = list(RELATIONS) if args.data is None else None
    elif rel is None:
        rel = ["capital"] if args.data is None else None  # with --data: every relation in it
    if args.limit is not None and args.limit < 1:
        raise UsageError("--limit must be at least 1")
    templates = getattr(args, "templates", None)
    if templates == "natural" and args.data is not None:
        raise UsageError(
            "--templates natural re-renders the bundled facts; a --data file keeps its own "
            "prompts (drop --templates)"
        )
    if templates is None:
        templates = getattr(args, "_templates_default", "tuned") if args.data is None else "tuned"
    args.templates_used = "file" if args.data is not None else templates
    try:
        facts = load_facts(
            langs=split_list(args.langs),
            relations=rel,
            limit=args.limit,
            path=args.data,
            templates=templates,
        )
    except MechlingoError:
        raise
    except (ValueError, OSError) as err:
        raise UsageError(str(err)) from err
    args._facts = facts
    return facts


def load_cli_model(args: Any) -> Any:
    """Load ``--model`` on ``--device``/``--dtype``, then run the checks that need it
    (:func:`mechlingo.validate.check_after_load`) before any computation."""
    from mechlingo.distributed import dist_info
    from mechlingo.models import load_model
    from mechlingo.validate import check_after_load

    device = args.device
    info = dist_info()
    if device is None and info.world_size > 1:
        device = str(info.device)  # under torchrun: this rank's GPU, or the CPU
    model = load_model(args.model, device=device, dtype=args.dtype, compat=args.compat)
    check_after_load(model, args)
    return model


def run_meta(model: Any, args: Any, **extra: Any) -> dict[str, Any]:
    """The ``meta`` record of a command's summary (model, weights, device, version)."""
    from mechlingo import __version__
    from mechlingo.models import model_name, weight_mode

    return {
        "model": model_name(model),
        "weights": weight_mode(model),
        "device": str(model.W_U.device),
        "mechlingo": __version__,
        **({"templates": args.templates_used} if hasattr(args, "templates_used") else {}),
        **extra,
    }


# --------------------------------------------------------------------------------------


def _lens_args(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_data_args(p)
    add_out_arg(p)
    p.add_argument(
        "--track",
        default="en",
        help="extra languages whose answers to track besides the prompt's own (default en)",
    )
    p.add_argument(
        "--max-rank",
        type=int,
        default=10,
        help="rank counted as 'decodable' in the summary (default 10)",
    )


@command("lens", "per-language logit lens and latent-language curves", _lens_args)
def cmd_lens(args: Any) -> int:
    from mechlingo.lens import lens_facts
    from mechlingo.report import Report, write_outputs

    facts = load_selected_facts(args)
    model = load_cli_model(args)
    track = split_list(args.track) or []
    t0 = time.time()
    try:
        result = lens_facts(
            model, facts, track_langs=track, batch_size=args.batch_size, progress=not args.quiet
        )
    except ValueError as err:
        raise UsageError(str(err)) from err
    summary = result.summary(max_rank=args.max_rank)
    summary["meta"] = run_meta(model, args, n_facts=len(facts), seconds=round(time.time() - t0, 1))
    report = Report("mechlingo: per-language logit lens", summary["meta"])
    report.add_text(
        "Each prompt's residual stream at its last token is decoded after every layer through "
        "the final norm and unembedding. Curves show the probability of the answer in the "
        "prompt's language and in the tracked languages. A rise of the English answer in the "
        "middle layers before the prompt-language answer is the English pivot.",
        note=True,
    )
    report.add_heading("Summary")
    report.add_table(
        [
            {
                "lang": lg,
                "prompts": summary["n_prompts"][lg],
                "final-layer top-1 accuracy": summary["final_layer_accuracy"].get(lg, 0.0),
                f"English answer rank <= {args.max_rank} before the last layer": summary[
                    "english_decodable_before_last"
                ].get(lg, 0.0),
            }
            for lg in summary["n_prompts"]
        ]
    )
    report.add_heading("Latent-language curves")
    report.add_figure(result.fig_latent_curves())
    if "en" in result.tracks:
        report.add_heading("English answer rank per layer and prompt")
        report.add_figure(result.fig_heatmap("en", "rank"))
    report.add_heading("Prompt-language answer rank per layer and prompt")
    report.add_figure(result.fig_heatmap("answer", "rank"))
    df = result.to_dataframe()
    write_outputs(
        args.out,
        {
            "summary.json": summary,
            "lens.csv": df.to_csv(index=False),
            "report.html": report,
        },
    )
    print(f"wrote {args.out}/summary.json, lens.csv and report.html")
    return 0


def _eval_args(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_data_args(p)
    add_out_arg(p)
    p.add_argument(
        "--max-new-tokens", type=int, default=8, help="greedy tokens to generate (default 8)"
    )


@command("eval", "greedy-generation accuracy per language (the baseline)", _eval_args)
def cmd_eval(args: Any) -> int:
    from mechlingo.evaluate import evaluate_facts
    from mechlingo.report import Report, write_outputs

    facts = load_selected_facts(args)
    model = load_cli_model(args)
    t0 = time.time()
    result = evaluate_facts(
        model,
        facts,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        progress=not args.quiet,
    )
    from mechlingo.stats import wilson_table

    by_lang: dict[str, list[bool]] = {}
    for r in result.records:
        by_lang.setdefault(r["lang"], []).append(bool(r["correct"]))
    ci = wilson_table({"accuracy": dict(sorted(by_lang.items()))})["accuracy"]
    summary = {
        "accuracy": result.accuracy(),
        "accuracy_ci": ci,
        "answered_in_english": result.english_rate(),
        "meta": run_meta(
            model,
            args,
            n_facts=len(facts),
            max_new_tokens=args.max_new_tokens,
            seconds=round(time.time() - t0, 1),
        ),
    }
    report = Report("mechlingo: greedy accuracy", summary["meta"])
    report.add_text(
        "Correct = the greedy continuation starts with the answer or an alias after "
        "normalisation (case, whitespace, leading punctuation; word boundary in languages "
        "written with spaces).",
        note=True,
    )
    from mechlingo.plots import accuracy_bars

    report.add_figure(
        accuracy_bars(
            {"accuracy": summary["accuracy"]},
            "Greedy accuracy per language (Wilson 95% intervals)",
            {"accuracy": ci},
        )
    )
    report.add_table([{"lang": lg, **c} for lg, c in ci.items()])
    report.add_heading("Generations")
    report.add_table(
        result.records[:300], ["lang", "id", "prompt", "answer", "generation", "correct"]
    )
    write_outputs(
        args.out,
        {
            "summary.json": summary,
            "generations.jsonl": "\n".join(
                __import__("json").dumps(r, ensure_ascii=False) for r in result.records
            )
            + "\n",
            "report.html": report,
        },
    )
    for lg, x in summary["accuracy"].items():
        print(f"{lg}: {x:.3f} [{ci[lg]['lo']:.3f}, {ci[lg]['hi']:.3f}]")
    print(f"wrote {args.out}/summary.json, generations.jsonl and report.html")
    return 0


def _register_optional() -> None:
    """Subcommands defined in other modules register themselves on import."""
    import importlib

    for mod in ("mechlingo.pipeline_cli", "mechlingo.steering_cli", "mechlingo.experts_cli"):
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as err:
            if err.name != mod:
                raise


def build_parser() -> argparse.ArgumentParser:
    _register_optional()
    parser = argparse.ArgumentParser(
        prog="mechlingo",
        description="Mechanistic interpretability of multilingual language models "
        "(TransformerLens). Each command writes OUT/summary.json and OUT/report.html.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (add_args, fn) in _COMMANDS.items():
        sp = sub.add_parser(
            name, help=getattr(fn, "help_text", ""), description=getattr(fn, "help_text", "")
        )
        add_args(sp)
        sp.set_defaults(_run=fn)
    return parser


def _cleanup_at_start(args: Any) -> None:
    """Remove leftovers of killed runs: temporary siblings of ``--out`` and the model
    cache's unfinished conversions."""
    from pathlib import Path

    from mechlingo.artifacts import cleanup_stale
    from mechlingo.models import cache_dir

    out = getattr(args, "out", None)
    if isinstance(out, str) and out.strip():
        path = Path(out).expanduser().absolute()
        cleanup_stale(path.parent, path.name)
    cleanup_stale(cache_dir(), cache=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``mechlingo`` command line; returns the exit status.

    0: done. 2: bad input (one line on stderr: what, where, what to do; ``--out`` and the
    model cache untouched). 1: a bug (one line saying so, then the traceback). 130:
    interrupted. ``MECHLINGO_DEBUG=1`` re-raises instead.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    from mechlingo.distributed import process_group
    from mechlingo.validate import validate_args

    name = args.command + (f" {args.steer_command}" if getattr(args, "steer_command", None) else "")
    try:
        validate_args(args)
        _cleanup_at_start(args)
        # Under torchrun the statistics of `steer build` and `experts` are computed data-parallel
        # (each rank streams its shard; sums are all-reduced) and only rank 0 writes outputs.
        with process_group():
            return int(args._run(args) or 0)
    except MechlingoError as err:
        if os.environ.get("MECHLINGO_DEBUG"):
            raise
        print(f"mechlingo {name}: error: {format_error(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # pragma: no cover
        print("interrupted; nothing was written", file=sys.stderr)
        return 130
    except Exception as err:
        if os.environ.get("MECHLINGO_DEBUG"):
            raise
        print(
            f"mechlingo {name}: internal error ({type(err).__name__}): this is a bug in "
            "mechlingo, not in your input; please report it with the command line and the "
            "traceback below",
            file=sys.stderr,
        )
        traceback.print_exc(file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    # Run through the imported module, where the other modules register their subcommands.
    from mechlingo.cli import main as _main

    sys.exit(_main())
