"""Language-model likelihoods of text (per-line next-token NLL and perplexity), and samples.

:func:`line_nll` gives, for every text, the summed next-token negative log-likelihood (nats)
over every real token after BOS and the number of tokens it covers; :func:`perplexity` is
``exp(sum NLL / sum tokens)`` over all texts pooled. Only the final residual stream is kept
(the forward stops there) and the unembedding runs on the real positions in chunks, so no
``[batch, pos, vocab]`` tensor exists. An intervention enters as its ``fwd_hooks``
(``intervention.fwd_hooks(model)``); the k curve of the expert neurons and the side-effects
matrix both score held-out lines with these. :func:`sample_from_bos` draws text from a bare
BOS prompt (what the k curve identifies the language of).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypedDict, Unpack

import torch
from jaxtyping import Float, Int
from torch import Tensor

from mechlingo.activations.decoding import decode
from mechlingo.activations.pooled import encode_sentences
from mechlingo.activations.runs import StopForward, final_resid_name, run_batch
from mechlingo.core.defaults import BATCH_SIZE, KV_CACHE, SAMPLE_NEW_TOKENS, SEED
from mechlingo.core.errors import InputError
from mechlingo.core.tokens import TokenBatch, sorted_batches
from mechlingo.core.types import FwdHooks, Model
from mechlingo.kernels.readout import final_logits

__all__ = ["LineArgs", "line_nll", "perplexity", "sample_from_bos"]


class LineArgs(TypedDict, total=False):
    """The keywords of :func:`line_nll` after the texts, which :func:`perplexity` passes on
    (their defaults are :func:`line_nll`'s)."""

    fwd_hooks: FwdHooks
    batch_size: int
    max_tokens: int | None
    chunk_rows: int


def line_nll(
    model: Model,
    texts: Sequence[str],
    *,
    fwd_hooks: FwdHooks = (),
    batch_size: int = BATCH_SIZE,
    max_tokens: int | None = None,
    chunk_rows: int = 128,
) -> tuple[Float[Tensor, " text"], Int[Tensor, " text"]]:
    """Summed next-token negative log-likelihood (nats) of every text and the number of
    tokens it covers (every real token after BOS), in the order of ``texts``: the per-line
    pieces of :func:`perplexity`, for bootstrap intervals over lines. ``fwd_hooks`` run
    during the forward passes (an intervention's ``fwd_hooks(model)``); ``max_tokens`` keeps
    the first tokens of each text.

    Raises:
        InputError: no texts, or an empty or whitespace-only text.
    """
    texts = list(texts)
    if not texts:
        raise InputError("no texts to score")
    batch = encode_sentences(model, texts, max_tokens=max_tokens)
    name = final_resid_name(model)
    hooks = list(fwd_hooks)
    nll = torch.zeros(len(texts), dtype=torch.float64)
    counts = torch.zeros(len(texts), dtype=torch.long)
    got: dict[str, Tensor] = {}

    def grab(t: Tensor, hook: Any) -> None:
        got["r"] = t.detach()
        raise StopForward

    for rows in sorted_batches(batch.lengths, batch_size):
        sub = batch.select(rows)
        run_batch(model, sub, hooks + [(name, grab)])
        resid = got["r"]
        dev = resid.device
        pos = torch.arange(resid.shape[1], device=dev)
        pred = pos[None, :] < (sub.lengths.to(dev) - 1)[:, None]  # position t predicts t+1
        src = resid[pred]
        owner = torch.as_tensor(rows, dtype=torch.long)[pred.nonzero()[:, 0].cpu()]
        targets = sub.tokens.to(dev)[:, 1:][pred[:, :-1]]
        for i in range(0, src.shape[0], chunk_rows):
            lg = final_logits(model, src[i : i + chunk_rows])
            lp = lg.log_softmax(-1).gather(1, targets[i : i + chunk_rows, None].to(lg.device))
            nll.index_add_(0, owner[i : i + chunk_rows], -lp[:, 0].double().cpu())
        counts.index_add_(0, owner, torch.ones_like(owner))
    return nll, counts


def perplexity(model: Model, texts: Sequence[str], **options: Unpack[LineArgs]) -> float:
    """Perplexity of the model on ``texts``: exp of the mean next-token NLL over every real
    token after BOS, all texts pooled; ``options`` as :func:`line_nll` takes them.

    Raises:
        InputError: no texts, an empty text, or no token to score (every text is a single
            token).
    """
    nll, counts = line_nll(model, texts, **options)
    if int(counts.sum()) == 0:
        raise InputError("no tokens to score: every text is a single token")
    return float(torch.exp(nll.sum() / counts.sum()))


def sample_from_bos(
    model: Model,
    n: int,
    *,
    max_new_tokens: int = SAMPLE_NEW_TOKENS,
    fwd_hooks: FwdHooks = (),
    seed: int = SEED,
    temperature: float = 1.0,
    cache: bool = KV_CACHE,
) -> list[str]:
    """``n`` samples (temperature sampling, fixed seed) from a bare BOS prompt, with
    ``fwd_hooks`` (an intervention's ``fwd_hooks(model)``) applied at every step. Greedy
    decoding from BOS gives one string only, hence sampling. Decoded with a key-value cache
    where the model supports it (:func:`decode`); ``cache=False`` recomputes the prefix (the
    same draws). Each sample stops at EOS and is decoded without special tokens.

    Raises:
        InputError: the tokenizer has no BOS token.
    """
    bos = getattr(model.tokenizer, "bos_token_id", None)
    if bos is None:
        raise InputError("the model's tokenizer has no BOS token to start from")
    dev = model.W_U.device
    gen = torch.Generator(device="cpu").manual_seed(seed)
    tokens = torch.full((n, 1), int(bos), dtype=torch.long, device=dev)
    eos = getattr(model.tokenizer, "eos_token_id", None)

    def draw(logits: Tensor) -> Tensor:
        probs = torch.softmax(logits.float().cpu() / temperature, dim=-1)
        return torch.multinomial(probs, 1, generator=gen).squeeze(1)

    batch = TokenBatch(tokens, torch.ones(n, dtype=torch.long, device=dev), 0, True)
    rows = decode(
        model, batch, max_new_tokens=max_new_tokens, fwd_hooks=fwd_hooks, choose=draw, cache=cache
    )
    out = []
    for row in rows:
        if eos is not None and eos in row:
            row = row[: row.index(eos)]
        out.append(model.tokenizer.decode(row, skip_special_tokens=True))
    return out
