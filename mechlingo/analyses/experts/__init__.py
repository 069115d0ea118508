"""Expert (language-specific) MLP neurons: statistics, selection and the k curve (Sundar et al.,
ACL 2025, after Suau et al. and Kojima et al.), in three modules:

1. :mod:`~mechlingo.analyses.experts.stats` -- :func:`collect_neuron_stats` pools every
   ``mlp_post`` neuron over each sentence's real tokens; :func:`score_neurons` scores every
   neuron, one language against the rest (AUROC, average precision, LAPE);
2. :mod:`~mechlingo.analyses.experts.selection` -- :class:`ExpertResult`: the top ``k``
   neurons of a language, their overlaps, and the clamp to their mean (or median) pooled
   activation (:meth:`~ExpertResult.random_clamp`: the control); :func:`find_experts` does 1-2;
3. :mod:`~mechlingo.analyses.experts.kcurve` -- :func:`k_curve` (target-language rate of text
   sampled from BOS and held-out perplexity per ``k``) and :func:`choose_k` (the papers' rule
   within :data:`PPL_BUDGET`).

For gated MLPs the neuron is the down projection's input (``docs/models.md``); mixture-of-experts
models are refused. The method: ``docs/methods/expert-neurons.md``."""

from mechlingo.activations.pooled import NeuronStats
from mechlingo.analyses.experts.kcurve import (
    NEUTRAL_PROMPTS,
    PPL_BUDGET,
    KCurve,
    KCurveOptions,
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
    "KCurveOptions",
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
