"""The one rule of interrupted runs, for every long command: ``--work``, ``--fresh``.

``steer eval`` (with or without ``--transfer``, and ``--transfer-only``), ``experts``,
``align``, ``tuned-lens`` and ``replicate`` split their run into stages
(:class:`mechlingo.core.stages.Stages`) and keep every finished stage in a work folder beside
``--out``: ``.OUT.work/`` (or ``--work DIR``; never inside ``--out``, which is written in one
step at the end). The stages are keyed by the mechlingo version, the model's weights
fingerprint, a hash of the data and every setting that changes a number, so the stages of
another version, model, data or setting are never reused (they are recomputed).

- **A rerun of the same command goes on from the finished stages** (no flag needed): after
  Ctrl-C, SIGTERM, a SIGKILL or a crash, run the same command again. ``--resume`` is
  accepted and means the same (the default).
- ``--fresh`` starts over: the stored stages of this run's key are removed first.
- After ``--out`` is written the run's stages are removed (the work folder too when empty).
- Under ``torchrun`` every rank keeps its own stages (the rank is in the key) and the ranks
  agree on each stage before it is read back: a stage is reused only when every rank has it,
  otherwise all ranks recompute it (so their collective steps stay in step).

The helpers here turn the stored JSON back into the objects of the expert analyses (neuron
statistics and scores, saved interventions); the repair protocol keeps its own stages
(:func:`mechlingo.analyses.recall.steer_eval.run_steer_eval`).
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from mechlingo.activations.distributed import all_reduce_state, dist_info
from mechlingo.analyses.experts import NeuronScores, NeuronStats
from mechlingo.card.replicate import weights_fingerprint
from mechlingo.cli.common import UsageError
from mechlingo.core.describe import model_info
from mechlingo.core.errors import ArtifactError
from mechlingo.core.stages import Stages, key_hash
from mechlingo.core.types import Model
from mechlingo.core.untrusted import inside, load_tensors

__all__ = [
    "add_work_args",
    "all_ranks_have",
    "finish_stages",
    "hash_files",
    "kcurve_cache",
    "open_stages",
    "staged_scores",
    "staged_stats",
    "staged_folder",
    "work_folder",
]

#: bumped when a stage's stored result changes meaning (old stages are then not reused)
STAGE_VERSION = 1

#: flags that change no number (where the output goes, the progress bars, the stages)
_NOT_NUMBERS = frozenset({"out", "quiet", "work", "resume", "fresh", "command", "steer_command"})


def add_work_args(p: argparse.ArgumentParser) -> None:
    """``--work DIR``, ``--fresh`` and ``--resume`` (the default)."""
    g = p.add_argument_group("interrupted runs")
    g.add_argument(
        "--work",
        default=None,
        metavar="DIR",
        help="folder where finished stages are kept until --out is written (default: "
        ".OUT.work beside --out; it may not be inside --out)",
    )
    g.add_argument(
        "--fresh",
        action="store_true",
        help="start over: remove this run's finished stages first (by default a rerun of "
        "the same command with the same model, data and settings goes on from them)",
    )
    g.add_argument(
        "--resume",
        action="store_true",
        help="go on from the finished stages of an interrupted run (the default; kept for "
        "older scripts). Stages of another version, model, data or setting are recomputed",
    )


def work_folder(args: Any) -> Path:
    """The work folder of ``args`` (``--work``, or ``.OUT.work`` beside ``--out``); a
    :class:`UsageError` when it is ``--out`` or inside it."""
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
    return out.parent / f".{out.name}.work"


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


def settings_key(args: Any, skip: Iterable[str] = ()) -> dict[str, Any]:
    """Every plain flag value of ``args`` but those that change no number (and ``skip``:
    flags whose effect is in the stage names, such as the list of k)."""
    drop = _NOT_NUMBERS | set(skip)
    plain = (str, int, float, bool, type(None), list, tuple)
    return {
        k: v
        for k, v in sorted(vars(args).items())
        if not k.startswith("_") and k not in drop and isinstance(v, plain)
    }


def open_stages(
    args: Any, model: Model, data: Mapping[str, Any], *, skip: Iterable[str] = ()
) -> Stages:
    """The stages of this run: keyed by the model, ``data`` (hashes of what was read) and
    :func:`settings_key`. With ``--fresh`` the stages of this key are removed first;
    otherwise the finished ones are reused (a note on stderr says how many). Sets
    ``args._work`` (the message of a stopped run names it)."""
    folder = work_folder(args)
    key = {
        "command": " ".join(x for x in (args.command, getattr(args, "steer_command", None)) if x),
        "model": {**model_info(model), "weights_fingerprint": weights_fingerprint(model)},
        "data": dict(data),
        "settings": settings_key(args, skip),
        "stage_version": STAGE_VERSION,
    }
    info = dist_info()
    agree = None
    if info.world_size > 1:  # every rank keeps its own stages; they agree on each one
        key["rank"] = [info.rank, info.world_size]
        agree = all_ranks_have
    stages = Stages(folder, key, agree=agree)
    if getattr(args, "fresh", False):
        stages.clear()
    else:
        done = stage_names(stages)
        if done and info.rank == 0 and not getattr(args, "quiet", False):
            print(f"going on from {len(done)} finished stage(s) in {folder} (--fresh to start "
                  "over)", file=sys.stderr)  # fmt: skip
    args._work = str(folder)
    return stages


def all_ranks_have(done: bool) -> bool:
    """Under torchrun: true only when every rank has the stage (one all-reduce)."""
    total = all_reduce_state({"done": torch.tensor([1.0 if done else 0.0])})["done"]
    return int(total.item()) == dist_info().world_size


def finish_stages(stages: Stages, folder: str | Path | None = None) -> None:
    """After ``--out`` is written: remove the run's stages (``folder``: the key folder, when
    another object made the stages) and the work folder when it is empty."""
    if folder is None:
        stages.clear()
    else:
        shutil.rmtree(folder, ignore_errors=True)
    try:
        stages.root.rmdir()
    except OSError:
        pass


def stage_names(stages: Stages) -> list[str]:
    """The finished stages of ``stages``' key, sorted."""
    if not stages.folder.is_dir():
        return []
    return sorted(
        p.name
        for p in stages.folder.iterdir()
        if p.is_dir() and not p.name.startswith(".") and stages.done(p.name)
    )


# --------------------------------------------------------------------------------------
# Stored results back into objects
# --------------------------------------------------------------------------------------


def data_key(**parts: Any) -> dict[str, str | None]:
    """``{name: short hash}`` of JSON-able data (facts as dicts, texts)."""
    return {k: None if v is None else key_hash({"v": v}) for k, v in parts.items()}


def staged_stats(stages: Stages, name: str, collect: Callable[[], NeuronStats]) -> NeuronStats:
    """In-memory neuron statistics as stage ``name`` (the tensors in a safetensors file)."""

    def fn(tmp: Path) -> dict[str, Any]:
        st = collect()
        tensors = {"pooled": st.pooled, "lang_ids": st.lang_ids, "prob_active": st.prob_active}
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()},
                  str(tmp / "stats.safetensors"))  # fmt: skip
        return {"langs": st.langs, "layers": st.layers, "d_mlp": st.d_mlp, "pool": st.pool,
                "meta": st.meta, "device": str(st.prob_active.device)}  # fmt: skip

    d = stages.run(name, fn, folder=True)
    t = _stage_tensors(stages, name, "stats.safetensors", d)
    return NeuronStats(d["langs"], t["pooled"], t["lang_ids"], t["prob_active"], d["layers"],
                       d["d_mlp"], d["pool"], d["meta"])  # fmt: skip


def staged_scores(stages: Stages, name: str, score: Callable[[], NeuronScores]) -> NeuronScores:
    """Neuron scores as stage ``name`` (the tensors in a safetensors file)."""

    def fn(tmp: Path) -> dict[str, Any]:
        sc = score()
        tensors = {"auroc": sc.auroc, "ap": sc.ap, "lape": sc.lape}
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()},
                  str(tmp / "scores.safetensors"))  # fmt: skip
        return {"device": str(sc.auroc.device)}

    d = stages.run(name, fn, folder=True)
    t = _stage_tensors(stages, name, "scores.safetensors", d)
    return NeuronScores(t["auroc"], t["ap"], t["lape"])


def _stage_tensors(stages: Stages, name: str, file: str, d: Mapping[str, Any]) -> dict:
    """The tensors a stage stored, read with the checks of any file from a stranger (the
    header against the file's size, no link out of the stage folder); the device the
    stage recorded when it is a plain device name."""
    device = str(d.get("device", "cpu"))
    if not re.fullmatch(r"(cpu|cuda|mps)(:\d{1,3})?", device):
        device = "cpu"
    path = inside(stages.folder, stages.path(name) / file, ArtifactError)
    return load_tensors(path, ArtifactError, finite=False, device=device,
                        fix="delete the work folder (or rerun with --fresh)")  # fmt: skip


def staged_folder(stages: Stages, name: str, save: Callable[[Path], Any]) -> Path:
    """A saved artifact (``save(folder)``, e.g. a clamp) as stage ``name``; its folder."""

    def fn(tmp: Path) -> dict[str, Any]:
        save(tmp / "saved")
        return {"saved": "saved"}

    stages.run(name, fn, folder=True)
    return stages.path(name) / "saved"


def kcurve_cache(stages: Stages, prefix: str) -> Callable[[str, Callable[[], dict]], dict]:
    """The ``cache`` of :func:`mechlingo.analyses.experts.k_curve`: each arm the stage
    ``{prefix}{arm}``."""
    return lambda name, fn: stages.run(f"{prefix}{name}", fn)
