"""Language-model likelihoods of text: per-line next-token NLL and perplexity.

:func:`line_nll` gives, for every text, the summed next-token negative log-likelihood (nats)
over every real token after BOS and the number of tokens it covers; :func:`perplexity` is
``exp(sum NLL / sum tokens)`` over all texts pooled. Only the final residual stream is kept
(the forward stops there) and the unembedding runs on the real positions in chunks, so no
``[batch, pos, vocab]`` tensor exists. An intervention enters as its ``fwd_hooks``
(``intervention.fwd_hooks(model)``); the k curve of the expert neurons and the side-effects
matrix both score held-out lines with these.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypedDict, Unpack

import torch
from jaxtyping import Float, Int
from torch import Tensor

from mechlingo.activations.pooled import encode_sentences
from mechlingo.activations.runs import StopForward, final_resid_name, run_batch
from mechlingo.core.errors import InputError
from mechlingo.core.tokens import sorted_batches
from mechlingo.core.types import FwdHooks, Model
from mechlingo.kernels.readout import final_logits

__all__ = ["LineArgs", "line_nll", "perplexity"]


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
    batch_size: int = 16,
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
