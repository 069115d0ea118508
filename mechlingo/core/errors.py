"""One error hierarchy for everything a user can get wrong.

Every error mechlingo raises on bad input is a :class:`MechlingoError`; each subclass also
keeps its builtin base (``ValueError``, ``RuntimeError``, ``OSError``), so ``except
ValueError`` keeps working. The ``mechlingo`` command turns one into a single line on stderr
and exit status 2 (what is wrong, where, and what to do)::

    mechlingo eval: error: --batch-size must be at least 1, got 0 -> give a positive number

Anything else is a bug, reported with its traceback and exit status 1. Here:
:class:`InputError`, :class:`DataError`, :class:`OutputError`, :class:`ArtifactError`,
:class:`MissingArtifactError`, :class:`ContextLengthError`, :class:`DeviceError`,
:class:`ResourceError`, :class:`DeviceMemoryError`; the others live next to their code. Every
class and when it is raised: ``docs/gotchas.md`` ("Error classes"). This module imports
nothing from mechlingo, so every module can import it."""

from __future__ import annotations

__all__ = [
    "ExpertError",
    "InterventionError",
    "ModelMismatchError",
    "ModelLoadError",
    "ArtifactError",
    "ContextLengthError",
    "DataError",
    "DeviceError",
    "DeviceMemoryError",
    "InputError",
    "MechlingoError",
    "MissingArtifactError",
    "OutputError",
    "ResourceError",
    "format_error",
]


class MechlingoError(Exception):
    """Base class of every error mechlingo raises on bad input.

    Args:
        message: what is wrong.
        where: where it is: ``"file.jsonl, line 3"``, ``"--batch-size"`` (optional).
        fix: what to do about it (optional).

    ``str(err)`` is the message with ``where`` and ``fix`` appended, on one line.
    """

    def __init__(self, message: str = "", *, where: str | None = None, fix: str | None = None):
        super().__init__(message)
        self.message = message
        self.where = where
        self.fix = fix

    def __str__(self) -> str:
        text = str(self.args[0]) if self.args else ""
        if self.where and self.where not in text:
            text = f"{text} [{self.where}]"
        if self.fix:
            text = f"{text} -> {self.fix}"
        return text


class InputError(MechlingoError, ValueError):
    """A bad argument or flag value."""


class DataError(InputError):
    """A malformed or unusable data file; the message names the file and the line."""


class OutputError(MechlingoError, ValueError):
    """The output folder cannot be written (an existing file, a read-only folder, ...)."""


class ArtifactError(MechlingoError, ValueError):
    """A saved artifact (vectors, clamp) is missing, corrupt, incomplete or unusable."""


class MissingArtifactError(ArtifactError, FileNotFoundError):
    """A saved artifact folder or one of its files does not exist."""


class ContextLengthError(InputError):
    """A prompt (or prompt plus generated tokens) is longer than the model's context."""


class DeviceError(InputError):
    """An unknown or unavailable device, or an unknown dtype."""


class ResourceError(MechlingoError, OSError):
    """The machine refused a write (disk full, read-only, permission denied, a cache folder
    that cannot be created); nothing half-written is left, the message says what to do."""


class DeviceMemoryError(MechlingoError, MemoryError):
    """The GPU (or CPU) ran out of memory; the message names the batch-size flag and a
    smaller value to try."""


def format_error(err: BaseException) -> str:
    """``err`` as one line: newlines folded, the class name added for library errors."""
    text = " ".join(str(err).split())
    name = type(err).__name__
    if name not in ("UsageError", "InputError") and not text.startswith(name):
        text = f"{name}: {text}"
    return text


class ModelLoadError(MechlingoError, RuntimeError):
    """A model could not be loaded; the message says why and what to do."""


class InterventionError(MechlingoError, ValueError):
    """An intervention does not fit the model or cannot be built/saved; the message says why."""


class ModelMismatchError(InterventionError):
    """A saved intervention was built for a different model (or weight mode)."""


class ExpertError(MechlingoError, ValueError):
    """Bad input to an expert-neuron analysis (the message says what to change)."""
