"""The base of every intervention, and the two that combine others (the *where* / *what* split
of pyvene and steering-vectors):

* :class:`Intervention` -- the interface: ``fwd_hooks(model)`` (checked against the model),
  ``fwd_hooks_for(model, batch)``, ``attach(hf_model)``, ``+``, ``only_for(langs)``, ``save``
  and :func:`load_intervention`. Type an optional intervention ``Intervention | None``.
* :class:`SiteEdit` -- the *where* of the kinds that edit one site (site, layer(s), positions
  rule, the model and width checks, the saved where); a kind implements only
  :meth:`SiteEdit.edit`, ``fn(activation, mask) -> activation``, and saves only its own fields.
* :class:`Compose` and :class:`Gated` -- several applied in order, or one applied only to the
  prompts of some languages (the row side is :mod:`mechlingo.interventions.gate`). They live
  here because the interface's ``+`` and ``only_for`` build them, with no import cycle.

``_REGISTRY`` maps a saved ``kind`` to its class, for :func:`load_intervention` only. The kinds
and how to apply them: :mod:`mechlingo.interventions` and ``docs/interventions.md``."""

from __future__ import annotations

import abc
import html
import json
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from safetensors.torch import save_file
from torch import Tensor

from mechlingo.core.artifacts import atomic_folder
from mechlingo.core.describe import check_model, model_info
from mechlingo.core.errors import (
    ArtifactError,
    InterventionError,
    MechlingoError,
    MissingArtifactError,
)
from mechlingo.core.sites import (
    Site,
    SiteError,
    canonical_site,
    carries_first,
    edit_hooks,
    resolve_site,
)
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
from mechlingo.core.untrusted import inside, load_tensors, read_json, refuse_special
from mechlingo.core.version import __version__
from mechlingo.data.facts import Fact
from mechlingo.interventions.gate import UNKNOWN_RULES, RowLanguages, gated_hook
from mechlingo.interventions.hf import HFHandle, attach

FORMAT_VERSION = 1
_TENSORS_FILE = "intervention.safetensors"
_META_FILE = "intervention.json"


def check_finite(values: Tensor | float, what: str) -> None:
    """Refuse NaN/inf: they turn every logit into NaN without an error."""
    t = torch.as_tensor(values)
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        raise InterventionError(f"{what} has NaN or infinite values; give finite numbers")


def check_positions(positions: object) -> PositionSpec:
    """``positions`` as a valid rule (a rule name, an int, ints or a callable), or a clear
    error."""
    if isinstance(positions, str):
        position_mask(positions, None, (1, 2))  # raises for an unknown rule
        return positions
    if isinstance(positions, bool):
        raise InterventionError(f"positions must be a rule, ints or a callable, got {positions!r}")
    if isinstance(positions, int):
        check_index(positions, MAX_POSITION, "a position")
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
    for p in idx:
        check_index(p, MAX_POSITION, "a position")
    return idx


#: the largest position (counted from either end) an intervention may name
MAX_POSITION = 2**31 - 1
#: the largest layer (counted from either end) an intervention may name
MAX_LAYER = 4096


def check_index(value: int, most: int, what: str) -> None:
    """Refuse an integer beyond ``±most`` (a layer or a position no model has) when it is
    built or loaded, not at the first forward pass."""
    if abs(value) > most:
        raise InterventionError(
            f"{what} of {value} is beyond any model (at most {most:,} either way)",
            fix="give a layer or position the model has",
        )


def positions_to_json(positions: PositionSpec, owner: str) -> str | int | list[int]:
    """The positions rule as saved (a callable cannot be)."""
    if isinstance(positions, (str, int)):
        return positions
    if callable(positions):
        raise InterventionError(
            f"{owner} uses a callable positions rule, which cannot be saved; use 'last', "
            "'all', 'last+generated' or explicit integer positions for a saved intervention"
        )
    return [int(p) for p in positions]


def positions_text(positions: PositionSpec) -> str:
    """The positions rule for display."""
    if callable(positions) and not isinstance(positions, str):
        return getattr(positions, "__name__", "callable")
    return repr(positions)


_PADDING_SAFE_RULES = ("all", "all_with_bos")


def mask_for(positions: PositionSpec, t: Tensor, has_bos: bool = True) -> Tensor:
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
            f"positions={positions_text(positions)} on a batch of {t.shape[0]} rows with no "
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


def refuse_pattern(site: str, kind: str) -> None:
    """Refuse ``attn_pattern``: its last axis is a key position, not a feature."""
    if site == "attn_pattern":
        article = "an" if kind[:1] in "AEIOU" else "a"
        raise InterventionError(
            f"{article} {kind} cannot act on attn_pattern (its axes are [batch, head, query, "
            "key]); use a residual site, mlp_post or attn_z"
        )


def site_for(model: Model, site: str, layer: int, kind: str) -> Site:
    """``site`` at ``layer`` resolved in ``model``; an :class:`InterventionError` if it is not
    there (layer out of range, a site the family has not)."""
    try:
        return resolve_site(model, site, layer)
    except SiteError as err:
        raise InterventionError(f"{kind}: {err}") from err


class Intervention(abc.ABC):
    """What every intervention is: anything with ``fwd_hooks(model)``.

    Apply one with :func:`mechlingo.intervene` (``with intervene(model, iv, batch=b): ...``);
    :meth:`fwd_hooks_for` is the escape hatch for a raw ``model.run_with_hooks``, and
    :meth:`attach` applies it to a plain transformers model. Add two with ``+`` to compose
    them. Functions that take an optional intervention type it ``Intervention | None``.

    Attributes:
        meta: free metadata saved with the artifact; ``meta["model"]`` (from
            :func:`model_info`) is checked against the model on load, ``meta["build"]`` says
            how it was built (prompt counts, languages, relations).
    """

    kind: ClassVar[str] = "Intervention"
    meta: dict[str, Any]

    @abc.abstractmethod
    def fwd_hooks(self, model: Model) -> list[tuple[str, HookFn]]:
        """Check against ``model`` and return TransformerLens ``(hook_name, fn)`` pairs.

        What :func:`~mechlingo.interventions.apply.intervene` and mechlingo's runs apply;
        on its own it suits one unpadded row (``model.run_with_hooks(tokens,
        fwd_hooks=iv.fwd_hooks(model))``); for a padded batch use :meth:`fwd_hooks_for`."""

    def fwd_hooks_for(self, model: Model, batch: TokenBatch) -> list[tuple[str, HookFn]]:
        """:meth:`fwd_hooks` bound to ``batch`` (from :func:`mechlingo.core.tokens.encode`): each
        hook runs with that batch as the current one, so ``"last"`` and the other position
        rules find every row's real tokens in a plain ``run_with_hooks`` on the padded
        batch. The escape hatch for raw TransformerLens calls::

            model.run_with_hooks(b.tokens, attention_mask=b.attention_mask(),
                                 fwd_hooks=iv.fwd_hooks_for(model, b))
        """
        return [(name, _bound(fn, batch)) for name, fn in self.fwd_hooks(model)]

    def attach(self, hf_model: torch.nn.Module, *, has_bos: bool | None = None) -> HFHandle:
        """Apply this intervention to a plain transformers ``AutoModelForCausalLM`` with
        PyTorch hooks on its own modules, until the returned handle's ``remove()`` (or the
        end of its ``with`` block). Same numbers as on the TransformerLens bridge; position
        rules read the attention mask and the cache (``docs/interop.md``)."""
        return attach(self, hf_model, has_bos=has_bos)

    def __add__(self, other: Intervention) -> Intervention:
        if not isinstance(other, Intervention):
            return NotImplemented
        return Compose([self, other])

    def only_for(self, langs: Iterable[str], **kw: Any) -> Intervention:
        """This intervention applied only to prompts in ``langs``
        (:class:`Gated`; ``exclude=True`` for every language but those)."""
        return Gated(self, langs, **kw)

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
            (tmp / _META_FILE).write_text(
                json.dumps(doc, indent=2, ensure_ascii=False), encoding="utf-8"
            )
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


EditFn = Callable[[Tensor, Tensor], Tensor]
"""A kind's edit at one resolved site: ``fn(activation, mask) -> new activation``, where
``mask`` is a bool tensor broadcastable to the activation (``[batch, pos, 1, ...]``), true
at the positions the intervention acts on; the edit leaves the other positions as they are."""


class SiteEdit(Intervention):
    """The *where* of an intervention that edits one site of one or more layers.

    It holds the site (canonical name; ``attn_pattern`` refused), the layer (``layer``, for
    the kinds with one layer) or layers (:attr:`layers`), the positions rule and the
    metadata, and implements :meth:`fwd_hooks`: check the model (``meta["model"]``), resolve
    the site at each layer, ask the kind for its :meth:`edit` there (the kind checks its
    width against the resolved :class:`~mechlingo.core.sites.Site`), and wrap the edit with
    the positions mask (:func:`mask_for`) and :func:`~mechlingo.core.sites.edit_hooks` (a
    ``resid_mid`` write on a bridge is carried to ``resid_post``). It saves ``site``,
    ``positions`` and ``layer`` (or ``layers``) in the config, beside the kind's own fields.

    A kind sets ``kind``, calls ``super().__init__(site=..., positions=..., meta=...,
    layer=...)``, and implements :meth:`edit`, :meth:`_tensors`, :meth:`_own_config` and
    :meth:`_restore` (with :meth:`_where` for the saved where).
    """

    one_layer: ClassVar[bool] = True  # False: the kind holds several layers (``layers``)
    optional_layer: ClassVar[bool] = False  # True: ``layer=None`` allowed until placed
    site: str
    positions: PositionSpec
    layer: int | None

    def __init__(
        self,
        *,
        site: str,
        positions: PositionSpec,
        meta: Mapping[str, Any] | None,
        layer: int | None = None,
    ) -> None:
        if self.one_layer:
            bad = not isinstance(layer, int) or isinstance(layer, bool)
            if bad and not (layer is None and self.optional_layer):
                allowed = "an int or None" if self.optional_layer else "an int"
                raise InterventionError(f"layer must be {allowed}, got {layer!r}")
            if layer is not None:
                check_index(layer, MAX_LAYER, "a layer")
            self.layer = layer
        self.site = canonical_site(site)
        refuse_pattern(self.site, self.kind)
        self.positions = check_positions(positions)
        self.meta = dict(meta or {})

    @property
    def layers(self) -> tuple[int, ...]:
        """The layers this intervention edits, in the order its hooks are returned."""
        if self.layer is None:
            raise InterventionError(
                f"this {self.kind} has no layer; place it with .at(layer, alpha)"
            )
        return (self.layer,)

    @abc.abstractmethod
    def edit(self, model: Model, site: Site, layer: int) -> EditFn:
        """The edit at ``site``, resolved at ``layer`` (one of :attr:`layers`, as the
        intervention holds it; ``site.layer`` is the same layer counted from 0); raises an
        :class:`InterventionError` when the kind does not fit the site (a vector of another
        width, a neuron out of range)."""

    def fwd_hooks(self, model: Model) -> list[tuple[str, HookFn]]:
        layers = self.layers
        check_model(self.meta.get("model"), model, what=repr(self))
        bos = prepends_bos(model)
        hooks: list[tuple[str, HookFn]] = []
        for layer in layers:
            site = site_for(model, self.site, layer, self.kind)
            fn = _masked(self.edit(model, site, layer), self.positions, bos)
            hooks.extend(edit_hooks(model, site.hook_name, fn))
        return hooks

    def _config(self) -> dict[str, Any]:
        where: dict[str, Any] = {"site": self.site}
        if self.one_layer:
            where["layer"] = self.layer
        else:
            where["layers"] = list(self.layers)
        where["positions"] = positions_to_json(self.positions, f"this {self.kind}")
        return where | self._own_config()

    @abc.abstractmethod
    def _own_config(self) -> dict[str, Any]:
        """The kind's own JSON-ready fields (the where is saved by :class:`SiteEdit`)."""

    @staticmethod
    def _where(config: Mapping[str, Any]) -> dict[str, Any]:
        """The saved where as keyword arguments (``site``, ``positions``)."""
        return {"site": config["site"], "positions": config["positions"]}

    def _where_fields(self) -> dict[str, str]:
        """The where for display: site, layer(s) and positions."""
        layer = (
            {"layer": str(self.layer)}
            if self.one_layer
            else {"layers": ",".join(str(x) for x in self.layers)}
        )
        return {"site": self.site, **layer, "positions": positions_text(self.positions)}


def _masked(edit: EditFn, positions: PositionSpec, has_bos: bool) -> HookFn:
    def hook(t: Tensor, hook: Any) -> Tensor:
        return edit(t, mask_for(positions, t, has_bos))

    return hook


def _bound(fn: HookFn, batch: TokenBatch) -> HookFn:
    def hook(t: Tensor, hook: Any) -> Tensor | None:
        if current_batch() is not None:
            return fn(t, hook)
        with batch_context(batch.to(t.device)):
            return fn(t, hook)

    return hook


#: The class of each saved ``kind``, filled by :func:`register_kind`; used only to restore a
#: saved intervention (:func:`restore_any`), never to build one.
_REGISTRY: dict[str, type[Intervention]] = {}


def register_kind(cls: type[Intervention]) -> type[Intervention]:
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
    for p in (path, meta_path, tensor_path):
        refuse_special(p, ArtifactError, fix="give the folder a saved intervention was written to")
    if not meta_path.is_file() or not tensor_path.is_file():
        raise MissingArtifactError(
            f"{path} holds no saved intervention ({_META_FILE} + {_TENSORS_FILE} expected)"
        )
    fix = "re-save the intervention"
    doc = read_json(meta_path, ArtifactError, fix=fix, root=path)
    if not isinstance(doc, dict):
        raise ArtifactError(f"{meta_path} does not hold a JSON object", fix="re-save it")
    if doc.get("format") != FORMAT_VERSION:
        raise InterventionError(f"{path}: unsupported format {doc.get('format')!r}")
    inside(path, tensor_path, ArtifactError)
    tensors = load_tensors(tensor_path, ArtifactError, fix=fix)
    obj = _restore_checked(doc, tensors, meta_path)
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
        _check_fits(obj, model)
    return obj


def _check_fits(obj: Intervention, model: Model) -> None:
    """Layers, neurons and widths against ``model`` at load, not at the first forward pass
    (an unplaced stack is checked placed at layer 0: its length and width)."""
    if isinstance(obj, SiteEdit) and obj.one_layer and obj.layer is None:
        place = getattr(obj, "at", None)
        if place is not None:
            place(0).fwd_hooks(model)
        return
    obj.fwd_hooks(model)


def _restore_checked(doc: dict[str, Any], tensors: dict[str, Tensor], where: Path) -> Intervention:
    """The intervention of a saved description, every malformed field one line."""
    try:
        return restore_any(doc["kind"], tensors, doc["config"])
    except MechlingoError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError) as err:
        missing = f"the field {err}" if isinstance(err, KeyError) else f"{err}"
        raise ArtifactError(
            f"{where} is incomplete or does not match its tensors ({missing})"[:400],
            fix="re-save the intervention",
        ) from None


def restore_any(kind: str, tensors: dict[str, Tensor], config: dict[str, Any]) -> Intervention:
    if kind not in _REGISTRY:
        raise InterventionError(f"unknown intervention kind {kind!r}; known: {sorted(_REGISTRY)}")
    return _REGISTRY[kind]._restore(tensors, config)


# --------------------------------------------------------------------------------------
# interventions made of others (built by ``+`` and ``only_for`` above)
# --------------------------------------------------------------------------------------


@register_kind
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
        self.parts: list[Intervention] = flat
        self.meta = dict(meta or {})

    def fwd_hooks(self, model: Model) -> list[tuple[str, HookFn]]:
        check_model(self.meta.get("model"), model, what="this Compose")
        hooks: list[tuple[str, HookFn]] = []
        for p in self.parts:
            hooks.extend(p.fwd_hooks(model))
        return carries_first(hooks)

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
            part = restore_any(spec["kind"], sub, spec["config"])
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


@register_kind
class Gated(Intervention):
    """``inner`` applied only to the rows whose prompt language is in ``langs`` (or, with
    ``exclude``, not in it), row by row of the running batch, after CAST (Lee et al. 2024):
    how a row's language is found, and why the gate needs mechlingo's runs, is
    :mod:`mechlingo.interventions.gate`.

    Args:
        inner: any intervention (a steering vector, a clamp, an ablation, a composition).
        langs: language codes.
        exclude: apply to every language *but* ``langs`` (``Gated(iv, {"en"},
            exclude=True)`` = non-English only).
        declared: ``{prompt: language}``; these prompts get the declared language.
        identify: identify undeclared prompts from their text (default); ``False`` leaves
            them unknown.
        unknown: what a row of unknown language gets: ``"skip"`` (untouched, default) or
            ``"apply"``.
        meta: saved metadata (see :class:`Intervention`).
    """

    kind = "Gated"

    def __init__(
        self,
        inner: Intervention,
        langs: Iterable[str],
        *,
        exclude: bool = False,
        declared: Mapping[str, str] | None = None,
        identify: bool = True,
        unknown: str = "skip",
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(inner, Intervention):
            raise InterventionError(f"Gated wraps an intervention, got a {type(inner).__name__}")
        if isinstance(langs, str):
            langs = [langs]
        self.langs = frozenset(str(x) for x in langs)
        if not self.langs:
            raise InterventionError("Gated needs at least one language code")
        if unknown not in UNKNOWN_RULES:
            raise InterventionError(f"unknown must be one of {UNKNOWN_RULES}, got {unknown!r}")
        self.inner = inner
        self.exclude = bool(exclude)
        self.declared = {str(k): str(v) for k, v in (declared or {}).items()}
        self.identify = bool(identify)
        self.unknown = unknown
        self.meta = dict(meta or {})

    @classmethod
    def for_facts(cls, inner: Intervention, langs: Iterable[str], facts: Sequence[Fact],
                  prompts: Sequence[str] | None = None, **kw: Any) -> Gated:  # fmt: skip
        """A gate whose languages are declared by ``facts`` (each fact's ``lang`` for its
        ``prompt``, or for the matching entry of ``prompts``, e.g. few-shot prompts)."""
        texts = list(prompts) if prompts is not None else [f.prompt for f in facts]
        if len(texts) != len(facts):
            raise InterventionError(f"{len(texts)} prompts for {len(facts)} facts")
        return cls(
            inner, langs, declared={p: f.lang for p, f in zip(texts, facts, strict=True)}, **kw
        )

    def passes(self, lang: str | None) -> bool:
        """Whether a row of language ``lang`` (``None``: unknown) gets the intervention."""
        if lang is None:
            return self.unknown == "apply"
        return (lang not in self.langs) if self.exclude else (lang in self.langs)

    def fwd_hooks(self, model: Model) -> list[tuple[str, HookFn]]:
        rows = RowLanguages(model, self.declared, identify=self.identify, passes=self.passes)
        return [(name, gated_hook(fn, rows)) for name, fn in self.inner.fwd_hooks(model)]

    def _tensors(self) -> dict[str, Tensor]:
        return {f"inner.{k}": v for k, v in self.inner._tensors().items()}

    def _config(self) -> dict[str, Any]:
        return {
            "langs": sorted(self.langs),
            "exclude": self.exclude,
            "declared": self.declared,
            "identify": self.identify,
            "unknown": self.unknown,
            "inner": {"kind": self.inner.kind, "config": self.inner._config(),
                      "meta": self.inner.meta},
        }  # fmt: skip

    @classmethod
    def _restore(cls, tensors: dict[str, Tensor], config: dict[str, Any]) -> Gated:
        spec = config["inner"]
        sub = {k[len("inner.") :]: v for k, v in tensors.items() if k.startswith("inner.")}
        inner = restore_any(spec["kind"], sub, spec["config"])
        inner.meta = dict(spec.get("meta") or {})
        return cls(inner, config["langs"], exclude=config["exclude"],
                   declared=config.get("declared"), identify=config["identify"],
                   unknown=config["unknown"])  # fmt: skip

    def _fields(self) -> dict[str, str]:
        which = ("all but " if self.exclude else "") + ",".join(sorted(self.langs))
        return {"langs": which, "inner": repr(self.inner), "unknown": self.unknown}
