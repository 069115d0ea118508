"""The ``mechlingo`` command.

Each subcommand loads a model, runs one analysis, and writes ``--out/summary.json`` (the
headline numbers) and ``--out/report.html`` (one self-contained file with the figures), plus
its own detail files. Outputs are written only when the analysis has succeeded; on bad input
the command prints one line (what is wrong, where, what to do) and exits with status 2,
leaving ``--out`` untouched. Every flag is checked before the model loads
(:func:`mechlingo.cli.validate.validate_args`), what needs the model (layer counts, prompt
lengths against ``n_ctx``) right after it loads and before any computation. An unexpected
exception is a bug: it is reported with its traceback and exit status 1.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

# The command modules register their subcommands when imported; ``--help`` lists them in
# the order of HELP_ORDER (any other command after them).
from mechlingo.cli import (  # noqa: F401
    circuit,
    evaluate,
    experts,
    lens,
    replicate,
    steer,
    trace,
    tuned_lens,
)
from mechlingo.cli.common import COMMANDS
from mechlingo.cli.flags import HelpParser
from mechlingo.cli.streams import guarded_stdout
from mechlingo.cli.validate import validate_args
from mechlingo.cli.work import work_folder
from mechlingo.core.artifacts import cleanup_stale
from mechlingo.core.distributed import process_group
from mechlingo.core.errors import MechlingoError, format_error
from mechlingo.core.faults import (
    Stopped,
    disk_error,
    is_out_of_memory,
    memory_error,
    stop_on_signals,
)
from mechlingo.core.models import cache_dir
from mechlingo.core.version import __version__
from mechlingo.report.page import use_plotlyjs

HELP_ORDER = (
    "lens", "eval", "experts", "align", "tuned-lens", "replicate", "steer", "trace", "circuit",
)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = HelpParser(
        prog="mechlingo",
        description="Mechanistic interpretability of multilingual language models "
        "(TransformerLens). Each command writes its results into --out: summary.json and "
        "report.html, except `steer build` (the vectors, build.json and summary.json) and "
        "`replicate` (claims.json, claims.md and report.html). Flag names: docs/glossary.md.",
        epilog="Exit status: 0 done; 2 bad input or a fault you can fix (one line on stderr, "
        "--out untouched); 3 `replicate --strict` with a failed stage (the card is written); "
        "1 a bug (with its traceback); 128+N stopped by signal N (141: stdout closed before the "
        "outputs were written).",
    )
    parser.add_argument("--version", action="version", version=f"mechlingo {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    rank = {name: i for i, name in enumerate(HELP_ORDER)}
    for name in sorted(COMMANDS, key=lambda n: rank.get(n, len(rank))):
        add_args, fn = COMMANDS[name]
        sp = sub.add_parser(
            name, help=getattr(fn, "help_text", ""), description=getattr(fn, "help_text", "")
        )
        add_args(sp)
    return parser


def _cleanup_at_start(args: argparse.Namespace) -> None:
    """Remove leftovers of killed runs: temporary siblings of ``--out`` and the model
    cache's unfinished conversions."""

    out = getattr(args, "out", None)
    if isinstance(out, str) and out.strip():
        path = Path(out).expanduser().absolute()
        cleanup_stale(path.parent, path.name)
    cleanup_stale(cache_dir(), model_cache=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``mechlingo`` command line; returns the exit status.

    0: done (whatever happens to stdout after the outputs are written: a closed pipe, an
    encoding that cannot print a name). 2: bad input or a fault the user can fix (a full or
    read-only disk, a model cache that cannot be written, the GPU out of memory): one line on
    stderr (what, where, what to do), ``--out`` and the model cache as they were. 3:
    ``replicate --strict`` when a stage failed (the claim card is still written, the failed
    rows carry the error). 1: a bug (one line saying so, then the traceback). 130 (SIGINT,
    Ctrl-C), 143 (SIGTERM), 129 (SIGHUP), 141 (stdout closed before the outputs were
    written, as SIGPIPE stops any program): stopped, one line, ``--out`` as it was.
    ``MECHLINGO_DEBUG=1`` re-raises instead. stdout is a
    :class:`~mechlingo.cli.streams.GuardedStdout` meanwhile.
    """
    with guarded_stdout():
        args = argparse.Namespace(command=None)
        try:
            parser = build_parser()
            args = parser.parse_args(argv)
            if getattr(args, "command", None) not in COMMANDS:
                parser.print_help()
                return 2
            return _run(args)
        except (KeyboardInterrupt, Stopped) as err:  # while parsing, or Ctrl-C after a run
            return _stopped(err, args)


def _run(args: argparse.Namespace) -> int:
    """Run the parsed command ``args`` (see :func:`main` for the exit statuses)."""
    run = COMMANDS[args.command][1]
    name = _name(args)
    try:
        with stop_on_signals():
            validate_args(args)
            _cleanup_at_start(args)
            # Under torchrun the statistics of `steer build` and `experts` are computed
            # data-parallel (each rank streams its shard; sums are all-reduced) and only rank
            # 0 writes outputs.
            with process_group(), use_plotlyjs(getattr(args, "plotlyjs", None)):
                return int(run(args) or 0)
    except (KeyboardInterrupt, Stopped) as err:
        return _stopped(err, args)
    except Exception as err:
        fault = _user_fault(err, args)
        if os.environ.get("MECHLINGO_DEBUG"):
            raise
        if fault is not None:
            print(f"mechlingo {name}: error: {format_error(fault)}", file=sys.stderr)
            return 2
        print(
            f"mechlingo {name}: internal error ({type(err).__name__}): this is a bug in "
            "mechlingo, not in your input; please report it with the command line and the "
            "traceback below",
            file=sys.stderr,
        )
        traceback.print_exc(file=sys.stderr)
        return 1


def _name(args: argparse.Namespace) -> str:
    """The command's name in messages: ``lens``, ``steer build``; ``mechlingo`` alone
    before one is known."""
    command = getattr(args, "command", None)
    if not command:
        return ""
    sub = getattr(args, "steer_command", None)
    return command + (f" {sub}" if sub else "")


def _stopped(err: BaseException, args: argparse.Namespace) -> int:
    """One line for a run stopped by a signal (or a closed stdout) and its status
    ``128 + signal``: what was left as it was, and where the checkpoints are kept."""
    signum = err.signum if isinstance(err, Stopped) else int(signal.SIGINT)
    out = getattr(args, "out", None)
    left = f"{out} was left as it was" if isinstance(out, str) else "nothing was written"
    sig = signal.Signals(signum).name
    why = f"by {sig}" if signum != signal.SIGPIPE else "as its output was closed (SIGPIPE)"
    work = _work_of(args)
    if work is not None and work.is_dir():
        left += f"; the checkpoints are kept in {work}: run the same command again to go on"
    name = _name(args)
    print(f"mechlingo{' ' + name if name else ''}: stopped {why}; {left}", file=sys.stderr)
    return 128 + signum


def _work_of(args: argparse.Namespace) -> Path | None:
    """The work folder of a command with ``--work`` (named by the message of a stopped
    run), ``None`` for the others or when ``--out``/``--work`` give none."""
    if not hasattr(args, "work") or not isinstance(getattr(args, "out", None), str):
        return None
    try:
        return work_folder(args)
    except MechlingoError:
        return None


def _user_fault(err: Exception, args: argparse.Namespace) -> MechlingoError | None:
    """``err`` as an error the user can fix: a :class:`MechlingoError` as it is, a disk
    fault (:func:`mechlingo.core.faults.disk_error`) or running out of memory
    (:func:`mechlingo.core.faults.memory_error`, naming ``--batch-size``); else ``None``."""
    if isinstance(err, MechlingoError):
        return err
    if is_out_of_memory(err):
        extra = ("--cells-per-batch",) if hasattr(args, "cells_per_batch") else ()
        return memory_error(err, getattr(args, "batch_size", None), extra_flags=extra)
    return disk_error(err, what=f"running mechlingo {args.command}", atomic=False)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
