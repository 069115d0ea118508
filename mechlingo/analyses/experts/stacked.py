"""Expert neurons: several clamps (conditions) measured in one batched pass.

A population of random-neuron clamps is many conditions on the same inputs. Here every
condition's copy of the inputs runs stacked in one batch, each condition's hooks acting on its
own rows only (:func:`mechlingo.activations.prefix.rows_hooks`), so each condition sees
exactly what it would see alone: :func:`stacked_bos_samples` (temperature samples from a bare
BOS prompt, each condition drawing with its own generator of the same seed, as
:func:`mechlingo.activations.likelihood.sample_from_bos` draws alone) and
:func:`stacked_line_nll` (the per-line NLL of
:func:`mechlingo.activations.likelihood.line_nll`). Equal to one run per condition up to the
float rounding of a larger batch (tested).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from mechlingo.activations.decoding import (
    decode_cached,
    decode_uncached,
    fits_window,
    kv_cache_path,
)
from mechlingo.activations.pooled import encode_sentences
from mechlingo.activations.prefix import rows_hooks, stacked_owners
from mechlingo.activations.runs import StopForward, final_resid_name, model_input_device, run_batch
from mechlingo.core.defaults import BATCH_SIZE, KV_CACHE, SAMPLE_NEW_TOKENS, SEED
from mechlingo.core.errors import InputError
from mechlingo.core.tokens import TokenBatch, sorted_batches
from mechlingo.core.types import FwdHooks, Model
from mechlingo.kernels.readout import final_logits

__all__ = ["stacked_bos_samples", "stacked_line_nll"]


def _stack(batch: TokenBatch, k: int) -> TokenBatch:
    """``k`` copies of ``batch``, copy after copy (condition ``c``'s rows are the ``c``-th)."""
    return TokenBatch(batch.tokens.repeat(k, 1), batch.lengths.repeat(k), batch.pad_id,
                      batch.has_bos, batch.prompt_lengths.repeat(k))  # fmt: skip


def stacked_bos_samples(
    model: Model,
    hook_sets: Sequence[FwdHooks],
    n: int,
    *,
    max_new_tokens: int = SAMPLE_NEW_TOKENS,
    seed: int = SEED,
    temperature: float = 1.0,
    cache: bool = KV_CACHE,
) -> list[list[str]]:
    """``out[c]``: the ``n`` samples of ``sample_from_bos(model, n, fwd_hooks=hook_sets[c],
    seed=seed, ...)``, every condition decoded in one stacked batch of ``n * len(hook_sets)``
    rows; each condition draws its rows with its own generator seeded ``seed``, so a
    condition's samples do not depend on the others.

    Raises:
        InputError: the tokenizer has no BOS token, or ``n`` below 1.
    """
    bos = getattr(model.tokenizer, "bos_token_id", None)
    if bos is None:
        raise InputError("the model's tokenizer has no BOS token to start from")
    if n < 1:
        raise InputError(f"need at least one sample per condition, got n={n}")
    k = len(hook_sets)
    if k == 0:
        return []
    dev = model.W_U.device
    gens = [torch.Generator(device="cpu").manual_seed(seed) for _ in range(k)]
    owners = stacked_owners(k, n, model_input_device(model))

    def draw(logits: Tensor) -> Tensor:
        probs = torch.softmax(logits.float().cpu() / temperature, dim=-1)
        own = owners.owner.cpu()
        out = torch.zeros(len(probs), dtype=torch.long)
        for c in range(k):
            idx = (own == c).nonzero().squeeze(1)
            if idx.numel():
                out[idx] = torch.multinomial(probs[idx], 1, generator=gens[c]).squeeze(1)
        return out

    tokens = torch.full((k * n, 1), int(bos), dtype=torch.long, device=dev)
    batch = TokenBatch(tokens, torch.ones(k * n, dtype=torch.long, device=dev), 0, True)
    hooks = rows_hooks(hook_sets, owners)
    path = kv_cache_path(model) if cache else "none"
    if path != "none" and fits_window(model, batch, max_new_tokens):
        rows = decode_cached(model, batch, path=path, on_keep=owners.keep,
                             max_new_tokens=max_new_tokens, fwd_hooks=hooks, choose=draw)  # fmt: skip
    else:
        rows = decode_uncached(model, batch, max_new_tokens=max_new_tokens, fwd_hooks=hooks,
                               choose=draw)  # fmt: skip
    eos = getattr(model.tokenizer, "eos_token_id", None)
    texts = []
    for row in rows:
        if eos is not None and eos in row:
            row = row[: row.index(eos)]
        texts.append(model.tokenizer.decode(row, skip_special_tokens=True))
    return [texts[c * n : (c + 1) * n] for c in range(k)]


def stacked_line_nll(
    model: Model,
    texts: Sequence[str],
    hook_sets: Sequence[FwdHooks],
    *,
    batch_size: int = BATCH_SIZE,
    max_tokens: int | None = None,
    chunk_rows: int = 128,
) -> list[tuple[Float[Tensor, " text"], Int[Tensor, " text"]]]:
    """``out[c]``: ``line_nll(model, texts, fwd_hooks=hook_sets[c], ...)`` (every text's
    summed next-token NLL in nats and its token count), each batch of ``batch_size`` texts
    run once with every condition's copy stacked.

    Raises:
        InputError: no texts, or an empty or whitespace-only text.
    """
    texts = list(texts)
    if not texts:
        raise InputError("no texts to score")
    k, t = len(hook_sets), len(texts)
    batch = encode_sentences(model, texts, max_tokens=max_tokens)
    name = final_resid_name(model)
    nll = torch.zeros(k * t, dtype=torch.float64)
    counts = torch.zeros(k * t, dtype=torch.long)
    got: dict[str, Tensor] = {}

    def grab(x: Tensor, hook: object) -> None:
        got["r"] = x.detach()
        raise StopForward

    for rows in sorted_batches(batch.lengths, batch_size) if k else []:
        sub = _stack(batch.select(rows), k)
        owners = stacked_owners(k, len(rows), model_input_device(model))
        run_batch(model, sub, [*rows_hooks(hook_sets, owners), (name, grab)])
        resid = got["r"]
        dev = resid.device
        pred = (
            torch.arange(resid.shape[1], device=dev)[None, :] < (sub.lengths.to(dev) - 1)[:, None]
        )
        ids = torch.as_tensor(rows, dtype=torch.long).repeat(k)
        ids = ids + torch.arange(k).repeat_interleave(len(rows)) * t
        src, owner = resid[pred], ids[pred.nonzero()[:, 0].cpu()]
        targets = sub.tokens.to(dev)[:, 1:][pred[:, :-1]]
        for i in range(0, src.shape[0], chunk_rows):
            lg = final_logits(model, src[i : i + chunk_rows])
            lp = lg.log_softmax(-1).gather(1, targets[i : i + chunk_rows, None].to(lg.device))
            nll.index_add_(0, owner[i : i + chunk_rows], -lp[:, 0].double().cpu())
        counts.index_add_(0, owner, torch.ones_like(owner))
    return [(nll[c * t : (c + 1) * t], counts[c * t : (c + 1) * t]) for c in range(k)]
