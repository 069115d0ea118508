"""The ``--smoke`` flag every benchmark takes: the test suite's size.

``tests/system/test_benchmarks.py`` runs every benchmark with ``--smoke --model <tiny>``, so an
API change that breaks one fails the suite instead of rotting unseen. At smoke size a
benchmark runs its whole code path on a tiny random model (``--model``, or one built in a
temporary folder) with the smallest sizes that exercise every branch, leaves out the peers
that need their own environment (nnterp, steering-vectors), and still ends with its
``name: N.Nx`` lines. Those numbers mean nothing: the model is random and the work is
seconds.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from typing import Any

SMOKE_HELP = (
    "the test suite's size: a tiny random model unless --model, the smallest sizes (they "
    "override the size flags), no peer environments; the timings mean nothing"
)


def add_smoke_flag(ap: argparse.ArgumentParser) -> None:
    """Add ``--smoke`` to a benchmark's parser."""
    ap.add_argument("--smoke", action="store_true", help=SMOKE_HELP)


def apply_smoke(args: argparse.Namespace, sizes: dict[str, Any]) -> argparse.Namespace:
    """Under ``--smoke``, set ``sizes`` (argument name -> value) on ``args``; ``args``."""
    if args.smoke:
        for name, value in sizes.items():
            setattr(args, name, value)
    return args


def bench_model(args: argparse.Namespace, **kw: Any) -> Any:
    """``--model`` loaded with ``load_model`` (the embedded model when it is not given), or,
    under ``--smoke`` without ``--model``, a tiny random model built in a temporary folder."""
    from mechlingo.core.models import load_model

    if args.smoke and args.model is None:
        from mechlingo.testing import build_tiny_folder

        args.model = str(build_tiny_folder(tempfile.mkdtemp(prefix="bench-smoke-")))
    return load_model(args.model, **kw)


def skipped(what: str) -> None:
    """The note a smoke run prints for a part it leaves out."""
    print(f"smoke: {what} skipped at smoke size")


def cpu_timed(fn: Callable[[], Any], repeats: int = 1) -> tuple[Any, float]:
    """``(result, best CPU seconds)`` of ``fn`` over ``repeats`` calls (process time: the
    benchmarks compare CPU, which a loaded machine does not inflate as it does wall time)."""
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.process_time()
        out = fn()
        best = min(best, time.process_time() - t0)
    return out, best
