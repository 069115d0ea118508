"""How each pytest-xdist worker runs: one torch thread, unless the user chose a number."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, MutableMapping, Sequence


def one_thread_per_worker(env: MutableMapping[str, str]) -> bool:
    """Set ``OMP_NUM_THREADS=1`` in ``env`` inside an xdist worker unless the user chose a
    number; whether it did. torch's default, one thread per core, puts 2 workers x 2 threads
    on 2 cores, where threads that wait for each other spin (the README's test timings say
    how much that cost). The worker's child processes (commands, torchrun, notebook kernels)
    inherit the setting."""
    if env.get("PYTEST_XDIST_WORKER") and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = "1"
        return True
    return False


def is_xdist_controller(argv: Sequence[str], env: Mapping[str, str]) -> bool:
    """Whether this pytest process is pytest-xdist's controller: ``-n N`` (N > 0 or ``auto``)
    on the command line or in ``PYTEST_ADDOPTS``, and not a worker. The controller hands out
    the tests and runs none, so ``conftest.py`` spares it torch and the package (a cold
    import of them delayed the workers' start). Any form this does not read counts as
    ``False``: the process then imports them as a worker does."""
    if env.get("PYTEST_XDIST_WORKER"):
        return False
    args = [*argv[1:], *shlex.split(env.get("PYTEST_ADDOPTS", ""))]
    if "no:xdist" in args or "-pno:xdist" in args:
        return False
    value = None
    for i, arg in enumerate(args):
        if arg in ("-n", "--numprocesses") and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith("--numprocesses="):
            value = arg.split("=", 1)[1]
        elif arg.startswith("-n") and len(arg) > 2 and not arg.startswith("--"):
            value = arg[2:].lstrip("=")
    return value is not None and (
        value in ("auto", "logical") or value.isdigit() and int(value) > 0
    )
