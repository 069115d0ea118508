"""Child processes forked from the test process.

A forked child starts with what the test process has imported (torch, TransformerLens, the
package): a new interpreter spends most of a short command's time importing them again. It
ends as any other process does (an exit code or a signal, and the files it left), so a test
can kill it, or run torch's launcher in it with ranks that are forked in turn.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

#: the file that ``python -m mechlingo.cli`` runs (torchrun's ``--run-path`` takes a path)
CLI_MAIN = Path(__file__).resolve().parents[1] / "mechlingo" / "cli" / "__main__.py"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fork_call(
    fn: Callable[[], int | None],
    log: Path,
    env: Mapping[str, str | None] | None = None,
    timeout: float = 600.0,
) -> int:
    """``fn()`` in a forked child with ``env`` applied (``None`` removes a variable) and its
    stdout and stderr written to ``log``. Returns the child's exit code (``fn``'s int, 0 for
    ``None``, 1 for an exception, whose traceback goes to the log) or minus the signal that
    ended it. The child leads its own process group, which is killed, with whatever it
    started, when it runs past ``timeout`` seconds (then :class:`TimeoutError`). torch, where
    imported, runs on one thread in the child: a pool of the parent's OpenMP threads would
    hang it, since those threads do not exist there. Its temporary folder follows its
    environment (``TMPDIR``), as a new interpreter's would, not the parent's cached one."""
    with warnings.catch_warnings():  # Python 3.12+ warns of fork in a threaded process
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 70
        try:
            os.setpgid(0, 0)
            for key, value in (env or {}).items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            tempfile.tempdir = None  # read from the environment again
            if "torch" in sys.modules:  # the parent's OpenMP threads are not forked
                sys.modules["torch"].set_num_threads(1)
            fh = open(log, "w", encoding="utf-8")  # noqa: SIM115 - the child ends by _exit
            os.dup2(fh.fileno(), 1)
            os.dup2(fh.fileno(), 2)
            sys.stdout = sys.stderr = fh
            result = fn()
            code = 0 if result is None else int(result)
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
        except BaseException:  # noqa: BLE001 - reported in the log, the code says it failed
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            os._exit(code)
    try:
        os.setpgid(pid, pid)  # here too: the group exists before a timeout can signal it
    except OSError:
        pass  # the child set it first
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise TimeoutError(f"forked child ran past {timeout:.0f} s; see {log}")
        time.sleep(0.05)


def torchrun(
    args: Sequence[str],
    log: Path,
    env: Mapping[str, str | None] | None = None,
    nproc: int = 2,
    timeout: float = 600.0,
) -> subprocess.CompletedProcess[str]:
    """torch's launcher, ``torchrun --nproc_per_node NPROC --master_addr 127.0.0.1
    --master_port <free> --start-method fork --run-path ...``, run in a forked child
    (:func:`fork_call`): its elastic agent forks the ranks, which set up their process group
    from the launcher's environment as under a plain ``torchrun``.

    ``args``: what follows the launcher's options, ``["-m", "mechlingo.cli", ...]`` (run as
    the package's ``cli/__main__.py``) or a script's path and its arguments. ``WORLD_SIZE``
    and the like of an enclosing launch are removed, ``OMP_NUM_THREADS`` is 1 and ``TMPDIR``
    a folder beside the log (where the launcher leaves its ``torchelastic_*`` folders and a
    killed rank its temporary files) unless ``env`` says otherwise. Returns the launcher's
    exit code and the log as ``stdout``."""
    from torch.distributed import run

    args = list(args)
    if args[:2] == ["-m", "mechlingo.cli"]:
        args = [str(CLI_MAIN), *args[2:]]
    elif args[:1] == ["-m"]:
        raise ValueError(f"only -m mechlingo.cli is run by its path, not -m {args[1:2]}")
    launcher = ["--nproc_per_node", str(nproc), "--master_addr", "127.0.0.1", "--master_port",
                str(free_port()), "--start-method", "fork", "--run-path"]  # fmt: skip
    outer = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    tmp = log.parent / f"{log.stem}-tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    full_env: dict[str, str | None] = {**dict.fromkeys(outer), "OMP_NUM_THREADS": "1"}
    full_env.update({"TMPDIR": str(tmp), **(env or {})})

    def launch() -> None:
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))  # as a new interpreter would
        run.main([*launcher, *args])

    code = fork_call(launch, log, full_env, timeout)
    return subprocess.CompletedProcess(["torchrun", *launcher, *args], code, log.read_text(), "")
