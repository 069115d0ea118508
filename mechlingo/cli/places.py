"""Where a command runs and what it writes: the checks of ``--device``, ``--dtype``,
``--model`` and ``--out``, run before any model loads (by
:func:`~mechlingo.cli.validate.validate_args`, which re-exports them).

Each check raises a :class:`~mechlingo.core.errors.MechlingoError` subclass whose message says
what is wrong, which flag, and what to do.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from mechlingo.core.artifacts import output_target, writes_inside
from mechlingo.core.checks import check_gguf_file, check_model_folder
from mechlingo.core.errors import DeviceError, ModelLoadError, OutputError

__all__ = ["check_device", "check_dtype", "check_model_source", "check_out"]

# --------------------------------------------------------------------------------------
# Device, dtype, model source
# --------------------------------------------------------------------------------------


def check_device(text: str | None, flag: str = "--device") -> None:
    """Refuse a device string torch does not know or a device this machine lacks.

    Raises:
        DeviceError: ``gpu0`` (not a device), ``cuda`` on CPU-only torch, ``cuda:3`` with
            two GPUs, ...
    """

    if text is None:
        return
    if not text.strip():
        raise DeviceError(f"{flag} is empty", where=flag, fix="use cpu or cuda, or omit it")
    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError):
        raise DeviceError(
            f"{flag} {text!r} is not a device", where=flag, fix="use cpu, cuda or cuda:N"
        ) from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(
                f"{flag} {text} but torch sees no CUDA device (CPU-only torch or no GPU visible)",
                where=flag,
                fix="use --device cpu, or omit --device",
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise DeviceError(
                f"{flag} {text} but there are only {torch.cuda.device_count()} CUDA devices",
                where=flag,
                fix=f"use cuda:0 .. cuda:{torch.cuda.device_count() - 1}",
            )
    elif dev.type == "mps":
        if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise DeviceError(f"{flag} mps is not available here", where=flag, fix="use cpu")
    elif dev.type != "cpu":
        raise DeviceError(
            f"{flag} {text!r}: mechlingo runs on cpu, cuda or mps", where=flag, fix="use cpu"
        )


def check_dtype(text: str | None, flag: str = "--dtype") -> None:
    """Refuse a dtype name that is not a floating torch dtype (``nn``, ``int8``, ``""``).

    Raises:
        DeviceError: naming the flag and the usual choices.
    """

    if text is None:
        return
    found = getattr(torch, text.strip(), None) if text.strip() else None
    if not isinstance(found, torch.dtype) or not found.is_floating_point:
        raise DeviceError(
            f"{flag} {text!r} is not a floating-point torch dtype",
            where=flag,
            fix="use float32, bfloat16 or float16",
        )


def check_model_source(text: str | None, flag: str = "--model") -> None:
    """Cheap checks of ``--model`` before loading: an existing local folder or .gguf file
    must look complete (hub ids and the default are checked by the loader)."""

    if text is None:
        return
    if not text.strip():
        raise ModelLoadError(
            f"{flag} is empty", where=flag, fix="omit it for the embedded default model"
        )
    path = Path(text).expanduser()
    if path.suffix == ".gguf":
        if not path.exists():
            raise ModelLoadError(f"GGUF file {path} does not exist", where=flag)
        check_gguf_file(path)
    elif path.is_dir():
        check_model_folder(path)
    elif path.is_file():
        raise ModelLoadError(
            f"{flag} {text} is a file but not a .gguf file",
            where=flag,
            fix="pass a transformers folder, a .gguf file or a hub id",
        )


# --------------------------------------------------------------------------------------
# Output folder
# --------------------------------------------------------------------------------------


def _writable(folder: Path) -> bool:
    return os.access(folder, os.W_OK | os.X_OK)


def check_out(text: str | None, flag: str = "--out", *, artifact: bool = False) -> None:
    """Check that ``--out`` can be written, before any work is done.

    Refuses an empty string, an existing file, a path under a file (``file/sub``), a
    read-only folder, the current folder or one of its parents (the output folder is
    replaced as a whole), and, with ``artifact`` (folders of saved vectors or clamps), a
    non-empty folder that mechlingo did not write. An existing ``--out`` that is a mount
    point, or whose parent cannot be written, needs only itself writable: its outputs are
    published file by file inside it.

    Raises:
        OutputError: naming the flag and what to do.
    """
    if text is None:
        return
    if not text.strip():
        raise OutputError(
            f"{flag} is empty (it would write into the current folder)",
            where=flag,
            fix="name an output folder, e.g. --out results",
        )
    try:
        path = output_target(text)  # a symlink to a folder: that folder is written
    except OutputError as err:
        raise OutputError(f"{flag} {err.message}", where=flag, fix=err.fix) from None
    if path.exists() and not path.is_dir():
        raise OutputError(
            f"{flag} {text} is an existing file", where=flag, fix="name a folder instead"
        )
    here = Path.cwd().resolve()
    resolved = path.resolve()
    if resolved == here or resolved in here.parents:
        raise OutputError(
            f"{flag} {text} is the current folder or one of its parents; mechlingo replaces "
            "its output folder as a whole",
            where=flag,
            fix="name a subfolder, e.g. --out results",
        )
    probe = path
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise OutputError(
            f"{flag} {text}: {probe} is a file, so no folder can be created under it",
            where=flag,
            fix="choose a path whose parents are folders",
        )
    need = path.parent if path.exists() else probe
    if path.exists() and writes_inside(path):
        need = path  # published file by file inside it: only --out itself is written
    for folder in {need, path} if path.exists() else {need}:
        if not _writable(folder):
            raise OutputError(
                f"{flag} {text}: {folder} is not writable",
                where=flag,
                fix="choose an --out in a folder you can write",
            )
    if artifact and path.is_dir() and any(path.iterdir()):
        ours = any(
            (path / f).exists()
            for f in ("summary.json", "build.json", "intervention.json", "task/intervention.json")
        )
        if not ours:
            raise OutputError(
                f"{flag} {text} is a non-empty folder that mechlingo did not write; an "
                "artifact folder is replaced as a whole",
                where=flag,
                fix="choose a new or empty folder",
            )
