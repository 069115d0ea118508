"""Token-by-token decoding with a key-value cache that keeps mechlingo's hook semantics, and
passes that reuse the cached keys and values of an unpatched prefix.

**Why not the bridge's own cache.** With TransformerLens 4.3 and transformers 5 the bridge's
cached decoding is wrong: transformers 5 renamed the cache keyword its decoder layers hand to
attention from ``past_key_values`` to ``cache``, and the bridge's attention components only
look for the old names (``AttentionBridge._update_kv_cache`` reads ``past_key_values`` or
``layer_past``). The cache object is passed along but never filled, so every decoding step
attends to itself alone and ``generate(use_past_kv_cache=True)`` gives other tokens than
uncached decoding.

**What mechlingo does.** It drives the underlying transformers model's own cache
(``DynamicCache``) through the bridge's ``forward``, so every TransformerLens hook point still
fires, and it adds a small adapter: a forward pre-hook on each attention bridge that copies the
``cache`` keyword to ``past_key_values`` when the latter is missing. Which of three paths a
model takes is decided once per model by a probe (:func:`kv_cache_path`): decode two tokens
then a third with a fresh cache and compare the third token's logits with an uncached pass.

* ``"native"`` -- the bridge fills the cache by itself (TransformerLens fixed upstream): no
  adapter is installed;
* ``"adapter"`` -- the cache works with the adapter (TransformerLens 4.3 + transformers 5);
* ``"none"`` -- neither agrees with uncached decoding, or the model is not a bridge (a classic
  ``HookedTransformer``): decoding recomputes the prefix each step, as before.

**Hook semantics.** The prompt runs once (the *prefill*) with the whole right-padded batch as
the current batch; every later step runs one new token per row, with the whole sequence so far
as the current batch and that token's position as the step's column
(:func:`mechlingo.core.tokens.batch_context`). Interventions evaluate their position rule on the
whole sequence and read it at the step's columns, so:

* ``"last"``, integer positions and callables act in the prefill; the keys and values of the
  positions they changed are cached and attended to later, exactly as when the prefix is
  recomputed each step (tokens are equal to the uncached decoder, tested);
* ``"generated"``, ``"last+generated"`` and ``"all"`` also act on each new token as it is
  decoded.

A plain TransformerLens hook sees the prefill's ``[batch, prompt, ...]`` activations and then
``[batch, 1, ...]`` for each new token. A hook that treats every position alike (add a vector,
zero a neuron) gives the same tokens as uncached decoding; one that indexes positions should
read :func:`mechlingo.core.tokens.current_columns`, or decode with ``cache=False``.

**Padding and early stops.** Rows stay right-padded: a shorter row's new tokens follow a gap
of padding in the cache, which the attention mask hides, and the bridge derives each new
token's position from the mask (its real position, not its column), so a mixed-length batch
equals decoding each prompt alone. Rows that finish (EOS, or a line break after some text)
leave the batch, and the cache drops them, so the batch shrinks as decoding goes on. Models
with a sliding attention window decode uncached when a batch would outgrow the window (the
window would be counted in columns, not in real positions).

**The next token.** Once the cache is in place, the largest cost of a step on a CPU is the
unembedding over Gemma 3's 262,144 tokens. The cached decoder takes the greedy token with a
bfloat16-screened arg-max (:mod:`mechlingo.kernels.argmax`): exact in float32, 3x
cheaper on one CPU thread with native bfloat16 (256 rows). The uncached reference keeps the
plain float32 arg-max, so the equality tests check the screen too.

**Prefix reuse.** A patch at token position ``p`` cannot change what a causal model computes
at positions before ``p``: their residual streams, and so the keys and values every later
position attends to, are those of the unpatched run. A patched copy therefore only computes
positions ``p`` and after, against the unpatched run's cached keys and values
(:mod:`mechlingo.analyses.recall.patching.passes` and candidate ranking use this):

* :func:`record_prefix` runs the unpatched batch once with a fresh cache and keeps its keys
  and values at every layer, and each row's final residual stream at its last token;
  :func:`cache_upto` builds a fresh cache of the first ``p`` positions of some of its rows;
* :func:`cache_grower` is a hook that, when a pass appends copies of some rows to the batch
  at a block's input (``batching="grow"``), appends the same rows' keys and values to the
  cache of that block and every later one (a copy's prefix is the prefix of the row it
  copies);
* :func:`run_on_cache` runs positions ``p`` onwards against such a cache and returns the final
  residual stream of every row at the last token; :func:`run_reads` reads several positions
  per row (candidate ranking);
* :func:`decode_conditions` decodes greedily under several sets of hooks (*conditions*, e.g.
  steering settings) at once: each prompt's positions before its last ``d`` run once,
  unedited, and every condition's copy of the batch continues from that shared cache, all
  stacked in one batch, each condition's hooks acting on its own rows only (:func:`rows_hooks`).

It works where cached decoding works (:func:`kv_cache_path` is not ``"none"``, and the cache
keeps one ``keys``/``values`` tensor pair per layer) and the row fits a sliding attention
window, if the model has one: :func:`prefix_reuse_supported`. Elsewhere the caller runs every
position, which gives the same numbers.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Required, TypedDict, Unpack, cast

import torch
from jaxtyping import Float, Int
from torch import Tensor

from mechlingo.activations.runs import (
    FwdHooks,
    StopForward,
    final_resid_name,
    hooked,
    model_input_device,
)
from mechlingo.core.errors import InputError
from mechlingo.core.tokens import TokenBatch, batch_context, current_batch, current_columns
from mechlingo.core.types import HookFn, Model
from mechlingo.kernels.readout import final_logits, greedy_next

log = logging.getLogger(__name__)

KVPath = Literal["native", "adapter", "none"]
ChooseFn = Callable[[Float[Tensor, "batch vocab"]], Int[Tensor, " batch"]]
StopFn = Callable[[int, list[int]], bool]


class DecodeArgs(TypedDict, total=False):
    """The decoding rule every decoder here takes as keywords: ``max_new_tokens`` (required)
    new tokens per row, ``fwd_hooks`` during every pass (default none), ``choose`` (logits to
    token ids; default the greedy arg-max), ``stop(row, ids)`` (a row stops once true;
    default never) and ``eos`` (a row stops before this token; default none)."""

    max_new_tokens: Required[int]
    fwd_hooks: FwdHooks
    choose: ChooseFn | None
    stop: StopFn | None
    eos: int | None


def _rule(
    rule: DecodeArgs,
) -> tuple[int, FwdHooks, ChooseFn | None, StopFn | None, int | None]:
    """The fields of ``rule`` with their defaults; a ``TypeError`` for a keyword that is not
    one (as a misspelt keyword argument raises)."""
    unknown = sorted(set(rule) - set(DecodeArgs.__annotations__))
    if unknown or "max_new_tokens" not in rule:
        raise TypeError(
            f"decoding takes max_new_tokens (required), fwd_hooks, choose, stop and eos; got "
            f"{sorted(rule)}"
        )
    got = rule.get
    return (
        int(rule["max_new_tokens"]),
        cast("FwdHooks", got("fwd_hooks", ())),
        cast("ChooseFn | None", got("choose")),
        cast("StopFn | None", got("stop")),
        cast("int | None", got("eos")),
    )


_PATHS: weakref.WeakKeyDictionary[Any, KVPath] = weakref.WeakKeyDictionary()
_PROBE_TOLERANCE = 1e-3


def _hf_model(model: Model) -> Any:
    """The transformers model inside a TransformerLens bridge, or ``None``."""
    if not hasattr(model, "adapter"):
        return None
    return getattr(model, "original_model", None)


def _attention_modules(model: Model) -> list[torch.nn.Module]:
    # Imported here: the bridge takes seconds to import and TransformerLens 3 has none.
    try:
        from transformer_lens.model_bridge.generalized_components.attention import (
            AttentionBridge,
        )
    except ImportError:  # pragma: no cover - TransformerLens 3 has no bridge
        return []
    return [m for m in model.modules() if isinstance(m, AttentionBridge)]


def _copy_cache_keyword(
    module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]
) -> tuple[tuple, dict[str, Any]] | None:
    if kwargs.get("cache") is None:
        return None
    if kwargs.get("past_key_values") is not None or kwargs.get("layer_past") is not None:
        return None
    return args, {**kwargs, "past_key_values": kwargs["cache"]}


@contextlib.contextmanager
def cache_adapter(model: Model, path: KVPath) -> Iterator[None]:
    """Install the ``cache`` -> ``past_key_values`` adapter on the model's attention bridges
    for the block when ``path == "adapter"``; removed on exit, also after an error."""
    handles = []
    if path == "adapter":
        handles = [
            m.register_forward_pre_hook(_copy_cache_keyword, with_kwargs=True)
            for m in _attention_modules(model)
        ]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _cache_keyword(hf: Any) -> str:
    params = inspect.signature(hf.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def new_cache(model: Model) -> Any:
    """An empty transformers ``DynamicCache`` for the model (sliding layers as its config
    says)."""
    from transformers import DynamicCache

    return DynamicCache(config=_hf_model(model).config)


def _cache_kwargs(model: Model, cache: Any) -> dict[str, Any]:
    return {_cache_keyword(_hf_model(model)): cache, "use_cache": True}


def _probe(model: Model, path: KVPath) -> bool:
    vocab = int(model.cfg.d_vocab)
    ids = torch.tensor([[min(i, vocab - 1) for i in (2, 17, 31)]], device=model_input_device(model))
    with torch.no_grad():
        full = model(ids)[0, -1].float()
        cache = new_cache(model)
        with cache_adapter(model, path):
            model(ids[:, :2], **_cache_kwargs(model, cache))
            if int(cache.get_seq_length()) != 2:
                return False
            step = model(ids[:, 2:], **_cache_kwargs(model, cache))[0, -1].float()
    scale = 1.0 + float(full.abs().max())
    return float((step - full).abs().max()) <= _PROBE_TOLERANCE * scale


def kv_cache_path(model: Model) -> KVPath:
    """How cached decoding runs on ``model``: ``"native"``, ``"adapter"`` or ``"none"`` (see
    the module docstring). Probed once per model (three short forward passes) and
    remembered."""
    try:
        return _PATHS[model]
    except (KeyError, TypeError):
        pass
    path: KVPath = "none"
    if _hf_model(model) is not None:
        for candidate in ("native", "adapter"):
            try:
                ok = _probe(model, candidate)
            except (TypeError, ValueError, RuntimeError) as err:
                log.debug("KV-cache probe %s failed: %s", candidate, err)
                ok = False
            if ok:
                path = candidate
                break
        if path == "none":
            log.warning(
                "mechlingo: cached decoding disagrees with uncached decoding on %s; "
                "generation recomputes the prefix at each step",
                getattr(model.cfg, "model_name", type(model).__name__),
            )
    with contextlib.suppress(TypeError):
        _PATHS[model] = path
    return path


# --------------------------------------------------------------------------------------
# One forward pass of a decoding loop
# --------------------------------------------------------------------------------------


@dataclass
class _Step:
    """A pass over some columns of ``batch`` with a cache (``None`` for the prefill's
    columns = every position)."""

    input_ids: Int[Tensor, "batch t"]
    attention_mask: Tensor | None  # [batch, cols] 0/1, or a 4-D additive mask (prefix passes)
    columns: Int[Tensor, "batch t"] | None
    read: Int[Tensor, " row"]  # one per row the pass ends with (a grown batch has more)
    model_kwargs: dict[str, Any]


def _final_resid(
    model: Model, batch: TokenBatch, step: _Step, fwd_hooks: FwdHooks
) -> Float[Tensor, "row d_model"]:
    """The final residual stream of every row at its column ``step.read[row]``, the forward
    pass stopped right after the last block (the cache is complete by then). ``step.read``
    has one entry per row the pass ends with (more than ``batch`` has when a hook grows the
    batch, as :func:`cache_grower`'s passes do)."""
    name = final_resid_name(model)
    out: dict[str, Tensor] = {}

    def read(t: Tensor, hook: Any) -> None:
        if t.shape[0] != step.read.shape[0]:
            raise RuntimeError(f"the pass ended with {t.shape[0]} rows, not {step.read.shape[0]}")
        rows = torch.arange(t.shape[0], device=t.device)
        out["resid"] = t[rows, step.read.to(t.device)].detach().float()
        raise StopForward

    with torch.no_grad(), batch_context(batch, step.columns):
        with hooked(model, [*fwd_hooks, (name, read)]):
            try:
                model(step.input_ids, attention_mask=step.attention_mask, **step.model_kwargs)
            except StopForward:
                pass
    if "resid" not in out:
        raise RuntimeError(f"hook {name} did not fire during the decoding pass")
    return out["resid"]


def _argmax(logits: Float[Tensor, "batch vocab"]) -> Int[Tensor, " batch"]:
    return logits.argmax(-1)


def _append(tokens: Tensor, lengths: Tensor, nxt: Tensor, pad_id: int) -> Tensor:
    if int(lengths.max()) >= tokens.shape[1]:
        tokens = torch.cat([tokens, torch.full_like(tokens[:, :1], pad_id)], 1)
    tokens = tokens.clone()
    tokens[torch.arange(tokens.shape[0], device=tokens.device), lengths] = nxt
    return tokens


def _record(
    active: Sequence[int], nxt: Sequence[int], out: list[list[int]], eos: int | None, stop: StopFn
) -> list[bool]:
    """Append each active row's new token; return which rows go on."""
    keep = []
    for r, tid in zip(active, nxt, strict=True):
        if eos is not None and tid == eos:
            keep.append(False)
            continue
        out[r].append(int(tid))
        keep.append(not stop(r, out[r]))
    return keep


def _start(
    model: Model, batch: TokenBatch, stop: StopFn | None
) -> tuple[StopFn, torch.device, TokenBatch, list[list[int]]]:
    """What both decoders start from: the stop rule (never, by default), the input device,
    the batch on it, and one empty list of new tokens per row."""
    dev = model_input_device(model)
    b = batch.to(dev)
    return stop or (lambda r, ids: False), dev, b, [[] for _ in range(b.batch_size)]


def decode_cached(
    model: Model,
    batch: TokenBatch,
    *,
    path: KVPath = "adapter",
    prefix: tuple[Any, int] | None = None,
    on_keep: Callable[[Tensor], None] | None = None,
    **rule: Unpack[DecodeArgs],
) -> list[list[int]]:
    """Decode ``max_new_tokens`` tokens after each row of a right-padded ``batch`` with a KV
    cache (one prefill, then one token per row per step). Returns each row's new token ids,
    cut before EOS; a row stops early once ``stop(row, ids)`` is true and leaves the batch.
    ``choose`` maps each step's logits to tokens; ``None`` is the greedy float32 arg-max,
    found with :func:`mechlingo.kernels.readout.greedy_next` (bfloat16-screened where the
    CPU has native bfloat16, which never changes the token; see
    :mod:`mechlingo.kernels.argmax`).

    ``prefix=(cache, d)``: ``cache`` already holds every row's positions but its last ``d``
    (``d`` >= 1, below every row's length), right-padded to the batch's width minus ``d``
    (:func:`cache_upto`), so the prefill computes each row's last ``d``
    positions only, with those positions as its columns: the padding of shorter rows stays
    in the cache as a gap the attention mask hides, as in every later step.
    ``on_keep(idx)`` is called with the indices (into the rows still decoding) of the rows
    that go on, whenever some leave the batch. The rule's keywords: :class:`DecodeArgs`."""
    max_new_tokens, fwd_hooks, choose, stop, eos = _rule(rule)
    stop, dev, b, out = _start(model, batch, stop)
    tokens, lengths, plen = b.tokens, b.lengths.clone(), b.prompt_lengths
    active = torch.arange(b.batch_size, device=dev)
    attn = b.attention_mask()
    if prefix is None:
        cache = new_cache(model)
        kw = _cache_kwargs(model, cache)
        step = _Step(tokens, attn, None, lengths - 1, kw)
    else:
        cache, d = prefix
        kw = _cache_kwargs(model, cache)
        cols = (lengths - d).unsqueeze(1) + torch.arange(d, device=dev)
        head = torch.arange(tokens.shape[1] - d, device=dev) < (lengths - d).unsqueeze(1)
        attn = torch.cat([head.long(), torch.ones_like(cols)], 1)
        step = _Step(tokens.gather(1, cols), attn, cols, torch.full_like(lengths, d - 1), kw)
    with cache_adapter(model, path):
        for i in range(max_new_tokens):
            cur = TokenBatch(tokens, lengths, b.pad_id, b.has_bos, plen)
            resid = _final_resid(model, cur, step, fwd_hooks)
            nxt = (
                greedy_next(model, resid) if choose is None else choose(final_logits(model, resid))
            )
            nxt = nxt.to(dev)
            tokens = _append(tokens, lengths, nxt, b.pad_id)
            lengths = lengths + 1
            keep = _record(active.tolist(), nxt.tolist(), out, eos, stop)
            if i == max_new_tokens - 1 or not any(keep):
                break
            if not all(keep):
                idx = torch.tensor([j for j, k in enumerate(keep) if k], device=dev)
                cache.batch_select_indices(idx)
                if on_keep is not None:
                    on_keep(idx)
                tokens, lengths, plen = tokens[idx], lengths[idx], plen[idx]
                attn, nxt, active = attn[idx], nxt[idx], active[idx]
            attn = torch.cat([attn, torch.ones_like(attn[:, :1])], 1)
            cols = (lengths - 1).unsqueeze(1)
            step = _Step(nxt.unsqueeze(1), attn, cols, torch.zeros_like(lengths), kw)
    return out


def decode_uncached(model: Model, batch: TokenBatch, **rule: Unpack[DecodeArgs]) -> list[list[int]]:
    """The reference decoder: the whole prefix is recomputed at every step (every row stays
    in the batch until all have stopped). Same arguments and result as
    :func:`decode_cached`, except that ``choose=None`` takes the plain arg-max of the full
    float32 logits, so comparing the two also checks the screened arg-max."""
    max_new_tokens, fwd_hooks, choose, stop, eos = _rule(rule)
    stop, dev, b, out = _start(model, batch, stop)
    tokens, lengths, plen = b.tokens, b.lengths.clone(), b.prompt_lengths
    going = [True] * b.batch_size
    for _ in range(max_new_tokens):
        cur = TokenBatch(tokens, lengths, b.pad_id, b.has_bos, plen)
        step = _Step(tokens, cur.attention_mask(), None, lengths - 1, {})
        choose_fn = _argmax if choose is None else choose
        nxt = choose_fn(final_logits(model, _final_resid(model, cur, step, fwd_hooks))).to(dev)
        tokens = _append(tokens, lengths, nxt, b.pad_id)
        lengths = lengths + 1
        live = [r for r in range(b.batch_size) if going[r]]
        keep = _record(live, [int(nxt[r]) for r in live], out, eos, stop)
        for r, k in zip(live, keep, strict=True):
            going[r] = k
        if not any(going):
            break
    return out


def _fits_window(model: Model, batch: TokenBatch, max_new_tokens: int) -> bool:
    window = getattr(getattr(_hf_model(model), "config", None), "sliding_window", None)
    return not window or batch.tokens.shape[1] + max_new_tokens <= int(window)


def decode(
    model: Model, batch: TokenBatch, *, cache: bool = True, **rule: Unpack[DecodeArgs]
) -> list[list[int]]:
    """Decode after each row of ``batch`` by the rule's keywords (:class:`DecodeArgs`):
    cached when ``cache`` and the model supports it (:func:`kv_cache_path`), else by
    recomputing the prefix; both give the same tokens."""
    max_new_tokens = _rule(rule)[0]
    if max_new_tokens < 0:
        raise InputError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if max_new_tokens == 0:
        return [[] for _ in range(batch.batch_size)]
    path = kv_cache_path(model) if cache else "none"
    if path != "none" and _fits_window(model, batch, max_new_tokens):
        return decode_cached(model, batch, path=path, **rule)
    return decode_uncached(model, batch, **rule)


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
    pass, :func:`_final_resid`); the final residual stream of
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
    return prefix_reuse_supported(model, width) and _fits_window(model, batch, max_new_tokens)


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
    owners = _RowOwners(torch.arange(k).repeat_interleave(n).to(model_input_device(model)))
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
                model(ids, attention_mask=mask, **_cache_kwargs(model, cache))
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
