"""Notebook kernels forked from a warm interpreter.

A fresh ``python -m ipykernel_launcher`` spends most of a short notebook's time importing
torch, TransformerLens and the package before its first cell computes anything. Here a
fork server (:mod:`multiprocessing`'s, one per test process) imports them once, in a new
interpreter that never ran a test (no shape-check hook, no fixture, no patched module), and
each kernel is a fork of it: the real ipykernel on the connection file jupyter_client wrote,
with the environment, folder and module path (``sys.path``) of a new interpreter. What a
module reads from the environment when it is imported is set again in the kernel (plotly's
renderer, torch's thread count, ipykernel's parent). ``make docs`` and ``make notebooks`` still start plain kernels.
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from jupyter_client.manager import AsyncKernelManager

ROOT = Path(__file__).resolve().parents[1]

#: what a kernel imports before its first cell reads data: ipykernel, and the model's stack
#: (``load_model`` imports TransformerLens's bridge and transformers)
_PRELOAD = [
    "ipykernel.kernelapp",
    "ipykernel.ipkernel",
    "torch",
    "transformers",
    "transformer_lens",
    "transformer_lens.model_bridge",
    "plotly.graph_objects",
    "plotly.io",
    "mechlingo.core.models",
]


def notebook_imports(folder: Path = ROOT / "notebooks") -> list[str]:
    """The modules the notebooks in ``folder`` import (``import x`` and ``from x import``)."""
    found: dict[str, None] = {}
    for path in sorted(folder.glob("*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] == "code":
                src = "".join(cell["source"])
                found.update(
                    dict.fromkeys(re.findall(r"^\s*(?:from|import)\s+([\w.]+)", src, re.M))
                )
    return list(found)


@functools.cache
def _context() -> tuple[Any, list[str]]:
    """The fork server's context, its preload list set before it first starts, and the
    module path of a new interpreter (the fork server has the test process's, which pytest
    extended with the checkout)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([*_PRELOAD, *notebook_imports()])
    fresh = subprocess.run(
        [sys.executable, "-c", "import json, sys; print(json.dumps(sys.path))"],
        capture_output=True, text=True, check=True, cwd=ROOT.parent,
    )  # fmt: skip
    return ctx, [p for p in json.loads(fresh.stdout) if p]


def _serve(args: list[str], env: dict[str, str], cwd: str, path: list[str]) -> None:
    """In the forked kernel: the environment, folder and module path asked for, then
    ipykernel's app."""
    os.setsid()  # its own session and process group, as jupyter_client's launcher starts it
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.path[:] = path
    torch = sys.modules.get("torch")
    if torch is not None and env.get("OMP_NUM_THREADS", "").isdigit():
        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    pio = sys.modules.get("plotly.io")
    if pio is not None and env.get("PLOTLY_RENDERER"):
        pio.renderers.default = env["PLOTLY_RENDERER"]
    # ipykernel reads its parent's pid from the environment when it is imported
    parent = (
        [f"--IPKernelApp.parent_handle={env['JPY_PARENT_PID']}"] if "JPY_PARENT_PID" in env else []
    )
    sys.argv = ["ipykernel_launcher", *args, *parent]
    from ipykernel import kernelapp

    kernelapp.launch_new_instance(argv=[*args, *parent])


class _KernelProcess:
    """What jupyter_client's local provisioner reads of a ``Popen``, for a forked kernel."""

    stdin = stdout = stderr = None

    def __init__(self, proc: Any) -> None:
        self._proc = proc
        self.pid = proc.pid

    def poll(self) -> int | None:
        return self._proc.exitcode

    def wait(self, timeout: float | None = None) -> int | None:
        self._proc.join(timeout)
        return self._proc.exitcode

    def send_signal(self, signum: int) -> None:
        if self._proc.exitcode is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class ForkedKernelManager(AsyncKernelManager):
    """An ``AsyncKernelManager`` whose ``ipykernel_launcher`` kernel is forked from the warm
    fork server instead of started as a new interpreter (``NotebookClient``'s
    ``kernel_manager_class``). Signals go to the kernel's own process."""

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw: Any) -> None:
        if "ipykernel_launcher" not in kernel_cmd:
            raise ValueError(f"not an ipykernel command: {kernel_cmd}")
        args = kernel_cmd[kernel_cmd.index("ipykernel_launcher") + 1 :]
        env = {str(k): str(v) for k, v in (kw.get("env") or os.environ).items()}
        if not kw.get("independent"):  # as jupyter_client's launcher sets it
            env["JPY_PARENT_PID"] = str(os.getpid())
        cwd = str(kw.get("cwd") or os.getcwd())
        ctx, path = _context()
        proc = ctx.Process(target=_serve, args=(args, env, cwd, path), daemon=True)
        proc.start()
        prov: Any = self.provisioner
        prov.process = _KernelProcess(proc)
        prov.pid, prov.pgid, prov.cwd = proc.pid, None, cwd
        self._reconcile_connection_info(prov.connection_info)
