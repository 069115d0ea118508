"""Passes that reuse the keys and values of an unpatched prefix.

A patch at position ``p`` cannot change what a causal model computes before ``p``, so a patched
copy only computes positions ``p`` onwards against the unpatched run's cache:
:func:`record_prefix` keeps every layer's keys and values, :func:`cache_upto` cuts a cache from
them, :func:`cache_grower` grows it when a pass appends row copies, :func:`run_on_cache` and
:func:`run_reads` run the rest (patching, candidate ranking), and :func:`decode_conditions`
decodes several hook sets (*conditions*) stacked in one batch over one shared prefix, each
condition's hooks acting on its own rows (:func:`rows_hooks`). It works where
:func:`prefix_reuse_supported`; elsewhere callers run every position, with the same numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from mechlingo.activations.decoding import (
    Step,
    cache_adapter,
    cache_kwargs,
    decode_cached,
    final_resid_pass,
    fits_window,
    hf_model,
    kv_cache_path,
    new_cache,
)
from mechlingo.activations.runs import (
    FwdHooks,
    StopForward,
    final_resid_name,
    hooked,
    model_input_device,
)
from mechlingo.core.tokens import TokenBatch, batch_context, current_batch, current_columns
from mechlingo.core.types import HookFn, Model

# --------------------------------------------------------------------------------------
# Passes that reuse an unpatched prefix's keys and values (see the module docstring)
# --------------------------------------------------------------------------------------


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
    if hf_model(model) is None or kv_cache_path(model) == "none":
        return False
    window = getattr(getattr(hf_model(model), "config", None), "sliding_window", None)
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
    pass, :func:`final_resid_pass`); the final residual stream of
    every row at its column ``read[row]``."""
    ids = rows.tokens[:, p:]
    cols = torch.arange(p, rows.tokens.shape[1], device=ids.device).expand(ids.shape[0], -1)
    kwargs = {} if cache is None else cache_kwargs(model, cache)
    step = Step(ids, attention_mask, None if p == 0 else cols, read, kwargs)
    with cache_adapter(model, kv_cache_path(model)):
        return final_resid_pass(model, rows, step, fwd_hooks)


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
    the batch (see :func:`mechlingo.analyses.recall.patching.passes.brancher`): it appends the same
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


# --------------------------------------------------------------------------------------
# Several conditions decoded over one shared prefix
# --------------------------------------------------------------------------------------


class _RowOwners:
    """Which condition each row of a stacked batch belongs to, kept up to date as rows
    leave the batch (:func:`decode_cached`'s ``on_keep``)."""

    def __init__(self, owner: Tensor) -> None:
        self.owner = owner
        self._rows: dict[int, Tensor] = {}

    def keep(self, idx: Tensor) -> None:
        self.owner = self.owner[idx.to(self.owner.device)]
        self._rows = {}

    def rows(self, cond: int) -> Tensor:
        if cond not in self._rows:
            self._rows[cond] = (self.owner == cond).nonzero().squeeze(1)
        return self._rows[cond]


def _sub_batch(batch: TokenBatch, idx: Tensor) -> TokenBatch:
    """Rows ``idx`` of ``batch``, not trimmed (the pass's columns still index it)."""
    i = idx.to(batch.tokens.device)
    return TokenBatch(batch.tokens[i], batch.lengths[i], batch.pad_id, batch.has_bos,
                      batch.prompt_lengths[i])  # fmt: skip


def _on_rows(fn: HookFn, cond: int, owners: _RowOwners) -> HookFn:
    def hook(t: Tensor, hook: Any) -> Tensor | None:
        idx = owners.rows(cond).to(t.device)
        if idx.numel() == 0:
            return None
        batch, cols = current_batch(), current_columns()
        if batch is None or batch.batch_size != t.shape[0]:
            raise RuntimeError("a stacked-condition hook ran outside its decoding pass")
        part = t[idx]
        with batch_context(_sub_batch(batch, idx), None if cols is None else cols[idx]):
            out = fn(part, hook)
        new = part if out is None else out
        if new.shape != part.shape:
            raise RuntimeError("a condition's hook changed the shape of its rows")
        res = t.clone()
        res[idx] = new.to(t.dtype)
        return res

    if getattr(fn, "carries_resid_mid", False):
        hook.carries_resid_mid = True  # type: ignore[attr-defined]
    return hook


def stacked_owners(k: int, n: int, device: torch.device | str) -> _RowOwners:
    """The row owners of ``k`` conditions' copies of ``n`` rows stacked condition after
    condition (rows ``c * n`` to ``c * n + n - 1`` are condition ``c``'s), for
    :func:`rows_hooks`; pass its ``keep`` as a decoder's ``on_keep``."""
    return _RowOwners(torch.arange(k).repeat_interleave(n).to(device))


def rows_hooks(
    hook_sets: Sequence[FwdHooks], owners: _RowOwners
) -> list[tuple[str | Callable[[str], bool], HookFn]]:
    """The hooks of every condition, each acting on its condition's rows of a stacked batch
    only, with those rows (and their columns) as the current batch while it runs: a hook
    sees exactly the rows, positions and batch it would see if its condition ran alone."""
    return [(name, _on_rows(fn, c, owners)) for c, hooks in enumerate(hook_sets)
            for name, fn in hooks]  # fmt: skip


def record_head(model: Model, batch: TokenBatch, d: int) -> PrefixRecord:
    """:func:`record_prefix` of every row of ``batch`` without its last ``d`` tokens (``d``
    below every row's length), right-padded to the batch's width minus ``d``: the unedited
    keys and values a shared prefix is made of."""
    b = batch.to(model_input_device(model))
    width = b.tokens.shape[1] - d
    head = TokenBatch(b.tokens[:, :width].contiguous(), b.lengths - d, b.pad_id, b.has_bos)
    return record_prefix(model, head)


def shared_decoding_supported(model: Model, batch: TokenBatch, max_new_tokens: int) -> bool:
    """Whether :func:`decode_conditions` can share a prefix on ``batch``: prefix reuse works
    on the model for its rows (:func:`prefix_reuse_supported`) and the rows with their new
    tokens fit the sliding window, if any."""
    width = int(batch.tokens.shape[1])
    return prefix_reuse_supported(model, width) and fits_window(model, batch, max_new_tokens)


def decode_conditions(
    model: Model,
    batch: TokenBatch,
    hook_sets: Sequence[FwdHooks],
    d: int,
    *,
    max_new_tokens: int,
    stop: Callable[[int, int, list[int]], bool] | None = None,
    eos: int | None = None,
    record: PrefixRecord | None = None,
) -> list[list[list[int]]]:
    """Greedy decoding after every row of the right-padded ``batch`` under each hook set of
    ``hook_sets`` (one *condition* each): ``out[c][r]`` are the new token ids of row ``r``
    under condition ``c``, equal to decoding the batch alone with ``hook_sets[c]``
    (:func:`decode_cached`; tested).

    Every row's positions but its last ``d`` run once, with no hooks, into a cache copied
    for every condition (:func:`record_head`); every condition's copy of the batch then runs
    each row's last ``d`` positions and decodes, all conditions stacked in one batch, each
    hook set acting on its own rows only (:func:`rows_hooks`). That is exact when no hook
    edits a row's position before its last ``d`` (the caller's promise, from the position
    rules: ``d = 1`` for ``"last"`` steering). ``d = 0`` runs every position. Call only
    where :func:`shared_decoding_supported`. ``stop(c, r, ids)``: condition ``c``'s row ``r``
    may stop with its new ``ids`` so far. ``record``: :func:`record_head` of ``batch`` at
    this ``d``, to share one prefix pass between several calls.
    """
    k, n = len(hook_sets), batch.batch_size
    if k == 0:
        return []
    if d < 0 or (d > 0 and d >= int(batch.lengths.min())):
        raise ValueError(f"the shared suffix of {d} tokens is not below every row's length")
    stacked = TokenBatch(batch.tokens.repeat(k, 1), batch.lengths.repeat(k), batch.pad_id,
                         batch.has_bos, batch.prompt_lengths.repeat(k))  # fmt: skip
    owners = stacked_owners(k, n, model_input_device(model))
    prefix = None
    if d > 0:
        rec = record if record is not None else record_head(model, batch, d)
        width = int(batch.tokens.shape[1]) - d
        if rec.keys[0].shape[-2] != width or rec.keys[0].shape[0] != n:
            raise ValueError("the prefix record holds other positions or other rows")
        idx = torch.arange(n, device=rec.keys[0].device).repeat(k)
        prefix = (cache_upto(model, rec, idx, width), d)
    rows = decode_cached(
        model,
        stacked,
        max_new_tokens=max_new_tokens,
        fwd_hooks=rows_hooks(hook_sets, owners),
        stop=None if stop is None else (lambda r, ids: stop(r // n, r % n, ids)),
        eos=eos,
        path=kv_cache_path(model),
        prefix=prefix,
        on_keep=owners.keep,
    )
    return [rows[c * n : (c + 1) * n] for c in range(k)]


# --------------------------------------------------------------------------------------
# Passes that read several positions per row (candidate ranking)
# --------------------------------------------------------------------------------------


def run_reads(
    model: Model,
    batch: TokenBatch,
    rows: Int[Tensor, " read"],
    pos: Int[Tensor, " read"],
    *,
    prefix: tuple[Any, Int[Tensor, " batch"]] | None = None,
    fwd_hooks: FwdHooks = (),
) -> tuple[PrefixRecord, Float[Tensor, "read d_model"]]:
    """One pass over the right-padded ``batch``, stopped after the last block: the final
    residual stream at the positions ``pos`` of the rows ``rows``.

    Without ``prefix`` every position runs, into a fresh cache that is returned as a
    :class:`PrefixRecord` (its ``final`` empty). With ``prefix=(cache, starts)`` the cache
    holds the first ``starts[r]`` positions of every row ``r`` (right-padded: the gap after
    them is hidden by the attention mask), and the pass computes positions ``starts[r]``
    onwards of each row, left-aligned in its columns (``pos`` must lie among them); the
    record returned is then the grown cache: the cached columns, then the pass's. The hooks
    see ``batch`` as the current batch and those positions as the pass's columns."""
    b = batch.to(model_input_device(model))
    dev = b.tokens.device
    if prefix is None:
        cache, ids, cols, mask, at = new_cache(model), b.tokens, None, b.attention_mask(), pos
    else:
        cache, starts = prefix
        starts = starts.to(dev)
        n_cached = _layers(cache)[0].keys.shape[-2]  # type: ignore[index]
        width = int((b.lengths - starts).max())
        cols = starts.unsqueeze(1) + torch.arange(width, device=dev)
        real = cols < b.lengths.unsqueeze(1)
        head = torch.arange(n_cached, device=dev) < starts.unsqueeze(1)
        mask = torch.cat([head.long(), real.long()], 1)
        width_all = b.tokens.shape[1]
        ids = b.tokens.gather(1, cols.clamp(max=width_all - 1)).masked_fill(~real, b.pad_id)
        at = pos.to(dev) - starts[rows.to(dev)]
    out: dict[str, Tensor] = {}

    def read(t: Tensor, hook: Any) -> None:
        out["resid"] = t[rows.to(t.device), at.to(t.device)].detach()
        raise StopForward

    hooks = [*fwd_hooks, (final_resid_name(model), read)]
    with torch.no_grad(), batch_context(b, cols), hooked(model, hooks):
        with cache_adapter(model, kv_cache_path(model)):
            try:
                model(ids, attention_mask=mask, **cache_kwargs(model, cache))
            except StopForward:
                pass
    if "resid" not in out:
        raise RuntimeError("the final residual hook did not fire during the pass")
    cols_all = b.tokens.shape[1] if prefix is None else n_cached + width
    layers = _layers(cache)
    if layers is None or any(la.keys.shape[-2] != cols_all for la in layers):
        raise RuntimeError("the cache did not record every position of every layer")
    keys = tuple(la.keys for la in layers)
    empty = torch.empty(0, int(model.cfg.d_model))
    return PrefixRecord(keys, tuple(la.values for la in layers), empty), out["resid"]
