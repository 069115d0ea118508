"""Expert (language-specific) MLP neurons: statistics, selection and the k curve.

Method (Sundar et al., ACL 2025, after Suau et al. and Kojima et al.; the method page is
``docs/methods/expert-neurons.md``), in three modules:

1. :mod:`~mechlingo.analyses.experts.stats` -- :func:`collect_neuron_stats` pools every
   ``mlp_post`` neuron over the real tokens of sentences of every language (mean or max; BOS
   and padding excluded) in one pass, and :func:`score_neurons` scores every neuron at once,
   one language against the rest: AUROC, average precision and LAPE.
2. :mod:`~mechlingo.analyses.experts.selection` -- :class:`ExpertResult` chooses the top
   ``k`` neurons of a language (:meth:`~ExpertResult.top`), their overlap between languages
   and count per layer, and the clamp: an intervention that sets each of them, at every
   position, to its mean (or median) pooled activation over that language's sentences, with
   :meth:`~ExpertResult.random_clamp` (the same values on ``k`` random other neurons) as the
   control. :func:`find_experts` runs 1 and 2 in one call.
3. :mod:`~mechlingo.analyses.experts.kcurve` -- :func:`k_curve` measures, for each ``k``, how
   often text sampled from a bare BOS prompt is in the target language with the clamp on, and
   the held-out perplexity of every language, against the random control and no clamp;
   :func:`choose_k` picks ``k`` by the papers' rule (the highest target rate within a
   perplexity budget, :data:`PPL_BUDGET`); never by retrieval.

A feature index ``f`` of the flattened neuron axis is neuron ``f % d_mlp`` of layer
``layers[f // d_mlp]``.

For gated MLPs (Llama, Gemma, Qwen, Cohere, ...) the neuron is the input of the down
projection, ``act(gate(x)) * up(x)``, not the gate alone: it is what multiplies the neuron's
row of the down projection, so a clamp on it sets exactly that neuron's contribution to the
residual stream, and it is the same place as a plain MLP's ``act(in(x))``. The ``> 0`` firing
rate behind LAPE is then the sign of the product (``docs/models.md``). Mixture-of-experts
models have no single neuron layer and are refused.

The language-model helpers the k curve uses live with the other general helpers:
:func:`mechlingo.activations.likelihood.line_nll` and ``perplexity``,
:func:`mechlingo.activations.likelihood.sample_from_bos` and
:func:`mechlingo.data.langid.identify_languages`.
"""

from mechlingo.activations.pooled import NeuronStats
from mechlingo.analyses.experts.kcurve import (
    NEUTRAL_PROMPTS,
    PPL_BUDGET,
    KCurve,
    OthersRule,
    choose_k,
    k_curve,
)
from mechlingo.analyses.experts.selection import (
    ExpertResult,
    find_experts,
    load_clamp,
    make_clamp,
)
from mechlingo.analyses.experts.stats import (
    NeuronScores,
    Pool,
    ScoreName,
    collect_neuron_stats,
    encode_sentences,
    score_neurons,
)
from mechlingo.core.errors import ExpertError

__all__ = [
    "NEUTRAL_PROMPTS",
    "PPL_BUDGET",
    "ExpertError",
    "ExpertResult",
    "KCurve",
    "NeuronScores",
    "NeuronStats",
    "OthersRule",
    "Pool",
    "ScoreName",
    "choose_k",
    "collect_neuron_stats",
    "encode_sentences",
    "find_experts",
    "k_curve",
    "load_clamp",
    "make_clamp",
    "score_neurons",
]
