"""Expert neurons, part 2: choosing expert sets and the clamp that sets them.

:meth:`ExpertResult.clamp` keeps the top ``k`` neurons of a language and returns an
intervention that sets each of them, at every position, to its mean (or median) pooled
activation over that language's sentences. :meth:`ExpertResult.random_clamp` is the control:
the same values written to ``k`` random other neurons. :meth:`ExpertResult.overlap` and
:meth:`ExpertResult.layer_counts` describe the sets (shared neurons between languages, experts
per layer). :func:`find_experts` runs the statistics and the scores in one call.

A feature index ``f`` of the flattened neuron axis is neuron ``f % d_mlp`` of layer
``layers[f // d_mlp]``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Unpack

import torch
from jaxtyping import Float, Int
from torch import Tensor

from mechlingo.activations.pooled import NeuronStats, PoolArgs, check_texts
from mechlingo.analyses.experts.stats import (
    NeuronScores,
    ScoreName,
    collect_neuron_stats,
    score_neurons,
)
from mechlingo.core.defaults import SEED
from mechlingo.core.errors import ExpertError
from mechlingo.core.types import Model
from mechlingo.interventions import Intervention, NeuronClamp, load_intervention
from mechlingo.kernels.ranking import feature_mean, feature_median, top_k_per_language
from mechlingo.viz.common import html_summary
from mechlingo.viz.experts import experts_per_layer_figure, overlap_figure

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

__all__ = ["ExpertResult", "find_experts", "load_clamp", "make_clamp"]


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
        seed: int = SEED,
        by: ScoreName | None = None,
        positions: str = "all_with_bos",
        layer_matched: bool = False,
    ) -> NeuronClamp:
        """Control: the values of :meth:`clamp` written to ``k`` random neurons that are not
        among the ``k`` experts (same size, same values; :meth:`random_features`)."""
        feats = self.top(lang, k, by)
        vals = self.clamp_values(lang, feats, value)
        pick = self.random_features(lang, k, seed=seed, by=by, layer_matched=layer_matched)
        layers, neurons = self.stats.locate(pick)
        meta = self._meta(lang, k, value, control=True, seed=seed, layer_matched=layer_matched)
        return make_clamp(layers, neurons, vals, meta, positions)

    def random_features(
        self,
        lang: str,
        k: int,
        *,
        seed: int = SEED,
        by: ScoreName | None = None,
        layer_matched: bool = False,
    ) -> Int[Tensor, " k"]:
        """``k`` random non-expert neurons (feature indices, seeded): uniform over the model,
        or with ``layer_matched`` as many in each layer as the top-``k`` experts of ``lang``
        have there (the i-th expert's layer gives the i-th draw's, so values written in
        :meth:`random_clamp` go to the same layers).

        Raises:
            ExpertError: too few non-expert neurons (in a layer, when matched)."""
        feats = self.top(lang, k, by).cpu()
        n = self.stats.n_features
        if 2 * k > n:
            raise ExpertError(f"k={k} leaves too few non-expert neurons ({n - k}) for a control")
        gen = torch.Generator().manual_seed(seed)
        is_expert = torch.zeros(n, dtype=torch.bool)
        is_expert[feats] = True
        if not layer_matched:
            pool_idx = (~is_expert).nonzero().flatten()
            return pool_idx[torch.randperm(pool_idx.numel(), generator=gen)[:k]]
        layer_of = torch.as_tensor(self.stats.locate(torch.arange(n))[0])
        want = torch.as_tensor(self.stats.locate(feats)[0])
        pick = torch.empty(len(feats), dtype=torch.long)
        for layer in want.unique():
            slots = (want == layer).nonzero().flatten()
            pool_idx = ((layer_of == layer) & ~is_expert).nonzero().flatten()
            if pool_idx.numel() < len(slots):
                raise ExpertError(f"layer {int(layer)} has too few non-expert neurons for a "
                                  "layer-matched control", fix="use a smaller k")  # fmt: skip
            pick[slots] = pool_idx[torch.randperm(pool_idx.numel(), generator=gen)[: len(slots)]]
        return pick

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

    def __repr__(self) -> str:
        n = int(self.neuron_scores.auroc.shape[-1])
        return f"ExpertResult({len(self.langs)} languages {self.langs}, {n} neurons, by {self.by})"

    def _repr_html_(self) -> str:
        """Per language the best and the 10th AUROC and AP of its experts, and how many
        neurons pass AUROC 0.9."""
        s = self.summary(10)
        rows = [{"lang": lg, **v} for lg, v in s["per_lang"].items()]
        note = (
            f"mean overlap of top-10 sets between languages {s['mean_overlap_between_langs']:.3g}"
        )
        return html_summary(repr(self), rows, note)

    def fig_layers(self, k: int = 100) -> go.Figure:
        """Grouped bars: how many of each language's top-``k`` experts sit in each layer."""
        return experts_per_layer_figure(self.layer_counts(k), self.langs, self.stats.layers, k)

    def fig_overlap(self, k: int = 100) -> go.Figure:
        """Heatmap of the fraction of shared top-``k`` experts between languages."""
        return overlap_figure(self.overlap(k), self.langs, k)


def find_experts(
    model: Model,
    texts: Mapping[str, Sequence[str]],
    *,
    by: ScoreName = "auroc",
    **options: Unpack[PoolArgs],
) -> ExpertResult:
    """Collect statistics (:func:`collect_neuron_stats`, which takes the same ``options``:
    :class:`~mechlingo.activations.pooled.PoolArgs`) and score every neuron by ``by``
    (:func:`score_neurons`); select with :meth:`ExpertResult.clamp`. With ``store`` the
    statistics stay on disk under ``max_memory`` (see :func:`collect_neuron_stats`)."""
    check_texts(texts, 2, error=ExpertError)
    stats = collect_neuron_stats(model, texts, **options)
    return ExpertResult(stats, score_neurons(stats, max_memory=options.get("max_memory")), by)
