"""Token-by-token greedy decoding with a key-value cache that keeps mechlingo's hook semantics.

TransformerLens 4.3 with transformers 5 never fills the bridge's own cache (the decoder layers
pass it as ``cache``; the bridge's attention reads ``past_key_values``), so this module drives
the transformers model's ``DynamicCache`` through the bridge's ``forward`` (every hook point
fires) with a pre-hook that copies the keyword (:func:`cache_adapter`). :func:`kv_cache_path`
probes each model once: ``"native"``, ``"adapter"`` or ``"none"`` (recompute the prefix).

The prompt runs once as the current batch; every later step runs one new token per row with
the step's column set (:func:`mechlingo.core.tokens.batch_context`), so position rules mean
what they mean uncached (tested). Rows that finish leave the batch; a sliding attention window
the batch would outgrow decodes uncached. The passes that reuse an unpatched prefix are in
:mod:`mechlingo.activations.prefix`. The why and the speed: ``docs/concepts.md``, "Generation
and the KV cache".
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
from mechlingo.core.defaults import KV_CACHE
from mechlingo.core.errors import InputError
from mechlingo.core.tokens import TokenBatch, batch_context
from mechlingo.core.types import Model
from mechlingo.kernels.readout import final_logits, greedy_next

log = logging.getLogger(__name__)

KVPath = Literal["native", "adapter", "none"]
ChooseFn = Callable[[Float[Tensor, "batch vocab"]], Int[Tensor, " batch"]]
StopFn = Callable[[int, list[int]], bool]


class DecodeRule(TypedDict, total=False):
    """The decoding rule every decoder here takes as keywords: ``max_new_tokens`` (required)
    new tokens per row, ``fwd_hooks`` during every pass (default none), ``choose`` (logits to
    token ids; default the greedy arg-max), ``stop(row, ids)`` (a row stops once true;
    default never) and ``eos`` (a row stops before this token; default none). The kernels'
    per-row rule, below the user's decoding options
    (:class:`mechlingo.scoring.evaluate.DecodeOptions`), which the scoring layer turns into it."""

    max_new_tokens: Required[int]
    fwd_hooks: FwdHooks
    choose: ChooseFn | None
    stop: StopFn | None
    eos: int | None


def _rule(
    rule: DecodeRule,
) -> tuple[int, FwdHooks, ChooseFn | None, StopFn | None, int | None]:
    """The fields of ``rule`` with their defaults; a ``TypeError`` for a keyword that is not
    one (as a misspelt keyword argument raises)."""
    unknown = sorted(set(rule) - set(DecodeRule.__annotations__))
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


def hf_model(model: Model) -> Any:
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

    return DynamicCache(config=hf_model(model).config)


def cache_kwargs(model: Model, cache: Any) -> dict[str, Any]:
    return {_cache_keyword(hf_model(model)): cache, "use_cache": True}


def _probe(model: Model, path: KVPath) -> bool:
    vocab = int(model.cfg.d_vocab)
    ids = torch.tensor([[min(i, vocab - 1) for i in (2, 17, 31)]], device=model_input_device(model))
    with torch.no_grad():
        full = model(ids)[0, -1].float()
        cache = new_cache(model)
        with cache_adapter(model, path):
            model(ids[:, :2], **cache_kwargs(model, cache))
            if int(cache.get_seq_length()) != 2:
                return False
            step = model(ids[:, 2:], **cache_kwargs(model, cache))[0, -1].float()
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
    if hf_model(model) is not None:
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
class Step:
    """A pass over some columns of ``batch`` with a cache (``None`` for the prefill's
    columns = every position)."""

    input_ids: Int[Tensor, "batch t"]
    attention_mask: Tensor | None  # [batch, cols] 0/1, or a 4-D additive mask (prefix passes)
    columns: Int[Tensor, "batch t"] | None
    read: Int[Tensor, " row"]  # one per row the pass ends with (a grown batch has more)
    model_kwargs: dict[str, Any]


def final_resid_pass(
    model: Model, batch: TokenBatch, step: Step, fwd_hooks: FwdHooks
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
    **rule: Unpack[DecodeRule],
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
    that go on, whenever some leave the batch. The rule's keywords: :class:`DecodeRule`."""
    max_new_tokens, fwd_hooks, choose, stop, eos = _rule(rule)
    stop, dev, b, out = _start(model, batch, stop)
    tokens, lengths, plen = b.tokens, b.lengths.clone(), b.prompt_lengths
    active = torch.arange(b.batch_size, device=dev)
    attn = b.attention_mask()
    if prefix is None:
        cache = new_cache(model)
        kw = cache_kwargs(model, cache)
        step = Step(tokens, attn, None, lengths - 1, kw)
    else:
        cache, d = prefix
        kw = cache_kwargs(model, cache)
        cols = (lengths - d).unsqueeze(1) + torch.arange(d, device=dev)
        head = torch.arange(tokens.shape[1] - d, device=dev) < (lengths - d).unsqueeze(1)
        attn = torch.cat([head.long(), torch.ones_like(cols)], 1)
        step = Step(tokens.gather(1, cols), attn, cols, torch.full_like(lengths, d - 1), kw)
    with cache_adapter(model, path):
        for i in range(max_new_tokens):
            cur = TokenBatch(tokens, lengths, b.pad_id, b.has_bos, plen)
            resid = final_resid_pass(model, cur, step, fwd_hooks)
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
            step = Step(nxt.unsqueeze(1), attn, cols, torch.zeros_like(lengths), kw)
    return out


def decode_uncached(model: Model, batch: TokenBatch, **rule: Unpack[DecodeRule]) -> list[list[int]]:
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
        step = Step(tokens, cur.attention_mask(), None, lengths - 1, {})
        choose_fn = _argmax if choose is None else choose
        nxt = choose_fn(final_logits(model, final_resid_pass(model, cur, step, fwd_hooks))).to(dev)
        tokens = _append(tokens, lengths, nxt, b.pad_id)
        lengths = lengths + 1
        live = [r for r in range(b.batch_size) if going[r]]
        keep = _record(live, [int(nxt[r]) for r in live], out, eos, stop)
        for r, k in zip(live, keep, strict=True):
            going[r] = k
        if not any(going):
            break
    return out


def fits_window(model: Model, batch: TokenBatch, max_new_tokens: int) -> bool:
    window = getattr(getattr(hf_model(model), "config", None), "sliding_window", None)
    return not window or batch.tokens.shape[1] + max_new_tokens <= int(window)


def decode(
    model: Model, batch: TokenBatch, *, cache: bool = KV_CACHE, **rule: Unpack[DecodeRule]
) -> list[list[int]]:
    """Decode after each row of ``batch`` by the rule's keywords (:class:`DecodeRule`):
    cached when ``cache`` and the model supports it (:func:`kv_cache_path`), else by
    recomputing the prefix; both give the same tokens."""
    max_new_tokens = _rule(rule)[0]
    if max_new_tokens < 0:
        raise InputError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if max_new_tokens == 0:
        return [[] for _ in range(batch.batch_size)]
    path = kv_cache_path(model) if cache else "none"
    if path != "none" and fits_window(model, batch, max_new_tokens):
        return decode_cached(model, batch, path=path, **rule)
    return decode_uncached(model, batch, **rule)
