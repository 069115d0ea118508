"""The one rule of interrupted runs, for every long command: ``--work``, ``--fresh``, ``--resume``.

``steer eval``, ``experts``, ``align``, ``tuned-lens`` and ``replicate`` split their run into
checkpoints (:class:`mechlingo.core.checkpoints.Checkpoints`) kept in a work folder beside ``--out``
(``.OUT.work/`` or ``--work DIR``), keyed by the mechlingo version, the model's weights
fingerprint, the data and every setting that changes a number: a rerun of the same command
goes on from the checkpoints. Entry points: :func:`add_work_args`, :func:`open_checkpoints`,
:func:`finish_checkpoints`, :func:`data_key`, :func:`settings_key`, :func:`all_ranks_have`. The
analyses keep their own checkpoints in the ``Checkpoints`` made here
(:func:`mechlingo.analyses.experts.run.run_experts`,
:func:`mechlingo.analyses.experts.align_run.run_alignment`,
:func:`mechlingo.analyses.decoders.run.run_tuned_lens`,
:func:`mechlingo.analyses.recall.steer_eval.run_steer_eval`). ``docs/gotchas.md`` ("Going on
after a stop") has the rule for users.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from mechlingo.card.replicate import weights_fingerprint
from mechlingo.cli.common import UsageError
from mechlingo.cli.glossary import about
from mechlingo.core.artifacts import sibling_name
from mechlingo.core.checkpoints import Checkpoints, key_hash, release_free_locks
from mechlingo.core.describe import model_info
from mechlingo.core.distributed import all_reduce_state, dist_info
from mechlingo.core.types import Model

__all__ = [
    "add_work_args",
    "all_ranks_have",
    "data_key",
    "finish_checkpoints",
    "hash_files",
    "open_checkpoints",
    "require_finished",
    "work_folder",
]

#: bumped when a checkpoint's stored result changes meaning (old checkpoints are then not reused)
CHECKPOINT_VERSION = 1

#: flags that change no number (where the output goes, the progress bars, the checkpoints)
_NOT_NUMBERS = frozenset({"out", "quiet", "work", "resume", "fresh", "command", "steer_command"})


def add_work_args(p: argparse.ArgumentParser) -> None:
    """``--work DIR``, ``--fresh`` and ``--resume`` (go on, and refuse when there is nothing
    to go on from)."""
    g = p.add_argument_group("interrupted runs")
    g.add_argument(
        "--work",
        default=None,
        metavar="DIR",
        help=about("--work", "default: .OUT.work beside --out; it may not be inside --out"),
    )
    g.add_argument(
        "--fresh",
        action="store_true",
        help=about(
            "--fresh",
            "by default a rerun of the same command with the same model, "
            "data and settings goes on from them",
        ),
    )
    g.add_argument(
        "--resume",
        action="store_true",
        help=about(
            "--resume",
            "exit 2, nothing computed, e.g. because a setting, the model, "
            "the data or the mechlingo version changed since the interrupted run; "
            "without it a rerun also goes on from its checkpoints, and starts over when "
            "there are none",
        ),
    )


def work_folder(args: argparse.Namespace) -> Path:
    """The work folder of ``args`` (``--work``, or ``.OUT.work`` beside ``--out``, with
    ``OUT`` shortened as :func:`~mechlingo.core.artifacts.sibling_name` does when the name
    would pass the 255-byte limit); a :class:`UsageError` when it is ``--out`` or inside it."""
    out = Path(args.out).expanduser().absolute()
    if args.work:
        work = Path(args.work).expanduser().absolute()
        if work == out or out in work.parents:
            raise UsageError(
                f"--work {args.work} is inside --out {args.out}, which is replaced in one step "
                "when the run ends",
                where="--work",
                fix="choose a folder outside --out (or drop --work: the default is .OUT.work)",
            )
        return work
    return out.parent / f".{sibling_name(out.name)}.work"


def hash_files(folder: str | Path | None) -> str | None:
    """A short hash of the names and bytes of every file under ``folder`` (``None``: none)."""
    if folder is None:
        return None
    h = hashlib.sha256()
    root = Path(folder)
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def settings_key(args: argparse.Namespace, skip: Iterable[str] = ()) -> dict[str, Any]:
    """Every plain flag value of ``args`` but those that change no number (and ``skip``:
    flags whose effect is in the checkpoint names, such as the list of k)."""
    drop = _NOT_NUMBERS | set(skip)
    plain = (str, int, float, bool, type(None), list, tuple)
    return {
        k: v
        for k, v in sorted(vars(args).items())
        if not k.startswith("_") and k not in drop and isinstance(v, plain)
    }


def open_checkpoints(
    args: argparse.Namespace, model: Model, data: Mapping[str, Any], *, skip: Iterable[str] = ()
) -> Checkpoints:
    """The checkpoints of this run: keyed by the model, ``data`` (hashes of what was read) and
    :func:`settings_key`. With ``--fresh`` the checkpoints of this key are removed first;
    otherwise the finished ones are reused (a note on stderr says how many). The key's lock is
    taken first (:meth:`Checkpoints.lock`): a live run of the same key is refused with one line
    (an :class:`~mechlingo.core.errors.OutputError`) before anything is computed or removed."""
    folder = work_folder(args)
    key = {
        "command": " ".join(x for x in (args.command, getattr(args, "steer_command", None)) if x),
        "model": {**model_info(model), "weights_fingerprint": weights_fingerprint(model)},
        "data": dict(data),
        "settings": settings_key(args, skip),
        "checkpoint_version": CHECKPOINT_VERSION,
    }
    info = dist_info()
    agree = None
    if info.world_size > 1:  # every rank keeps its own checkpoints; they agree on each one
        key["rank"] = [info.rank, info.world_size]
        agree = all_ranks_have
    checkpoints = Checkpoints(folder, key, agree=agree)
    checkpoints.lock()
    if getattr(args, "fresh", False) and getattr(args, "resume", False):
        raise UsageError("--fresh and --resume contradict each other", where="--resume",
                         fix="give one: --fresh starts over, --resume only goes on")  # fmt: skip
    if getattr(args, "fresh", False):
        checkpoints.clear()
    else:
        done = checkpoint_names(checkpoints)
        if not done and getattr(args, "resume", False):
            raise UsageError(
                f"--resume: no checkpoint of this run in {folder} (another setting, "
                "model, data or mechlingo version than the interrupted run's)",
                where="--resume",
                fix="rerun the interrupted command exactly as it was, or drop --resume to start",
            )
        if done and info.rank == 0 and not getattr(args, "quiet", False):
            print(f"going on from {len(done)} checkpoint(s) in {folder} (--fresh to start "
                  "over)", file=sys.stderr)  # fmt: skip
    return checkpoints


def require_finished(args: argparse.Namespace, folder: Path) -> None:
    """``--resume`` of a command whose checkpoints are keyed elsewhere (``replicate``): refuse
    when ``folder`` holds no checkpoint of any key (a :class:`UsageError`)."""
    if getattr(args, "fresh", False) and getattr(args, "resume", False):
        raise UsageError("--fresh and --resume contradict each other", where="--resume",
                         fix="give one: --fresh starts over, --resume only goes on")  # fmt: skip
    if getattr(args, "resume", False) and not any(folder.glob("*/*/result.json")):
        raise UsageError(
            f"--resume: no checkpoint in {folder}",
            where="--resume",
            fix="rerun the interrupted command exactly as it was, or drop --resume to start",
        )


def all_ranks_have(done: bool) -> bool:
    """Under torchrun: true only when every rank has the checkpoint (one all-reduce)."""
    total = all_reduce_state({"done": torch.tensor([1.0 if done else 0.0])})["done"]
    return int(total.item()) == dist_info().world_size


def finish_checkpoints(checkpoints: Checkpoints, folder: str | Path | None = None) -> None:
    """After ``--out`` is written: remove the run's checkpoints (``folder``: the key folder, when
    another object made the checkpoints), give their lock back (lock files no live run holds are
    removed too) and remove the work folder when it is empty."""
    if folder is None:
        checkpoints.clear()
    else:
        shutil.rmtree(folder, ignore_errors=True)
    checkpoints.unlock()
    release_free_locks(checkpoints.root)
    try:
        checkpoints.root.rmdir()
    except OSError:
        pass


def checkpoint_names(checkpoints: Checkpoints) -> list[str]:
    """The checkpoints of ``checkpoints``' key, sorted."""
    if not checkpoints.folder.is_dir():
        return []
    return sorted(
        p.name
        for p in checkpoints.folder.iterdir()
        if p.is_dir() and not p.name.startswith(".") and checkpoints.done(p.name)
    )


def data_key(**parts: Any) -> dict[str, str | None]:
    """``{name: short hash}`` of JSON-able data (facts as dicts, texts)."""
    return {k: None if v is None else key_hash({"v": v}) for k, v in parts.items()}
