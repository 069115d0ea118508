"""What the end-to-end runs share: writing their files into one folder in one step.

:class:`~mechlingo.analyses.recall.trace.TraceRun` (``mechlingo trace``) and
:class:`~mechlingo.analyses.recall.steer_eval.SteerEvalResult` (``mechlingo steer eval``) each say which
files they consist of (``files(meta)``: name -> JSON-ready object, text or bytes);
:class:`WritesFolder` writes them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from mechlingo.core.artifacts import write_files
from mechlingo.core.distributed import is_main

__all__ = ["WritesFolder"]


class WritesFolder:
    """Mixin for a result with a ``files(meta)`` method: :meth:`write` puts those files (and
    ``extra`` ones, e.g. a report) into a folder in one step."""

    files: Callable[..., dict[str, Any]]

    def write(
        self, out: str | Path, *, meta: dict[str, Any] | None = None, extra: dict | None = None
    ) -> Path:
        """Write :meth:`files` (and ``extra`` files) into ``out`` in one step, replacing a
        previous folder only once everything is written
        (:func:`mechlingo.core.artifacts.write_files`); under torchrun on rank 0 only.
        Returns the folder."""
        files = {**self.files(meta), **(extra or {})}
        return write_files(out, files) if is_main() else Path(out)
