"""Composable interventions: objects that turn into plain TransformerLens hooks.

An intervention is an artifact: you build it once (by hand or with :mod:`mechlingo.analyses.repair`),
save it, load it, and apply it to any run of a model it fits. Every intervention has
``fwd_hooks(model)``, which checks it against the model (site, layer, vector size) and returns
a list of ``(hook_name, fn)`` pairs where ``fn(tensor, hook)`` is an ordinary TransformerLens
hook function. So there are three equivalent ways to apply one::

    with mechlingo.intervene(model, a + b):
        logits = model(tokens)

    logits = model.run_with_hooks(tokens, fwd_hooks=(a + b).fwd_hooks(model))

    with model.hooks(fwd_hooks=(a + b).fwd_hooks(model)):
        logits = model(tokens)

and :func:`mechlingo.analyses.evaluate.greedy_generate` / ``evaluate_facts`` take ``intervention=``.

Kinds:

* :class:`SteeringVector` -- add ``alpha * v`` to a site (default ``resid_pre``) at a layer.
* :class:`NeuronClamp` -- set / scale / add / zero chosen MLP neurons (``mlp_post``) of one
  or several layers.
* :class:`Ablation` -- replace a site's activation by zero or by a mean.
* :class:`Compose` (also ``a + b``) -- several interventions as one. **Order**: hooks are
  returned in list order, and TransformerLens runs hooks registered at the same hook point
  in registration order, so in ``a + b`` the hook of ``a`` sees the clean activation and the
  hook of ``b`` sees ``a``'s result.

Positions (where along the sequence an intervention acts) follow
:func:`mechlingo.core.tokens.position_mask`: ``"last"`` (each row's last *prompt* token; padding-
and BOS-safe inside mechlingo runs, which set the current batch; a plain tensor run is taken to
be unpadded), ``"all"``, ``"last+generated"``, ``"generated"``, integer positions, or a
callable ``f(batch) -> mask``.
"""

from __future__ import annotations

import abc
import contextlib
import html
import json
import math
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from jaxtyping import Float, Int
from safetensors.torch import load_file, save_file
from torch import Tensor

from mechlingo.activations.runs import hooked
from mechlingo.core.artifacts import atomic_folder
from mechlingo.core.checks import check_safetensors_header
from mechlingo.core.describe import check_model, model_info
from mechlingo.core.errors import (
    ArtifactError,
    InterventionError,
    MechlingoError,
    MissingArtifactError,
    ModelMismatchError,
)
from mechlingo.core.sites import SiteError, canonical_site, resolve_site
from mechlingo.core.tokens import (
    PositionSpec,
    TokenBatch,
    batch_context,
    current_batch,
    current_columns,
    position_mask,
    prepends_bos,
)
from mechlingo.core.types import HookFn, Model
from mechlingo.core.version import __version__

FORMAT_VERSION = 1
_TENSORS_FILE = "intervention.safetensors"
_META_FILE = "intervention.json"

__all__ = [
    "Ablation",
    "Compose",
    "Intervention",
    "InterventionError",
    "ModelMismatchError",
    "NeuronClamp",
    "SteeringVector",
    "intervene",
    "load_intervention",
    "model_info",
]


# --------------------------------------------------------------------------------------
# Model description recorded with every artifact
# --------------------------------------------------------------------------------------


def _check_finite(values: Tensor | float, what: str) -> None:
    """Refuse NaN/inf: they turn every logit into NaN without an error."""
    t = torch.as_tensor(values)
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        raise InterventionError(f"{what} has NaN or infinite values; give finite numbers")


# --------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------


def _check_positions(positions: Any) -> PositionSpec:
    if isinstance(positions, str):
        position_mask(positions, None, (1, 2))  # raises for an unknown rule
        return positions
    if isinstance(positions, bool):
        raise InterventionError(f"positions must be a rule, ints or a callable, got {positions!r}")
    if isinstance(positions, int):
        return positions
    if callable(positions):
        return positions
    try:
        idx = [int(p) for p in positions]
    except TypeError as err:
        raise InterventionError(
            f"positions must be 'last', 'all', 'last+generated', ints or a callable, got "
            f"{positions!r}"
        ) from err
    if not idx:
        raise InterventionError("an empty list of positions")
    return idx


def _positions_to_json(positions: PositionSpec, owner: str) -> str | int | list[int]:
    if isinstance(positions, (str, int)):
        return positions
    if callable(positions):
        raise InterventionError(
            f"{owner} uses a callable positions rule, which cannot be saved; use 'last', "
            "'all', 'last+generated' or explicit integer positions for a saved intervention"
        )
    return [int(p) for p in positions]


def _positions_text(positions: PositionSpec) -> str:
    if callable(positions) and not isinstance(positions, str):
        return getattr(positions, "__name__", "callable")
    return repr(positions)


_PADDING_SAFE_RULES = ("all", "all_with_bos")


def _mask_for(positions: PositionSpec, t: Tensor, has_bos: bool = True) -> Tensor:
    """Bool mask [batch, pos, 1, ...] broadcastable to the activation ``t`` [batch, pos, ...].

    Inside mechlingo runs the current batch (and, in a KV-cached decoding step, the columns
    being computed) say where each row's tokens are. Outside them a single row is taken to be
    unpadded; several rows are refused for every rule that depends on where a row ends,
    because a padded batch would be steered at padding (right padding) or at shifted
    positions (left padding, TransformerLens's default) without a word.
    """
    batch = current_batch()
    if batch is None and t.shape[0] > 1 and positions not in _PADDING_SAFE_RULES:
        raise InterventionError(
            f"positions={_positions_text(positions)} on a batch of {t.shape[0]} rows with no "
            "row lengths: a padded batch would be edited at padding. Apply it through "
            "mechlingo (evaluate_facts, greedy_generate, collect), or give the batch: "
            "`with mechlingo.intervene(model, iv, batch=b): model(b.tokens, "
            "attention_mask=b.attention_mask())` or "
            "`model.run_with_hooks(b.tokens, attention_mask=b.attention_mask(), "
            "fwd_hooks=iv.fwd_hooks_for(model, b))`, where b = mechlingo.core.tokens.encode(model, "
            "prompts); positions='all' needs no lengths"
        )
    if batch is None:  # a plain run of unpadded rows: BOS as the model's tokenizer adds it
        n, width = t.shape[0], t.shape[1]
        batch = TokenBatch(
            torch.zeros(n, width, dtype=torch.long, device=t.device),
            torch.full((n,), width, dtype=torch.long, device=t.device),
            0,
            has_bos,
        )
    mask = position_mask(
        positions, batch, (t.shape[0], t.shape[1]), device=t.device, columns=current_columns()
    )
    return mask.reshape(*mask.shape, *([1] * (t.ndim - 2)))


def _no_pattern(site: str, kind: str) -> None:
    if site == "attn_pattern":
        raise InterventionError(
            f"{kind} cannot act on attn_pattern (its axes are [batch, head, query, key]); use "
            "a residual site, mlp_post or attn_z"
        )


def _site(model: Model, site: str, layer: int, kind: str) -> Any:
    try:
        return resolve_site(model, site, layer)
    except SiteError as err:
        raise InterventionError(f"{kind}: {err}") from err


# --------------------------------------------------------------------------------------
# Base class
# --------------------------------------------------------------------------------------


class Intervention(abc.ABC):
    """Base class: anything with ``fwd_hooks(model)``. Add two with ``+`` to compose them.

    Attributes:
        meta: free metadata saved with the artifact; ``meta["model"]`` (from
            :func:`model_info`) is checked against the model on load, ``meta["build"]`` says
            how it was built (prompt counts, languages, relations).
    """

    kind: ClassVar[str] = "Intervention"
    meta: dict[str, Any]

    @abc.abstractmethod
    def fwd_hooks(self, model: Model) -> list[tuple[str, HookFn]]:
        """Check against ``model`` and return TransformerLens ``(hook_name, fn)`` pairs."""

    def fwd_hooks_for(self, model: Model, batch: TokenBatch) -> list[tuple[str, HookFn]]:
        """:meth:`fwd_hooks` bound to ``batch`` (from :func:`mechlingo.core.tokens.encode`): each
        hook runs with that batch as the current one, so ``"last"`` and the other position
        rules find every row's real tokens in a plain ``run_with_hooks`` on the padded
        batch."""
        return [(name, _bound(fn, batch)) for name, fn in self.fwd_hooks(model)]

    def __add__(self, other: Intervention) -> Compose:
        if not isinstance(other, Intervention):
            return NotImplemented
        return Compose([self, other])

    # -- serialization ----------------------------------------------------------------

    @abc.abstractmethod
    def _tensors(self) -> dict[str, Tensor]:
        """The tensors to save (safetensors)."""

    @abc.abstractmethod
    def _config(self) -> dict[str, Any]:
        """The JSON-ready configuration to save."""

    @classmethod
    @abc.abstractmethod
    def _restore(cls, tensors: dict[str, Tensor], config: dict[str, Any]) -> Intervention:
        """Rebuild from what :meth:`_tensors` and :meth:`_config` saved."""

    def save(self, path: str | Path, model: Model | None = None) -> Path:
        """Write the intervention to the folder ``path``: ``intervention.safetensors`` (the
        tensors) and ``intervention.json`` (kind, site, layer, positions rule, alpha, the model
        it fits, how it was built, the mechlingo version). With ``model``, its description
        (:func:`model_info`) is recorded; otherwise the one in ``meta["model"]`` is kept.

        Raises:
            InterventionError: a callable positions rule (cannot be saved).
        """

        config = self._config()  # raises for callables before anything is written
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in self._tensors().items()}
        meta = dict(self.meta)
        if model is not None:
            meta["model"] = model_info(model)
        doc = {
            "format": FORMAT_VERSION,
            "kind": self.kind,
            "config": config,
            "meta": meta,
            "mechlingo": __version__,
        }

        path = Path(path)
        with atomic_folder(path) as tmp:  # a kill leaves the old folder or the new one
            save_file(tensors, str(tmp / _TENSORS_FILE))
            (tmp / _META_FILE).write_text(json.dumps(doc, indent=2, ensure_ascii=False))
        return path

    @staticmethod
    def load(path: str | Path, model: Model | None = None) -> Intervention:
        """Load an intervention saved by :meth:`save` (see :func:`load_intervention`)."""
        return load_intervention(path, model)

    # -- display ---------------------------------------------------------------------

    def _fields(self) -> dict[str, str]:
        return {}

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v}" for k, v in self._fields().items())
        return f"{self.kind}({inner})"

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>"
            for k, v in self._fields().items()
        )
        build = self.meta.get("build") if self.meta else None
        if build:
            rows += f"<tr><td>built from</td><td>{html.escape(json.dumps(build))}</td></tr>"
        return f"<b>{self.kind}</b><table>{rows}</table>"


def _bound(fn: HookFn, batch: TokenBatch) -> HookFn:
    def hook(t: Tensor, hook: Any) -> Tensor | None:
        if current_batch() is not None:
            return fn(t, hook)
        with batch_context(batch.to(t.device)):
            return fn(t, hook)

    return hook


_REGISTRY: dict[str, type[Intervention]] = {}


def _register(cls: type[Intervention]) -> type[Intervention]:
    _REGISTRY[cls.kind] = cls
    return cls


def load_intervention(path: str | Path, model: Model | None = None) -> Intervention:
    """Load an intervention saved with :meth:`Intervention.save`.

    With ``model``, check that it fits: same ``d_model``, ``n_layers``, ``d_mlp``, weight mode
    and unembedding fingerprint as the model it was built on.

    Raises:
        FileNotFoundError: no saved intervention in ``path``.
        ModelMismatchError: it was built for a different model; the message lists what differs.
    """

    path = Path(path)
    meta_path, tensor_path = path / _META_FILE, path / _TENSORS_FILE
    if not meta_path.is_file() or not tensor_path.is_file():
        raise MissingArtifactError(
            f"{path} holds no saved intervention ({_META_FILE} + {_TENSORS_FILE} expected)"
        )
    try:
        doc = json.loads(meta_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ArtifactError(
            f"{meta_path} is not valid JSON ({err})", fix="re-save the intervention"
        ) from None
    if not isinstance(doc, dict):
        raise ArtifactError(f"{meta_path} does not hold a JSON object", fix="re-save it")
    if doc.get("format") != FORMAT_VERSION:
        raise InterventionError(f"{path}: unsupported format {doc.get('format')!r}")

    check_safetensors_header(tensor_path, ArtifactError)
    try:
        tensors = load_file(str(tensor_path))
    except Exception as err:
        raise ArtifactError(
            f"{tensor_path} cannot be read ({type(err).__name__}: {err}); it is truncated or "
            "corrupt",
            fix="re-save the intervention",
        ) from None
    try:
        obj = _restore_any(doc["kind"], tensors, doc["config"])
    except MechlingoError:
        raise
    except (KeyError, TypeError, ValueError, IndexError) as err:
        missing = f"the field {err}" if isinstance(err, KeyError) else f"{err}"
        raise ArtifactError(
            f"{meta_path} is incomplete or does not match its tensors ({missing})",
            fix="re-save the intervention",
        ) from None
    obj.meta = dict(doc.get("meta") or {})
    if model is not None:
        if not obj.meta.get("model"):
            warnings.warn(
                f"the intervention in {path} records no model (meta.model), so mechlingo cannot "
                "check that it fits this model; re-save it with intervention.save(path, model)",
                UserWarning,
                stacklevel=2,
            )
        check_model(obj.meta.get("model"), model, what=f"the intervention in {path}")
    return obj


def _restore_any(kind: str, tensors: dict[str, Tensor], config: dict[str, Any]) -> Intervention:
    if kind not in _REGISTRY:
        raise InterventionError(f"unknown intervention kind {kind!r}; known: {sorted(_REGISTRY)}")
    return _REGISTRY[kind]._restore(tensors, config)


# --------------------------------------------------------------------------------------
# SteeringVector
# --------------------------------------------------------------------------------------


@_register
class SteeringVector(Intervention):
    """Add ``alpha * v`` to the activation at ``site`` of ``layer``, at ``positions``.

    Args:
        vector: ``[width]``, or ``[n_layers, width]`` (one vector per layer, as built by
            :mod:`mechlingo.analyses.repair`; ``layer`` picks the row).
        layer: block index (negative from the end). ``None`` is allowed for a per-layer stack
            that has not been placed yet: choose with :meth:`at`.
        alpha: scale; 0 changes nothing.
        site: a residual site (``resid_pre`` by default), ``mlp_post`` or ``attn_z`` (a
            ``[d_head]`` vector is added to every head).
        positions: ``"last"`` (default: each row's last prompt token), ``"all"``,
            ``"last+generated"``, ints, or a callable.
        meta: metadata saved with the vector (see :class:`Intervention`).
    """

    kind = "SteeringVector"

    def __init__(
        self,
        vector: Float[Tensor, " width"] | Float[Tensor, "n_layers width"],
        layer: int | None = None,
        alpha: float = 1.0,
        *,
        site: str = "resid_pre",
        positions: PositionSpec = "last",
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        vector = torch.as_tensor(vector)
        if vector.ndim not in (1, 2) or not vector.is_floating_point():
            raise InterventionError(
                f"a steering vector must be a float tensor [width] or [n_layers, width], got "
                f"{vector.dtype} of shape {tuple(vector.shape)}"
            )
        if not bool(torch.isfinite(vector).all()):
            raise InterventionError("the steering vector has NaN or infinite entries")
        if layer is not None and (not isinstance(layer, int) or isinstance(layer, bool)):
            raise InterventionError(f"layer must be an int or None, got {layer!r}")
        self.vector = vector.detach()
        self.layer = layer
        self.alpha = float(alpha)
        _check_finite(self.alpha, "the steering alpha")
        self.site = canonical_site(site)
        _no_pattern(self.site, "a SteeringVector")
        self.positions = _check_positions(positions)
        self.meta = dict(meta or {})

    def at(self, layer: int, alpha: float | None = None, **kw: Any) -> SteeringVector:
        """The same vector (stack) placed at ``layer`` with scale ``alpha`` (default: the
        current one); other keyword arguments (``positions=``, ``site=``) override too."""
        args = {"site": self.site, "positions": self.positions, "meta": self.meta} | kw
        return SteeringVector(self.vector, layer, self.alpha if alpha is None else alpha, **args)

    def direction(self, model: Model | None = None) -> Float[Tensor, " width"]:
        """The vector that is added per unit of ``alpha`` (the row of ``layer`` for a stack)."""
        if self.vector.ndim == 1:
            return self.vector
        if self.layer is None:
            raise InterventionError(
                "this SteeringVector holds one vector per layer and has no layer yet; "
                "place it with .at(layer, alpha)"
            )
        n = self.vector.shape[0]
        if model is not None and n != int(model.cfg.n_layers):
            raise InterventionError(
                f"the vector stack has {n} layers but the model has {int(model.cfg.n_layers)}"
            )
        index = self.layer + n if self.layer < 0 else self.layer
        if not 0 <= index < n:
            raise InterventionError(
                f"layer {self.layer} is out of range for a stack of {n} layer vectors"
            )
        return self.vector[index]

    def fwd_hooks(self, model: Model) -> list[tuple[str, HookFn]]:
        if self.layer is None:
            raise InterventionError(
                "this SteeringVector has no layer; place it with .at(layer, alpha)"
            )
        check_model(self.meta.get("model"), model, what=repr(self))
        site = _site(model, self.site, self.layer, "SteeringVector")
        v = self.direction(model)
        if v.shape[-1] != site.width:
            raise InterventionError(
                f"SteeringVector has size {v.shape[-1]} but {site.name} at layer {site.layer} "
                f"has width {site.width} (d_model={int(model.cfg.d_model)})"
            )
        delta_cpu = (self.alpha * v.double()).float()
        positions = self.positions
        bos = prepends_bos(model)
        cache: dict[tuple[torch.device, torch.dtype], Tensor] = {}

        def steer(t: Tensor, hook: Any) -> Tensor:
            key = (t.device, t.dtype)
            delta = cache.get(key)
            if delta is None:
                delta = cache[key] = delta_cpu.to(device=t.device, dtype=t.dtype)
            mask = _mask_for(positions, t, bos)
            return torch.where(mask, t + delta, t)

        return [(site.hook_name, steer)]

    def _tensors(self) -> dict[str, Tensor]:
        return {"vector": self.vector.float()}

    def _config(self) -> dict[str, Any]:
        return {
            "site": self.site,
            "layer": self.layer,
            "alpha": self.alpha,
            "positions": _positions_to_json(self.positions, "this SteeringVector"),
            "shape": list(self.vector.shape),
        }

    @classmethod
    def _restore(cls, tensors: dict[str, Tensor], config: dict[str, Any]) -> SteeringVector:
        return cls(
            tensors["vector"],
            config["layer"],
            config["alpha"],
            site=config["site"],
            positions=config["positions"],
        )

    def _fields(self) -> dict[str, str]:
        out = {
            "site": self.site,
            "layer": str(self.layer),
            "alpha": f"{self.alpha:g}",
            "positions": _positions_text(self.positions),
            "shape": "x".join(str(s) for s in self.vector.shape),
        }
        with contextlib.suppress(InterventionError):
            out["norm"] = f"{float(self.direction().norm()):.3g}"
        name = self.meta.get("name")
        if name:
            out = {"name": str(name)} | out
        return out


# --------------------------------------------------------------------------------------
# NeuronClamp
# --------------------------------------------------------------------------------------

_CLAMP_MODES = ("set", "scale", "add", "zero")


@_register
class NeuronClamp(Intervention):
    """Set, scale, add to or zero chosen MLP neurons (``mlp_post``) of one or more layers.

    Args:
        neurons: ``{layer: neuron indices}``.
        values: one number for every chosen neuron, a flat sequence with one value per chosen
            neuron (layers in the order of ``neurons``), or ``{layer: one value per neuron}``.
            Ignored for ``mode="zero"``.
        mode: ``"set"`` (activation := value), ``"scale"`` (activation *= value), ``"add"``
            (activation += value) or ``"zero"``.
        positions: where along the sequence (default ``"all"`` real tokens after BOS).
        site: ``mlp_post`` (the neurons); any other site with a feature axis works too.
    """

    kind = "NeuronClamp"

    def __init__(
        self,
        neurons: Mapping[int, Sequence[int] | Int[Tensor, " k"]],
        values: float | Mapping[int, Sequence[float] | Float[Tensor, " k"]] = 0.0,
        mode: str = "set",
        *,
        positions: PositionSpec = "all",
        site: str = "mlp_post",
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        if mode not in _CLAMP_MODES:
            raise InterventionError(f"unknown clamp mode {mode!r}; use one of {_CLAMP_MODES}")
        if not neurons:
            raise InterventionError("NeuronClamp needs at least one layer with neurons")
        self.mode = mode
        self.site = canonical_site(site)
        _no_pattern(self.site, "a NeuronClamp")
        self.positions = _check_positions(positions)
        self.meta = dict(meta or {})
        self.neurons: dict[int, Tensor] = {}
        self.values: dict[int, Tensor] = {}
        flat: Tensor | None = None  # one value per neuron over all layers, in the given order
        if not isinstance(values, Mapping) and not isinstance(values, (int, float)):
            flat = torch.as_tensor(values, dtype=torch.float32).reshape(-1)
            total = sum(torch.as_tensor(i).numel() for i in neurons.values())
            if flat.numel() == 1:
                values, flat = float(flat), None
            elif flat.numel() != total:
                raise InterventionError(
                    f"{total} neurons but {flat.numel()} values; give one value per neuron "
                    "(in layer order), one number, or {layer: values}"
                )
        offset = 0
        for layer, idx in neurons.items():
            if not isinstance(layer, int) or isinstance(layer, bool):
                raise InterventionError(f"layer keys must be ints, got {layer!r}")
            ids = torch.as_tensor(idx, dtype=torch.long).reshape(-1)
            if ids.numel() == 0:
                raise InterventionError(f"no neurons given for layer {layer}")
            if bool((ids < 0).any()):
                raise InterventionError(f"negative neuron index at layer {layer}")
            if ids.unique().numel() != ids.numel():
                uniq, counts = ids.unique(return_counts=True)
                raise InterventionError(
                    f"neuron {int(uniq[counts > 1][0])} appears more than once at layer {layer}; "
                    "with two values one would silently win: list each neuron once"
                )
            self.neurons[layer] = ids
            if mode == "zero":
                val = torch.zeros(ids.numel())
            elif flat is not None:
                val = flat[offset : offset + ids.numel()]
                offset += ids.numel()
            elif isinstance(values, Mapping):
                if layer not in values:
                    raise InterventionError(f"no values given for layer {layer}")
                val = torch.as_tensor(values[layer], dtype=torch.float32).reshape(-1)
                if val.numel() == 1:
                    val = val.expand(ids.numel()).clone()
            else:
                val = torch.full((ids.numel(),), float(values))
            if val.numel() != ids.numel():
                raise InterventionError(
                    f"layer {layer}: {ids.numel()} neurons but {val.numel()} values"
                )
            _check_finite(val, f"NeuronClamp values at layer {layer}")
            self.values[layer] = val.float()

    def fwd_hooks(self, model: Model) -> list[tuple[str, HookFn]]:
        check_model(self.meta.get("model"), model, what=repr(self))
        hooks: list[tuple[str, HookFn]] = []
        bos = prepends_bos(model)
        for layer in sorted(self.neurons):
            site = _site(model, self.site, layer, "NeuronClamp")
            ids = self.neurons[layer]
            if int(ids.max()) >= site.width:
                raise InterventionError(
                    f"NeuronClamp: neuron {int(ids.max())} at layer {layer} is out of range "
                    f"({site.name} has {site.width} neurons)"
                )
            hooks.append((site.hook_name, self._hook(ids, self.values[layer], bos)))
        return hooks

    def _hook(self, ids_cpu: Tensor, vals_cpu: Tensor, bos: bool) -> HookFn:
        mode, positions = self.mode, self.positions

        def clamp(t: Tensor, hook: Any) -> Tensor:
            ids = ids_cpu.to(t.device)
            vals = vals_cpu.to(device=t.device, dtype=t.dtype)
            old = t[..., ids]
            if mode == "set":
                new = vals.expand_as(old)
            elif mode == "scale":
                new = old * vals
            elif mode == "add":
                new = old + vals
            else:
                new = torch.zeros_like(old)
            out = t.clone()
            out[..., ids] = torch.where(_mask_for(positions, t, bos), new, old)
            return out

        return clamp

    def _tensors(self) -> dict[str, Tensor]:
        out = {}
        for layer in self.neurons:
            out[f"neurons.{layer}"] = self.neurons[layer]
            out[f"values.{layer}"] = self.values[layer]
        return out

    def _config(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "site": self.site,
            "layers": sorted(self.neurons),
            "positions": _positions_to_json(self.positions, "this NeuronClamp"),
        }

    @classmethod
    def _restore(cls, tensors: dict[str, Tensor], config: dict[str, Any]) -> NeuronClamp:
        layers = config["layers"]
        return cls(
            {lay: tensors[f"neurons.{lay}"] for lay in layers},
            {lay: tensors[f"values.{lay}"] for lay in layers},
            config["mode"],
            positions=config["positions"],
            site=config["site"],
        )

    def _fields(self) -> dict[str, str]:
        per_layer = ", ".join(f"{lay}: {self.neurons[lay].numel()}" for lay in sorted(self.neurons))
        return {
            "mode": self.mode,
            "site": self.site,
            "neurons per layer": "{" + per_layer + "}",
            "positions": _positions_text(self.positions),
        }


# --------------------------------------------------------------------------------------
# Ablation
# --------------------------------------------------------------------------------------


@_register
class Ablation(Intervention):
    """Replace the activation at ``site``/``layer`` by zero or by a mean, at ``positions``.

    Args:
        site: any site except ``attn_pattern``.
        layer: block index.
        kind: ``"zero"`` or ``"mean"``.
        mean: the replacement for ``kind="mean"``: ``[width]`` (e.g. a mean last-token
            activation from :func:`mechlingo.activations.means.last_token_means`).
        positions: default ``"all"``.
    """

    kind = "Ablation"

    def __init__(
        self,
        site: str,
        layer: int,
        kind: str = "zero",
        *,
        mean: Float[Tensor, " width"] | None = None,
        positions: PositionSpec = "all",
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        if kind not in ("zero", "mean"):
            raise InterventionError(f"ablation kind must be 'zero' or 'mean', got {kind!r}")
        if kind == "mean" and mean is None:
            raise InterventionError("a mean ablation needs mean= (a [width] tensor)")
        if not isinstance(layer, int) or isinstance(layer, bool):
            raise InterventionError(f"layer must be an int, got {layer!r}")
        self.site = canonical_site(site)
        _no_pattern(self.site, "an Ablation")
        self.layer = layer
        self.ablation = kind
        self.mean = None if mean is None else torch.as_tensor(mean).detach().float()
        if self.mean is not None:
            _check_finite(self.mean, "the ablation mean")
        self.positions = _check_positions(positions)
        self.meta = dict(meta or {})

    def fwd_hooks(self, model: Model) -> list[tuple[str, HookFn]]:
        check_model(self.meta.get("model"), model, what=repr(self))
        site = _site(model, self.site, self.layer, "Ablation")
        mean = self.mean
        if mean is not None and mean.shape[-1] != site.width:
            raise InterventionError(
                f"Ablation mean has size {mean.shape[-1]} but {site.name} has width {site.width}"
            )
        positions = self.positions
        bos = prepends_bos(model)

        def ablate(t: Tensor, hook: Any) -> Tensor:
            fill = (
                torch.zeros((), device=t.device, dtype=t.dtype)
                if mean is None
                else mean.to(device=t.device, dtype=t.dtype)
            )
            return torch.where(_mask_for(positions, t, bos), fill, t)

        return [(site.hook_name, ablate)]

    def _tensors(self) -> dict[str, Tensor]:
        return {} if self.mean is None else {"mean": self.mean}

    def _config(self) -> dict[str, Any]:
        return {
            "site": self.site,
            "layer": self.layer,
            "kind": self.ablation,
            "positions": _positions_to_json(self.positions, "this Ablation"),
        }

    @classmethod
    def _restore(cls, tensors: dict[str, Tensor], config: dict[str, Any]) -> Ablation:
        return cls(
            config["site"],
            config["layer"],
            config["kind"],
            mean=tensors.get("mean"),
            positions=config["positions"],
        )

    def _fields(self) -> dict[str, str]:
        return {
            "site": self.site,
            "layer": str(self.layer),
            "kind": self.ablation,
            "positions": _positions_text(self.positions),
        }


# --------------------------------------------------------------------------------------
# Compose
# --------------------------------------------------------------------------------------


@_register
class Compose(Intervention):
    """Several interventions applied together, as one.

    Hooks are returned in list order; at a shared hook point TransformerLens runs them in
    that order, so each one sees the result of those before it. Nested compositions are
    flattened (``(a + b) + c == Compose([a, b, c])``).
    """

    kind = "Compose"

    def __init__(
        self, parts: Sequence[Intervention], *, meta: Mapping[str, Any] | None = None
    ) -> None:
        flat: list[Intervention] = []
        for p in parts:
            if not isinstance(p, Intervention):
                raise InterventionError(f"Compose takes interventions, got a {type(p).__name__}")
            flat.extend(p.parts if isinstance(p, Compose) else [p])
        self.parts = flat
        self.meta = dict(meta or {})

    def fwd_hooks(self, model: Model) -> list[tuple[str, HookFn]]:
        check_model(self.meta.get("model"), model, what="this Compose")
        hooks: list[tuple[str, HookFn]] = []
        for p in self.parts:
            hooks.extend(p.fwd_hooks(model))
        return hooks

    def _tensors(self) -> dict[str, Tensor]:
        out = {}
        for i, p in enumerate(self.parts):
            out.update({f"{i}.{k}": v for k, v in p._tensors().items()})
        return out

    def _config(self) -> dict[str, Any]:
        return {
            "parts": [{"kind": p.kind, "config": p._config(), "meta": p.meta} for p in self.parts]
        }

    @classmethod
    def _restore(cls, tensors: dict[str, Tensor], config: dict[str, Any]) -> Compose:
        parts = []
        for i, spec in enumerate(config["parts"]):
            prefix = f"{i}."
            sub = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
            part = _restore_any(spec["kind"], sub, spec["config"])
            part.meta = dict(spec.get("meta") or {})
            parts.append(part)
        return cls(parts)

    def save(self, path: str | Path, model: Model | None = None) -> Path:
        if model is None and "model" not in self.meta:
            infos = [p.meta.get("model") for p in self.parts if p.meta.get("model")]
            if infos:
                self.meta["model"] = infos[0]
        return super().save(path, model)

    def __repr__(self) -> str:
        return " + ".join(repr(p) for p in self.parts) if self.parts else "Compose([])"

    def _repr_html_(self) -> str:
        inner = "".join(f"<li>{p._repr_html_()}</li>" for p in self.parts)
        return f"<b>Compose</b> (applied in this order)<ol>{inner}</ol>"


# --------------------------------------------------------------------------------------
# Applying
# --------------------------------------------------------------------------------------


@contextlib.contextmanager
def intervene(
    model: Model, intervention: Intervention | None, *, batch: TokenBatch | None = None
) -> Iterator[Any]:
    """Apply ``intervention`` to every forward pass of ``model`` inside the block; its hooks
    are removed when the block exits, also after an exception. ``None`` applies nothing.

    Args:
        batch: the padded batch (:func:`mechlingo.core.tokens.encode`) the block runs, when it runs
            one of several rows: position rules then use each row's real tokens. Without it,
            a multi-row run is refused for every rule but ``"all"`` (see :func:`_mask_for`).
    """

    if intervention is None:
        hooks: list[tuple[str, HookFn]] = []
    elif batch is not None:
        hooks = intervention.fwd_hooks_for(model, batch)
    else:
        hooks = intervention.fwd_hooks(model)
    with hooked(model, hooks):
        yield model


def random_like(vector: Float[Tensor, " width"], seed: int = 0) -> Float[Tensor, " width"]:
    """A random direction with the same norm as ``vector`` (a control for steering), drawn on
    the CPU with a fixed seed so that it is the same on every device."""
    gen = torch.Generator().manual_seed(seed)
    r = torch.randn(vector.shape, generator=gen, dtype=torch.float64)
    norm = float(vector.double().norm())
    if not math.isfinite(norm):
        raise InterventionError("cannot match the norm of a non-finite vector")
    return (r / r.norm() * norm).to(vector.dtype)
