"""The token-level lens: what every lens entry predicts at every position of a prompt.

The classic logit-lens picture (nostalgebraist 2020; Wendler et al. 2024 read it per
language): for each position of the prompt and each entry (the residual stream after ``l``
blocks), the most likely next tokens when that residual is read through the final norm and
the unembedding, with their probabilities and the language each token looks like. It needs
no answer: :func:`mechlingo.analyses.decoders.lens.logit_lens` computes it when it is given
no answer tracks (or ``tokens=True``), and :meth:`LensResult.fig_tokens` draws it.

The readout is the lens's own (:func:`mechlingo.kernels.readout.read_logits`, chunks of
``chunk_rows`` rows, top-k and entropy only): the ``[entry, position, vocab]`` logits of a
prompt never exist at once. A tuned lens's translators or a patchscope decode the rows
first, exactly as on the last token (a patchscope runs one target prompt per entry and
position, so it costs ``entries x positions`` forward passes per prompt).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from mechlingo.activations.runs import StopForward, run_batch
from mechlingo.analyses.decoders.registry import Decoder, as_decoder
from mechlingo.core.defaults import BATCH_SIZE, PROGRESS
from mechlingo.core.tokens import TokenBatch, sorted_batches
from mechlingo.core.types import Model
from mechlingo.data.langid import token_language as _token_language
from mechlingo.kernels.readout import read_logits

__all__ = ["TokenGrid", "token_grid", "token_language"]


@dataclass
class TokenGrid:
    """The top-k tokens of every lens entry at every position, one prompt at a time.

    Attributes:
        layers: the lens entries (rows of each grid).
        tokens: per prompt, its input tokens decoded (``tokens[p][i]`` is position ``i``).
        top_ids, top_logprobs: per prompt ``[entry, position, k]``: the ``k`` most likely
            next tokens after each position when the entry is decoded, and their
            log-probabilities.
        top_tokens: per prompt ``[entry][position][k]`` those tokens decoded.
        top_langs: per prompt ``[entry][position][k]`` the language each top token looks
            like for the prompt's language and English (:func:`token_language`:
            ``"shared"``, written the same in several languages; ``None``, shown as "none":
            no language can be told).
        entropy: per prompt ``[entry, position]`` the entropy (nats) of the decoded
            next-token distribution.
    """

    layers: list[int]
    tokens: list[list[str]]
    top_ids: list[Int[Tensor, "entry position k"]]
    top_logprobs: list[Float[Tensor, "entry position k"]]
    top_tokens: list[list[list[list[str]]]]
    top_langs: list[list[list[list[str | None]]]]
    entropy: list[Float[Tensor, "entry position"]]

    def top1(self, prompt: int = 0) -> list[list[str]]:
        """``[entry][position]`` the most likely token of each cell of one prompt."""
        return [[cell[0] for cell in row] for row in self.top_tokens[prompt]]

    def to_json(self) -> list[dict[str, Any]]:
        """One record per prompt: its tokens, the entries and, per entry and position, the
        top tokens with their probabilities and languages (JSON-ready)."""
        out = []
        for p, toks in enumerate(self.tokens):
            prob = self.top_logprobs[p].exp().tolist()
            cells = [
                [
                    [
                        {"token": t, "prob": prob[e][i][j], "lang": self.top_langs[p][e][i][j]}
                        for j, t in enumerate(self.top_tokens[p][e][i])
                    ]  # fmt: skip
                    for i in range(len(toks))
                ]
                for e in range(len(self.layers))
            ]
            out.append({"tokens": toks, "layers": self.layers, "top": cells,
                        "entropy": self.entropy[p].tolist()})  # fmt: skip
        return out


def token_language(token: str, langs: Sequence[str] | None = None) -> str | None:
    """The language a single token looks like for the languages in use ``langs``
    (:func:`mechlingo.data.langid.token_language`): its script (kana -> ja, Hangul -> ko,
    Greek -> el, ...), else its word in the bundled lexicons; ``"shared"`` for numbers,
    punctuation, spaces and words written the same in several languages (most names);
    ``None`` for a word piece nothing places."""
    return _token_language(token, langs)


def _grid_acts(model: Model, batch: TokenBatch, names: Sequence[str]) -> dict[str, Tensor]:
    """The activations of ``names`` at every position of each row (``[row, pos, d]``,
    float32), the forward pass stopped after the last of them."""
    out: dict[str, Tensor] = {}
    remaining = set(names)

    def make(name: str) -> Any:
        def hook(t: Tensor, hook: Any) -> None:
            out[name] = t.detach().float()
            remaining.discard(name)
            if not remaining:
                raise StopForward

        return hook

    run_batch(model, batch, [(n, make(n)) for n in dict.fromkeys(names)])
    return out


def token_grid(
    model: Model,
    batch: TokenBatch,
    entries: Sequence[int],
    names: Sequence[str],
    *,
    langs: Sequence[str],
    decoder: Decoder | None = None,
    top_k: int = 5,
    batch_size: int = BATCH_SIZE,
    chunk_rows: int = 256,
    progress: bool = PROGRESS,
) -> TokenGrid:
    """The top ``top_k`` tokens of each lens entry (``entries``, read at the hooks
    ``names``) at every position of every prompt of ``batch`` (the prompts encoded,
    :func:`~mechlingo.core.tokens.encode`), through ``decoder`` (``None``: the logit
    lens) and :func:`mechlingo.kernels.readout.read_logits`."""
    dec = as_decoder(decoder, model)
    n_e, n_p = len(entries), int(batch.lengths.shape[0])
    ids: list[Tensor] = [torch.empty(0)] * n_p
    lps: list[Tensor] = [torch.empty(0)] * n_p
    ents: list[Tensor] = [torch.empty(0)] * n_p
    for rows in tqdm(sorted_batches(batch.lengths, batch_size), desc="token lens",
                     disable=not progress):  # fmt: skip
        sub = batch.select(rows)
        acts = _grid_acts(model, sub, names)
        full = torch.stack([acts[nm] for nm in names])  # [entry, b, pos, d]
        for j, p in enumerate(rows):
            n_pos = int(sub.lengths[j])
            stack = dec.decode(model, entries, full[:, j, :n_pos], [langs[p]] * n_pos)
            r = read_logits(model, stack.reshape(n_e * n_pos, -1), top_k=top_k,
                            chunk_rows=chunk_rows, ranks=False)  # fmt: skip
            k = r.top_ids.shape[-1]
            ids[p] = r.top_ids.reshape(n_e, n_pos, k).cpu()
            lps[p] = r.top_logprobs.reshape(n_e, n_pos, k).cpu()
            assert r.entropy is not None  # a top-k readout holds the logits
            ents[p] = r.entropy.reshape(n_e, n_pos).cpu()
    tok = model.tokenizer
    tokens = [tok.batch_decode([[i] for i in batch.tokens[p, : int(n)].tolist()])
              for p, n in enumerate(batch.lengths.tolist())]  # fmt: skip
    top_tokens, top_langs = [], []
    for p in range(n_p):
        e_, n_pos, k = ids[p].shape
        flat = tok.batch_decode([[i] for i in ids[p].reshape(-1).tolist()])
        grid = [[flat[(e * n_pos + i) * k : (e * n_pos + i + 1) * k] for i in range(n_pos)]
                for e in range(e_)]  # fmt: skip
        top_tokens.append(grid)
        in_use = tuple(dict.fromkeys((langs[p], "en")))  # the prompt's language, then English
        top_langs.append([[[token_language(t, in_use) for t in cell] for cell in row]
                          for row in grid])  # fmt: skip
    return TokenGrid(list(entries), tokens, ids, lps, top_tokens, top_langs, ents)
