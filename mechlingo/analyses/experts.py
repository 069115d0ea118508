"""Expert (language-specific) MLP neurons: statistics, scores, selection and clamps.

Method (Sundar et al., ACL 2025, after Suau et al. and Kojima et al.; the method page is
``docs/methods/expert-neurons.md``):

1. :func:`collect_neuron_stats` runs the model over sentences of every language, one forward
   per batch with a hook on every layer's ``mlp_post`` (the neuron activations, input of the
   down projection). Each hook pools its activations over the sentence's real tokens (BOS and
   padding excluded; mean or max) into one row of a ``[n_sentences, n_layers * d_mlp]``
   matrix, and counts how often each neuron is > 0 per language (for LAPE). The forward stops
   after the last layer's MLP, so the unembedding is never computed. Only the pooled matrix is
   kept; memory does not grow with sentence length.
2. :func:`score_neurons` scores every neuron at once, one language against the rest: AUROC
   (0.5 = no separation, 1.0 = higher on every sentence of the language than on any other
   sentence), average precision, and LAPE (entropy across languages; low = specific).
3. :meth:`ExpertResult.clamp` keeps the top ``k`` neurons of a language and returns an
   intervention that sets each of them, at every position, to its mean (or median) pooled
   activation over that language's sentences. :meth:`ExpertResult.random_clamp` is the
   control: the same values written to ``k`` random other neurons.
4. :func:`k_curve` measures, for each ``k``, how often text sampled from a bare BOS prompt
   (and greedy continuations of short neutral prompts) is in the target language with the
   clamp on (py3langid, offline; Wilson intervals), and the perplexity of held-out text of
   every language (the side effect; bootstrap intervals over lines), with the random-neuron
   control at the same ``k``. :func:`choose_k` applies the papers' rule: the highest target
   rate among the ``k`` whose target-language perplexity stays within a budget (default: at
   most :data:`PPL_BUDGET` times the no-clamp perplexity); ``others="geomean"`` or ``"max"``
   is a stricter rule that bounds the other languages too. ``k`` is never chosen by
   retrieval.

A feature index ``f`` of the flattened neuron axis is neuron ``f % d_mlp`` of layer
``layers[f // d_mlp]``.

For gated MLPs (Llama, Gemma, Qwen, Cohere, ...) the neuron is the input of the down
projection, ``act(gate(x)) * up(x)``, not the gate alone: it is what multiplies the neuron's
row of the down projection, so a clamp on it sets exactly that neuron's contribution to the
residual stream, and it is the same place as a plain MLP's ``act(in(x))``. The ``> 0`` firing
rate behind LAPE is then the sign of the product (``docs/models.md``). Mixture-of-experts
models have no single neuron layer and are refused.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import py3langid.langid as lid
import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from mechlingo.activations.decoding import decode
from mechlingo.activations.pooled import (
    NeuronStats,
    check_pool_args,
    check_texts,
    pooled_neuron_acts,
)
from mechlingo.activations.pooled import encode_sentences as _encode_sentences
from mechlingo.activations.runs import StopForward, final_resid_name, run_batch
from mechlingo.activations.shards import PooledShards, shard_scores
from mechlingo.analyses.evaluate import greedy_generate
from mechlingo.core.errors import ExpertError
from mechlingo.core.figures import draw
from mechlingo.core.sites import site_map
from mechlingo.core.tokens import TokenBatch, sorted_batches
from mechlingo.core.types import Model
from mechlingo.interventions import (
    Intervention,
    NeuronClamp,
    load_intervention,
)
from mechlingo.kernels.grouped import grouped_auroc_and_average_precision
from mechlingo.kernels.readout import final_logits
from mechlingo.kernels.significance import bootstrap_perplexity, mcnemar, perplexity_ratio, wilson
from mechlingo.kernels.ranking import (
    feature_mean,
    feature_median,
    lape,
    top_k_per_language,
)

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

Pool = Literal["mean", "max"]
ScoreName = Literal["auroc", "ap", "lape"]


# --------------------------------------------------------------------------------------
# 1. statistics
# --------------------------------------------------------------------------------------


def encode_sentences(
    model: Model, sentences: Sequence[str], *, max_tokens: int | None = None
) -> TokenBatch:
    """Tokenize sentences (with BOS when the model prepends one), optionally keeping only
    the first ``max_tokens`` real tokens of each (to bound the cost on CPU); see
    :func:`mechlingo.activations.pooled.encode_sentences`.

    Raises:
        ExpertError: an empty or whitespace-only sentence (it has no tokens to pool).
    """
    return _encode_sentences(model, sentences, max_tokens=max_tokens, error=ExpertError)


def collect_neuron_stats(
    model: Model,
    texts: Mapping[str, Sequence[str]],
    *,
    pool: Pool = "mean",
    layers: int | Sequence[int] | None = None,
    batch_size: int = 16,
    max_tokens: int | None = None,
    intervention: Any = None,
    progress: bool = False,
    store: str | Path | None = None,
    max_memory: int | str | None = None,
) -> NeuronStats:
    """Pooled activations of every MLP neuron over every sentence, in one pass.

    Under ``torchrun`` each rank pools its shard of the sentences and the rows are gathered
    back in order (:func:`mechlingo.activations.pooled.pooled_neuron_acts`); in a single
    process it is the one-process computation.

    Args:
        model: a TransformerLens model.
        texts: ``{lang: [sentence, ...]}``; sentences of one language are the positives of
            that language and negatives of every other. At least two languages are needed
            to score neurons later.
        pool: ``"mean"`` (Kojima et al.) or ``"max"`` (Suau et al.) over the sentence's real
            tokens, BOS and padding excluded.
        layers: layers to record (default all).
        batch_size: sentences per forward pass (sentences are sorted by length first).
        max_tokens: keep only the first ``max_tokens`` tokens of each sentence.
        intervention: optional intervention applied during the runs (anything with
            ``fwd_hooks(model)``).
        store: out of core: an empty folder (the same on every rank) where the pooled rows
            stream to disk shards, so memory does not grow with the number of sentences;
            scores, clamps and tables read them from there with the same values
            (``docs/scaling.md``).
        max_memory: with ``store``, the cap in bytes or as ``"2G"`` (default: from the
            machine, :func:`mechlingo.activations.shards.memory_budget`).

    Returns:
        :class:`NeuronStats` on the model's device.
    """
    langs = check_texts(texts, 1, error=ExpertError)
    check_pool_args(pool, batch_size, error=ExpertError)
    sm = site_map(model)
    if not sm.available["mlp_post"]:
        why = sm.why_unavailable.get("mlp_post", "it has no blocks.{l}.mlp.hook_post hooks")
        raise ExpertError(f"this model has no MLP neuron site (mlp_post): {why}")
    extra = list(intervention.fwd_hooks(model)) if intervention is not None else []
    try:
        acts = pooled_neuron_acts(
            model,
            {lang: texts[lang] for lang in langs},
            layers=layers,
            pool=pool,
            batch_size=batch_size,
            max_tokens=max_tokens,
            extra_hooks=extra,
            progress=progress,
            store=store,
            max_memory=max_memory,
        )
    except ValueError as err:
        raise ExpertError(str(err)) from err
    return acts


# --------------------------------------------------------------------------------------
# 2. scores
# --------------------------------------------------------------------------------------


@dataclass
class NeuronScores:
    """Scores of every neuron for every language (one language against the rest).

    Attributes:
        auroc: ``[n_langs, n_features]``; 1.0 = the neuron is higher on every sentence of the
            language than on any other sentence, 0.5 = no separation.
        ap: ``[n_langs, n_features]`` average precision (chance level = the language's share
            of sentences).
        lape: ``[n_features]`` entropy of the firing rate across languages (low = specific;
            NaN for neurons that never fire).
    """

    auroc: Float[Tensor, "lang feature"]
    ap: Float[Tensor, "lang feature"]
    lape: Float[Tensor, " feature"]

    def get(self, by: ScoreName) -> Float[Tensor, "lang feature"]:
        """Scores where higher = more expert-like, ``[n_langs, n_features]``. For LAPE the
        score of a language is ``-LAPE`` where that language has the highest firing rate
        and ``-inf`` elsewhere (dead neurons: ``-inf``)."""
        if by == "auroc":
            return self.auroc
        if by == "ap":
            return self.ap
        if by == "lape":
            raise ExpertError("use ExpertResult.scores('lape'), which needs firing rates")
        raise ExpertError(f"unknown score {by!r}; use 'auroc', 'ap' or 'lape'")


def score_neurons(stats: NeuronStats, *, max_memory: int | str | None = None) -> NeuronScores:
    """AUROC and average precision of every neuron for every language against the others
    (all neurons and languages from one sort: :mod:`mechlingo.kernels.grouped`), and LAPE
    from the firing rates. Statistics kept on
    disk (``collect_neuron_stats(store=...)``) are scored a block of neurons at a time under
    ``max_memory`` (:func:`mechlingo.activations.shards.shard_scores`), with equal results."""
    if len(stats.langs) < 2:
        raise ExpertError(
            f"scoring needs at least two languages (positives and negatives), got {stats.langs}"
        )
    if isinstance(stats.pooled, PooledShards):
        au_d, ap_d = shard_scores(stats.pooled, len(stats.langs), max_memory)
        dev = stats.prob_active.device
        return NeuronScores(au_d.to(dev), ap_d.to(dev), lape(stats.prob_active))
    au, ap = grouped_auroc_and_average_precision(stats.pooled, stats.lang_ids, len(stats.langs))
    return NeuronScores(au, ap, lape(stats.prob_active))


# --------------------------------------------------------------------------------------
# clamps
# --------------------------------------------------------------------------------------


def make_clamp(
    layers: Int[Tensor, " k"],
    neurons: Int[Tensor, " k"],
    values: Float[Tensor, " k"],
    meta: Mapping[str, Any] | None = None,
    positions: str = "all_with_bos",
) -> NeuronClamp:
    """A set-mode :class:`~mechlingo.interventions.NeuronClamp` of ``mlp_post`` neurons from
    flat ``(layer, neuron, value)`` triples (``positions`` default: every position, BOS
    included, as in the paper).

    Raises:
        ExpertError: inputs of different lengths or not 1-D, or no neuron at all.
    """
    layers, neurons, values = (torch.as_tensor(x) for x in (layers, neurons, values))
    if not (layers.ndim == neurons.ndim == values.ndim == 1):
        raise ExpertError(
            f"layers, neurons and values must be 1-D, got shapes {tuple(layers.shape)}, "
            f"{tuple(neurons.shape)}, {tuple(values.shape)}"
        )
    if not (layers.shape == neurons.shape == values.shape):
        raise ExpertError(
            f"layers {tuple(layers.shape)}, neurons {tuple(neurons.shape)} and values "
            f"{tuple(values.shape)} must have the same length (one value per neuron)"
        )
    if layers.numel() == 0:
        raise ExpertError("a clamp needs at least one neuron")
    layers, neurons, values = layers.long().cpu(), neurons.long().cpu(), values.float().cpu()
    by_layer = {int(lay): layers == lay for lay in torch.unique(layers).tolist()}
    return NeuronClamp(
        {lay: neurons[sel] for lay, sel in by_layer.items()},
        {lay: values[sel] for lay, sel in by_layer.items()},
        "set",
        positions=positions,
        meta=meta,
    )


def load_clamp(path: str | Path, model: Model | None = None) -> Intervention:
    """Load a clamp saved by ``clamp.save(folder)`` (checked against ``model`` if given)."""
    return load_intervention(path, model)


# --------------------------------------------------------------------------------------
# selection
# --------------------------------------------------------------------------------------


@dataclass
class ExpertResult:
    """Statistics and scores of every neuron for every language, and expert selection.

    ``scores(by)`` is ``[n_langs, n_features]`` (higher = more expert-like); ``top(lang, k)``
    the best ``k`` features of a language; ``clamp(lang, k)`` the intervention.
    """

    stats: NeuronStats
    neuron_scores: NeuronScores
    by: ScoreName = "auroc"

    @property
    def langs(self) -> list[str]:
        return self.stats.langs

    def scores(self, by: ScoreName | None = None) -> Float[Tensor, "lang feature"]:
        by = by or self.by
        if by == "lape":
            p = self.stats.prob_active
            ent = self.neuron_scores.lape.nan_to_num(nan=math.inf)
            best = p.argmax(0)
            own = torch.arange(p.shape[0], device=p.device)[:, None] == best[None, :]
            return torch.where(own, -ent[None, :], -math.inf)
        return self.neuron_scores.get(by)

    def top(self, lang: str, k: int, by: ScoreName | None = None) -> Int[Tensor, " k"]:
        """Flattened feature indices of the ``k`` best neurons of ``lang``, best first."""
        li = self.stats.lang_index(lang)
        n = self.stats.n_features
        if not isinstance(k, int) or not 1 <= k <= n:
            raise ExpertError(
                f"k must be an integer in [1, {n}] (the number of neurons scored: "
                f"{len(self.stats.layers)} layers x {self.stats.d_mlp}), got {k!r}"
            )
        s = self.scores(by)[li : li + 1]
        return top_k_per_language(s, k)[0]

    def clamp_values(
        self, lang: str, features: Int[Tensor, " k"], value: Literal["mean", "median"] = "mean"
    ) -> Float[Tensor, " k"]:
        """Mean or median pooled activation of ``features`` over sentences of ``lang``."""
        rows = self.stats.lang_ids == self.stats.lang_index(lang)
        sub = self.stats.pooled[:, features.to(self.stats.pooled.device)]
        if value == "mean":
            return feature_mean(sub, rows)
        if value == "median":
            return feature_median(sub, rows)
        raise ExpertError(f"value must be 'mean' or 'median', got {value!r}")

    def _meta(self, lang: str, k: int, value: str, **extra: Any) -> dict[str, Any]:
        build = {k_: v for k_, v in self.stats.meta.items() if k_ != "model"}
        build.update(
            method="experts", lang=lang, k=k, score=self.by, value=value, site="mlp_post", **extra
        )
        return {"model": self.stats.meta.get("model"), "build": build}

    def clamp(
        self,
        lang: str,
        k: int,
        *,
        value: Literal["mean", "median"] = "mean",
        by: ScoreName | None = None,
        positions: str = "all_with_bos",
    ) -> NeuronClamp:
        """The expert intervention: the top ``k`` neurons of ``lang`` set to their mean (or
        median) pooled activation over ``lang``'s sentences, at every position."""
        feats = self.top(lang, k, by)
        vals = self.clamp_values(lang, feats, value)
        layers, neurons = self.stats.locate(feats)
        s = self.scores(by)[self.stats.lang_index(lang), feats]
        meta = self._meta(lang, k, value, min_score=float(s.min()), control=False)
        return make_clamp(layers, neurons, vals, meta, positions)

    def random_clamp(
        self,
        lang: str,
        k: int,
        *,
        value: Literal["mean", "median"] = "mean",
        seed: int = 0,
        by: ScoreName | None = None,
        positions: str = "all_with_bos",
    ) -> NeuronClamp:
        """Control: the values of :meth:`clamp` written to ``k`` random neurons that are not
        among the ``k`` experts (same size, same values)."""
        feats = self.top(lang, k, by)
        n = self.stats.n_features
        if 2 * k > n:
            raise ExpertError(f"k={k} leaves too few non-expert neurons ({n - k}) for a control")
        vals = self.clamp_values(lang, feats, value)
        gen = torch.Generator().manual_seed(seed)
        is_expert = torch.zeros(n, dtype=torch.bool)
        is_expert[feats.cpu()] = True
        pool_idx = (~is_expert).nonzero().flatten()
        pick = pool_idx[torch.randperm(pool_idx.numel(), generator=gen)[:k]]
        layers, neurons = self.stats.locate(pick)
        meta = self._meta(lang, k, value, control=True, seed=seed)
        return make_clamp(layers, neurons, vals, meta, positions)

    def overlap(self, k: int, by: ScoreName | None = None) -> Float[Tensor, "lang lang"]:
        """Fraction of shared neurons between the top-``k`` sets of every pair of languages
        (``|A & B| / k``; 1 on the diagonal)."""
        s = self.scores(by)
        n = self.stats.n_features
        if not 1 <= k <= n:
            raise ExpertError(f"k must be in [1, {n}], got {k}")
        top = top_k_per_language(s, k)
        member = torch.zeros(s.shape, dtype=torch.float32, device=s.device)
        member.scatter_(1, top, 1.0)
        return (member @ member.T) / k

    def layer_counts(self, k: int, by: ScoreName | None = None) -> Int[Tensor, "lang layer"]:
        """Number of each language's top-``k`` experts in each recorded layer."""
        top = top_k_per_language(self.scores(by), k)
        slot = top // self.stats.d_mlp
        n_l = len(self.stats.layers)
        counts = torch.zeros(top.shape[0], n_l, dtype=torch.long, device=top.device)
        return counts.scatter_add_(1, slot, torch.ones_like(slot))

    def to_dataframe(self, k: int = 100, by: ScoreName | None = None) -> pd.DataFrame:
        """Top ``k`` neurons per language: lang, rank, layer, neuron, auroc, ap, lape,
        firing rate in the language, mean pooled activation in the language and elsewhere."""
        import pandas as pd

        s = self.scores(by)
        top = top_k_per_language(s, min(k, self.stats.n_features))
        frames = []
        for li, lang in enumerate(self.langs):
            f = top[li]
            layers, neurons = self.stats.locate(f)
            rows = self.stats.lang_ids == li
            sub = self.stats.pooled[:, f]
            frames.append(
                pd.DataFrame(
                    {
                        "lang": lang,
                        "rank": range(1, f.numel() + 1),
                        "layer": layers.cpu().numpy(),
                        "neuron": neurons.cpu().numpy(),
                        "auroc": self.neuron_scores.auroc[li, f].cpu().numpy(),
                        "ap": self.neuron_scores.ap[li, f].cpu().numpy(),
                        "lape": self.neuron_scores.lape[f].cpu().numpy(),
                        "fire_rate": self.stats.prob_active[li, f].cpu().numpy(),
                        "mean_in_lang": feature_mean(sub, rows).cpu().numpy(),
                        "mean_other": feature_mean(sub, ~rows).cpu().numpy(),
                    }
                )
            )
        return pd.concat(frames, ignore_index=True)

    def summary(self, k: int = 100) -> dict[str, Any]:
        """Headline numbers: per language the best and the k-th AUROC and AP, and the mean
        overlap of top-``k`` sets between languages."""
        out: dict[str, Any] = {"k": k, "per_lang": {}}
        top = top_k_per_language(self.scores(), k)
        for li, lang in enumerate(self.langs):
            a = self.neuron_scores.auroc[li, top[li]]
            p = self.neuron_scores.ap[li, top[li]]
            out["per_lang"][lang] = {
                "auroc_top1": float(a[0]),
                "auroc_at_k": float(a[-1]),
                "ap_top1": float(p[0]),
                "n_auroc_gt_0.9": int((self.neuron_scores.auroc[li] > 0.9).sum()),
            }
        ov = self.overlap(k)
        n = ov.shape[0]
        off = ov[~torch.eye(n, dtype=torch.bool, device=ov.device)]
        out["mean_overlap_between_langs"] = float(off.mean()) if off.numel() else float("nan")
        return out

    def fig_layers(self, k: int = 100) -> go.Figure:

        return draw(
            "experts_per_layer_figure", self.layer_counts(k), self.langs, self.stats.layers, k
        )

    def fig_overlap(self, k: int = 100) -> go.Figure:

        return draw("overlap_figure", self.overlap(k), self.langs, k)


def find_experts(
    model: Model,
    texts: Mapping[str, Sequence[str]],
    *,
    pool: Pool = "mean",
    by: ScoreName = "auroc",
    layers: int | Sequence[int] | None = None,
    batch_size: int = 16,
    max_tokens: int | None = None,
    progress: bool = False,
    store: str | Path | None = None,
    max_memory: int | str | None = None,
) -> ExpertResult:
    """Collect statistics (:func:`collect_neuron_stats`) and score every neuron
    (:func:`score_neurons`); select with :meth:`ExpertResult.clamp`. With ``store`` the
    statistics stay on disk under ``max_memory`` (see :func:`collect_neuron_stats`)."""
    check_texts(texts, 2, error=ExpertError)
    stats = collect_neuron_stats(
        model,
        texts,
        pool=pool,
        layers=layers,
        batch_size=batch_size,
        max_tokens=max_tokens,
        progress=progress,
        store=store,
        max_memory=max_memory,
    )
    return ExpertResult(stats, score_neurons(stats, max_memory=max_memory), by)


# --------------------------------------------------------------------------------------
# choosing k
# --------------------------------------------------------------------------------------

NEUTRAL_PROMPTS = ("1.", "*", "Text:", '"')


@functools.lru_cache(maxsize=4)
def _langid(langs: tuple[str, ...]) -> Any:

    ident = lid.LanguageIdentifier.from_model_file(lid.MODEL_FILE, norm_probs=True)
    unknown = [lang for lang in langs if lang not in ident.labels]
    if unknown:
        raise ExpertError(f"py3langid does not know language(s) {unknown}")
    ident.set_languages(list(langs))
    return ident


def identify_languages(texts: Sequence[str], langs: Sequence[str]) -> list[str | None]:
    """Language of each text among ``langs`` by py3langid (offline); ``None`` for a text
    with no letters (nothing to identify)."""
    ident = _langid(tuple(langs))
    out: list[str | None] = []
    for t in texts:
        if not any(ch.isalpha() for ch in t):
            out.append(None)
        else:
            out.append(ident.classify(t)[0])
    return out


def sample_from_bos(
    model: Model,
    n: int,
    *,
    max_new_tokens: int = 20,
    intervention: Any = None,
    seed: int = 0,
    temperature: float = 1.0,
    cache: bool = True,
) -> list[str]:
    """``n`` samples (temperature sampling, fixed seed) from a bare BOS prompt, with the
    intervention applied at every step. Greedy decoding from BOS gives one string only,
    hence sampling. Decoded with a key-value cache where the model supports it, like
    :func:`mechlingo.analyses.evaluate.greedy_generate`; ``cache=False`` recomputes the prefix (the
    same draws)."""

    bos = getattr(model.tokenizer, "bos_token_id", None)
    if bos is None:
        raise ExpertError("the model's tokenizer has no BOS token to start from")
    dev = model.W_U.device
    gen = torch.Generator(device="cpu").manual_seed(seed)
    tokens = torch.full((n, 1), int(bos), dtype=torch.long, device=dev)
    hooks = list(intervention.fwd_hooks(model)) if intervention is not None else []
    eos = getattr(model.tokenizer, "eos_token_id", None)

    def draw(logits: Tensor) -> Tensor:
        probs = torch.softmax(logits.float().cpu() / temperature, dim=-1)
        return torch.multinomial(probs, 1, generator=gen).squeeze(1)

    batch = TokenBatch(tokens, torch.ones(n, dtype=torch.long, device=dev), 0, True)
    rows = decode(
        model, batch, max_new_tokens=max_new_tokens, hooks=hooks, choose=draw, cache=cache
    )
    out = []
    for row in rows:
        if eos is not None and eos in row:
            row = row[: row.index(eos)]
        out.append(model.tokenizer.decode(row, skip_special_tokens=True))
    return out


def line_nll(
    model: Model,
    texts: Sequence[str],
    *,
    intervention: Any = None,
    batch_size: int = 16,
    max_tokens: int | None = None,
    chunk_rows: int = 128,
) -> tuple[Float[Tensor, " text"], Int[Tensor, " text"]]:
    """Summed next-token negative log-likelihood (nats) of every text and the number of
    tokens it covers (every real token after BOS), in the order of ``texts``: the per-line
    pieces of :func:`perplexity`, for bootstrap intervals over lines. Only the final residual
    stream is kept; the unembedding runs on the real positions in chunks of ``chunk_rows``,
    so no [batch, pos, vocab] tensor exists."""

    batch = encode_sentences(model, texts, max_tokens=max_tokens)
    name = final_resid_name(model)
    hooks = list(intervention.fwd_hooks(model)) if intervention is not None else []
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


def perplexity(
    model: Model,
    texts: Sequence[str],
    *,
    intervention: Any = None,
    batch_size: int = 16,
    max_tokens: int | None = None,
    chunk_rows: int = 128,
) -> float:
    """Perplexity of the model on ``texts``: exp of the mean next-token NLL over every real
    token after BOS, all texts pooled (see :func:`line_nll`)."""
    nll, counts = line_nll(
        model,
        texts,
        intervention=intervention,
        batch_size=batch_size,
        max_tokens=max_tokens,
        chunk_rows=chunk_rows,
    )
    if int(counts.sum()) == 0:
        raise ExpertError("no tokens to score: every text is a single token")
    return float(torch.exp(nll.sum() / counts.sum()))


#: Default perplexity budget of the k rule: a clamp may at most double held-out perplexity.
PPL_BUDGET = 2.0

OthersRule = Literal["geomean", "max", "none"]


def choose_k(
    rows: Sequence[Mapping[str, Any]],
    lang: str,
    *,
    ppl_budget: float = PPL_BUDGET,
    others: OthersRule = "none",
) -> dict[str, Any]:
    """The papers' rule for ``k`` (Sundar et al. after Kojima et al.): the ``k`` whose clamp
    makes generations from a bare BOS prompt most often the target language, among the ``k``
    whose side effect on perplexity stays within a budget. Never retrieval.

    A ``k`` (rows with ``arm == "experts"``) is *within budget* when, on held-out lines, the
    target language's perplexity is at most ``ppl_budget`` times its perplexity without a
    clamp (the ``arm == "none"`` row); with a stricter ``others``, the other languages'
    perplexity ratios, combined by it, must be too: ``"none"`` (default: the target only, the
    papers' rule), ``"geomean"`` (their geometric mean, the typical side effect) or ``"max"``
    (every other language). Among the
    within-budget ``k`` the highest ``target_rate_bos`` wins; ties go to the smaller ``k``.

    Args:
        rows: k-curve rows with ``k``, ``arm``, ``target_rate_bos`` and ``ppl_<lang>``.
        lang: the target language (``ppl_<lang>`` must be among the columns).

    Returns:
        ``{"k"``: the chosen ``k``, or ``None`` when no ``k`` is within budget; ``"rule"``: the
        rule in words; ``"ppl_budget"``, ``"others"``, ``"target_rate_none"`` and
        ``"candidates"``: per ``k`` its rate, perplexity ratios and whether it is within
        budget``}``.
    """
    if ppl_budget <= 0 or not math.isfinite(ppl_budget):
        raise ExpertError(f"the perplexity budget must be a positive number, got {ppl_budget}")
    if others not in ("geomean", "max", "none"):
        raise ExpertError(f"others must be 'geomean', 'max' or 'none', got {others!r}")
    base = [r for r in rows if r["arm"] == "none"]
    if not base:
        raise ExpertError("the k curve has no 'none' row (no clamp) to measure perplexity against")
    b = base[0]
    langs = [c[4:] for c in b if c.startswith("ppl_") and not c.startswith("ppl_ratio_")]
    langs = [x for x in langs if not x.endswith(("_lo", "_hi"))]
    if lang not in langs:
        raise ExpertError(f"no held-out perplexity of the target {lang!r}; have {langs}")
    cands = []
    for r in sorted((r for r in rows if r["arm"] == "experts"), key=lambda r: r["k"]):
        ratios = {x: r[f"ppl_{x}"] / b[f"ppl_{x}"] for x in langs}
        rest = [v for x, v in ratios.items() if x != lang]
        if others == "none" or not rest:
            agg = None
        elif others == "max":
            agg = max(rest)
        else:
            agg = math.exp(sum(math.log(v) for v in rest) / len(rest))
        ok = ratios[lang] <= ppl_budget and (agg is None or agg <= ppl_budget)
        cands.append(
            {
                "k": int(r["k"]),
                "target_rate_bos": r["target_rate_bos"],
                "ppl_ratio_target": ratios[lang],
                "ppl_ratio_others": agg,
                "within_budget": bool(ok),
            }
        )
    ok = [c for c in cands if c["within_budget"]]
    best = max(ok, key=lambda c: (c["target_rate_bos"], -c["k"])) if ok else None
    agg_words = {
        "geomean": "the geometric mean of the other languages' ratios",
        "max": "every other language's ratio",
        "none": "(other languages not constrained)",
    }[others]
    rule = (
        f"k = argmax over k of the fraction of bare-BOS generations identified as {lang}, "
        f"among k whose held-out perplexity ratio (clamp / no clamp) is <= {ppl_budget:g} for "
        f"{lang} and for {agg_words}; ties to the smaller k; never chosen by retrieval"
    )
    return {
        "lang": lang,
        "k": None if best is None else best["k"],
        "rule": rule,
        "ppl_budget": ppl_budget,
        "others": others,
        "target_rate_none": b["target_rate_bos"],
        "candidates": cands,
    }


@dataclass
class KCurve:
    """Effect of the expert clamp as a function of ``k``, with the random control.

    ``rows``: one dict per (k, arm) with ``arm`` in ``{"experts", "random", "none"}``:

    * ``target_rate_bos``: fraction of the ``n_bos`` samples from a bare BOS prompt identified
      as the target language, with its Wilson 95% interval ``target_rate_bos_lo/_hi``;
    * ``target_rate_prompt``: the same for greedy continuations of neutral prompts;
    * ``ppl_<lang>``: held-out perplexity of every language, with a bootstrap 95% interval
      over lines (``ppl_<lang>_lo/_hi``), and ``ppl_ratio_<lang>``: that perplexity over the
      no-clamp perplexity of the same lines (paired bootstrap ``_lo/_hi``);
    * ``examples`` (the generations) and ``bos_hits`` (per BOS sample: in the target?).
    """

    lang: str
    rows: list[dict[str, Any]]

    def to_dataframe(self) -> pd.DataFrame:
        import pandas as pd

        skip = ("examples", "bos_hits")
        return pd.DataFrame([{k: v for k, v in r.items() if k not in skip} for r in self.rows])

    def choose(self, ppl_budget: float = PPL_BUDGET, others: OthersRule = "none") -> dict:
        """:func:`choose_k` on this curve."""
        return choose_k(self.rows, self.lang, ppl_budget=ppl_budget, others=others)

    def tests(self) -> list[dict[str, Any]]:
        """Per ``k``: exact McNemar tests of the BOS target hits of the expert clamp against no
        clamp and against the random control at the same ``k`` (samples are paired by index:
        every arm draws with the same seed)."""

        none = next((r for r in self.rows if r["arm"] == "none"), None)
        out = []
        for r in self.rows:
            if r["arm"] != "experts":
                continue
            t: dict[str, Any] = {"k": r["k"]}
            if none is not None:
                t["vs_none"] = mcnemar(none["bos_hits"], r["bos_hits"])
            ctl = next((c for c in self.rows if c["arm"] == "random" and c["k"] == r["k"]), None)
            if ctl is not None:
                t["vs_random"] = mcnemar(ctl["bos_hits"], r["bos_hits"])
            out.append(t)
        return out

    def records(self) -> list[dict[str, Any]]:
        """JSON-ready rows (without the generations)."""
        return [{k: v for k, v in r.items() if k != "examples"} for r in self.rows]

    def fig_k_curve(self, chosen: int | None = None) -> go.Figure:
        """Target-language rate and held-out perplexity against ``k`` (experts, random
        control, no clamp), with the ``chosen`` k marked."""
        return draw("k_curve_figure", self, chosen)

    def figure(self, chosen: int | None = None) -> go.Figure:
        """Deprecated alias of :meth:`fig_k_curve` (removed in mechlingo 0.2)."""
        warnings.warn(
            "KCurve.figure is renamed KCurve.fig_k_curve (the old name is removed in "
            "mechlingo 0.2)",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.fig_k_curve(chosen)


def _k_arms(
    experts: ExpertResult,
    lang: str,
    ks: Sequence[int],
    value: Literal["mean", "median"],
    seed: int,
    control: bool,
) -> list[tuple[int, str, Any]]:
    """``(k, arm, intervention)`` of every run of the k curve: no clamp first, then per ``k``
    the expert clamp and (with ``control``) the random-neuron clamp."""
    arms: list[tuple[int, str, Any]] = [(0, "none", None)]
    for k in ks:
        arms.append((int(k), "experts", experts.clamp(lang, int(k), value=value)))
        if control:
            arms.append(
                (int(k), "random", experts.random_clamp(lang, int(k), value=value, seed=seed))
            )
    return arms


def _generation_rates(
    model: Model,
    lang: str,
    intervention: Any,
    id_langs: Sequence[str],
    *,
    n_samples: int,
    max_new_tokens: int,
    prompts: Sequence[str],
    seed: int,
) -> dict[str, Any]:
    """One arm's generations (bare-BOS samples and greedy continuations of ``prompts``) and
    how often they are in ``lang``: the row's rate columns, ``bos_hits`` and ``examples``."""
    bos_texts = sample_from_bos(
        model, n_samples, max_new_tokens=max_new_tokens, intervention=intervention, seed=seed
    )
    prompt_texts = (
        greedy_generate(
            model,
            list(prompts),
            max_new_tokens=max_new_tokens,
            intervention=intervention,
            stop_at_newline=False,
        )
        if prompts
        else []
    )
    ids_bos = identify_languages(bos_texts, id_langs)
    ids_prompt = identify_languages(prompt_texts, id_langs)
    hits = [x == lang for x in ids_bos]
    w = wilson(sum(hits), len(hits))
    return {
        "n_bos": len(hits),
        "target_bos": sum(hits),
        "target_rate_bos": w["p"],
        "target_rate_bos_lo": w["lo"],
        "target_rate_bos_hi": w["hi"],
        "target_rate_prompt": (
            sum(x == lang for x in ids_prompt) / len(ids_prompt) if ids_prompt else float("nan")
        ),
        "bos_hits": hits,
        "examples": [
            {"source": "BOS", "text": t, "lang": x} for t, x in zip(bos_texts, ids_bos, strict=True)
        ]
        + [
            {"source": p, "text": t, "lang": x}
            for p, t, x in zip(prompts, prompt_texts, ids_prompt, strict=True)
        ],
    }


def _heldout_perplexities(
    model: Model,
    heldout: Mapping[str, Sequence[str]],
    intervention: Any,
    base_nll: dict[str, Tensor] | None,
    *,
    max_tokens: int | None,
    seed: int,
) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """One arm's held-out perplexity of every language with bootstrap intervals over lines,
    and its ratio to the no-clamp arm's (``base_nll``; ``None`` for the no-clamp arm itself,
    whose ratios are 1). Returns the row's columns and the per-line NLL of each language."""
    row: dict[str, Any] = {}
    nlls: dict[str, Tensor] = {}
    for hl, sents in heldout.items():
        nll, cnt = line_nll(model, sents, intervention=intervention, max_tokens=max_tokens)
        keep = cnt > 0
        if not bool(keep.any()):
            raise ExpertError(f"no tokens to score in the held-out {hl} lines")
        nll, cnt = nll[keep], cnt[keep]
        nlls[hl] = nll
        pp = bootstrap_perplexity(nll.numpy(), cnt.numpy(), seed=seed)
        row[f"ppl_{hl}"], row[f"ppl_{hl}_lo"], row[f"ppl_{hl}_hi"] = pp["ppl"], pp["lo"], pp["hi"]
        if base_nll is None:
            for end in ("", "_lo", "_hi"):
                row[f"ppl_ratio_{hl}{end}"] = 1.0
        else:
            pr = perplexity_ratio(base_nll[hl].numpy(), nll.numpy(), cnt.numpy(), seed=seed)
            row[f"ppl_ratio_{hl}"] = pr["ratio"]
            row[f"ppl_ratio_{hl}_lo"], row[f"ppl_ratio_{hl}_hi"] = pr["lo"], pr["hi"]
    return row, nlls


def k_curve(
    model: Model,
    experts: ExpertResult,
    lang: str,
    ks: Sequence[int],
    heldout: Mapping[str, Sequence[str]],
    *,
    n_samples: int = 32,
    max_new_tokens: int = 20,
    prompts: Sequence[str] = NEUTRAL_PROMPTS,
    value: Literal["mean", "median"] = "mean",
    seed: int = 0,
    control: bool = True,
    max_tokens: int | None = 32,
    progress: bool = False,
    cache: Callable[[str, Callable[[], dict]], dict] | None = None,
) -> KCurve:
    """For each ``k``: language of generations with the clamp on and held-out perplexity of
    every language, for the experts, the random control, and no clamp (``k = 0``), with
    Wilson intervals for the rates and bootstrap intervals (over lines) for perplexities.

    The language of each generation is identified by py3langid among the languages of
    ``heldout`` and ``experts.langs``; generations with no letters count as not in the target.
    Choose ``k`` from the result with :meth:`KCurve.choose` (the papers' rule).

    ``cache(name, fn)``, when given, runs each arm (``name``: ``"none"``, ``"k50-experts"``,
    ``"k50-random"``...) and returns ``fn()`` (a JSON-able dict) or a stored equal result (a
    resumable stage, :class:`mechlingo.core.stages.Stages`; ``experts --resume``). Every arm
    draws with ``seed`` alone, so an arm's row does not depend on the other ``ks``.
    """

    if not ks:
        raise ExpertError("give at least one k")
    if n_samples < 1:
        raise ExpertError(f"n_samples must be >= 1, got {n_samples}")
    id_langs = list(dict.fromkeys([*experts.langs, *heldout]))
    check_texts(heldout, 1, error=ExpertError)
    rows = []
    base_nll: dict[str, Tensor] | None = None
    arms = _k_arms(experts, lang, ks, value, seed, control)
    run = cache or (lambda name, fn: fn())
    opts = {"n_samples": n_samples, "max_new_tokens": max_new_tokens, "prompts": prompts,
            "seed": seed, "max_tokens": max_tokens}  # fmt: skip
    for k, arm, iv in tqdm(arms, desc="k curve", disable=not progress):
        name = "none" if arm == "none" else f"k{k}-{arm}"
        out = run(name, lambda k=k, arm=arm, iv=iv, base=base_nll: _k_arm(
            model, lang, k, arm, iv, id_langs, heldout, base, **opts))  # fmt: skip
        if arm == "none":
            base_nll = {hl: torch.tensor(v, dtype=torch.float64) for hl, v in out["nll"].items()}
        rows.append(out["row"])
    return KCurve(lang, rows)


def _k_arm(
    model: Model,
    lang: str,
    k: int,
    arm: str,
    iv: Any,
    id_langs: Sequence[str],
    heldout: Mapping[str, Sequence[str]],
    base_nll: dict[str, Tensor] | None,
    *,
    n_samples: int,
    max_new_tokens: int,
    prompts: Sequence[str],
    seed: int,
    max_tokens: int | None,
) -> dict[str, Any]:
    """One run of the k curve: ``{"row": the KCurve row, "nll": {lang: per-line NLL}}``."""
    gen = _generation_rates(
        model,
        lang,
        iv,
        id_langs,
        n_samples=n_samples,
        max_new_tokens=max_new_tokens,
        prompts=prompts,
        seed=seed,
    )
    ppl, nlls = _heldout_perplexities(
        model, heldout, iv, base_nll, max_tokens=max_tokens, seed=seed
    )
    hits, examples = gen.pop("bos_hits"), gen.pop("examples")
    row = {"k": k, "arm": arm, **gen, **ppl, "bos_hits": hits, "examples": examples}
    return {"row": row, "nll": {hl: v.tolist() for hl, v in nlls.items()}}


__all__ = [
    "ExpertError",
    "ExpertResult",
    "KCurve",
    "NeuronScores",
    "NeuronStats",
    "collect_neuron_stats",
    "encode_sentences",
    "find_experts",
    "identify_languages",
    "PPL_BUDGET",
    "choose_k",
    "k_curve",
    "line_nll",
    "load_clamp",
    "make_clamp",
    "perplexity",
    "sample_from_bos",
    "score_neurons",
]
