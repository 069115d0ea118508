"""Pooled activations of sentences: each sentence's activation at a hook, pooled over its
real tokens (BOS and padding excluded), in one forward pass per batch.

What expert neurons (:mod:`mechlingo.analyses.experts`) and sentence embeddings
(:mod:`mechlingo.analyses.experts.align`) share: :func:`check_texts` (a corpus
``{lang: [sentence, ...]}`` is usable, optionally parallel), :func:`encode_sentences` and
:func:`truncate` (the first ``max_tokens`` real tokens of each sentence), and
:func:`pool_activations` (the hooked pass, stopped after the last hook).
:func:`pooled_neuron_acts` builds MLP-neuron statistics on them (:class:`NeuronStats`: pooled
``mlp_post`` rows and per-language firing rates), data-parallel under ``torchrun``."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypedDict, Unpack

import torch
from einops import rearrange
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from mechlingo.activations.runs import StopForward, run_batch
from mechlingo.activations.shards import PooledShards, ShardWriter, memory_budget
from mechlingo.core.defaults import BATCH_SIZE, PROGRESS
from mechlingo.core.describe import model_info
from mechlingo.core.distributed import (
    all_gather_rows,
    all_reduce_state,
    barrier,
    dist_info,
    is_main,
    shard_bounds,
)
from mechlingo.core.errors import ExpertError, InputError, MechlingoError
from mechlingo.core.sites import resolve_layers, resolve_site, site_map
from mechlingo.core.tokens import TokenBatch, encode, pad_rows, sorted_batches
from mechlingo.core.types import FwdHooks, Model
from mechlingo.kernels.streaming import ActivationProbability, masked_pool


@dataclass
class NeuronStats:
    """Pooled MLP-neuron activations of every sentence, and per-language firing rates.

    Attributes:
        langs: language codes; ``lang_ids`` index into this list.
        pooled: ``[n_sentences, n_layers * d_mlp]`` float32, each sentence's activation of
            every neuron pooled over its real tokens (see ``pool``); out of core, a
            :class:`~mechlingo.activations.shards.PooledShards` on disk with the same values
            (read by columns: ``pooled[:, features]``).
        lang_ids: language index of each row of ``pooled``.
        prob_active: ``[n_langs, n_layers * d_mlp]``, fraction of the language's real tokens
            where the neuron's activation is > 0 (the input of LAPE).
        layers: the layers whose neurons are in the feature axis, in order.
        d_mlp: neurons per layer.
        pool: ``"mean"`` or ``"max"``.
        meta: model name, weight mode, counts (recorded with every clamp built from it).
    """

    langs: list[str]
    pooled: Float[Tensor, "sentence feature"] | PooledShards
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


def _features(pooled: Float[Tensor, "row hook neuron"]) -> Float[Tensor, "row feature"]:
    """Feature ``hook * d_mlp + neuron`` of each row: the layout :meth:`NeuronStats.locate`
    undoes."""
    return rearrange(pooled, "row hook neuron -> row (hook neuron)")


def output_device(model: Model) -> torch.device:
    """Where pooled rows are kept: the device of the model's unembedding."""
    return model.W_U.device


# --------------------------------------------------------------------------------------
# Sentence corpora: checking, encoding, truncating
# --------------------------------------------------------------------------------------


def check_texts(
    texts: Mapping[str, Sequence[str]],
    min_langs: int = 1,
    *,
    parallel: bool = False,
    blank: bool = True,
    error: type[MechlingoError] = InputError,
) -> list[str]:
    """Languages of a corpus ``{lang: [sentence, ...]}``, after checking it is usable.

    Args:
        min_langs: the fewest languages accepted.
        parallel: line ``i`` is the same sentence in every language, so every language must
            have the same number of lines.
        blank: also refuse empty or whitespace-only sentences (they have no tokens to pool).
        error: the class raised (an analysis passes its own, e.g. ``ExpertError``).

    Raises:
        error: not a mapping, fewer than ``min_langs`` languages, a language with no
            sentences, different sentence counts (``parallel``), a sentence that is not a
            string, or an empty sentence (``blank``).
    """
    if not isinstance(texts, Mapping):
        raise error("texts must be a mapping {lang: [sentence, ...]}")
    langs = list(texts)
    if len(langs) < max(min_langs, 1):
        raise error(f"need sentences of at least {max(min_langs, 1)} languages, got {langs}")
    counts = {lang: len(texts[lang]) for lang in langs}
    empty = [lang for lang, n in counts.items() if n == 0]
    if empty:
        raise error(
            f"language(s) {empty} have no sentences; give every language at least one sentence "
            "or leave it out"
        )
    if parallel and len(set(counts.values())) > 1:
        raise error(f"parallel texts must have the same number of sentences: {counts}")
    for lang in langs:
        wrong = [i for i, s in enumerate(texts[lang]) if not isinstance(s, str)]
        if wrong:
            raise error(f"{lang}: sentences {wrong[:10]} are not strings")
        if not blank:
            continue
        bad = [i for i, s in enumerate(texts[lang]) if not s.strip()]
        if bad:
            fix = "drop those lines in every language" if parallel else "remove empty lines"
            raise error(f"{lang}: sentences {bad[:10]} are empty; {fix}")
    return langs


def truncate(
    batch: TokenBatch, max_tokens: int | None, *, error: type[MechlingoError] = InputError
) -> TokenBatch:
    """``batch`` with only the first ``max_tokens`` real tokens of each row (BOS not
    counted), trimmed to its longest row; ``None`` keeps everything."""
    if max_tokens is None:
        return batch
    if max_tokens < 1:
        raise error(f"max_tokens must be >= 1, got {max_tokens}")
    lengths = batch.lengths.clamp(max=max_tokens + (1 if batch.has_bos else 0))
    width = int(lengths.max())
    return TokenBatch(batch.tokens[:, :width], lengths, batch.pad_id, batch.has_bos)


def encode_sentences(
    model: Model,
    sentences: Sequence[str],
    *,
    max_tokens: int | None = None,
    error: type[MechlingoError] = InputError,
) -> TokenBatch:
    """Tokenize sentences (with BOS when the model prepends one), optionally keeping only
    the first ``max_tokens`` real tokens of each (to bound the cost on CPU).

    Raises:
        error: an empty or whitespace-only sentence (it has no tokens to pool), or a bad
            ``max_tokens``.
    """
    empty = [i for i, s in enumerate(sentences) if not s.strip()]
    if empty:
        raise error(f"sentences {empty[:10]} are empty; remove empty lines from the data first")
    sentences = list(sentences)
    if max_tokens is None or len(sentences) <= ENCODE_CHUNK:
        return truncate(encode(model, sentences), max_tokens, error=error)
    # truncated a chunk at a time: the full-length ids of every sentence never exist at once
    parts = [
        truncate(encode(model, sentences[i : i + ENCODE_CHUNK]), max_tokens, error=error)
        for i in range(0, len(sentences), ENCODE_CHUNK)
    ]
    rows = [p.tokens[j, : int(p.lengths[j])] for p in parts for j in range(p.batch_size)]
    return pad_rows(rows, pad_id=parts[0].pad_id, has_bos=parts[0].has_bos)


#: Sentences tokenized at once by :func:`encode_sentences` when it truncates.
ENCODE_CHUNK = 512


# --------------------------------------------------------------------------------------
# The pooling pass
# --------------------------------------------------------------------------------------


def check_pool_args(
    pool: str, batch_size: int, *, error: type[MechlingoError] = InputError
) -> None:
    """Raise ``error`` unless ``pool`` is ``"mean"`` or ``"max"`` and ``batch_size >= 1``."""
    if pool not in ("mean", "max"):
        raise error(f"pool must be 'mean' or 'max', got {pool!r}")
    if batch_size < 1:
        raise error(f"batch_size must be >= 1, got {batch_size}")


#: ``observe(slot, acts, mask, rows)``: called by :func:`pool_activations` for every hook and
#: batch with the float32 activations ``[batch, pos, d]``, the real-token mask ``[batch, pos]``
#: (on the activations' device) and the batch's row indices into the whole batch (CPU).
Observer = Callable[[int, Tensor, Tensor, Tensor], None]

#: ``sink(rows, pooled)``: called by :func:`pool_activations` once per batch with the batch's
#: row indices (CPU) and its pooled rows ``[batch, n_hooks, width]`` float32.
Sink = Callable[[Tensor, Tensor], None]


@dataclass(frozen=True)
class PoolPass:
    """How :func:`pool_activations` pools and batches (its defaults are these); checked by
    :func:`pool_activations` itself, which raises its caller's error type.

    Attributes:
        pool: ``"mean"`` or ``"max"`` over each row's real tokens.
        batch_size: rows per forward pass.
        progress: show a progress bar, named ``desc``.
    """

    pool: Literal["mean", "max"] = "mean"
    batch_size: int = BATCH_SIZE
    progress: bool = PROGRESS
    desc: str = "pooling"


def pool_activations(
    model: Model,
    batch: TokenBatch,
    hook_names: Sequence[str],
    width: int,
    options: PoolPass | None = None,
    *,
    fwd_hooks: FwdHooks = (),
    observe: Observer | None = None,
    sink: Sink | None = None,
    error: type[MechlingoError] = InputError,
) -> Float[Tensor, "row hook d"]:
    """Each row's activations at every hook, pooled over its real tokens, in one pass per
    batch of similar lengths.

    Every hook (``hook_names`` in forward order, each ``width`` wide) pools its activation
    over the row's real tokens (BOS and padding excluded; ``"mean"`` or ``"max"``, see
    :func:`mechlingo.kernels.streaming.masked_pool`) into ``out[row, slot]``; the forward pass
    stops after the last hook, so the unembedding is never computed, and memory does not grow
    with sentence length. ``fwd_hooks`` (e.g. an intervention's) run before the pooling
    hooks, so what is pooled includes their effect at the same hook point. ``observe`` sees
    the unpooled activations as well (e.g. to count firing tokens). ``sink(rows, pooled)``,
    when given, receives each batch's pooled rows ``[batch, n_hooks, width]`` instead of a
    matrix of every row (to stream them to disk: memory then does not grow with the rows).

    Returns:
        ``[n_rows, n_hooks, width]`` float32 on :func:`output_device`; ``.flatten(1)`` gives
        one row of ``n_hooks * width`` features per sentence without a copy. With ``sink``,
        an empty ``[0, n_hooks, width]`` tensor.

    Raises:
        error: a bad ``pool`` or ``batch_size``, or a row that is nothing but BOS.
    """
    o = PoolPass() if options is None else options
    pool, batch_size = o.pool, o.batch_size
    check_pool_args(pool, batch_size, error=error)
    dev = output_device(model)
    names = list(hook_names)
    n_out = 0 if sink is not None else batch.batch_size
    out = torch.zeros(n_out, len(names), width, dtype=torch.float32, device=dev)
    if batch.batch_size == 0:
        return out
    if batch.has_bos and bool((batch.lengths < 2).any()):
        raise error("some sentences tokenize to nothing but BOS")
    state: dict[str, Tensor] = {}

    def make(slot: int) -> Any:
        last = slot == len(names) - 1

        def hook(act: Tensor, hook: Any) -> None:
            a = act.detach().float()
            mask = state["mask"].to(a.device)
            target, at = (state["buf"], slice(None)) if sink else (out, state["rows"].to(dev))
            target[at, slot] = masked_pool(a, mask, pool).to(dev)
            if observe is not None:
                observe(slot, a, mask, state["rows"])
            if last:
                raise StopForward

        return hook

    fwd_hooks = list(fwd_hooks) + [(name, make(i)) for i, name in enumerate(names)]
    groups = sorted_batches(batch.lengths, batch_size)
    for rows in tqdm(groups, desc=o.desc, disable=not o.progress):
        sub = batch.select(rows)
        state["rows"] = torch.as_tensor(rows, dtype=torch.long)
        state["mask"] = sub.real_token_mask(include_bos=False)
        if sink is not None:
            state["buf"] = torch.zeros(len(rows), len(names), width, device=dev)
        run_batch(model, sub, fwd_hooks)
        if sink is not None:
            sink(state["rows"], state["buf"])
    return out


# --------------------------------------------------------------------------------------
# Pooled MLP neurons over all ranks
# --------------------------------------------------------------------------------------


class PoolArgs(TypedDict, total=False):
    """How sentences become pooled neuron activations: the keywords of
    :func:`pooled_neuron_acts` that the expert-neuron calls pass on unchanged
    (:func:`~mechlingo.analyses.experts.stats.collect_neuron_stats`,
    :func:`~mechlingo.analyses.experts.selection.find_experts`). Their defaults and meaning
    are :func:`pooled_neuron_acts`'s: ``layers`` (all), ``pool`` (``"mean"``),
    ``batch_size`` (16), ``max_tokens`` (every token), ``progress``, ``store`` (in memory)
    and ``max_memory``."""

    layers: int | Sequence[int] | None
    pool: Literal["mean", "max"]
    batch_size: int
    max_tokens: int | None
    progress: bool
    store: str | Path | None
    max_memory: int | str | None


def pooled_neuron_acts(
    model: Model,
    texts: Mapping[str, Sequence[str]],
    *,
    threshold: float = 0.0,
    fwd_hooks: FwdHooks = (),
    **options: Unpack[PoolArgs],
) -> NeuronStats:
    """Pooled ``mlp_post`` activations of every sentence over all ranks.

    Each rank pools its contiguous shard of the sentences (over real tokens, BOS and padding
    excluded) and counts firings per language; rows are gathered back in order and counts
    all-reduced, so every rank returns what one process computes on all sentences.

    Args:
        model: the model.
        texts: ``{lang: [sentence, ...]}``; identical on every rank.
        options: :class:`PoolArgs` (each unset one takes its default named here):
        layers: layers to record (default all).
        pool: ``"mean"`` (Kojima et al., the default) or ``"max"`` (Suau et al.).
        batch_size: sentences per forward pass (default 16).
        max_tokens: keep only the first ``max_tokens`` real tokens of each sentence
            (default: every token).
        threshold: a neuron "fires" on a token where its activation exceeds this.
        fwd_hooks: (name, fn) hook pairs applied during the runs (e.g. an intervention's
            ``fwd_hooks(model)``).
        store: out of core: an empty folder (the same on every rank) the pooled rows stream
            to (:mod:`mechlingo.activations.shards`); ``pooled`` is then a ``PooledShards``
            with the same values. The folder must outlive the statistics.
        max_memory: with ``store``, the memory cap in bytes or as ``"2G"`` (default: from
            the machine, :func:`~mechlingo.activations.shards.memory_budget`).

    Returns:
        :class:`NeuronStats` on the model's output device, the model recorded in ``meta``
        (``prob_active`` is float32: counts are summed exactly as integers first).
    """
    layers, pool = options.get("layers"), options.get("pool", "mean")
    batch_size, max_tokens = options.get("batch_size", BATCH_SIZE), options.get("max_tokens")
    progress, store = options.get("progress", PROGRESS), options.get("store")
    check_pool_args(pool, batch_size)
    langs = check_texts(texts)
    sm = site_map(model)
    if not sm.available["mlp_post"]:
        raise InputError("this model has no mlp_post hooks (blocks.{l}.mlp.hook_post)")
    layer_list = resolve_layers(model, layers)
    names = [resolve_site(model, "mlp_post", layer).hook_name for layer in layer_list]
    sentences = [s for lang in langs for s in texts[lang]]
    all_ids = [i for i, lang in enumerate(langs) for _ in texts[lang]]
    bounds = shard_bounds(len(sentences))
    mine = sentences[bounds.start : bounds.stop]
    lang_ids = torch.tensor(all_ids[bounds.start : bounds.stop], dtype=torch.long)
    dev = output_device(model)
    counters, count = _firing_counters(
        len(langs), len(layer_list), sm.d_mlp, lang_ids, dev, threshold
    )
    writer = _shard_writer(store, options.get("max_memory"), len(names) * sm.d_mlp, dev)
    sink = None
    if writer is not None:

        def sink(rows: Tensor, pooled: Tensor) -> None:
            writer.add(_features(pooled), rows + bounds.start, lang_ids[rows])

    pooled = torch.zeros(0, len(names), sm.d_mlp, dtype=torch.float32, device=dev)
    if mine:
        batch = encode_sentences(model, mine, max_tokens=max_tokens)
        pooled = pool_activations(
            model,
            batch,
            names,
            sm.d_mlp,
            PoolPass(pool=pool, batch_size=batch_size, progress=progress, desc="neuron acts"),
            fwd_hooks=fwd_hooks,
            observe=count,
            sink=sink,
        )
    prob = _firing_rates(counters, dev)
    meta = {
        "pool": pool,
        "n_sentences": {lang: len(texts[lang]) for lang in langs},
        "max_tokens": max_tokens,
        "threshold": threshold,
        "world_size": dist_info().world_size,
        "model": model_info(model),
    }
    rows_all: Tensor | PooledShards
    if writer is not None:
        writer.close()
        barrier()
        disk = PooledShards(writer.directory, writer.n_features)
        meta["out_of_core"] = {"max_memory": writer.max_memory, "shards": disk.n_shards}
        rows_all, ids_all = disk, disk.lang_ids.to(dev)
    else:
        rows_all = all_gather_rows(_features(pooled))
        ids_all = all_gather_rows(lang_ids.to(dev))
    return NeuronStats(langs, rows_all, ids_all, prob, layer_list, sm.d_mlp, pool, meta)


def _firing_rates(
    counters: Sequence[ActivationProbability], dev: torch.device
) -> Float[Tensor, "lang feature"]:
    """Per-language firing rates of every neuron over all ranks (integer counts summed
    exactly, then one float64 division), float32."""
    active = torch.cat([c.state_dict()["active"].to(dev) for c in counters], dim=1)
    tokens = counters[0].state_dict()["tokens"].to(dev)
    summed = all_reduce_state({"active": active, "tokens": tokens})
    prob = summed["active"].to(torch.float64) / summed["tokens"].to(torch.float64)[:, None]
    return prob.to(torch.float32)


def _firing_counters(
    n_langs: int, n_layers: int, d_mlp: int, lang_ids: Tensor, dev: torch.device, threshold: float
) -> tuple[list[ActivationProbability], Observer]:
    """One firing counter per layer and the observer that feeds them."""
    zeros = {
        "active": torch.zeros(n_langs, d_mlp, dtype=torch.int64, device=dev),
        "tokens": torch.zeros(n_langs, dtype=torch.int64, device=dev),
    }
    counters = [ActivationProbability.from_state(zeros, threshold) for _ in range(n_layers)]

    def count(slot: int, acts: Tensor, mask: Tensor, rows: Tensor) -> None:
        counters[slot].update(acts, lang=lang_ids[rows].to(acts.device), mask=mask)

    return counters, count


def _shard_writer(
    store: str | Path | None, max_memory: int | str | None, n_features: int, dev: torch.device
) -> ShardWriter | None:
    """The writer of this rank's shards in ``store`` (``None``: in memory), after checking
    that the folder holds no shards of an earlier run."""
    if store is None:
        return None
    folder = Path(store)
    if is_main() and folder.is_dir() and any(folder.glob("*.rows.npy")):
        raise InputError(
            f"{folder} already holds pooled shards of another run",
            fix="give an empty folder (or none: a temporary one)",
        )
    barrier()
    return ShardWriter(folder, n_features, memory_budget(max_memory))
