"""The work folder of the long commands (``steer eval``, ``experts``): ``--work`` and ``--resume``.

Each command splits its run into stages (:class:`mechlingo.core.stages.Stages`) and keeps
every finished stage's result in a work folder beside ``--out`` (``.OUT.work/``, or
``--work DIR``; never inside ``--out``, which is written in one step at the end). The stages
are keyed by the model's weights fingerprint, a hash of the data and every setting that
changes a number, so the stages of other settings are never reused.

- Without ``--resume`` a run starts fresh: the stages stored under its key are removed first.
- With ``--resume`` it reads back the finished stages of its key and computes the rest; with
  no work folder, or one that holds only other settings' stages, it simply runs (and says so).
- After ``--out`` is written the run's stages are removed (the work folder too when empty).
- Under ``torchrun`` every rank keeps its own stages and ``--resume`` is refused.
- A stopped run (Ctrl-C, SIGTERM) keeps them; ``mechlingo`` then says to rerun with
  ``--resume``.

The helpers here turn the stored JSON back into the objects of the expert analyses (neuron
statistics and scores, saved interventions); the repair protocol keeps its own stages
(:func:`mechlingo.analyses.protocol.run_protocol`).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from safetensors.torch import load_file, save_file

from mechlingo.activations.distributed import dist_info
from mechlingo.analyses.experts import NeuronScores, NeuronStats
from mechlingo.analyses.replicate import weights_fingerprint
from mechlingo.cli.common import UsageError
from mechlingo.core.describe import model_info
from mechlingo.core.stages import Stages, key_hash
from mechlingo.core.types import Model

__all__ = [
    "add_work_args",
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
_NOT_NUMBERS = frozenset({"out", "quiet", "work", "resume", "command", "steer_command"})


def add_work_args(p: argparse.ArgumentParser) -> None:
    """``--work DIR`` and ``--resume``."""
    g = p.add_argument_group("interrupted runs")
    g.add_argument(
        "--work",
        default=None,
        metavar="DIR",
        help="folder where finished stages are kept until --out is written (default: "
        ".OUT.work beside --out; it may not be inside --out)",
    )
    g.add_argument(
        "--resume",
        action="store_true",
        help="go on from the finished stages of an interrupted run with the same model, data "
        "and settings (stages of other settings are not used: those are recomputed); without "
        "it a run starts fresh",
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
    :func:`settings_key`. Without ``--resume`` the stages of this key are removed first;
    with it, a note on stderr when nothing can be reused. Sets ``args._work`` (the message
    of a stopped run names it)."""
    folder = work_folder(args)
    key = {
        "command": " ".join(x for x in (args.command, getattr(args, "steer_command", None)) if x),
        "model": {**model_info(model), "weights_fingerprint": weights_fingerprint(model)},
        "data": dict(data),
        "settings": settings_key(args, skip),
        "stage_version": STAGE_VERSION,
    }
    info = dist_info()
    if info.world_size > 1:  # every rank keeps its own stages; ranks must agree on each stage
        if getattr(args, "resume", False):
            raise UsageError(
                "--resume is not available under torchrun (the ranks may have finished "
                "different stages)",
                where="--resume",
                fix="rerun without --resume, or resume in a single process",
            )
        key["rank"] = [info.rank, info.world_size]
    stages = Stages(folder, key)
    if not getattr(args, "resume", False):
        stages.clear()
    elif not stages.folder.is_dir():
        others = folder.is_dir() and any(p.is_dir() for p in folder.iterdir())
        why = "holds only stages of other settings or data" if others else "does not exist yet"
        print(f"--resume: the work folder {folder} {why}; starting from the first stage",
              file=sys.stderr)  # fmt: skip
    args._work = str(folder)
    return stages


def finish_stages(stages: Stages) -> None:
    """After ``--out`` is written: remove the run's stages (and the work folder when empty)."""
    stages.clear()
    try:
        stages.root.rmdir()
    except OSError:
        pass


def stage_names(stages: Stages) -> list[str]:
    """The finished stages of ``stages``' key, sorted."""
    if not stages.folder.is_dir():
        return []
    return sorted(p.name for p in stages.folder.iterdir() if stages.done(p.name))


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
    t = load_file(str(stages.path(name) / "stats.safetensors"), device=d["device"])
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
    t = load_file(str(stages.path(name) / "scores.safetensors"), device=d["device"])
    return NeuronScores(t["auroc"], t["ap"], t["lape"])


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
