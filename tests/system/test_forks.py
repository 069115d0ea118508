"""The forked children of the tests (tests/forks.py): what a child returns, the environment
and output it gets, a timeout that ends it and what it started, and torch's launcher with
forked ranks against one process."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.forks import CLI_MAIN, fork_call, torchrun

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="os.fork")


def test_exit_codes_signals_and_exceptions(tmp_path):
    log = tmp_path / "child.log"
    assert fork_call(lambda: None, log) == 0
    assert fork_call(lambda: 3, log) == 3
    assert fork_call(lambda: sys.exit(4), log) == 4
    assert fork_call(lambda: os.kill(os.getpid(), signal.SIGKILL), log) == -signal.SIGKILL

    def fails() -> None:
        raise ValueError("the child's own error")

    assert fork_call(fails, log) == 1
    assert "ValueError: the child's own error" in log.read_text()


def test_environment_and_output_stay_in_the_child(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHLINGO_FORK_GONE", "here")
    log = tmp_path / "child.log"

    def child() -> int:
        print("out:", os.environ.get("MECHLINGO_FORK_SET"), os.environ.get("MECHLINGO_FORK_GONE"))
        print("err", file=sys.stderr)
        return 0

    env = {"MECHLINGO_FORK_SET": "1", "MECHLINGO_FORK_GONE": None}
    assert fork_call(child, log, env) == 0
    assert log.read_text().splitlines() == ["out: 1 None", "err"]
    assert "MECHLINGO_FORK_SET" not in os.environ and os.environ["MECHLINGO_FORK_GONE"] == "here"


def test_the_childs_temporary_folder_follows_its_environment(tmp_path):
    """``TMPDIR`` given to the child is where its ``tempfile`` writes (the parent's folder is
    cached in ``tempfile.tempdir`` once read), and the parent's stays as it was."""
    import tempfile

    before = tempfile.gettempdir()
    mine = tmp_path / "tmp"
    mine.mkdir()
    log = tmp_path / "child.log"
    assert fork_call(lambda: print(tempfile.mkdtemp(prefix="x-")), log, {"TMPDIR": str(mine)}) == 0
    assert Path(log.read_text().strip()).parent == mine
    assert tempfile.gettempdir() == before


def test_a_timeout_kills_the_child_and_what_it_started(tmp_path):
    """The child and its own child sleep; past the timeout both are gone."""
    pids = tmp_path / "pids"

    def child() -> None:
        grandchild = os.fork()
        if grandchild == 0:
            time.sleep(60)
            os._exit(0)
        pids.write_text(str(grandchild))
        time.sleep(60)

    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="past 1 s"):
        fork_call(child, tmp_path / "child.log", timeout=1)
    assert time.monotonic() - t0 < 30
    grandchild = int(pids.read_text())
    for _ in range(100):  # reaped by init once killed
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the grandchild outlived the timeout")


@pytest.mark.skipif(not torch.distributed.is_available(), reason="no torch.distributed")
def test_torch_in_a_child_of_a_multithreaded_parent(tmp_path):
    """A parent that ran torch on two threads (pytest without workers does) forks a child that
    runs torch again: the child finishes, on one thread, where the parent's thread pool, which
    does not exist in the child, would hang it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        a = torch.randn(512, 512)
        (a @ a).sum()  # the parent's pool is started

        def child() -> int:
            b = torch.randn(512, 512)
            assert bool(torch.isfinite(b @ b).all())
            return torch.get_num_threads()

        assert fork_call(child, tmp_path / "log", timeout=60) == 1
    finally:
        torch.set_num_threads(threads)


def test_torchrun_forks_ranks_with_the_launchers_environment(tmp_path):
    """Each rank sees torchrun's variables (its rank, a world of 2, one thread), joins the
    process group and all-reduces; a failing rank fails the launch."""
    script = tmp_path / "rank.py"
    script.write_text(
        "import os, sys, torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "t = torch.tensor([dist.get_rank() + 1.0])\n"
        "dist.all_reduce(t)\n"
        "with open(os.path.join(sys.argv[1], f\"r{os.environ['RANK']}\"), 'w') as f:\n"
        "    f.write(f\"{os.environ['WORLD_SIZE']} {torch.get_num_threads()} {t.item()}\")\n"
        "dist.destroy_process_group()\n"
        "sys.exit(int(sys.argv[2]))\n"
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the launcher sets each rank to OMP_NUM_THREADS
    try:
        ok = torchrun([str(script), str(tmp_path), "0"], tmp_path / "ok.log")
    finally:
        torch.set_num_threads(threads)
    assert ok.returncode == 0, ok.stdout[-3000:]
    assert [(tmp_path / f"r{r}").read_text() for r in (0, 1)] == ["2 1 3.0"] * 2
    assert torch.get_num_threads() == threads and "RANK" not in os.environ
    failed = torchrun([str(script), str(tmp_path), "5"], tmp_path / "failed.log")
    assert failed.returncode == 1 and "ChildFailedError" in failed.stdout


def test_the_cli_file_is_what_python_m_runs():
    """``-m mechlingo.cli`` becomes ``--run-path CLI_MAIN``: the file ``python -m`` runs."""
    import importlib.util

    spec = importlib.util.find_spec("mechlingo.cli.__main__")
    assert spec is not None and Path(str(spec.origin)).resolve() == CLI_MAIN
