"""The derived marks (tests/marks.py): the rule on real tests of the suite and on small
functions written here, and the guard that fails a test whose marks are wrong."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests import marks


@dataclass
class Item:
    """The parts of a collected pytest item that :func:`marks.marks_for` reads."""

    function: Any
    fixturenames: list[str] = field(default_factory=list)
    own: set[str] = field(default_factory=set)

    def get_closest_marker(self, name: str) -> Any:
        return name if name in self.own else None


def _spawns() -> None:
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def _helper_then_spawn() -> None:
    _spawns()


@functools.cache
def _cached_spawn() -> int:
    _spawns()
    return 1


def _through_a_cache() -> None:
    _cached_spawn()


def _imports_inside() -> None:
    import subprocess as sp

    sp.check_output(["true"])


def _forks() -> None:
    os.fork()


def _pure(x: int) -> int:
    return os.path.join("a", str(x)).count("a")


@pytest.mark.parametrize(
    ("fn", "expected"),
    [
        (_spawns, {"subprocess"}),
        (_helper_then_spawn, {"subprocess"}),
        (_through_a_cache, {"subprocess"}),
        (_imports_inside, {"subprocess"}),
        (_forks, {"subprocess"}),
        (_pure, set()),
    ],
)
def test_rule_on_small_functions(fn, expected):
    assert marks.marks_for(Item(fn)) == expected


def test_fixtures_decide_embedded_and_it_implies_slow():
    assert marks.marks_for(Item(_pure, ["tiny", "tmp_path"])) == set()
    assert marks.marks_for(Item(_pure, ["gemma"])) == {"embedded", "slow"}
    assert marks.marks_for(Item(_pure, own={"embedded"})) == {"slow"}


def test_rule_on_tests_of_the_suite():
    from tests.core import test_models
    from tests.system import test_distributed, test_reports_browser

    # a fake model cache (MECHLINGO_CACHE in tmp_path) is not the embedded model
    for fn in (test_models.test_default_cache_is_checked_and_rebuilt,
               test_models.test_interrupted_conversion_leaves_no_cache):  # fmt: skip
        assert marks.marks_for(Item(fn, ["tmp_path", "monkeypatch"])) == set(), fn.__name__
    assert marks.marks_for(Item(test_models.test_default_model_loads_from_cache, ["gemma"])) == {
        "embedded",
        "slow",
    }
    torchrun = test_distributed.test_experts_command_under_torchrun_equals_one_process
    assert marks.marks_for(Item(torchrun, ["tiny_dir", "tmp_path"])) == {"subprocess"}
    assert marks.marks_for(Item(test_distributed.test_shard_bounds_cover_in_order)) == set()
    page = test_reports_browser.test_report_renders_in_browser
    assert marks.marks_for(Item(page, ["reports"])) == {"browser", "subprocess"}


def test_guard_names_what_the_marks_do_not_say():
    guard = marks.Guard()
    guard.start()
    guard.audit("subprocess.Popen", (sys.executable, [sys.executable, "-c", "pass"], None, None))
    guard.audit("open", ("/etc/hosts", "r", 0))  # not a process
    assert guard.problems(set()) == [
        f"starts a process (subprocess.Popen {os.path.basename(sys.executable)}) but is not "
        "marked subprocess"
    ]
    guard.start()
    guard.audit("subprocess.Popen", ("/sbin/ldconfig", ["/sbin/ldconfig", "-p"], None, None))
    guard.embedded.append("/root/.cache/mechlingo/gemma-3-270m")
    assert guard.problems({"embedded"}) == []  # a library's probe is not the test's process
    guard.start()
    guard.audit("os.fork", ())
    assert guard.problems({"subprocess"}) == []
    assert not guard.active  # nothing is recorded between tests
    guard.audit("os.fork", ())
    assert guard.spawned == ["os.fork os.fork"]


def test_one_torch_thread_per_worker_unless_the_user_chose():
    """Inside an xdist worker with no ``OMP_NUM_THREADS`` the suite sets 1 (its children
    inherit it); a user's number, or no worker, is left alone. In this run: a worker that
    set it runs torch on one thread."""
    import torch

    from tests import conftest
    from tests.workers import one_thread_per_worker

    env = {"PYTEST_XDIST_WORKER": "gw0"}
    assert one_thread_per_worker(env) and env["OMP_NUM_THREADS"] == "1"
    mine = {"PYTEST_XDIST_WORKER": "gw1", "OMP_NUM_THREADS": "3"}
    assert not one_thread_per_worker(mine) and mine["OMP_NUM_THREADS"] == "3"
    alone: dict[str, str] = {}
    assert not one_thread_per_worker(alone) and alone == {}
    if conftest.ONE_THREAD:
        assert torch.get_num_threads() == 1 and os.environ["OMP_NUM_THREADS"] == "1"


def test_only_the_xdist_controller_skips_torch_and_the_package():
    """The controller (``-n N``, not a worker) runs no test; a worker, a run without ``-n``
    or with ``-n 0``, and any form not read, import everything. In this run (a process that
    runs tests) the conftest is no controller's."""
    from tests import conftest
    from tests.workers import is_xdist_controller as controller

    run = ["/venv/bin/python -m pytest"]
    assert controller([*run, "-q", "-n", "2", "--dist", "loadscope", "tests"], {})
    assert controller([*run, "-n2"], {}) and controller([*run, "--numprocesses=auto"], {})
    assert controller([*run, "tests"], {"PYTEST_ADDOPTS": "-n 2"})
    assert not controller([*run, "-n", "2"], {"PYTEST_XDIST_WORKER": "gw0"})
    assert not controller([*run, "-n", "0"], {}) and not controller([*run, "tests"], {})
    assert not controller([*run, "-n", "2", "-p", "no:xdist"], {})
    assert not conftest.CONTROLLER and "mechlingo.core.tokens" in sys.modules
