"""Named places in a model, resolved to TransformerLens hook names.

A *site* is a kind of activation (``"resid_pre"``, ``"mlp_post"``, ...) at a layer. Every
other module addresses the model through sites, so a typo or a layer out of range is caught
here, once, with a message that lists what exists, instead of a hook that silently never fires.
Entry points: :func:`resolve_site`, :func:`hook_name`, :func:`site_map` (a :class:`SiteMap`:
the sites a model has), :func:`mlp_width`, :func:`resolve_layers`, :func:`layers_at`, and
:func:`edit_hooks`, through which every writer registers its edit so that a write at
``resid_mid`` on a TransformerBridge reaches the residual stream as on a ``HookedTransformer``.
``docs/concepts.md`` ("Sites") has the table of sites and hooks, ``docs/gotchas.md`` why a
write at ``resid_mid`` needs :func:`edit_hooks`.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from mechlingo.core.errors import MechlingoError
from mechlingo.core.families import STANDARD_HOOKS, family_of
from mechlingo.core.types import HookFn, Model

#: The hook of each site in every supported family (a family may give its own:
#: :attr:`mechlingo.core.families.Family.hooks`, which :class:`SiteMap` reads).
SITE_HOOKS: Mapping[str, str] = STANDARD_HOOKS
SITE_ALIASES: dict[str, str] = {"neurons": "mlp_post", "mlp_neurons": "mlp_post", "z": "attn_z"}
RESIDUAL_SITES = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")


class SiteError(MechlingoError, ValueError):
    """An unknown site, a layer out of range, or a hook the model does not have."""


@dataclass(frozen=True)
class Site:
    """One resolved place in one model.

    Attributes:
        name: canonical site name (``"resid_pre"``, ``"mlp_post"``, ...).
        layer: block index.
        hook_name: the TransformerLens hook name that fires there.
        width: size of the last axis of the activation (``d_model``, ``d_mlp`` or ``d_head``).
    """

    name: str
    layer: int
    hook_name: str
    width: int


class SiteMap:
    """The sites of one model, checked against its ``hook_dict`` once."""

    def __init__(self, model: Model) -> None:
        cfg = model.cfg
        self.n_layers = int(cfg.n_layers)
        self.d_model = int(cfg.d_model)
        self.d_mlp = mlp_width(model)
        self.n_heads = int(getattr(cfg, "n_heads", 0) or 0)
        self.d_head = int(getattr(cfg, "d_head", 0) or 0)
        family = family_of(str(getattr(cfg, "architecture", "") or ""))
        self.family = family.name if family is not None else None
        self.hooks: Mapping[str, str] = family.hooks if family is not None else SITE_HOOKS
        names = set(model.hook_dict.keys())
        self.available: dict[str, bool] = {}
        for site, pattern in self.hooks.items():
            self.available[site] = all(
                pattern.format(layer=layer) in names for layer in range(self.n_layers)
            )
        self.why_unavailable: dict[str, str] = {}
        if family is not None and family.parallel:
            self.available["resid_mid"] = False  # a bridge may alias a hook there: no residual
        if family is not None and family.final_norm and getattr(model, "ln_final", None) is None:
            raise SiteError(
                f"this {family.name} model has no ln_final, but the family reads through "
                f"{family.final_norm}: the lens would skip it; load it with mechlingo.load_model"
            )
        n_experts = int(getattr(cfg, "num_experts", 0) or 0)
        if n_experts > 1:
            # blocks.{l}.mlp.hook_post of a TransformerLens MoE block is the mixed output
            # (d_model wide), not a layer of neurons: refuse it rather than index into it
            self.available["mlp_post"] = False
            self.why_unavailable["mlp_post"] = (
                f"this is a mixture-of-experts model ({n_experts} experts per layer): each "
                "expert has its own neurons and there is no single neuron layer to read"
            )
        if not self.available["resid_mid"]:
            self.why_unavailable["resid_mid"] = (
                "this model's blocks are parallel (attention and MLP read the same residual), "
                "so there is no residual between them; use resid_pre, attn_out or mlp_out"
            )
        if not self.available["resid_pre"] or not self.available["resid_post"]:
            raise SiteError(
                "this model exposes no blocks.{l}.hook_resid_pre/post hooks; mechlingo needs a "
                "TransformerLens decoder model with the standard block stack"
            )

    def width(self, site: str) -> int:
        if site == "mlp_post":
            return self.d_mlp
        if site == "attn_z":
            return self.d_head
        if site == "attn_pattern":
            return -1
        return self.d_model

    def resolve(self, site: str, layer: int) -> Site:
        """Resolve ``site`` at ``layer`` (negative layers count from the end)."""
        canonical = canonical_site(site)
        if not isinstance(layer, int) or isinstance(layer, bool):
            raise SiteError(f"layer must be an int, got {layer!r}")
        index = layer + self.n_layers if layer < 0 else layer
        if not 0 <= index < self.n_layers:
            raise SiteError(
                f"layer {layer} is out of range: this model has {self.n_layers} layers "
                f"(0..{self.n_layers - 1}, or negative from the end)"
            )
        if not self.available[canonical]:
            why = self.why_unavailable.get(canonical, "it is not a hook of this model")
            raise SiteError(
                f"site {canonical!r} ({self.hooks[canonical]}) is not available: {why}; "
                f"available: {[s for s, ok in self.available.items() if ok]}"
            )
        return Site(
            canonical, index, self.hooks[canonical].format(layer=index), self.width(canonical)
        )


def mlp_width(model: Model) -> int:
    """Number of MLP neurons per layer: the input width of block 0's down projection when the
    model exposes it (a TransformerBridge), else ``cfg.d_mlp``.

    The module is the ground truth: TransformerLens 4.3 guesses ``d_mlp = 4 * d_model`` for
    configs that name the width ``ffn_dim`` (XGLM), and that guess would make every ``mlp_post``
    width, neuron index check and neuron statistic wrong."""
    cfg_width = int(getattr(model.cfg, "d_mlp", 0) or 0)
    try:
        down = model.blocks[0].mlp.out.original_component
    except (AttributeError, IndexError, TypeError):
        return cfg_width
    if isinstance(down, torch.nn.Linear):
        return int(down.in_features)
    weight = getattr(down, "weight", None)
    if type(down).__name__ == "Conv1D" and weight is not None:  # GPT-2: weight is [in, out]
        return int(weight.shape[0])
    return cfg_width


def canonical_site(site: str) -> str:
    """The canonical name of a site or alias; a clear error for anything else."""
    name = SITE_ALIASES.get(site, site)
    if name not in SITE_HOOKS:
        raise SiteError(
            f"unknown site {site!r}; known sites: {sorted(SITE_HOOKS)} "
            f"(aliases: {sorted(SITE_ALIASES)})"
        )
    return name


_SITE_MAPS: weakref.WeakKeyDictionary[Any, SiteMap] = weakref.WeakKeyDictionary()


def site_map(model: Model) -> SiteMap:
    """The :class:`SiteMap` of ``model`` (built once per model and remembered)."""
    try:
        return _SITE_MAPS[model]
    except (KeyError, TypeError):
        pass
    sm = SiteMap(model)
    try:
        _SITE_MAPS[model] = sm
    except TypeError:  # an object that cannot be weakly referenced: no memo
        pass
    return sm


def resolve_site(model: Model, site: str, layer: int) -> Site:
    """Resolve ``site`` at ``layer`` of ``model`` to a :class:`Site` (checked hook name)."""
    return site_map(model).resolve(site, layer)


def hook_name(model: Model, site: str, layer: int) -> str:
    """The TransformerLens hook name of ``site`` at ``layer`` (checked against the model)."""
    return resolve_site(model, site, layer).hook_name


def mid_is_residual(model: Model) -> bool:
    """Whether a value returned at ``blocks.{l}.hook_resid_mid`` is the residual stream the
    block carries on (a classic ``HookedTransformer``), rather than the MLP's input only (a
    TransformerLens 4 ``TransformerBridge``, in every sequential family)."""
    return not any(c.__name__ == "TransformerBridge" for c in type(model).__mro__)


def edit_hooks(model: Model, name: str, fn: HookFn) -> list[tuple[str, HookFn]]:
    """The ``(hook_name, fn)`` pairs that apply the edit ``fn`` at the hook ``name`` so that
    it edits what the site names.

    For every hook but a bridge's ``blocks.{l}.hook_resid_mid`` this is ``[(name, fn)]``. At
    resid_mid on a bridge the hook point is the MLP's input only (``docs/gotchas.md``), so
    the change ``fn`` makes there (its output minus its input, zero where it leaves the
    activation as it is) is also added to the block's output ``blocks.{l}.hook_resid_post``:
    a write of ``x`` at resid_mid then gives ``resid_post = x + mlp(x)``, the same as a write
    at the residual itself. Register the pairs together and before other hooks at that
    layer's resid_post (:func:`carries_first` does it; mechlingo's runs and ``Compose`` call
    it); hooks that only read (return ``None``) need no care. Writes that change the batch
    size at resid_mid cannot be carried and raise :class:`SiteError` at the resid_post hook.
    """
    layer = _mid_layer(name)
    if layer is None or mid_is_residual(model):
        return [(name, fn)]
    post = SITE_HOOKS["resid_post"].format(layer=layer)
    change: list[Tensor | None] = [None]

    def at_mid(t: Tensor, hook: Any) -> Tensor | None:
        before = t.clone()  # fn may edit t in place
        out = fn(t, hook)
        change[0] = (t if out is None else out) - before
        return out

    def at_post(t: Tensor, hook: Any) -> Tensor:
        delta, change[0] = change[0], None
        if delta is None:
            return t
        if delta.shape != t.shape:
            raise SiteError(
                f"an edit at {name} changed the activation's shape to {tuple(delta.shape)}, "
                f"but {post} is {tuple(t.shape)}: on a TransformerBridge a resid_mid write is "
                "carried to resid_post and must keep the shape"
            )
        return t + delta.to(t.dtype)

    at_post.carries_resid_mid = True  # type: ignore[attr-defined]
    return [(name, at_mid), (post, at_post)]


def carries_first(fwd_hooks: Sequence[tuple[Any, HookFn]]) -> list[tuple[Any, HookFn]]:
    """``fwd_hooks`` with the resid_post carries of :func:`edit_hooks` moved to the front (a
    stable reorder: hooks at one hook point fire in the order they were added, so a carry
    must come before another write at that resid_post, e.g. an ablation of it, whatever order
    the interventions were composed in; the resid_mid edit happens first in the block)."""
    return sorted(fwd_hooks, key=lambda h: not getattr(h[1], "carries_resid_mid", False))


def _mid_layer(name: str) -> int | None:
    head, _, tail = name.partition(".hook_resid_mid")
    if tail or not head.startswith("blocks.") or not head[7:].isdigit():
        return None
    return int(head[7:])


def resolve_layers(model: Model, layers: Any = None) -> list[int]:
    """Normalise a layer selection (``None`` = all, an int, a range or a list; negatives count
    from the end) to a sorted list of distinct valid layer indices."""
    n = site_map(model).n_layers
    if layers is None:
        return list(range(n))
    if isinstance(layers, int):
        layers = [layers]
    out = []
    for layer in layers:
        index = int(layer) + n if int(layer) < 0 else int(layer)
        if not 0 <= index < n:
            raise SiteError(f"layer {layer} is out of range for a model with {n} layers")
        out.append(index)
    if not out:
        raise SiteError("the layer selection is empty")
    return sorted(set(out))


# Two rules that pick layers to steer at, and their names say which (the steering settings,
# mechlingo.analyses.recall.settings, use them; the lens's "mid-network" entries of
# ``mechlingo trace`` are a third thing: lens entries to read, not places to steer).


def every_second_layer(n_layers: int) -> list[int]:
    """Every second layer from about 20% to about 90% of the depth (4, 6, ..., 16 of 18):
    the default dev grid of ``steer eval``; ``[n_layers // 2]`` when that band is empty."""
    lo, hi = round(0.2 * n_layers), round(0.9 * n_layers)
    layers = list(range(lo, min(hi, n_layers - 1) + 1, 2))
    return layers or [n_layers // 2]


def layers_at(fractions: Sequence[float], n_layers: int) -> list[int]:
    """The layers at ``fractions`` of the depth: ``round(f * n_layers)`` clamped to
    ``0 .. n_layers - 1``, sorted, each once (0.5 and 0.67 of 18: 9, 12)."""
    return sorted({min(n_layers - 1, max(0, round(f * n_layers))) for f in fractions})
