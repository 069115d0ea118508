"""Passes that reuse the keys and values of an unpatched prefix.

A patch at token position ``p`` cannot change what a causal model computes at positions before
``p``: their residual streams, and so the keys and values every later position attends to, are
those of the unpatched run. A patched copy therefore only needs to compute positions ``p`` and
after, attending to the unpatched run's cached keys and values for the prefix. On short factual
prompts, patched at their last few tokens, that is a fraction of the positions.

This module holds the cache side of that (:mod:`mechlingo.analyses.patching.passes` uses it):

* :func:`record_prefix` runs the unpatched batch once with a transformers ``DynamicCache``
  and keeps its keys and values at every layer, and each row's final residual stream at its
  last token;
* :func:`cache_upto` builds a fresh cache holding the first ``p`` positions of some rows of
  that record;
* :func:`cache_grower` is a hook that, when a pass appends copies of some rows to the batch
  at a block's input (``batching="grow"``), appends the same rows' keys and values to the
  cache of that block and every later one (a copy's prefix is the prefix of the row it
  copies);
* :func:`run_on_cache` runs positions ``p`` onwards against such a cache with the given hooks
  and returns the final residual stream of every row at the last token.

It works where mechlingo's cached decoding works (:func:`mechlingo.activations.decoding.kv_cache_path`
is not ``"none"``: a TransformerLens bridge over a transformers model whose cache keeps one
``keys``/``values`` tensor pair per layer) and the row fits a sliding attention window, if the
model has one. :func:`prefix_reuse_supported` says whether it does; elsewhere the caller runs
every position, which gives the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from mechlingo.activations.decoding import (
    _cache_kwargs,
    _final_resid,
    _hf_model,
    _Step,
    cache_adapter,
    kv_cache_path,
    new_cache,
)
from mechlingo.activations.runs import (
    FwdHooks,
    model_input_device,
)
from mechlingo.core.tokens import TokenBatch
from mechlingo.core.types import HookFn, Model

__all__ = [
    "PrefixRecord",
    "cache_grower",
    "cache_upto",
    "prefix_reuse_supported",
    "record_prefix",
    "run_on_cache",
]


@dataclass(frozen=True)
class PrefixRecord:
    """An unpatched right-padded batch's keys and values at every layer
    (``[batch, kv_heads, pos, d_head]`` each, transformers' layout; positions past a row's
    length are padding) and each row's final residual stream at its last token."""

    keys: tuple[Tensor, ...]
    values: tuple[Tensor, ...]
    final: Float[Tensor, "batch d_model"]


def _layers(cache: Any) -> list[Any] | None:
    """The cache's per-layer objects when each holds one ``keys``/``values`` pair that can
    select batch rows (transformers 5's ``DynamicCache``); ``None`` otherwise."""
    layers = getattr(cache, "layers", None)
    if not isinstance(layers, list) or not layers:
        return None
    need = ("keys", "values", "batch_select_indices")
    return layers if all(all(hasattr(la, n) for n in need) for la in layers) else None


def prefix_reuse_supported(model: Model, length: int) -> bool:
    """Whether prefix reuse works on ``model`` for rows of ``length`` tokens: cached decoding
    agrees with uncached decoding there (probed once per model), its cache keeps one
    key/value pair per layer, and ``length`` fits the sliding window (if any)."""
    if _hf_model(model) is None or kv_cache_path(model) == "none":
        return False
    window = getattr(getattr(_hf_model(model), "config", None), "sliding_window", None)
    if window and length >= int(window):
        return False
    layers = _layers(new_cache(model))
    return layers is not None and len(layers) == int(model.cfg.n_layers)


def _forward(
    model: Model,
    rows: TokenBatch,
    p: int,
    cache: Any,
    fwd_hooks: FwdHooks,
    read: Int[Tensor, " row"],
    attention_mask: Tensor | None,
) -> Float[Tensor, "row d_model"]:
    """One pass of positions ``p`` onwards of ``rows`` against ``cache`` (``None``: none),
    with ``rows`` as the current batch and those positions as its columns (the decoder's
    pass, :func:`mechlingo.activations.decoding._final_resid`); the final residual stream of
    every row at its column ``read[row]``."""
    ids = rows.tokens[:, p:]
    cols = torch.arange(p, rows.tokens.shape[1], device=ids.device).expand(ids.shape[0], -1)
    kwargs = {} if cache is None else _cache_kwargs(model, cache)
    step = _Step(ids, attention_mask, None if p == 0 else cols, read, kwargs)
    with cache_adapter(model, kv_cache_path(model)):
        return _final_resid(model, rows, step, fwd_hooks)


def record_prefix(model: Model, batch: TokenBatch) -> PrefixRecord:
    """Run the right-padded ``batch`` once, unpatched, with a fresh cache, and keep every
    layer's keys and values and each row's final residual stream at its last token (right
    padding changes neither: a causal model's real positions never attend to the padding
    after them)."""
    cache = new_cache(model)
    b = batch.to(model_input_device(model))
    width = b.tokens.shape[1]
    final = _forward(model, b, 0, cache, (), b.last_index, b.attention_mask())
    layers = _layers(cache)
    if layers is None or any(la.keys.shape[-2] != width for la in layers):
        raise RuntimeError("the cache did not record every position of every layer")
    return PrefixRecord(tuple(la.keys for la in layers), tuple(la.values for la in layers), final)


def cache_upto(model: Model, record: PrefixRecord, rows: Tensor, p: int) -> Any:
    """A fresh cache holding positions ``0..p-1`` of the batch rows ``rows`` of ``record``
    at every layer (``p`` must not exceed any of those rows' lengths)."""
    if p < 1:
        raise ValueError(f"prefix length {p} < 1: run without a cache")
    cache = new_cache(model)
    idx = rows.to(record.keys[0].device)
    for j, (k, v) in enumerate(zip(record.keys, record.values, strict=True)):
        cache.update(k[idx, :, :p], v[idx, :, :p], j)
    return cache


def cache_grower(cache: Any, first_layer: int, rows: Tensor) -> HookFn:
    """A hook for the block input at which copies of the batch rows ``rows`` were appended to
    the batch (see :func:`mechlingo.analyses.patching.passes.brancher`): it appends the same
    rows' keys and values to the cache of layer ``first_layer`` and of every later layer
    (not yet run in this pass, so they still hold the prefix alone, which a copy shares with
    the row it copies). Every growth of the batch needs one. It changes no activation."""
    layers = _layers(cache)
    if layers is None:
        raise RuntimeError("this cache does not keep one key/value pair per layer")

    def hook(t: Tensor, hook: Any) -> None:
        for la in layers[first_layer:]:
            have = la.keys.shape[0]
            if have + rows.shape[0] != t.shape[0]:
                raise RuntimeError(
                    f"cache of {have} rows + {rows.shape[0]} copies != batch of {t.shape[0]}"
                )
            idx = torch.cat([torch.arange(have), rows]).to(la.keys.device)
            la.batch_select_indices(idx)

    return hook


def run_on_cache(
    model: Model,
    rows: TokenBatch,
    cache: Any,
    p: int,
    fwd_hooks: FwdHooks,
    read: Int[Tensor, " row"],
) -> Float[Tensor, "row d_model"]:
    """Positions ``p`` onwards of the right-padded ``rows`` against ``cache`` (holding
    their positions ``0..p-1``, from :func:`cache_upto`; ``None`` when ``p == 0``), with
    ``fwd_hooks``, unmasked (right padding only follows the real positions). The hooks see
    the pass's columns: position ``q`` is column ``q - p``; a hook that appends rows to the
    batch must be followed by a :func:`cache_grower` on ``cache`` at the same hook point.
    Returns the final residual stream of every row of the grown batch at its column
    ``read[row]``."""
    if (cache is None) != (p == 0):
        raise ValueError("a cache is needed exactly when the pass starts after position 0")
    rows = rows.to(model_input_device(model))
    width = rows.tokens.shape[1]
    # one causal mask for every row, with batch 1 so that it broadcasts over the grown batch
    # (a 2-D mask would be expanded to the starting batch); column c is position p + c. It is
    # additive (0 = attend, the dtype's minimum = not), which every attention adds as it is;
    # a boolean one would be added as 0/1 by attentions that expect additive masks
    dev = rows.tokens.device
    dtype = model.W_U.dtype if model.W_U.is_floating_point() else torch.float32
    allowed = torch.ones(width - p, width, dtype=torch.bool, device=dev).tril(diagonal=p)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=dev)
    mask = mask.masked_fill(~allowed, torch.finfo(dtype).min)
    return _forward(model, rows, p, cache, fwd_hooks, read, mask[None, None])
