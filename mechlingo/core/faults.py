"""Faults of the machine and of the run, turned into errors that say what to do.

- :func:`disk_error`: a full disk, a read-only file system or a denied write as a
  :class:`~mechlingo.core.errors.ResourceError` naming the path and what to do.
- :func:`memory_error`: an out-of-memory error as a
  :class:`~mechlingo.core.errors.DeviceMemoryError` naming ``--batch-size`` and a value to try.
- :func:`stop_on_signals`: SIGTERM (and SIGHUP) raise :class:`Stopped`, as SIGINT raises
  ``KeyboardInterrupt``, so a stopped command unwinds and exits with ``128 + signal number``.
- :func:`file_lock`: an exclusive advisory lock on a file.
- :func:`derive_seed`: the seed of one stream (an arm, a k, a condition) from the user's seed
  and the stream's name, so streams never share draws and adding one changes no other.

This module imports only :mod:`mechlingo.core.errors` from mechlingo; what each fault looks
like to a user: ``docs/gotchas.md``."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mechlingo.core.errors import DeviceMemoryError, ResourceError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "DISK_ERRNOS",
    "FULL_ERRNOS",
    "OOM_WORDINGS",
    "Stopped",
    "derive_seed",
    "disk_error",
    "file_lock",
    "is_out_of_memory",
    "memory_error",
    "stop_on_signals",
]

#: errno values of an ``OSError`` that the user fixes (space, a read-only disk, permissions).
DISK_ERRNOS: dict[int, str] = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EFBIG: "the file is larger than the file system allows",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "the operation is not permitted",
}

#: errno values of a file system that has no locks.
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL)

#: errno values of a full disk.
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def disk_error(
    err: BaseException, *, what: str, fix: str | None = None, atomic: bool = True
) -> ResourceError | None:
    """``err`` as a one-line :class:`ResourceError` when it is a disk fault the user can fix
    (:data:`DISK_ERRNOS`), else ``None`` (the caller re-raises it).

    Args:
        err: the exception caught.
        what: what was being done, e.g. ``"writing --out results"``.
        fix: what to do; default: free space (full disk) or choose a writable place.
        atomic: the write was atomic (the message then says nothing was left half-written).
    """
    if not isinstance(err, OSError) or err.errno not in DISK_ERRNOS:
        return None
    path = err.filename or ""
    reason = DISK_ERRNOS[err.errno]
    if fix is None:
        fix = (
            "free space on that disk (df -h shows it) or write somewhere else"
            if err.errno in FULL_ERRNOS
            else "choose a folder you can write, or fix its permissions"
        )
    at = f" ({path})" if path else ""
    name = errno.errorcode.get(err.errno, str(err.errno))
    clean = "; nothing was left half-written" if atomic else ""
    return ResourceError(f"{reason} while {what}{at} [{name}]{clean}", fix=fix)


#: how running out of memory reads, lower case: torch on CUDA, ROCm, MPS and XPU ("CUDA out of
#: memory", "MPS backend out of memory"), its CPU allocator ("DefaultCPUAllocator: can't
#: allocate memory", "not enough memory"), cuBLAS and cuDNN ("CUBLAS_STATUS_ALLOC_FAILED"),
#: C++ (``std::bad_alloc``) and the OS (``ENOMEM``: "Cannot allocate memory")
OOM_WORDINGS = (
    "out of memory",
    "not enough memory",
    "can't allocate memory",
    "cannot allocate memory",
    "failed to allocate",
    "unable to allocate",
    "alloc_failed",
    "bad_alloc",
)


def is_out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` (or the error it was raised from, ``raise ... from``) is running out of
    memory: Python's ``MemoryError``, torch's ``OutOfMemoryError``, an ``OSError`` with
    ``ENOMEM``, or a ``RuntimeError``/``OSError`` in one of the :data:`OOM_WORDINGS`."""
    seen: set[int] = set()
    cur: BaseException | None = err
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, MemoryError) or (isinstance(cur, OSError) and cur.errno == errno.ENOMEM):
            return True
        if "OutOfMemoryError" in {c.__name__ for c in type(cur).__mro__}:
            return True  # torch.cuda.OutOfMemoryError / torch.OutOfMemoryError
        if isinstance(cur, RuntimeError | OSError):
            text = str(cur).lower()
            if any(w in text for w in OOM_WORDINGS):
                return True
        cur = cur.__cause__
    return False


def memory_error(err: BaseException, batch_size: int | None, *, flag: str = "--batch-size",
                 extra_flags: tuple[str, ...] = ()) -> DeviceMemoryError:  # fmt: skip
    """A one-line :class:`DeviceMemoryError` for an out-of-memory ``err``: it names ``flag``
    and half of ``batch_size`` to try (or, at 1, what else lowers the memory)."""
    gpu = "CUDA" in type(err).__name__ or "cuda" in str(err).lower() or "GPU" in str(err)
    where = "the GPU" if gpu else "the device"
    if batch_size is not None and batch_size > 1:
        fix = f"try {flag} {max(1, batch_size // 2)}"
        if extra_flags:
            fix += " (or lower " + ", ".join(extra_flags) + ")"
    else:
        fix = "a smaller --dtype (bfloat16), fewer tokens per prompt, or a device with more memory"
    size = f" with {flag} {batch_size}" if batch_size is not None else ""
    first = str(err).strip().splitlines()[0][:160] if str(err).strip() else type(err).__name__
    return DeviceMemoryError(f"{where} ran out of memory{size} ({first})", fix=fix)


# --------------------------------------------------------------------------------------
# Signals
# --------------------------------------------------------------------------------------


class Stopped(BaseException):
    """Raised in the main thread by SIGTERM or SIGHUP inside :func:`stop_on_signals` (a
    ``BaseException``, like ``KeyboardInterrupt``, so ``except Exception`` does not catch
    it). ``signum`` is the signal's number; the conventional exit status is ``128 + signum``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


def _raise_stopped(signum: int, frame: Any) -> None:
    raise Stopped(signum)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP raise :class:`Stopped` in the main thread (SIGINT
    keeps raising ``KeyboardInterrupt``). The previous handlers are restored on exit. Does
    nothing outside the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    wanted = [signal.SIGTERM] + ([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])
    old = {s: signal.getsignal(s) for s in wanted}
    for s in wanted:
        signal.signal(s, _raise_stopped)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)


# --------------------------------------------------------------------------------------
# Locks and seeds
# --------------------------------------------------------------------------------------


@contextlib.contextmanager
def file_lock(path: str | os.PathLike[str]) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``path`` (a folder, or a file created if missing)
    while inside; another process asking for it waits. The lock goes with the process if it
    dies. Where ``fcntl`` does not exist (Windows) or the file system has no locks (some
    NFS mounts: ``ENOLCK``), this does nothing: the atomic rename of the caller still keeps
    readers from seeing a partial folder (two processes may then both do the work)."""
    if fcntl is None:  # pragma: no cover - Windows
        yield
        return
    path = Path(path)
    flags = os.O_RDONLY if path.is_dir() else os.O_RDWR | os.O_CREAT
    fd = os.open(path, flags, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as err:
            if err.errno not in _NO_LOCKS:
                raise
        yield
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def derive_seed(seed: int, *stream: str | int) -> int:
    """The seed of the stream ``stream`` (e.g. ``("random", "task")``, ``("es", 200)``) under
    the user's ``seed``: a stable hash of both, in ``[0, 2**63)``. Two different streams get
    unrelated seeds (``derive_seed(0, "diff")`` and ``derive_seed(1, "task")`` do not
    collide, as ``seed + 1`` would), and a stream's seed depends on nothing else that runs.
    With no ``stream`` the seed is returned as it is."""
    if not stream:
        return int(seed)
    key = "|".join([str(int(seed)), *(str(s) for s in stream)])
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") >> 1
