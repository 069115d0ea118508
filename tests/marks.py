"""The suite's marks, derived from what a test does (tests/conftest.py applies them).

* ``embedded``: the test's fixtures include ``gemma`` (or one built on it); implies ``slow``.
* ``subprocess``: the test or a fixture it uses reaches, through functions of the test
  modules, a call that starts a process (``subprocess``, ``os.fork``/``system``/``exec*``,
  ``multiprocessing``): CLI runs in a child, torchrun, notebooks, Chromium, pip, mount.
* ``browser``: it reaches :func:`tests.browser.check_report` (headless Chromium).
* :data:`BY_HAND`: the few tests where neither shows (a notebook kernel, a child process that
  loads the default model, a command run in process on the default model).

A guard checks each run: a test not marked ``subprocess`` that starts a process, or one not
marked ``embedded`` that loads the real embedded model (a fake cache does not count), fails.
"""

from __future__ import annotations

import dis
import functools
import os
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

#: the functions of ``os`` that start a process
OS_SPAWNERS = frozenset(
    {"fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp"}
    | {f"exec{s}" for s in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")}
    | {f"spawn{s}" for s in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")}
)
#: modules whose use starts processes
SPAWNING_MODULES = frozenset({"subprocess", "multiprocessing", "torch.multiprocessing", "pty"})
#: audit events of a process start (sys.addaudithook)
SPAWN_EVENTS = frozenset(
    {"subprocess.Popen", "os.fork", "os.forkpty", "os.system", "os.posix_spawn", "os.exec"}
    | {"os.spawn"}
)
#: programs that libraries run to probe the system (not a test starting a process)
PROBES = frozenset({"ldconfig", "uname", "gcc", "cc", "ld", "objdump", "lsb_release"})


#: tests whose process start or embedded load happens where no test code shows it (a
#: notebook's kernel, a child process loading the default model), by test function name
BY_HAND: dict[str, frozenset[str]] = {
    "test_notebook_runs_and_renders": frozenset({"subprocess", "embedded"}),
    "test_lens_and_eval_commands_on_default_model": frozenset({"embedded"}),
    "test_lens_cli_token_grid_on_the_embedded_model": frozenset({"embedded"}),
    "test_fresh_venv_runs_a_command_on_the_embedded_model": frozenset({"embedded"}),
}


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    """A code object and every code object nested in it (inner functions, lambdas)."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _spawning_module(name: str) -> bool:
    return name in SPAWNING_MODULES or name.split(".")[0] in {"multiprocessing", "nbclient"}


def _effects_of_global(obj: Any, attrs: frozenset[str]) -> set[str]:
    """What a global the code refers to does by itself (``attrs``: the attribute names used)."""
    found: set[str] = set()
    module = str(getattr(obj, "__module__", "") or "")
    if isinstance(obj, types.ModuleType):
        if _spawning_module(obj.__name__) or (obj is os and attrs & OS_SPAWNERS):
            found.add("subprocess")
    elif callable(obj) and _spawning_module(module):
        found.add("subprocess")  # from subprocess import run
    if module == "tests.browser" and getattr(obj, "__name__", "") == "check_report":
        found.add("browser")
    return found


@functools.cache
def _direct(fn: Callable[..., Any]) -> tuple[frozenset[str], tuple[Callable[..., Any], ...]]:
    """What ``fn``'s own code does, and the functions of the test modules it refers to."""
    names: set[str] = set()
    found: set[str] = set()
    for c in _codes(fn.__code__):
        names.update(c.co_names)
        for ins in dis.get_instructions(c):
            if ins.opname == "IMPORT_NAME" and _spawning_module(str(ins.argval)):
                found.add("subprocess")  # import subprocess inside the function
            if ins.opname == "IMPORT_FROM" and ins.argval in {"check_report"}:
                found.add("browser")
    attrs = frozenset(names)
    glob = getattr(fn, "__globals__", {})
    calls: list[Callable[..., Any]] = []
    for name in sorted(names & set(glob)):
        obj = getattr(glob[name], "__wrapped__", glob[name])  # through functools.cache & co.
        found |= _effects_of_global(obj, attrs)
        if not str(getattr(obj, "__module__", "") or "").startswith("tests"):
            continue
        if isinstance(obj, type):
            calls.extend(m for m in vars(obj).values() if hasattr(m, "__code__"))
        elif hasattr(obj, "__code__"):
            calls.append(obj)
    return frozenset(found), tuple(calls)


def reached(fn: Callable[..., Any], seen: set[int] | None = None) -> set[str]:
    """The effects (``"subprocess"``, ``"browser"``) that ``fn`` reaches: through its own code
    and, transitively, the functions of the test modules (``tests.*``) it refers to."""
    seen = set() if seen is None else seen
    fn = getattr(fn, "__wrapped__", fn)
    if not hasattr(fn, "__code__") or id(fn) in seen:
        return set()
    seen.add(id(fn))
    found, calls = _direct(fn)
    out = set(found)
    for callee in calls:
        out |= reached(callee, seen)
    return out


def marks_for(item: Any) -> set[str]:
    """The derived marks of one collected test item."""
    marks: set[str] = set()
    fn = getattr(item, "function", None)
    if fn is not None:
        marks |= BY_HAND.get(fn.__name__, frozenset())
    if "gemma" in set(getattr(item, "fixturenames", ())):
        marks.add("embedded")
    fns = [fn]
    info = getattr(item, "_fixtureinfo", None)
    for defs in getattr(info, "name2fixturedefs", {}).values():
        fns.extend(
            d.func for d in defs if str(getattr(d.func, "__module__", "")).startswith("tests")
        )
    seen: set[int] = set()
    for f in fns:
        if f is not None:
            marks |= reached(f, seen)
    if "browser" in marks:
        marks.add("subprocess")  # Chromium is a process
    if "embedded" in marks or item.get_closest_marker("embedded") is not None:
        marks.add("slow")
    return marks


class Guard:
    """Records, per test, whether it started a process or loaded the embedded model."""

    def __init__(self) -> None:
        self.active = False
        self.spawned: list[str] = []
        self.embedded: list[str] = []

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        """The audit hook: note a process start while a test runs."""
        if not self.active or event not in SPAWN_EVENTS:
            return
        what = args[1] if event == "subprocess.Popen" and len(args) > 1 else args[:1]
        argv = [what] if isinstance(what, (str, bytes, os.PathLike)) else list(what or [])
        prog = os.path.basename(os.fsdecode(argv[0])) if argv else event
        if prog not in PROBES:
            self.spawned.append(f"{event} {prog}")

    def start(self) -> None:
        """Begin recording one test."""
        self.active, self.spawned, self.embedded = True, [], []

    def problems(self, marks: set[str]) -> list[str]:
        """What the recorded test did that its marks do not say (empty when they agree)."""
        self.active = False
        out = []
        if self.spawned and "subprocess" not in marks:
            out.append(f"starts a process ({self.spawned[0]}) but is not marked subprocess")
        if self.embedded and "embedded" not in marks:
            out.append("loads the embedded model but is not marked embedded")
        return out


def install(guard: Guard) -> None:
    """Hook ``guard`` into the interpreter's audit events and the embedded model's loader."""
    from mechlingo.core import models

    sys.addaudithook(guard.audit)
    real = models.ensure_default_model
    home = os.path.realpath(models.cache_dir())

    def recording(*args: Any, **kwargs: Any) -> Any:
        folder = real(*args, **kwargs)
        if guard.active and os.path.realpath(folder).startswith(home):
            guard.embedded.append(str(folder))
        return folder

    models.ensure_default_model = recording  # type: ignore[assignment]
