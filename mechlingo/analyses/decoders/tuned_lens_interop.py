"""Tuned lenses in the format of the ``tuned-lens`` package (Belrose et al. 2023; PyPI
``tuned-lens``): load a lens the package trained or downloaded, and give mechlingo's lenses
to it.

Entry points: :func:`load_package_lens` (a package folder as a
:class:`~mechlingo.analyses.decoders.tuned_lens.TunedLens`) and :func:`export_package_lens`.
Both formats hold the same affine translators at the same places, so conversion copies the
tensors; a checkpoint is untrusted input (``params.pt`` is read with
``torch.load(..., weights_only=True)``, or ``params.safetensors`` when present).
``docs/methods/logit-lens.md`` ("The tuned lens") has the format, the README the check
against the package itself.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from mechlingo.analyses.decoders.tuned_lens import TunedLens
from mechlingo.core.artifacts import atomic_folder
from mechlingo.core.describe import model_info
from mechlingo.core.errors import ArtifactError, MissingArtifactError, ModelMismatchError
from mechlingo.core.models import model_name
from mechlingo.core.sites import site_map
from mechlingo.core.types import Model
from mechlingo.core.untrusted import load_tensors, read_json, refuse_special

__all__ = [
    "PACKAGE_CONFIG",
    "PACKAGE_PARAMS",
    "export_package_lens",
    "load_package_lens",
    "unembedding_hash",
]

PACKAGE_CONFIG = "config.json"
PACKAGE_PARAMS = "params.pt"
_SAFE_PARAMS = "params.safetensors"
_FIX = "give a folder saved by tuned-lens (TunedLens.save) or by export_package_lens"


def unembedding_hash(model: Model) -> str:
    """The package's fingerprint of the unembedding (``Unembed.unembedding_hash``: SHA-256 of
    numpy's one-decimal printout of the ``[vocab, d_model]`` matrix). It depends on numpy's
    print options, so a mismatch is reported as such, never silently ignored."""
    w: Float[Tensor, "vocab d_model"] = model.W_U.detach().T.float().cpu()
    return hashlib.sha256(np.array_str(w.numpy(), precision=1).encode()).hexdigest()


def _read_state(folder: Path) -> dict[str, Tensor]:
    safe = folder / _SAFE_PARAMS
    refuse_special(safe, ArtifactError, fix=_FIX)
    if safe.is_file():
        return load_tensors(safe, ArtifactError, fix=_FIX)
    path = folder / PACKAGE_PARAMS
    refuse_special(path, ArtifactError, fix=_FIX)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError) as err:
        raise ArtifactError(
            f"{path} is not a readable torch checkpoint ({err})", fix=_FIX
        ) from None
    except Exception as err:  # weights_only refusals raise pickle.UnpicklingError
        if type(err).__name__ != "UnpicklingError":
            raise
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ArtifactError(
            f"{path} needs more than tensors to load (it would run code from the pickle: "
            f"{first[:200]}); refused",
            fix="load it in the tuned-lens package and save it again with TunedLens.save, "
            "or convert it to params.safetensors",
        ) from None
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, Tensor) for k, v in state.items()
    ):
        raise ArtifactError(f"{path} is not a state dict of tensors", fix=_FIX)
    return state


def _read_config(folder: Path) -> dict[str, Any]:
    path = folder / PACKAGE_CONFIG
    config = read_json(path, ArtifactError, fix=_FIX, root=folder)
    if not isinstance(config, dict):
        raise ArtifactError(f"{path} is not a tuned-lens config", fix=_FIX)
    kind = config.get("lens_type", "linear_tuned_lens")
    if kind != "linear_tuned_lens":
        raise ArtifactError(f"{path}: lens type {kind!r} is not supported (linear_tuned_lens)")
    for key in ("d_model", "num_hidden_layers"):
        if not isinstance(config.get(key), int) or config[key] < 1:
            raise ArtifactError(f"{path}: {key!r} must be a positive integer", fix=_FIX)
    return config


def load_package_lens(
    path: str | Path, model: Model | None = None, *, check_unembed: bool = True
) -> TunedLens:
    """A lens saved by the ``tuned-lens`` package, as a mechlingo
    :class:`~mechlingo.analyses.decoders.tuned_lens.TunedLens` (usable as ``--decoder tuned`` and in
    :func:`mechlingo.analyses.decoders.lens.logit_lens`).

    Args:
        path: the folder with ``config.json`` and ``params.pt`` (or ``params.safetensors``).
        model: the model it is for: its layer count and width are checked, the unembedding
            against the config's ``unembed_hash`` (``check_unembed``), and the lens records
            the model's description and moves to its device.
        check_unembed: refuse a lens whose ``unembed_hash`` differs from ``model``'s.

    Raises:
        MissingArtifactError: no ``config.json`` or no parameters in ``path``.
        ArtifactError: a checkpoint that needs more than tensors, or keys and shapes that are
            not a tuned lens's.
        ModelMismatchError: the lens is for a model of other sizes or another unembedding.
    """
    folder = Path(path)
    for name in (PACKAGE_CONFIG, PACKAGE_PARAMS, _SAFE_PARAMS):
        refuse_special(folder / name, ArtifactError, fix=_FIX)
    if not (folder / PACKAGE_CONFIG).is_file() or not (
        (folder / PACKAGE_PARAMS).is_file() or (folder / _SAFE_PARAMS).is_file()
    ):
        raise MissingArtifactError(
            f"{folder} holds no tuned-lens package lens ({PACKAGE_CONFIG} + {PACKAGE_PARAMS})",
            fix=_FIX,
        )
    config = _read_config(folder)
    state = _read_state(folder)
    n, d = int(config["num_hidden_layers"]), int(config["d_model"])
    lens = TunedLens(n, d, meta={"source": "tuned-lens package", "config": config})
    with torch.no_grad():
        for i in range(n):
            w, b = state.get(f"{i}.weight"), state.get(f"{i}.bias")
            if w is None or tuple(w.shape) != (d, d) or (b is not None and tuple(b.shape) != (d,)):
                raise ArtifactError(
                    f"{folder / PACKAGE_PARAMS}: translator {i} is missing or not [{d}, {d}] "
                    f"(+ [{d}] bias)",
                    fix=_FIX,
                )
            lens.weight[i].copy_(w.float())
            lens.bias[i].copy_(b.float() if b is not None else torch.zeros(d))
    extra = set(state) - {f"{i}.{p}" for i in range(n) for p in ("weight", "bias")}
    if extra:
        raise ArtifactError(f"{folder / PACKAGE_PARAMS} has unexpected tensors {sorted(extra)[:3]}")
    if model is not None:
        _check_model(config, model, folder, check_unembed)
        lens.model_info = model_info(model)
        lens = lens.to(model.W_U.device)
    return lens


def _check_model(config: dict[str, Any], model: Model, folder: Path, check_unembed: bool) -> None:
    n, d = site_map(model).n_layers, int(model.cfg.d_model)
    if (config["num_hidden_layers"], config["d_model"]) != (n, d):
        raise ModelMismatchError(
            f"the tuned lens in {folder} is for {config['num_hidden_layers']} layers x "
            f"d_model {config['d_model']} (model {config.get('base_model_name_or_path')!r}); "
            f"this model has {n} x {d}",
            fix="load the lens trained for this model",
        )
    want = config.get("unembed_hash")
    if check_unembed and want and want != unembedding_hash(model):
        raise ModelMismatchError(
            f"the tuned lens in {folder} was trained with another unembedding than this "
            f"model's (unembed_hash differs; a model loaded with compat=True folds the final "
            "norm into it)",
            fix="load the model the lens was trained on (raw weights), or pass "
            "check_unembed=False if you know it is the same (the hash depends on numpy's "
            "print options)",
        )


def export_package_lens(lens: TunedLens, path: str | Path, *, model: Model | None = None) -> Path:
    """Save ``lens`` in the ``tuned-lens`` package's format (``config.json`` + ``params.pt``,
    a plain state dict of tensors), loadable with the package's
    ``TunedLens.from_model_and_pretrained(hf_model, lens_resource_id=path)``. With ``model``
    the config names it and carries its ``unembed_hash``. Written in one step (a kill leaves
    the old folder); returns the folder."""
    n, d = lens.n_layers, int(lens.weight.shape[1])
    name = model_name(model) if model is not None else str(lens.model_info.get("model_name", ""))
    config = {
        "base_model_name_or_path": name,
        "d_model": d,
        "num_hidden_layers": n,
        "bias": True,
        "base_model_revision": None,
        "unembed_hash": unembedding_hash(model) if model is not None else None,
        "lens_type": "linear_tuned_lens",
    }
    state = {}
    for i in range(n):
        state[f"{i}.weight"] = lens.weight[i].detach().cpu().clone().contiguous()
        state[f"{i}.bias"] = lens.bias[i].detach().cpu().clone().contiguous()
    folder = Path(path)
    with atomic_folder(folder, keep_others=False) as tmp:
        torch.save(state, tmp / PACKAGE_PARAMS)
        (tmp / PACKAGE_CONFIG).write_text(json.dumps(config, indent=2), encoding="utf-8")
    return folder
