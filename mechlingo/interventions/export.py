"""Steering vectors for other tools: steering-vectors, repeng and llama.cpp control vectors.

:func:`export` turns a mechlingo :class:`SteeringVector` (or a :class:`Compose` of them) into a
:class:`VectorExport`: one raw vector (``alpha * direction``) per layer in *that tool's* layer
index (``resid_pre`` l exports as ``l - 1``, ``resid_post`` l as ``l``), the layer type, a
model hint, what does not carry over (``dropped``: position rules, alpha units) and
mechlingo's provenance (``meta``). ``save`` writes it, :func:`read_export` reads it back,
``to_library()`` builds the tool's own object where it is installed, and ``to_intervention()``
turns it back into a mechlingo intervention with the tool's semantics.

Refused, with the reason: clamps, ablations, sites a format has no place for, ``resid_pre`` 0,
llama.cpp's block 0, and a steering-vectors export that mixes layer types. The formats, the
layer indexing and what is lost: ``docs/interop.md``."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from jaxtyping import Float
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from mechlingo.core.artifacts import atomic_file
from mechlingo.core.errors import ArtifactError, InterventionError, MissingArtifactError
from mechlingo.core.families import SUPPORTED_ARCHITECTURES
from mechlingo.core.types import Model
from mechlingo.core.untrusted import (
    check_finite_tensors,
    gguf_header,
    load_tensors,
    loads,
    refuse_special,
    safetensors_header,
)
from mechlingo.interventions.base import Compose, Intervention, positions_text
from mechlingo.interventions.hf import LAYOUTS
from mechlingo.interventions.steering import SteeringVector

FORMATS = ("steering-vectors", "repeng", "llama.cpp")
ARCH = "controlvector"
_META_KEY = "mechlingo.export"
_SV_LAYER_TYPES = ("decoder_block", "self_attn", "mlp")


@dataclass
class VectorExport:
    """A steering intervention in another tool's terms.

    Attributes:
        format: ``"steering-vectors"``, ``"repeng"`` or ``"llama.cpp"``.
        vectors: ``{layer index in the tool's convention: raw float32 vector [d_model]}``;
            parts at the same index are summed.
        layer_type: steering-vectors' layer type (``"decoder_block"`` for repeng and
            llama.cpp, whose vectors are always added to block outputs).
        model_hint: the model type (``config.model_type``), repeng's ``model_type`` and
            llama.cpp's ``controlvector.model_hint``.
        dropped: what of the mechlingo intervention does not carry over, one sentence each.
        meta: mechlingo's description: each part's site, layer, alpha, alpha unit, positions,
            the exported index, and the model it was built on.
    """

    format: str
    vectors: dict[int, Float[Tensor, " d_model"]]
    layer_type: str = "decoder_block"
    model_hint: str = ""
    dropped: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def save(self, path: str | Path) -> Path:
        """Write the export: a GGUF for repeng and llama.cpp, safetensors for
        steering-vectors (tensors ``layer_activations.{k}``). Written atomically."""
        path = Path(path)
        if self.format == "steering-vectors":
            tensors = {f"layer_activations.{k}": v.contiguous() for k, v in self.vectors.items()}
            header = {"format": self.format, "layer_type": self.layer_type, **self._doc()}
            with atomic_file(path) as tmp:
                save_file(tensors, str(tmp), metadata={_META_KEY: json.dumps(header)})
            return path
        with atomic_file(path) as tmp:
            _write_gguf(self, Path(tmp))
        return path

    def _doc(self) -> dict[str, Any]:
        return {"model_hint": self.model_hint, "dropped": self.dropped, "meta": self.meta}

    def to_library(self) -> Any:
        """The tool's own object: ``steering_vectors.SteeringVector`` or
        ``repeng.ControlVector`` (each needs its package installed; llama.cpp reads the
        file, use :meth:`save`)."""
        if self.format == "steering-vectors":
            sv = _optional("steering-vectors")
            return sv.SteeringVector(
                layer_activations=dict(self.vectors), layer_type=self.layer_type
            )
        if self.format == "repeng":
            rp = _optional("repeng")
            directions = {k: v.numpy() for k, v in self.vectors.items()}
            return rp.ControlVector(model_type=self.model_hint, directions=directions)
        raise InterventionError(
            "llama.cpp has no Python object; save() the GGUF and pass it "
            "to llama.cpp with --control-vector"
        )

    def to_intervention(self) -> Intervention:
        """What the tool does, as a mechlingo intervention: each vector added at every token
        (``positions="all_with_bos"``) of the site the tool adds it to (resid_post k for a
        block output), alpha 1."""
        site = {"decoder_block": "resid_post", "self_attn": "attn_out", "mlp": "mlp_out"}
        parts = [
            SteeringVector(v, k, 1.0, site=site[self.layer_type], positions="all_with_bos")
            for k, v in sorted(self.vectors.items())
        ]
        if not parts:
            raise InterventionError(f"this {self.format} export holds no vectors")
        # An external format records no full model description (no weights mode or
        # unembedding fingerprint): what it knows is kept as ``exported_for``, not as the
        # ``model`` the load-time fit check would refuse as partial.
        meta = {k: v for k, v in self.meta.items() if k != "model"}
        if self.meta.get("model"):
            meta["exported_for"] = self.meta["model"]
        return parts[0] if len(parts) == 1 else Compose(parts, meta=meta)


def _steering_vectors() -> Any:
    import steering_vectors

    return steering_vectors


def _repeng() -> Any:
    import repeng

    return repeng


#: The optional packages :meth:`VectorExport.to_library` may load: the pip name and a
#: loader (a plain import) per export format. A fixed list: the format (which a file names)
#: picks a loader here, never a module by a name taken from the file.
_LIBRARIES: dict[str, tuple[str, Callable[[], Any]]] = {
    "steering-vectors": ("steering-vectors", _steering_vectors),
    "repeng": ("repeng", _repeng),
}


def _optional(fmt: str) -> Any:
    """The package of export format ``fmt`` (one of ``_LIBRARIES``), or a one-line error
    that says how to install it."""
    package, load = _LIBRARIES[fmt]
    try:
        return load()
    except ImportError as err:
        raise InterventionError(
            f"{package} is not installed ({err})",
            fix=f"pip install {package} (steering-vectors needs transformers < 5: use a venv "
            "of its own), or save() the export and load it there",
        ) from None


# --------------------------------------------------------------------------------------
# export
# --------------------------------------------------------------------------------------


def _steering_parts(iv: Intervention, fmt: str) -> list[SteeringVector]:
    parts = iv.parts if isinstance(iv, Compose) else [iv]
    for p in parts:
        if not isinstance(p, SteeringVector):
            what = "a neuron clamp sets" if p.kind == "NeuronClamp" else "an ablation replaces"
            raise InterventionError(
                f"{fmt} cannot express a {p.kind}: its vectors are added to the residual "
                f"stream, while {what} activations; export only the steering part",
                fix="export a SteeringVector or a Compose of SteeringVectors",
            )
    if not parts:
        raise InterventionError("nothing to export: an empty Compose")
    return [p for p in parts if isinstance(p, SteeringVector)]  # all of them (checked above)


def _n_layers(p: SteeringVector, model_info: Mapping[str, Any] | None) -> int | None:
    if model_info and model_info.get("n_layers"):
        return int(model_info["n_layers"])
    return int(p.vector.shape[0]) if p.vector.ndim == 2 else None


def _place(p: SteeringVector, fmt: str, family: str | None, n: int | None) -> tuple[int, str]:
    """(index in the target's convention, steering-vectors layer type) of one part."""
    if p.layer is None:
        raise InterventionError("a SteeringVector with no layer; place it with .at(layer)")
    layer = p.layer + n if p.layer < 0 and n else p.layer
    if layer < 0:
        raise InterventionError(f"layer {p.layer} is negative and the model's depth is unknown")
    if p.site == "resid_post":
        index, kind = layer, "decoder_block"
    elif p.site == "resid_pre":
        if layer == 0:
            raise InterventionError(
                f"{fmt} cannot express resid_pre 0: it is the embedding output, and no "
                "decoder block outputs it (targets add to block outputs)",
                fix="steer resid_pre 1 or later (the same as resid_post of the block before)",
            )
        index, kind = layer - 1, "decoder_block"
    elif p.site in ("attn_out", "mlp_out") and fmt == "steering-vectors":
        layout = LAYOUTS.get(family or "")
        module = "self_attn" if p.site == "attn_out" else "mlp"
        own = (
            None if layout is None else layout.attn_out if p.site == "attn_out" else layout.mlp_out
        )
        if own != module:
            raise InterventionError(
                f"steering-vectors' {module!r} layer type adds to the output of the {module} "
                f"module, which is not {p.site} in this family ({family or 'unknown'}: "
                f"{p.site} is the output of {own!r})",
                fix="give the model (model=) of a family without post-norms, or steer resid_post",
            )
        index, kind = layer, module
    else:
        where = "block outputs" if fmt != "steering-vectors" else "block, attention or MLP outputs"
        raise InterventionError(
            f"{fmt} cannot express a SteeringVector at {p.site}: it adds vectors to {where} only",
            fix="steer resid_pre or resid_post",
        )
    if fmt == "llama.cpp" and index == 0:
        raise InterventionError(
            "llama.cpp cannot steer block 0's output (resid_post 0 = resid_pre 1): its loader "
            "refuses a direction.0 tensor and applies control vectors from block 1 on",
            fix="steer resid_post 1 / resid_pre 2 or later",
        )
    if n is not None and index >= n:
        raise InterventionError(f"layer {p.layer} is out of range for {n} layers")
    return index, kind


def _part_meta(p: SteeringVector, index: int, v: Tensor) -> dict[str, Any]:
    build = p.meta.get("build") or {}
    return {
        "site": p.site,
        "layer": p.layer,
        "alpha": p.alpha,
        "alpha_unit": build.get("unit", "raw"),
        "positions": positions_text(p.positions),
        "index": index,
        "norm": round(float(v.double().norm()), 6),
        "name": p.meta.get("name"),
    }


def _dropped(parts: list[SteeringVector], fmt: str) -> list[str]:
    out = []
    rules = sorted({positions_text(p.positions) for p in parts})
    if rules != ["'all_with_bos'"]:
        how = (
            "steering-vectors adds at every token from min_token_index (default 0), BOS and "
            "padding included, unless you pass token_indices"
            if fmt == "steering-vectors"
            else f"{fmt} adds at every token of every pass: prompt, BOS and generated tokens"
        )
        out.append(f"positions {', '.join(rules)} do not carry over: {how}")
    units = sorted({(p.meta.get("build") or {}).get("unit", "raw") for p in parts})
    alphas = ", ".join(f"{p.alpha:g}" for p in parts)
    unit = (
        " (alpha was in units of the mean residual norm at the layer)" if "resid" in units else ""
    )
    out.append(
        f"alpha {alphas}{unit} is folded in: the vectors are alpha * direction in raw "
        "residual-stream units, so the tool's multiplier/strength 1.0 is mechlingo's edit"
    )
    return out


def export(
    intervention: Intervention,
    format: str,
    *,
    model: Model | torch.nn.Module | None = None,
    model_type: str | None = None,
) -> VectorExport:
    """Export a steering intervention for ``format`` (one of :data:`FORMATS`).

    Args:
        intervention: a :class:`SteeringVector` or a :class:`Compose` of them.
        model: the model it is meant for (the bridge or the plain transformers model):
            its depth checks the layers, its ``config.model_type`` becomes the model hint,
            its family decides whether steering-vectors' ``self_attn``/``mlp`` are
            mechlingo's attn_out/mlp_out. Without it, ``intervention.meta["model"]``.
        model_type: the model hint, overriding the model's.

    Raises:
        InterventionError: what the format cannot express (see the module docstring); the
            message says why.
    """
    if format not in FORMATS:
        raise InterventionError(f"unknown export format {format!r}; use one of {FORMATS}")
    parts = _steering_parts(intervention, format)
    info, family, hint = _model_facts(intervention, model)
    vectors: dict[int, Tensor] = {}
    kinds, metas = set(), []
    for p in parts:
        n = _n_layers(p, info)
        index, kind = _place(p, format, family, n)
        v = (p.alpha * p.direction().double()).float().cpu()
        if info.get("d_model") and v.numel() != int(info["d_model"]):
            raise InterventionError(
                f"a vector of size {v.numel()} for a model with d_model={info['d_model']}"
            )
        vectors[index] = vectors[index] + v if index in vectors else v
        kinds.add(kind)
        metas.append(_part_meta(p, index, v))
    if len(kinds) > 1:
        raise InterventionError(
            f"a steering-vectors SteeringVector has one layer_type, these parts need "
            f"{sorted(kinds)}; export them separately"
        )
    meta = {"parts": metas, "model": info or None, "family": family}
    return VectorExport(
        format,
        dict(sorted(vectors.items())),
        kinds.pop(),
        model_type or hint,
        _dropped(parts, format),
        meta,
    )


def _model_facts(
    iv: Intervention, model: Model | torch.nn.Module | None
) -> tuple[dict[str, Any], str | None, str]:
    """(model description, family, model type) from ``model`` or the intervention's meta."""
    from_meta = dict(iv.meta.get("model") or {})
    if isinstance(iv, Compose) and not from_meta:
        from_meta = next((dict(p.meta["model"]) for p in iv.parts if p.meta.get("model")), {})
    if model is None:
        return from_meta, None, str(from_meta.get("model_name", ""))
    config = getattr(model, "config", None) or getattr(
        getattr(model, "original_model", None), "config", None
    )
    arch = type(model).__name__
    if hasattr(model, "original_model"):
        arch = type(model.original_model).__name__
    family = SUPPORTED_ARCHITECTURES.get(arch)
    n = getattr(getattr(model, "cfg", None), "n_layers", None) or getattr(
        config, "num_hidden_layers", None
    )
    d = getattr(getattr(model, "cfg", None), "d_model", None) or getattr(
        config, "hidden_size", None
    )
    info = {
        **from_meta,
        **({"n_layers": int(n)} if n else {}),
        **({"d_model": int(d)} if d else {}),
    }
    return info, family, str(getattr(config, "model_type", "") or "")


# --------------------------------------------------------------------------------------
# GGUF (repeng and llama.cpp) and reading back
# --------------------------------------------------------------------------------------


def _write_gguf(ex: VectorExport, path: Path) -> None:
    if not ex.vectors:
        raise InterventionError("nothing to write: the export holds no vectors")
    writer = gguf.GGUFWriter(str(path), ARCH)
    writer.add_string(f"{ARCH}.model_hint", ex.model_hint)
    writer.add_uint32(f"{ARCH}.layer_count", len(ex.vectors))
    writer.add_string(_META_KEY, json.dumps({"format": ex.format, **ex._doc()}))
    for k, v in sorted(ex.vectors.items()):
        writer.add_tensor(f"direction.{k}", v.detach().cpu().float().numpy().astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


#: the highest layer index an export may name (models have at most a few hundred blocks)
MAX_EXPORT_LAYER = 4096
_FIX = "re-export the vectors, or ask whoever made the file for one that mechlingo writes"


def read_gguf(path: str | Path) -> VectorExport:
    """Read a control-vector GGUF (written here, by repeng, or by llama.cpp's
    cvector-generator): ``direction.{k}`` tensors and the model hint, with the checks
    llama.cpp's loader makes (names, F32, 1-D, one width). The header is walked first
    (:func:`mechlingo.core.untrusted.gguf_header`: no count or size larger than the file),
    the values must be finite and the layer indices below :data:`MAX_EXPORT_LAYER`."""
    path = Path(path)
    if not path.is_file():
        raise MissingArtifactError(f"{path} does not exist")
    strings, declared = gguf_header(
        path, ArtifactError, fix=_FIX, keep=(_META_KEY, f"{ARCH}.model_hint")
    )
    for name, shape, gtype in declared:
        head, _, tail = name.partition(".")
        if head != "direction" or not tail.isdigit() or int(tail) > MAX_EXPORT_LAYER:
            raise ArtifactError(f"{path}: tensor {name[:80]!r} is not direction.<layer>", fix=_FIX)
        if gtype != int(gguf.GGMLQuantizationType.F32) or len(shape) != 1:
            raise ArtifactError(f"{path}: {name} is not a 1-D F32 tensor", fix=_FIX)
    if len({shape for _, shape, _ in declared}) > 1:
        raise ArtifactError(f"{path}: direction tensors of different widths", fix=_FIX)
    try:
        reader = gguf.GGUFReader(str(path))
        vectors = {int(t.name.partition(".")[2]): torch.from_numpy(np.array(t.data,
                   dtype=np.float32)) for t in reader.tensors}  # fmt: skip
    except Exception as err:
        raise ArtifactError(
            f"{path} is not a readable GGUF ({type(err).__name__}: {err})", fix=_FIX
        ) from None
    check_finite_tensors({f"direction.{k}": v for k, v in vectors.items()}, ArtifactError,
                         str(path), fix=_FIX)  # fmt: skip
    doc = _export_doc(strings.get(_META_KEY), path)
    return VectorExport(
        str(doc.get("format", "llama.cpp")),
        dict(sorted(vectors.items())),
        "decoder_block",
        strings.get(f"{ARCH}.model_hint") or "",
        list(doc.get("dropped", [])),
        dict(doc.get("meta", {})),
    )


def _export_doc(text: str | None, path: Path) -> dict[str, Any]:
    """mechlingo's description stored in an export (a JSON object of the known fields)."""
    doc = loads(text or "{}", ArtifactError, f"the {_META_KEY} of {path}", fix=_FIX)
    ok = (
        isinstance(doc, dict)
        and doc.get("format", "llama.cpp") in FORMATS
        and isinstance(doc.get("dropped", []), list)
        and isinstance(doc.get("meta", {}), dict)
        and doc.get("layer_type", "decoder_block") in _SV_LAYER_TYPES
        and isinstance(doc.get("model_hint", ""), str)
    )
    if not ok:
        raise ArtifactError(f"{path}: the {_META_KEY} description is malformed", fix=_FIX)
    return doc


def read_export(path: str | Path) -> VectorExport:
    """Read back what :meth:`VectorExport.save` wrote (GGUF or safetensors): the same
    vectors, layer type, model hint, ``dropped`` and ``meta``. Every tensor must be
    ``layer_activations.<k>`` (``k`` at most :data:`MAX_EXPORT_LAYER`), 1-D and finite."""
    path = Path(path)
    refuse_special(path, ArtifactError, fix=_FIX)
    if not path.is_file():
        raise MissingArtifactError(f"{path} does not exist")
    with path.open("rb") as fh:
        magic = fh.read(4)
    if magic == b"GGUF":
        return read_gguf(path)
    try:
        header = safetensors_header(path, ArtifactError, fix=_FIX)
    except ArtifactError as err:
        raise ArtifactError(f"{path} is neither a GGUF nor a mechlingo steering-vectors export "
                            f"({err.message})", fix=_FIX) from None  # fmt: skip
    for name, (_, shape) in header.items():
        head, _, tail = name.rpartition(".")
        if head != "layer_activations" or not tail.isdigit() or int(tail) > MAX_EXPORT_LAYER:
            raise ArtifactError(f"{path}: tensor {name[:80]!r} is not layer_activations.<k>",
                                fix=_FIX)  # fmt: skip
        if len(shape) != 1:
            raise ArtifactError(f"{path}: {name} is not a 1-D vector", fix=_FIX)
    tensors = load_tensors(path, ArtifactError, fix=_FIX)
    with safe_open(str(path), framework="pt") as fh:
        doc = _export_doc((fh.metadata() or {}).get(_META_KEY), path)
    vectors = {int(k.rsplit(".", 1)[1]): v for k, v in tensors.items()}
    return VectorExport(
        str(doc.get("format", "steering-vectors")),
        dict(sorted(vectors.items())),
        str(doc.get("layer_type", "decoder_block")),
        str(doc.get("model_hint", "")),
        list(doc.get("dropped", [])),
        dict(doc.get("meta", {})),
    )


def from_library(obj: Any, *, model_type: str = "") -> VectorExport:
    """Wrap a ``steering_vectors.SteeringVector`` or a ``repeng.ControlVector`` (or anything
    with the same fields) as a :class:`VectorExport`, e.g. to apply it through mechlingo with
    ``.to_intervention()``."""
    if hasattr(obj, "layer_activations"):
        vectors = {
            int(k): torch.as_tensor(v).detach().float().cpu()
            for k, v in obj.layer_activations.items()
        }
        kind = str(getattr(obj, "layer_type", "decoder_block"))
        if kind not in _SV_LAYER_TYPES:
            raise InterventionError(
                f"steering-vectors layer_type {kind!r} has no mechlingo "
                f"site; known: {_SV_LAYER_TYPES}"
            )
        return VectorExport("steering-vectors", vectors, kind, model_type)
    if hasattr(obj, "directions"):
        vectors = {
            int(k): torch.as_tensor(np.asarray(v, dtype=np.float32))
            for k, v in obj.directions.items()
        }
        return VectorExport("repeng", vectors, "decoder_block", str(obj.model_type))
    raise InterventionError(
        f"a {type(obj).__name__} is neither a steering-vectors "
        "SteeringVector nor a repeng ControlVector"
    )
