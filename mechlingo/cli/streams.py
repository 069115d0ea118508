"""Standard output that cannot turn a finished run into a failed one (``docs/security.md``,
"The exit status tells the truth").

While a command runs, ``sys.stdout`` is a :class:`GuardedStdout`: a line the stream's encoding
cannot hold (``--out résultats`` on an ASCII terminal) is printed with escapes
(``r\\xe9sultats``); each write is flushed at once, so a closed pipe shows where it happens,
not at the interpreter's exit (status 120); a closed pipe *before* the command's outputs are
written stops it as SIGPIPE stops any program (:class:`~mechlingo.core.faults.Stopped`,
status 141, ``--out`` as it was), *after* them (:func:`outputs_written`) the rest of the
output is dropped and the run's status stands. Imports only :mod:`mechlingo.core.faults`."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
from collections.abc import Iterator
from typing import Any, TextIO

from mechlingo.core.faults import Stopped

__all__ = ["GuardedStdout", "guarded_stdout", "outputs_written"]


class GuardedStdout:
    """A text stream around ``inner`` (see the module docstring). ``written`` says that the
    command's outputs are in place; ``closed`` that the reader went away."""

    def __init__(self, inner: TextIO) -> None:
        self.inner = inner
        self.written = False
        self.closed_pipe = False

    def write(self, text: str) -> int:
        if not self.closed_pipe:
            self._guard(lambda: self._write(text))
        return len(text)

    def flush(self) -> None:
        if not self.closed_pipe:
            self._guard(self.inner.flush)

    def _write(self, text: str) -> None:
        try:
            self.inner.write(text)
        except UnicodeEncodeError:
            enc = getattr(self.inner, "encoding", None) or "ascii"
            self.inner.write(text.encode(enc, "backslashreplace").decode(enc, "replace"))
        self.inner.flush()

    def _guard(self, step: Any) -> None:
        try:
            step()
        except OSError as err:
            if err.errno not in (errno.EPIPE, errno.ECONNRESET):
                raise
            self.closed_pipe = True
            _to_devnull(self.inner)
            if not self.written:
                raise Stopped(int(signal.SIGPIPE)) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _to_devnull(stream: TextIO) -> None:
    """Point ``stream``'s file descriptor at ``/dev/null``, so that what is still buffered
    and the interpreter's last flush go nowhere instead of failing again."""
    with contextlib.suppress(OSError, ValueError, AttributeError):  # no descriptor: nothing to do
        fd = stream.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, fd)
        finally:
            os.close(null)


def outputs_written() -> None:
    """Say that the running command's outputs are in place: from now on a closed stdout no
    longer stops it (its exit status is then the run's)."""
    out = sys.stdout
    if isinstance(out, GuardedStdout):
        out.written = True


@contextlib.contextmanager
def guarded_stdout() -> Iterator[GuardedStdout]:
    """``sys.stdout`` is a :class:`GuardedStdout` while inside; restored after."""
    old = sys.stdout
    guard = GuardedStdout(old)
    sys.stdout = guard  # type: ignore[assignment]
    try:
        yield guard
    finally:
        if sys.stdout is guard:
            sys.stdout = old
