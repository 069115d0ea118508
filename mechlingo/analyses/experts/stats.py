"""Expert neurons, part 1: pooled statistics of every MLP neuron and their scores.

:func:`collect_neuron_stats` runs the model over sentences of every language, one forward per
batch with a hook on every layer's ``mlp_post`` (the neuron activations, input of the down
projection). Each hook pools its activations over the sentence's real tokens (BOS and padding
excluded; mean or max) into one row of a ``[n_sentences, n_layers * d_mlp]`` matrix, and
counts how often each neuron is > 0 per language (for LAPE). The forward stops after the last
layer's MLP, so the unembedding is never computed. Only the pooled matrix is kept; memory does
not grow with sentence length.

:func:`score_neurons` scores every neuron at once, one language against the rest: AUROC (0.5 =
no separation, 1.0 = higher on every sentence of the language than on any other sentence),
average precision, and LAPE (entropy across languages; low = specific).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Unpack

from jaxtyping import Float
from torch import Tensor

from mechlingo.activations.pooled import (
    NeuronStats,
    PoolArgs,
    check_texts,
    pooled_neuron_acts,
)
from mechlingo.activations.pooled import encode_sentences as _encode_sentences
from mechlingo.activations.shards import PooledShards, shard_scores
from mechlingo.core.errors import ExpertError
from mechlingo.core.sites import site_map
from mechlingo.core.tokens import TokenBatch
from mechlingo.core.types import Model
from mechlingo.interventions import Intervention, intervention_hooks
from mechlingo.kernels.grouped import grouped_auroc_and_average_precision
from mechlingo.kernels.ranking import lape

__all__ = [
    "NeuronScores",
    "Pool",
    "ScoreName",
    "collect_neuron_stats",
    "encode_sentences",
    "score_neurons",
]

Pool = Literal["mean", "max"]
ScoreName = Literal["auroc", "ap", "lape"]


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
    intervention: Intervention | None = None,
    **options: Unpack[PoolArgs],
) -> NeuronStats:
    """Pooled activations of every MLP neuron over every sentence, in one pass.

    Under ``torchrun`` every rank returns what one process computes on all sentences.

    Args:
        model: a TransformerLens model.
        texts: ``{lang: [sentence, ...]}``; sentences of one language are the positives of
            that language and negatives of every other. At least two languages are needed
            to score neurons later.
        intervention: optional intervention applied during the runs.
        **options: how sentences are pooled (:class:`~mechlingo.activations.pooled.PoolArgs`:
            ``pool``, ``layers``, ``batch_size``, ``max_tokens``, ``progress``, and out of core
            ``store`` and ``max_memory``), as :func:`~mechlingo.activations.pooled.pooled_neuron_acts`
            takes and describes them.

    Returns:
        :class:`NeuronStats` on the model's device.
    """
    langs = check_texts(texts, 1, error=ExpertError)
    sm = site_map(model)
    if not sm.available["mlp_post"]:
        why = sm.why_unavailable.get("mlp_post", "it has no blocks.{l}.mlp.hook_post hooks")
        raise ExpertError(f"this model has no MLP neuron site (mlp_post): {why}")
    extra = intervention_hooks(model, intervention)
    try:
        acts = pooled_neuron_acts(
            model, {lang: texts[lang] for lang in langs}, fwd_hooks=extra, **options
        )
    except ValueError as err:  # a bad pool, batch size or layer, as an ExpertError
        raise ExpertError(str(err)) from err
    return acts


# --------------------------------------------------------------------------------------
# scores
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
