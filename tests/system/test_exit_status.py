"""The exit status tells the truth about a run, whatever happens to its stdout.

- A run that wrote its outputs exits 0 when its stdout is a pipe whose reader has gone
  (``mechlingo ... | head -c1``, the read end closed before the last line) or cannot encode
  the output folder's name (``PYTHONIOENCODING=ascii`` and ``--out résultats``: the line is
  printed with ``\\xe9``): in a forked child whose stdout is a real pipe with no reader,
  and in process.
- A closed stdout before anything is written (``--dry-run``, whose plan is its output) stops
  quietly: one line on stderr, status 141 (128 + SIGPIPE), ``--out`` untouched.
- Ctrl-C while the command is still importing torch (seen in the child's memory map) is one
  line and status 130, through the console script's entry point from ``pyproject.toml``.
"""

from __future__ import annotations

import errno
import io
import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest

from mechlingo.cli import main
from tests.forks import fork_call

REPO = Path(__file__).resolve().parents[2]


def _entry_code() -> str:
    """Python code that runs the ``mechlingo`` console script as pip's wrapper does."""
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    module, func = scripts["scripts"]["mechlingo"].split(":")
    return f"import sys\nfrom {module} import {func} as entry\nsys.exit(entry())\n"


def _default_sigint() -> None:
    """In the child before it runs Python: SIGINT back to its default action."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path, **extra)


def _lens(tiny_dir: Any, out: str, *more: str) -> list[str]:
    return ["lens", "--model", str(tiny_dir), "--langs", "en", "--limit", "1", "--track", "",
            "--quiet", "--out", out, *more]  # fmt: skip


class _ClosedPipe(io.TextIOBase):
    """A stdout whose reader has gone: every write fails with ``EPIPE``."""

    encoding = "utf-8"

    def write(self, text: str) -> int:
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")


def test_finished_run_with_a_closed_stdout_exits_0(tiny_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    assert main(_lens(tiny_dir, "out")) == 0, capsys.readouterr().err[-3000:]
    assert (tmp_path / "out" / "summary.json").is_file()


def test_finished_run_on_an_ascii_stdout_prints_what_it_can(tiny_dir, tmp_path, monkeypatch,
                                                            capsys):  # fmt: skip
    monkeypatch.chdir(tmp_path)
    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="ascii"))
    assert main(_lens(tiny_dir, "résultats")) == 0, capsys.readouterr().err[-3000:]
    assert b"wrote r\\xe9sultats/summary.json" in raw.getvalue()
    assert (tmp_path / "résultats" / "summary.json").is_file()


def test_closed_stdout_before_any_output_stops_with_141(tiny_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "summary.json").write_text('{"old": true}', encoding="utf-8")
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    status = main(_lens(tiny_dir, "out", "--dry-run"))
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert status == 128 + signal.SIGPIPE, err[-3000:]
    assert len(lines) == 1 and "SIGPIPE" in lines[0] and "out was left as it was" in lines[0]
    assert os.listdir(tmp_path / "out") == ["summary.json"]


@pytest.mark.parametrize("encoding", ["utf-8", "ascii"])
def test_finished_run_into_a_closed_pipe_exits_0(tiny_dir, tmp_path, monkeypatch, encoding):
    """In a forked child whose stdout is a real pipe with no reader (the kernel's ``EPIPE``),
    block-buffered as a pipe is, ending with the flush the interpreter does at exit."""
    monkeypatch.chdir(tmp_path)

    def child() -> int:
        read, write = os.pipe()
        os.close(read)  # the reader is gone before the last line
        os.dup2(write, 1)
        os.close(write)
        log = sys.stdout
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding=encoding)
        code = main(_lens(tiny_dir, "résultats"))
        try:
            sys.stdout.flush()  # as at the interpreter's exit, where it used to end in 120
        except BrokenPipeError:
            code = 120
        sys.stdout = log
        return code

    status = fork_call(child, tmp_path / "log")
    log = (tmp_path / "log").read_text(encoding="utf-8", errors="replace")
    assert status == 0 and "Traceback" not in log, log[-3000:]
    assert sorted(p.name for p in (tmp_path / "résultats").iterdir()) == [
        "lens.csv", "report.html", "summary.json"]  # fmt: skip


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc (Linux)")
def test_ctrl_c_while_importing_is_one_line_and_130(tmp_path):
    # the child starts with Ctrl-C's default action, as in a terminal: a pytest-xdist worker
    # (or a test before this one) may ignore SIGINT, and a Python started with SIGINT
    # ignored keeps ignoring it (it ran to the end and exited 0)
    proc = subprocess.Popen(
        [sys.executable, "-c", _entry_code(), "lens", "--out", "out"], cwd=tmp_path,
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=_default_sigint,
    )  # fmt: skip
    deadline = time.time() + 120
    while True:  # interrupt while torch's libraries are being loaded: mid-import
        maps = Path(f"/proc/{proc.pid}/maps")
        try:
            if "libtorch" in maps.read_text(encoding="utf-8", errors="replace"):
                break
        except OSError:
            pass
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() < deadline, "torch never started loading"
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert proc.returncode == 130, err[-3000:]
    assert len(lines) == 1 and "stopped by SIGINT" in lines[0] and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


def test_every_command_says_when_its_outputs_are_written():
    """A command function that prints what it wrote calls ``outputs_written()`` first, so that
    a closed stdout from then on cannot turn its finished run into status 141."""
    import ast

    missing = []
    for path in sorted((REPO / "mechlingo" / "cli").glob("*.py")):
        for fn in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(fn, ast.FunctionDef):
                continue
            calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call)]
            names = [getattr(c.func, "id", getattr(c.func, "attr", "")) for c in calls]
            says = [c for c, n in zip(calls, names, strict=True) if n == "print"
                    and "wrote " in ast.unparse(c)]  # fmt: skip
            marks = [c.lineno for c, n in zip(calls, names, strict=True) if n == "outputs_written"]
            if says and not (marks and min(marks) < min(c.lineno for c in says)):
                missing.append(f"{path.name}:{fn.name}")
    assert missing == [], missing
