"""Pooled MLP-neuron statistics of sentences: each sentence's activation of every neuron
pooled over its real tokens, and per-language firing rates; data-parallel under torchrun
(each rank pools its shard, rows are gathered back in order, counts all-reduced)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from mechlingo.activations.parallel import (
    all_gather_rows,
    all_reduce_state,
    dist_info,
    shard_bounds,
)
from mechlingo.activations.runs import StopForward, run_batch
from mechlingo.core.describe import model_info
from mechlingo.core.errors import ExpertError
from mechlingo.core.sites import resolve_layers, resolve_site, site_map
from mechlingo.core.tokens import TokenBatch, encode, sorted_batches
from mechlingo.core.types import FwdHooks, Model
from mechlingo.kernels.stats import ActivationProbability, masked_pool


@dataclass
class NeuronStats:
    """Pooled MLP-neuron activations of every sentence, and per-language firing rates.

    Attributes:
        langs: language codes; ``lang_ids`` index into this list.
        pooled: ``[n_sentences, n_layers * d_mlp]`` float32, each sentence's activation of
            every neuron pooled over its real tokens (see ``pool``).
        lang_ids: language index of each row of ``pooled``.
        prob_active: ``[n_langs, n_layers * d_mlp]``, fraction of the language's real tokens
            where the neuron's activation is > 0 (the input of LAPE).
        layers: the layers whose neurons are in the feature axis, in order.
        d_mlp: neurons per layer.
        pool: ``"mean"`` or ``"max"``.
        meta: model name, weight mode, counts (recorded with every clamp built from it).
    """

    langs: list[str]
    pooled: Float[Tensor, "sentence feature"]
    lang_ids: Int[Tensor, " sentence"]
    prob_active: Float[Tensor, "lang feature"]
    layers: list[int]
    d_mlp: int
    pool: str
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def n_features(self) -> int:
        return int(self.pooled.shape[1])

    def lang_index(self, lang: str) -> int:
        if lang not in self.langs:
            raise ExpertError(f"language {lang!r} is not in these statistics; have {self.langs}")
        return self.langs.index(lang)

    def locate(self, features: Int[Tensor, " k"]) -> tuple[Int[Tensor, " k"], Int[Tensor, " k"]]:
        """(layer, neuron) of flattened feature indices."""
        layers = torch.tensor(self.layers, dtype=torch.long, device=features.device)
        return layers[features // self.d_mlp], features % self.d_mlp


def _output_device(model: Model) -> torch.device:
    return model.W_U.device


def _flatten_texts(
    texts: Mapping[str, Sequence[str]],
) -> tuple[list[str], list[str], list[int]]:
    if not isinstance(texts, Mapping) or not texts:
        raise ValueError("texts must be a non-empty mapping {lang: [sentence, ...]}")
    langs = list(texts)
    sentences, ids = [], []
    for i, lang in enumerate(langs):
        if len(texts[lang]) == 0:
            raise ValueError(f"language {lang!r} has no sentences; drop it or add sentences")
        for s in texts[lang]:
            if not isinstance(s, str) or not s.strip():
                raise ValueError(f"an empty sentence in language {lang!r}; remove empty lines")
            sentences.append(s)
            ids.append(i)
    return langs, sentences, ids


def _truncate(batch: TokenBatch, max_tokens: int | None) -> TokenBatch:
    if max_tokens is None:
        return batch
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    lengths = batch.lengths.clamp(max=max_tokens + (1 if batch.has_bos else 0))
    width = int(lengths.max())
    return TokenBatch(batch.tokens[:, :width], lengths, batch.pad_id, batch.has_bos)


def pooled_neuron_acts(
    model: Model,
    texts: Mapping[str, Sequence[str]],
    *,
    layers: Any = None,
    pool: Literal["mean", "max"] = "mean",
    batch_size: int = 16,
    max_tokens: int | None = None,
    threshold: float = 0.0,
    extra_hooks: FwdHooks = (),
    progress: bool = False,
) -> NeuronStats:
    """Pooled ``mlp_post`` activations of every sentence over all ranks.

    The sentences (``texts`` flattened language by language, in order) are split into
    contiguous shards; each rank pools its shard's activations over real tokens (BOS and
    padding excluded; the first ``max_tokens`` real tokens when given) and counts how often
    each neuron fires per language. Pooled rows are gathered back in the original order and
    the counts all-reduced, so every rank returns what one process computes on all sentences.

    Args:
        model: the model.
        texts: ``{lang: [sentence, ...]}``; identical on every rank.
        layers: layers to record (default all).
        pool: ``"mean"`` (Kojima et al.) or ``"max"`` (Suau et al.).
        batch_size: sentences per forward pass.
        max_tokens: keep only the first ``max_tokens`` real tokens of each sentence.
        threshold: a neuron "fires" on a token where its activation exceeds this.
        extra_hooks: hooks applied during the runs (e.g. an intervention's ``fwd_hooks``).

    Returns:
        :class:`NeuronStats` on the model's output device, the model recorded in ``meta``
        (``prob_active`` is float32: counts are summed exactly as integers first).
    """
    if pool not in ("mean", "max"):
        raise ValueError(f"pool must be 'mean' or 'max', got {pool!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    langs, sentences, all_ids = _flatten_texts(texts)
    sm = site_map(model)
    if not sm.available["mlp_post"]:
        raise ValueError("this model has no mlp_post hooks (blocks.{l}.mlp.hook_post)")
    layer_list = resolve_layers(model, layers)
    names = [resolve_site(model, "mlp_post", layer).hook_name for layer in layer_list]
    d_mlp, n_layers = sm.d_mlp, len(layer_list)
    dev = _output_device(model)
    bounds = shard_bounds(len(sentences))
    mine = sentences[bounds.start : bounds.stop]
    lang_ids = torch.tensor(all_ids[bounds.start : bounds.stop], dtype=torch.long)
    pooled = torch.zeros(len(mine), n_layers * d_mlp, dtype=torch.float32, device=dev)
    zeros = {
        "active": torch.zeros(len(langs), d_mlp, dtype=torch.int64, device=dev),
        "tokens": torch.zeros(len(langs), dtype=torch.int64, device=dev),
    }
    counters = [ActivationProbability.from_state(zeros, threshold) for _ in layer_list]
    if mine:
        batch = _truncate(encode(model, mine), max_tokens)
        if batch.has_bos and bool((batch.lengths < 2).any()):
            raise ValueError("some sentences tokenize to nothing but BOS")
        state: dict[str, Tensor] = {}

        def make(slot: int) -> Any:
            last = slot == n_layers - 1

            def hook(act: Tensor, hook: Any) -> None:
                a = act.detach().float()
                mask = state["mask"].to(a.device)
                cols = slice(slot * d_mlp, (slot + 1) * d_mlp)
                pooled[state["rows"], cols] = masked_pool(a, mask, pool).to(dev)
                counters[slot].update(a, lang=state["lang"].to(a.device), mask=mask)
                if last:
                    raise StopForward

            return hook

        hooks = list(extra_hooks) + [(nm, make(i)) for i, nm in enumerate(names)]
        groups = sorted_batches(batch.lengths, batch_size)
        with torch.no_grad():
            for rows in tqdm(groups, desc="neuron acts", disable=not progress):
                sub = batch.select(rows)
                idx = torch.as_tensor(rows, dtype=torch.long)
                state["rows"] = idx.to(dev)
                state["mask"] = sub.real_token_mask(include_bos=False)
                state["lang"] = lang_ids[idx]
                run_batch(model, sub, hooks)
    active = torch.cat([c.state_dict()["active"].to(dev) for c in counters], dim=1)
    tokens = counters[0].state_dict()["tokens"].to(dev)
    summed = all_reduce_state({"active": active, "tokens": tokens})
    prob = summed["active"].to(torch.float64) / summed["tokens"].to(torch.float64)[:, None]
    info = dist_info()
    meta = {
        "pool": pool,
        "n_sentences": {lang: len(texts[lang]) for lang in langs},
        "max_tokens": max_tokens,
        "threshold": threshold,
        "world_size": info.world_size,
    }
    meta["model"] = model_info(model)
    return NeuronStats(
        langs=langs,
        pooled=all_gather_rows(pooled),
        lang_ids=all_gather_rows(lang_ids.to(dev)),
        prob_active=prob.to(torch.float32),
        layers=layer_list,
        d_mlp=d_mlp,
        pool=pool,
        meta=meta,
    )
