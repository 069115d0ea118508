"""How each pytest-xdist worker runs: one torch thread, unless the user chose a number."""

from __future__ import annotations

from collections.abc import MutableMapping


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
