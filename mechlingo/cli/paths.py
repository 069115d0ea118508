"""The paths a command line names: resolved once, checked before any work.

Every path flag of every command is expanded here (``~`` and ``~user``): one that cannot be
(a user that does not exist, a ``~`` with no home directory) is refused with one line. The
paths a command *reads* (:data:`INPUT_FLAGS`) must be regular files or folders (a named pipe,
socket or device is refused before anything opens it), and the folders it *writes*
(:data:`OUTPUT_FLAGS`: ``--out``, ``--work``, ``--shard-dir``) may not be, hold or lie inside
any of them: on resolved paths, symlinks followed, so that no command writes over, moves or
deletes a file it reads, nor replaces a folder holding one. Repeated names in a list-valued
flag (:data:`LIST_FLAGS`) are refused too: a value given twice is always a slip (one lens of
two kept, a language counted twice).

The rules are listed in ``docs/security.md``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from pathlib import Path

from mechlingo.core.artifacts import sibling_name
from mechlingo.core.errors import DataError, InputError, OutputError
from mechlingo.core.untrusted import expand_path, refuse_special

__all__ = [
    "INPUT_FLAGS",
    "LIST_FLAGS",
    "OUTPUT_FLAGS",
    "check_paths",
    "check_repeats",
    "expand_path",
    "input_paths",
]

#: ``args`` attribute -> flag, for every flag that names a file or folder a command reads
INPUT_FLAGS = {
    "model": "--model",
    "facts": "--facts",
    "parallel": "--parallel",
    "side_effects": "--parallel",
    "vectors": "--vectors",
    "clamp": "--clamp",
    "control": "--control",
    "tuned_lens": "--tuned-lens",
    "text_file": "--text-file",
    "settings": "--settings",
}
#: ``args`` attribute -> flag, for every folder a command writes or removes
OUTPUT_FLAGS = {"out": "--out", "work": "--work", "shard_dir": "--shard-dir"}
#: ``args`` attribute -> flag of every comma-separated list whose items must be distinct
LIST_FLAGS = {
    "langs": "--langs",
    "relation": "--relation",
    "track": "--track",
    "target": "--target",
    "k": "--k",
    "layers": "--layers",
    "task_layers": "--task-layers",
    "diff_layers": "--diff-layers",
    "task_alphas": "--task-alphas",
    "diff_alphas": "--diff-alphas",
    "seeds": "--control-seeds",
    "mid_layers": "--mid-layers",
    "patch_sites": "--patch-sites",
    "decoder": "--decoder",
    "tuned_lens": "--tuned-lens",
}


def _items(name: str, text: str) -> list[str]:
    """The paths in one flag value (``--tuned-lens NAME=DIR,NAME=DIR``: the folders)."""
    if name == "tuned_lens":
        return [x.strip().partition("=")[2] or x.strip() for x in text.split(",") if x.strip()]
    if name == "settings":
        return [text] if text.strip().endswith(".json") else []
    return [text] if text.strip() else []


def input_paths(args: argparse.Namespace) -> Iterator[tuple[str, Path]]:
    """``(flag, path)`` of every existing file or folder the command line reads (expanded,
    not resolved); names that are not local paths (a hub id, the embedded model) are
    skipped."""
    for name, flag in INPUT_FLAGS.items():
        value = getattr(args, name, None)
        if not isinstance(value, str):
            continue
        for item in _items(name, value):
            path = expand_path(item, flag)
            if os.path.lexists(path):
                yield flag, path


def _writes(args: argparse.Namespace) -> Iterator[tuple[str, Path]]:
    """``(flag, path)`` of every folder the command writes or removes: ``--out``, ``--work``
    (or the default ``.OUT.work`` beside ``--out``), ``--shard-dir``."""
    for name, flag in OUTPUT_FLAGS.items():
        value = getattr(args, name, None)
        if isinstance(value, str) and value.strip():
            yield flag, expand_path(value, flag)
    out = getattr(args, "out", None)
    if isinstance(out, str) and out.strip() and hasattr(args, "work") and not args.work:
        path = expand_path(out, "--out").absolute()
        yield "--out", path.parent / f".{sibling_name(path.name)}.work"


def check_paths(args: argparse.Namespace) -> None:
    """The path rules above, for one parsed command line, before any work.

    Raises:
        InputError: a path that cannot be expanded.
        DataError: an input that is a named pipe, a socket or a device.
        OutputError: ``--out`` (or ``--work``, ``--shard-dir``) equal to, holding or inside
            an input.
    """
    for name, value in sorted(vars(args).items()):
        if isinstance(value, str) and value.startswith("~") and not name.startswith("_"):
            expand_path(value, "--" + name.replace("_", "-"))
    inputs = list(input_paths(args))
    for flag, path in inputs:
        refuse_special(path, DataError, what=f"{flag} {path}")
    for out_flag, out in _writes(args):
        out_real = out.resolve()
        for flag, path in inputs:
            real = path.resolve()
            if out_real == real:
                rel = "is"
            elif out_real in real.parents:
                rel = "holds"
            elif real in out_real.parents:
                rel = "is inside"
            else:
                continue
            raise OutputError(
                f"{out_flag} {out} {rel} the input {flag} {path}; mechlingo replaces the folders "
                "it writes as a whole and never writes over what it reads",
                where=out_flag,
                fix=f"choose an {out_flag} outside the folders the command reads",
            )


def _norm(item: str) -> str | int | float:
    for cast in (int, float):
        try:
            return cast(item)
        except ValueError:
            pass
    return item


def check_repeats(args: argparse.Namespace) -> None:
    """Refuse a list-valued flag that names one item twice (``--langs en,fr,en``, ``--k
    50,050``, ``--tuned-lens a=X,a=Y``: the same name with two lenses).

    Raises:
        InputError: naming the flag and the repeated item.
    """
    for name, flag in LIST_FLAGS.items():
        value = getattr(args, name, None)
        if not isinstance(value, str):
            continue
        items = [x.strip() for x in value.split(",") if x.strip()]
        if name == "tuned_lens":
            items = [x.partition("=")[0] if "=" in x else "(unnamed)" for x in items]
        seen: dict[str | int | float, str] = {}
        for item in items:
            key = _norm(item)
            if key in seen:
                same = "" if seen[key] == item else f" (as {seen[key]!r})"
                what = "name" if name == "tuned_lens" else "item"
                raise InputError(
                    f"{flag} {value!r} names {item!r} more than once{same}",
                    where=flag,
                    fix=f"give each {what} of {flag} once",
                )
            seen[key] = item
