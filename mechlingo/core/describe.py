"""The description of a model that every saved artifact records, and the check that a
loaded artifact fits the model it is applied to."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any

from mechlingo.core.errors import ModelMismatchError
from mechlingo.core.models import model_name, unembed_fingerprint, weight_mode
from mechlingo.core.types import Model

_STRICT_KEYS = ("d_model", "n_layers", "d_mlp", "weights", "unembed_fingerprint")


def _shape(model: Model) -> dict[str, Any]:
    """Sizes and weight mode: the part of the description that is cheap to compute."""
    cfg = model.cfg
    return {
        "d_model": int(cfg.d_model),
        "n_layers": int(cfg.n_layers),
        "d_mlp": int(getattr(cfg, "d_mlp", 0) or 0),
        "weights": weight_mode(model),
    }


def model_info(model: Model) -> dict[str, Any]:
    """What an artifact records about the model it was built on: name, sizes, weight mode
    (``raw``/``compat``) and a fingerprint of the unembedding."""
    info = {"model_name": model_name(model), **_shape(model)}
    info["unembed_fingerprint"] = unembed_fingerprint(model)
    return info


def missing_fields(info: Mapping[str, Any], *, fingerprint: bool = True) -> list[str]:
    """The fields of a recorded model description that :func:`check_model` compares and
    ``info`` lacks (or holds as something that is not a plain value: a width that is not
    a non-negative integer, a fingerprint that is not a string)."""
    missing = []
    for key in _STRICT_KEYS:
        if key == "unembed_fingerprint" and not fingerprint:
            continue
        v = info.get(key)
        if key in ("d_model", "n_layers", "d_mlp"):
            ok = isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**31
        else:
            ok = isinstance(v, str) and bool(v)
        if not ok:
            missing.append(key)
    return missing


def check_model(
    info: Mapping[str, Any] | None, model: Model, *, fingerprint: bool = True, what: str = ""
) -> None:
    """Raise :class:`ModelMismatchError` when ``model`` differs from the recorded ``info`` in
    size, weight mode or (with ``fingerprint``) unembedding fingerprint, or when ``info``
    lacks one of those fields (a partial description cannot show that the model fits)."""
    if not info:
        return
    missing = missing_fields(info, fingerprint=fingerprint)
    if missing:
        raise ModelMismatchError(
            f"{what or 'this intervention'} records the model {info.get('model_name')!r} "
            f"without {', '.join(missing)}, so mechlingo cannot check that it fits this model",
            fix="re-save it with intervention.save(path, model) on the model it was built on",
        )

    now = _shape(model)
    if fingerprint:
        now["unembed_fingerprint"] = _cached_fingerprint(model, unembed_fingerprint)
    diffs = [
        f"{k}: saved {info[k]!r}, this model {now[k]!r}"
        for k in _STRICT_KEYS
        if k in now and k in info and info[k] != now[k]
    ]
    if diffs:
        hint = ""
        if any(d.startswith("weights") for d in diffs):
            hint = " (load the model with the same compat= setting it was built with)"
        raise ModelMismatchError(
            f"{what or 'this intervention'} was built on {info.get('model_name')!r} and does not "
            f"fit this model ({model_info_name(model)}): " + "; ".join(diffs) + hint
        )


_FINGERPRINTS: weakref.WeakKeyDictionary[Any, tuple[tuple, str]] = weakref.WeakKeyDictionary()


def _cached_fingerprint(model: Model, compute: Callable[[Any], str]) -> str:
    """The unembedding fingerprint, computed once per model and unembedding version."""
    w = model.W_U
    key = (w.data_ptr(), getattr(w, "_version", 0), tuple(w.shape), str(w.device), w.dtype)
    try:
        hit = _FINGERPRINTS.get(model)
    except TypeError:
        hit = None
    if hit is not None and hit[0] == key:
        return hit[1]
    fp = compute(model)
    try:
        _FINGERPRINTS[model] = (key, fp)
    except TypeError:  # cannot be weakly referenced: no memo
        pass
    return fp


def model_info_name(model: Model) -> str:

    return model_name(model)
