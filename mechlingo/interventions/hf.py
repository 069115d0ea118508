"""Interventions on a plain transformers model: PyTorch hooks on its own modules.

``iv.attach(hf_model)`` (:meth:`Intervention.attach`, implemented by :func:`attach` here) is
*the* way to apply an intervention outside TransformerLens: it registers forward hooks and
pre-hooks on a plain ``AutoModelForCausalLM`` of a family in
:data:`mechlingo.core.families.FAMILIES` and returns an :class:`HFHandle` that removes them
(``handle.remove()``, or as a context manager, also after an exception). The hooks run the
intervention's own TransformerLens hook functions at each site's module (:data:`LAYOUTS`), in
mechlingo's right-padded coordinates of the batch, so every kind means exactly what it means
on the bridge (tested: logits and greedy ``generate()`` tokens are equal, on every family).
``docs/interop.md`` ("Plain transformers: ``attach``") has where each site is, how positions
keep their meaning with padding and the KV cache, and what is not covered.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace, TracebackType
from typing import Any, Protocol, runtime_checkable

import torch
from jaxtyping import Int
from torch import Tensor

from mechlingo.core.errors import InterventionError
from mechlingo.core.families import FAMILIES, SUPPORTED_ARCHITECTURES, Layout
from mechlingo.core.sites import SITE_HOOKS
from mechlingo.core.tokens import TokenBatch, batch_context
from mechlingo.core.types import HookFn


@runtime_checkable
class HasHooks(Protocol):
    """Anything with ``fwd_hooks(model)`` (every :class:`Intervention`; this module sits
    below :mod:`~mechlingo.interventions.base`, which imports it, so it names the one method
    it calls). The model it is given is an :class:`HFView`."""

    def fwd_hooks(self, model: HFView) -> list[tuple[str, HookFn]]: ...


class _Layouts(Mapping[str, Layout]):
    """Family name -> :class:`~mechlingo.core.families.Layout`, read from the family registry
    on every lookup (a family registered later is there too)."""

    def __getitem__(self, name: str) -> Layout:
        family = FAMILIES.get(name)
        if family is None or family.layout is None:
            raise KeyError(name)
        return family.layout

    def __iter__(self) -> Iterator[str]:
        return (name for name, f in FAMILIES.items() if f.layout is not None)

    def __len__(self) -> int:
        return sum(f.layout is not None for f in FAMILIES.values())


#: Where the sites are in each family's transformers modules (a view of the registry).
LAYOUTS: Mapping[str, Layout] = _Layouts()

# Where several sites share one module, the one TransformerLens computes first is hooked first.
_SITE_ORDER = {s: i for i, s in enumerate(SITE_HOOKS)}
_SITE_ORDER["attn_out"], _SITE_ORDER["resid_mid"] = -2, -1


def hf_family(hf_model: torch.nn.Module) -> str:
    """The family (a key of :data:`LAYOUTS`) of a plain transformers model; a clear error for
    an architecture mechlingo has no module map for."""
    config = getattr(hf_model, "config", None)
    names = [type(hf_model).__name__, *(getattr(config, "architectures", None) or [])]
    for name in names:
        fam = SUPPORTED_ARCHITECTURES.get(name)
        if fam is not None and fam in LAYOUTS:
            return fam
    raise InterventionError(
        f"no module map for a plain transformers {names[0]}: attach() knows the families "
        f"{sorted(LAYOUTS)} ({', '.join(sorted(SUPPORTED_ARCHITECTURES))})",
        fix="load the model with mechlingo.load_model and apply the intervention there",
    )


def _linear_in(module: Any) -> int:
    if type(module).__name__ == "Conv1D":  # GPT-2: weight is [in, out]
        return int(module.weight.shape[0])
    return int(module.in_features)


class HFView:
    """What :meth:`Intervention.fwd_hooks` reads from a model (``cfg``, ``hook_dict``,
    ``W_U``), built from a plain transformers model, so that an intervention checks its
    sites, layers and sizes against it and returns its hook functions."""

    def __init__(self, hf_model: torch.nn.Module, family: str, has_bos: bool) -> None:
        self.hf, self.family, self.layout = hf_model, family, LAYOUTS[family]
        layers: Any = hf_model.get_submodule(self.layout.layers)  # a ModuleList
        block = layers[0]
        config: Any = hf_model.config
        n_heads = int(
            getattr(config, "num_attention_heads", 0) or getattr(config, "n_head", 0) or 0
        )
        o_in = _linear_in(block.get_submodule(self.layout.o_proj))
        self.cfg = SimpleNamespace(
            n_layers=len(layers),
            d_model=int(hf_model.get_input_embeddings().weight.shape[1]),  # type: ignore[operator]
            d_mlp=_linear_in(block.get_submodule(self.layout.down)),
            n_heads=n_heads,
            d_head=o_in // max(n_heads, 1),
            default_prepend_bos=has_bos,
            model_name=str(getattr(config, "_name_or_path", "") or type(hf_model).__name__),
            num_experts=0,
        )
        self.hook_dict = {
            SITE_HOOKS[s].format(layer=layer): None
            for s in SITE_HOOKS
            for layer in range(self.cfg.n_layers)
        }

    @property
    def W_U(self) -> Tensor:  # noqa: N802 - TransformerLens's name
        """The unembedding ``[d_model, vocab]`` (the output embedding's weight, as the bridge
        holds it in raw mode), for the model check of a saved intervention."""
        return self.hf.get_output_embeddings().weight.T  # type: ignore[operator]


# --------------------------------------------------------------------------------------
# The current pass: mechlingo's right-padded view of the model's (left-)padded batch
# --------------------------------------------------------------------------------------


@dataclass
class _Pass:
    """The token history of the sequence being run (all passes since its prompt)."""

    ids: Tensor  # [batch, cols] every column so far (padding included)
    mask: Tensor  # [batch, cols] 1 at real tokens
    prompt_lengths: Tensor  # [batch] real tokens in the prompt


@dataclass
class _State:
    has_bos: bool | None
    bos_id: int | None
    seq: _Pass | None = None
    batch: TokenBatch | None = None
    columns: Tensor | None = None
    resid_pre: dict[int, Tensor] = field(default_factory=dict)


def _past_length(kwargs: dict[str, Any]) -> int:
    cache = kwargs.get("past_key_values")
    if cache is None:
        return 0
    if hasattr(cache, "get_seq_length"):
        return int(cache.get_seq_length())
    return int(cache[0][0].shape[-2])  # legacy tuple cache


def _right_padded(seq: _Pass, has_bos: bool, cols: int) -> tuple[TokenBatch, Tensor]:
    """The sequence in mechlingo's coordinates, and where the last ``cols`` columns sit."""
    mask = seq.mask.bool()
    rank = mask.long().cumsum(1) - 1  # each real column's position among the real tokens
    lengths = mask.sum(1)
    width = max(int(lengths.max()), 1)
    tokens = torch.zeros(mask.shape[0], width, dtype=torch.long, device=mask.device)
    rows = torch.arange(mask.shape[0], device=mask.device).unsqueeze(1).expand_as(mask)
    tokens[rows[mask], rank[mask]] = seq.ids.to(mask.device)[mask]
    batch = TokenBatch(tokens, lengths, 0, has_bos, seq.prompt_lengths.to(mask.device))
    columns = torch.where(mask, rank, torch.full_like(rank, -1))[:, mask.shape[1] - cols :]
    return batch, columns


def _continues(prev: _Pass, ids: Tensor, mask: Tensor, kwargs: dict[str, Any]) -> bool:
    """An uncached generate() step: the same rows, one more column, the same prefix."""
    if kwargs.get("use_cache") is not False or ids.shape[0] != prev.ids.shape[0]:
        return False
    if ids.shape[1] != prev.ids.shape[1] + 1:
        return False
    p = prev.ids.shape[1]
    return bool(torch.equal(ids[:, :p], prev.ids.to(ids.device))) and bool(
        torch.equal(mask[:, :p].long(), prev.mask.to(mask.device).long())
    )


def _start_pass(state: _State, hf_model: Any, kwargs: dict[str, Any], args: tuple) -> None:
    ids = kwargs.get("input_ids", args[0] if args else None)
    embeds = kwargs.get("inputs_embeds")
    if ids is None and embeds is None:
        raise InterventionError("attach(): the forward pass got neither input_ids nor embeds")
    ref: Any = ids if ids is not None else embeds
    b, t = int(ref.shape[0]), int(ref.shape[1])
    if ids is None:
        ids = torch.zeros(b, t, dtype=torch.long, device=ref.device)
    mask = kwargs.get("attention_mask")
    past = _past_length(kwargs)
    if mask is None:
        mask = torch.ones(b, past + t, dtype=torch.long, device=ref.device)
    if mask.ndim != 2 or mask.shape[0] != b or mask.shape[1] < t:
        raise InterventionError(
            f"attach(): an attention_mask of shape {tuple(mask.shape)} for input of shape "
            f"{(b, t)}; position rules need a 2-D [batch, past + new] mask of 0/1"
        )
    mask = mask.long()
    if mask.shape[1] > t:  # a cached step: columns after those the cache holds
        prev = state.seq
        if prev is None or prev.ids.shape != (b, mask.shape[1] - t):
            raise InterventionError(
                "attach(): a pass with a key-value cache whose earlier tokens did not run "
                "under this handle, so the prompt's positions are unknown",
                fix="attach the intervention before the prompt pass (generate() does that)",
            )
        state.seq = _Pass(
            torch.cat([prev.ids, ids.to(prev.ids.device)], 1), mask, prev.prompt_lengths
        )
    elif state.seq is not None and _continues(state.seq, ids, mask, kwargs):
        state.seq = _Pass(ids, mask, state.seq.prompt_lengths)
    else:
        state.seq = _Pass(ids, mask, mask.sum(1))
    has_bos = state.has_bos
    if has_bos is None:
        seq = state.seq
        first = seq.mask.long().argmax(1)
        firsts = seq.ids.gather(1, first.unsqueeze(1).to(seq.ids.device)).squeeze(1)
        has_bos = state.bos_id is not None and bool((firsts == state.bos_id).all())
        if embeds is not None and kwargs.get("input_ids") is None and not args:
            has_bos = False
    state.batch, state.columns = _right_padded(state.seq, has_bos, t)
    state.resid_pre.clear()


def _end_pass(state: _State) -> Callable[..., None]:
    def hook(m: Any, a: tuple, out: Any) -> None:
        state.batch, state.columns = None, None
        state.resid_pre.clear()

    return hook


# --------------------------------------------------------------------------------------
# Hooks on the modules
# --------------------------------------------------------------------------------------


def _first(out: Any) -> Tensor:
    return out[0] if isinstance(out, tuple) else out


def _replace_first(out: Any, new: Tensor) -> Any:
    return (new, *out[1:]) if isinstance(out, tuple) else new


def _run(state: _State, fn: HookFn, t: Tensor, point: Any) -> Tensor:
    if state.batch is None:
        raise InterventionError("attach(): a module ran outside a forward pass of the model")
    with batch_context(state.batch, state.columns):
        out = fn(t, point)
    return t if out is None else out


def _parse(hook_name: str) -> tuple[str, int]:
    for site, pattern in SITE_HOOKS.items():
        prefix, suffix = pattern.split("{layer}")
        if hook_name.startswith(prefix) and hook_name.endswith(suffix):
            middle = hook_name[len(prefix) : len(hook_name) - len(suffix)]
            if middle.isdigit():
                return site, int(middle)
    raise InterventionError(f"attach(): {hook_name!r} is not a mechlingo site hook")


_NO_MODULE = {
    "attn_pattern": "attention probabilities are not the output of a module in transformers",
}


def _register(
    view: HFView, state: _State, site: str, layer: int, fn: HookFn, point: Any
) -> list[Any]:
    """Register the torch hooks that run ``fn`` at ``site`` of ``layer``; their handles."""
    lay = view.layout
    block = view.hf.get_submodule(lay.layers)[layer]  # type: ignore[index]
    run: Callable[[Tensor], Tensor] = lambda t: _run(state, fn, t, point)  # noqa: E731
    if site == "resid_pre":
        return [block.register_forward_pre_hook(_pre_input(run), with_kwargs=True)]
    if site == "resid_post":
        return [
            block.register_forward_hook(lambda m, a, out: _replace_first(out, run(_first(out))))
        ]
    if site in ("attn_out", "mlp_out"):
        mod = block.get_submodule(lay.attn_out if site == "attn_out" else lay.mlp_out)
        return [mod.register_forward_hook(lambda m, a, out: _replace_first(out, run(_first(out))))]
    if site == "mlp_post":
        down = block.get_submodule(lay.down)
        return [down.register_forward_pre_hook(lambda m, a: (run(a[0]), *a[1:]))]
    if site == "attn_z":
        heads, d_head = view.cfg.n_heads, view.cfg.d_head

        def z_hook(m: Any, a: tuple) -> tuple:
            x = a[0]
            z = run(x.reshape(*x.shape[:-1], heads, d_head))
            return (z.reshape(x.shape), *a[1:])

        return [block.get_submodule(lay.o_proj).register_forward_pre_hook(z_hook)]
    if site == "resid_mid":
        return _register_mid(view, state, block, layer, run)
    raise InterventionError(
        f"{site} at layer {layer} has no module in a plain transformers {view.family} model: "
        f"{_NO_MODULE.get(site, 'unknown site')}"
    )


def _pre_input(run: Callable[[Tensor], Tensor]) -> Callable[..., Any]:
    def hook(m: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
        if args:
            return (run(args[0]), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": run(kwargs["hidden_states"])}

    return hook


def _register_mid(
    view: HFView, state: _State, block: Any, layer: int, run: Callable[[Tensor], Tensor]
) -> list[Any]:
    lay = view.layout
    if FAMILIES[view.family].parallel:
        raise InterventionError(
            f"resid_mid at layer {layer} has no module in a plain transformers {view.family} "
            "model: its attention and MLP read the same residual in parallel, so there is no "
            "residual between them",
            fix="use resid_pre, resid_post, attn_out or mlp_out",
        )
    if lay.mid:  # the module's output is resid_mid itself
        mod = block.get_submodule(lay.mid)
        return [mod.register_forward_hook(lambda m, a, out: _replace_first(out, run(_first(out))))]

    def keep_pre(m: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        state.resid_pre[layer] = args[0] if args else kwargs["hidden_states"]

    def mid_hook(m: Any, a: tuple, out: Any) -> Any:
        attn = _first(out)
        mid = state.resid_pre[layer] + attn
        return _replace_first(out, attn + (run(mid) - mid))

    return [
        block.register_forward_pre_hook(keep_pre, with_kwargs=True),
        block.get_submodule(lay.attn_out).register_forward_hook(mid_hook),
    ]


# --------------------------------------------------------------------------------------
# The handle
# --------------------------------------------------------------------------------------


class HFHandle:
    """The torch hooks of one intervention on one plain transformers model.

    ``remove()`` takes them all off (safe to call twice); as a context manager they come off
    when the block exits, also after an exception. ``family`` names the module map used."""

    def __init__(self, hf_model: torch.nn.Module, family: str, handles: list[Any]) -> None:
        self.model, self.family, self._handles = hf_model, family, handles

    @property
    def n_hooks(self) -> int:
        """How many torch hooks are attached (0 once removed)."""
        return len(self._handles)

    def remove(self) -> None:
        """Remove every hook this handle registered."""
        while self._handles:
            self._handles.pop().remove()

    def __enter__(self) -> HFHandle:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.remove()


def attach(
    intervention: HasHooks, hf_model: torch.nn.Module, *, has_bos: bool | None = None
) -> HFHandle:
    """Apply ``intervention`` to a plain transformers causal LM with PyTorch hooks (what
    ``intervention.attach(hf_model)`` calls; use that).

    Every forward pass of ``hf_model`` (``model(...)``, ``generate()``) runs the intervention
    until the returned handle's ``remove()`` (or the end of its ``with`` block). Position
    rules read the attention mask and the cache (``docs/interop.md``).

    Args:
        intervention: any mechlingo intervention (or anything with ``fwd_hooks(model)`` that
            returns hooks at mechlingo's sites).
        hf_model: an ``AutoModelForCausalLM`` of a family in :data:`LAYOUTS`, float weights
            as loaded (not a TransformerLens model: use :func:`mechlingo.intervene` there).
        has_bos: whether position 0 of every row is a BOS token (``"all"`` skips it); by
            default, whether each row's first real token is the config's ``bos_token_id``.

    Raises:
        InterventionError: an architecture with no module map, a site with no module in
            this family (``resid_mid`` of a parallel block, ``attn_pattern``), or anything the
            intervention's own checks refuse (layer out of range, a vector of the wrong
            width, a saved intervention built on another model). Nothing is attached then.
    """
    if hasattr(hf_model, "hook_dict") or hasattr(hf_model, "run_with_hooks"):
        raise InterventionError(
            "attach() is for a plain transformers model; this is a TransformerLens model",
            fix="use mechlingo.intervene(model, intervention) or intervention.fwd_hooks(model)",
        )
    family = hf_family(hf_model)
    bos = getattr(hf_model.config, "bos_token_id", None)
    view = HFView(hf_model, family, bool(has_bos))
    hooks = intervention.fwd_hooks(view)  # every check runs before anything is attached
    state = _State(has_bos, None if bos is None else int(bos))
    parsed = [(*_parse(name), fn, name) for name, fn in hooks]
    for site, layer, _fn, _name in parsed:  # refuse a site with no module before attaching
        if site == "attn_pattern" or (site == "resid_mid" and view.layout.mid is None):
            _register(view, state, site, layer, lambda t, h: t, None)
    order = sorted(range(len(parsed)), key=lambda i: (parsed[i][1], _SITE_ORDER[parsed[i][0]], i))
    handles: list[Any] = []
    try:
        handles.append(
            hf_model.register_forward_pre_hook(
                lambda m, a, kw: _start_pass(state, hf_model, kw, a), with_kwargs=True
            )
        )
        handles.append(hf_model.register_forward_hook(_end_pass(state), always_call=True))
        for i in order:
            site, layer, fn, name = parsed[i]
            point = SimpleNamespace(name=name, layer=lambda layer=layer: layer)
            handles.extend(_register(view, state, site, layer, fn, point))
    except BaseException:
        for h in handles:
            h.remove()
        raise
    return HFHandle(hf_model, family, handles)


def left_padded(
    rows: list[Tensor], pad_id: int
) -> tuple[Int[Tensor, "batch pos"], Int[Tensor, "batch pos"]]:
    """Left-pad 1-D id tensors as transformers' ``generate()`` expects: ``(input_ids,
    attention_mask)``."""
    width = max(int(r.numel()) for r in rows)
    ids = torch.full((len(rows), width), int(pad_id), dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - r.numel() :] = r.cpu()
        mask[i, width - r.numel() :] = 1
    return ids, mask
