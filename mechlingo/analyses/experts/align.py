"""Sentence embeddings, cross-lingual distances and retrieval (Sundar et al., ACL 2025).

A sentence embedding is the mean of a layer's ``resid_post`` over the sentence's real tokens
(BOS and padding excluded); :func:`embed_parallel` computes it for every chosen layer in one
forward per batch, on parallel sentences (line ``i`` is the same sentence in every language).
On cosine similarity, batched over languages and layers:

* :func:`distances` -- mean cosine distance between translations, to the medoid, to a target
  language, and same- vs different-sentence (``centre=True`` subtracts the mean embedding
  first: on this model a few residual dimensions make every raw cosine close to 1);
* :func:`retrieval` -- for every ordered language pair, the share of sentences whose nearest
  neighbour in the other language is its translation (chance ``1 / n_sentences``);
* :func:`compare_alignment` -- both, before and after an intervention (an expert clamp), per
  layer. The method and results: ``docs/methods/expert-neurons.md``."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float
from torch import Tensor

from mechlingo.activations.pooled import (
    PoolPass,
    check_texts,
    encode_sentences,
    output_device,
    pool_activations,
)
from mechlingo.core.defaults import BATCH_SIZE, PROGRESS, SEED
from mechlingo.core.distributed import gather_lists, scoring_sharded, shard_by_cost
from mechlingo.core.errors import MechlingoError
from mechlingo.core.sites import hook_name, resolve_layers
from mechlingo.core.tokens import TokenBatch, sorted_batches
from mechlingo.core.types import Model
from mechlingo.interventions import Intervention, intervention_hooks
from mechlingo.kernels.significance import bootstrap_mean, paired_gain, wilson
from mechlingo.viz.align import pca_figure, retrieval_heatmaps, retrieval_per_layer_figure
from mechlingo.viz.common import html_summary

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go


class AlignmentError(MechlingoError, ValueError):
    """Bad input to an embedding-space measurement (the message says what to change)."""


# Elements of the [layer, lang, lang, n, n] similarity block processed at once by retrieval.
_RETRIEVAL_CHUNK_ELEMENTS = 1 << 25


def check_parallel(texts: Mapping[str, Sequence[str]], min_langs: int = 1) -> list[str]:
    """Languages of a parallel corpus, after checking it is usable
    (:func:`mechlingo.activations.pooled.check_texts` with ``parallel=True``).

    Raises:
        AlignmentError: fewer than ``min_langs`` languages, a language with no sentences,
            different sentence counts, or an empty sentence.
    """
    return check_texts(texts, min_langs, parallel=True, error=AlignmentError)


def drop_empty_lines(texts: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """Keep only the lines that are non-empty in every language (keeps the alignment)."""
    langs = list(texts)
    n = min(len(texts[lang]) for lang in langs)
    keep = [i for i in range(n) if all(texts[lang][i].strip() for lang in langs)]
    return {lang: [texts[lang][i] for i in keep] for lang in langs}


@dataclass
class Embeddings:
    """Sentence embeddings of a parallel corpus.

    Attributes:
        emb: ``[layer, lang, sentence, d_model]`` float32; ``emb[l, a, i]`` is the mean
            residual stream after block ``layers[l]`` over sentence ``i`` of language
            ``langs[a]``.
        langs: language codes.
        layers: block indices of the first axis.
    """

    emb: Float[Tensor, "layer lang sentence d_model"]
    langs: list[str]
    layers: list[int]

    def layer_slot(self, layer: int | None) -> int:
        """Index along the first axis of a block index (``None`` = the last recorded)."""
        if layer is None:
            return len(self.layers) - 1
        n = max(self.layers) + 1
        if layer < 0:
            layer += n
        if layer not in self.layers:
            raise AlignmentError(f"layer {layer} was not embedded; have {self.layers}")
        return self.layers.index(layer)


def embed_parallel(
    model: Model,
    texts: Mapping[str, Sequence[str]],
    *,
    layers: int | Sequence[int] | str | None = None,
    intervention: Intervention | None = None,
    batch_size: int = BATCH_SIZE,
    max_tokens: int | None = None,
    progress: bool = PROGRESS,
) -> Embeddings:
    """Mean-pooled residual-stream embeddings of every sentence at the chosen layers.

    Args:
        texts: ``{lang: [sentence, ...]}``, line-aligned.
        layers: ``None`` (default) = the final layer; ``"all"`` = every layer in one pass; an
            int or list of ints (negative counts from the end).
        intervention: applied during the runs (anything with ``fwd_hooks(model)``).
        max_tokens: keep only the first ``max_tokens`` tokens of each sentence.
    """
    langs = check_parallel(texts)
    if layers is None:
        layer_list = resolve_layers(model, -1)
    elif layers == "all":
        layer_list = resolve_layers(model, None)
    elif isinstance(layers, str):
        raise AlignmentError(f"layers must be None, 'all', an int or a list, got {layers!r}")
    else:
        layer_list = resolve_layers(model, layers)
    names = [hook_name(model, "resid_post", layer) for layer in layer_list]
    sentences = [s for lang in langs for s in texts[lang]]
    batch = encode_sentences(model, sentences, max_tokens=max_tokens, error=AlignmentError)
    extra = intervention_hooks(model, intervention)

    def pooled(rows: TokenBatch) -> Tensor:
        run = PoolPass(batch_size=batch_size, progress=progress, desc="embedding")
        return pool_activations(model, rows, names, int(model.cfg.d_model), run,
                                fwd_hooks=extra, error=AlignmentError)  # fmt: skip

    if scoring_sharded():
        out = _pooled_sharded(batch, batch_size, pooled).to(output_device(model))
    else:
        out = pooled(batch)
    # [sentence, layer, d] -> [layer, lang, sentence, d]
    emb = out.transpose(0, 1).unflatten(1, (len(langs), len(texts[langs[0]]))).contiguous()
    return Embeddings(emb, langs, layer_list)


def _pooled_sharded(
    batch: TokenBatch, batch_size: int, pooled: Callable[[TokenBatch], Tensor]
) -> Float[Tensor, "row layer d"]:
    """``pooled(batch)`` with its batches of similar lengths shared out among the ranks by
    cost (inside :func:`~mechlingo.core.distributed.sharded_scoring` under torchrun):
    each rank pools whole batches of the one-process run and every rank gets every row."""
    groups = sorted_batches(batch.lengths, batch_size)
    cost = [len(g) * max(int(batch.lengths[r]) for r in g) for g in groups]
    rows = sorted(r for i in shard_by_cost(cost) for r in groups[i])
    part = pooled(batch.select(rows)).cpu() if rows else None
    out: Tensor | None = None
    for got_rows, got in gather_lists([(rows, part)]):
        if got is None:
            continue
        if out is None:
            out = torch.zeros(batch.batch_size, *got.shape[1:], dtype=got.dtype)
        out[torch.as_tensor(got_rows, dtype=torch.long)] = got
    if out is None:
        raise AlignmentError("no sentences to embed")
    return out


def _normed(x: Float[Tensor, "*lead lang n d"], centre: bool) -> Float[Tensor, "*lead lang n d"]:
    if centre:
        x = x - x.mean(dim=(-3, -2), keepdim=True)
    return torch.nn.functional.normalize(x.double(), dim=-1)


def retrieval(
    emb: Float[Tensor, "*layer lang n d"], *, centre: bool = False
) -> Float[Tensor, "*layer lang lang"]:
    """Top-1 retrieval accuracy for every ordered language pair.

    ``out[..., a, b]`` is the fraction of sentences ``i`` of language ``a`` whose most similar
    (cosine) sentence among all sentences of language ``b`` is sentence ``i`` (its
    translation). The diagonal (``a == b``) is 1 by construction. Chance level is ``1/n``.
    A leading layer axis is optional; all pairs and layers are computed with batched matmuls
    (chunked over layers to bound memory). ``centre``: subtract the mean embedding (over all
    languages and sentences of that layer) first.
    """
    if emb.ndim < 3:
        raise AlignmentError(f"expected [*layer, lang, n, d] embeddings, got {tuple(emb.shape)}")
    squeeze = emb.ndim == 3
    x = emb.unsqueeze(0) if squeeze else emb.reshape(-1, *emb.shape[-3:])
    n_l, n_a, n, _ = x.shape
    per_layer = n_a * n_a * n * n
    step = max(1, _RETRIEVAL_CHUNK_ELEMENTS // max(per_layer, 1))
    parts = []
    target = torch.arange(n, device=x.device)
    for i in range(0, n_l, step):
        xn = _normed(x[i : i + step], centre)
        sims = torch.einsum("lain,lbjn->labij", xn, xn)
        hit = sims.argmax(-1) == target
        parts.append(hit.double().mean(-1))
    out = torch.cat(parts)
    return out[0] if squeeze else out.reshape(*emb.shape[:-3], n_a, n_a)


def retrieval_hits(emb: Float[Tensor, "lang n d"], *, centre: bool = False) -> Tensor:
    """``hits[a, b, i]``: whether sentence ``i`` of language ``a`` retrieves its translation
    as the nearest neighbour (cosine) among the sentences of ``b`` (one layer). The mean over
    ``i`` is :func:`retrieval`; per-query hits are what bootstrap intervals resample."""
    if emb.ndim != 3:
        raise AlignmentError(f"expected [lang, n, d] embeddings, got {tuple(emb.shape)}")
    xn = _normed(emb, centre)
    sims = torch.einsum("ain,bjn->abij", xn, xn)
    return sims.argmax(-1) == torch.arange(emb.shape[1], device=emb.device)


def per_sentence(
    emb: Float[Tensor, "lang n d"],
    langs: Sequence[str],
    *,
    target: str | None = None,
    centre: bool = False,
) -> dict[str, Float[Tensor, " n"]]:
    """Per-sentence values whose means are the headline measurements of one layer, for
    bootstrap intervals over sentences:

    * ``retrieval``: fraction of ordered pairs ``a -> b`` (``a != b``) where sentence ``i`` of
      ``a`` retrieves its translation (the mean over ``i`` is the mean off-diagonal top-1);
    * ``between_languages``: mean cosine distance between sentence ``i`` in two languages,
      over pairs ``a != b``;
    * ``to_medoid``: mean distance of sentence ``i`` (every language) to the medoid of all
      embeddings of this space;
    * with a ``target``: ``to_target`` (mean distance of sentence ``i`` in every other
      language to its translation in the target) and ``retrieval_to_target`` (fraction of
      other languages whose sentence ``i`` retrieves its translation among the target's).
    """
    n_a = emb.shape[0]
    if len(langs) != n_a:
        raise AlignmentError(f"{len(langs)} language names for {n_a} languages of embeddings")
    if n_a < 2:
        raise AlignmentError("per-sentence measurements need at least two languages")
    off = ~torch.eye(n_a, dtype=torch.bool, device=emb.device)
    hits = retrieval_hits(emb, centre=centre).double()
    out = {"retrieval": hits[off].mean(0)}
    xn = _normed(emb, centre)
    same = torch.einsum("ain,bin->abi", xn, xn)  # cos(sentence i in a, sentence i in b)
    out["between_languages"] = (1 - same[off]).mean(0)
    flat = xn.reshape(-1, xn.shape[-1])
    medoid = flat[(1 - flat @ flat.T).sum(1).argmin()]
    out["to_medoid"] = (1 - xn @ medoid).mean(0)
    if target is not None:
        t = list(langs).index(target)
        rest = [a for a in range(n_a) if a != t]
        out["to_target"] = (1 - same[rest, t]).mean(0)
        out["retrieval_to_target"] = hits[rest, t].mean(0)
    return {k: v.float() for k, v in out.items()}


@dataclass
class Distances:
    """Mean cosine distances (``1 - cos``) in one embedding space.

    Attributes:
        between: ``[lang, lang]`` mean distance between sentence ``i`` of ``a`` and sentence
            ``i`` of ``b`` (same sentence, two languages).
        different: ``[lang, lang]`` mean distance between sentence ``i`` of ``a`` and
            sentence ``j != i`` of ``b`` (different sentences): the baseline that
            ``between`` should be well below if the space encodes meaning across languages.
        to_medoid: ``[lang]`` mean distance of a language's sentences to the medoid of all
            embeddings (the embedding with the smallest total distance to all others).
        to_target: ``[lang]`` ``between[:, target]``, or None without a target.
    """

    langs: list[str]
    between: Float[Tensor, "lang lang"]
    different: Float[Tensor, "lang lang"]
    to_medoid: Float[Tensor, " lang"]
    to_target: Float[Tensor, " lang"] | None
    target: str | None
    centred: bool

    def summary(self) -> dict[str, Any]:
        """``between_languages`` (mean over pairs a != b), ``different_sentences`` (same
        pairs, different sentences), ``ratio`` (between / different: < 1 means translations
        are closer than unrelated sentences), ``to_medoid`` and ``to_target`` (mean over
        languages other than the target)."""
        n = len(self.langs)
        off = ~torch.eye(n, dtype=torch.bool, device=self.between.device)
        between = float(self.between[off].mean()) if n > 1 else math.nan
        diff = float(self.different[off].mean()) if n > 1 else math.nan
        out: dict[str, Any] = {
            "between_languages": between,
            "different_sentences": diff,
            "ratio": between / diff if diff else math.nan,
            "to_medoid": float(self.to_medoid.mean()),
            "centred": self.centred,
        }
        if self.to_target is not None and self.target is not None:
            t = self.langs.index(self.target)
            others = [i for i in range(n) if i != t]
            out["to_target"] = float(self.to_target[others].mean()) if others else math.nan
            out["target"] = self.target
        return out


def distances(
    emb: Float[Tensor, "lang n d"],
    langs: Sequence[str],
    *,
    target: str | None = None,
    centre: bool = False,
) -> Distances:
    """Cosine distances of one layer's parallel embeddings (see :class:`Distances`)."""
    if emb.ndim != 3:
        raise AlignmentError(f"expected [lang, n, d] embeddings, got {tuple(emb.shape)}")
    n_a, n, _ = emb.shape
    if len(langs) != n_a:
        raise AlignmentError(f"{len(langs)} language names for {n_a} languages of embeddings")
    if target is not None and target not in langs:
        raise AlignmentError(f"target {target!r} is not among the languages {list(langs)}")
    xn = _normed(emb, centre)
    gram = torch.einsum("ain,bjn->abij", xn, xn)  # [a, b, i, j]
    same = torch.diagonal(gram, dim1=-2, dim2=-1)  # [a, b, i]
    between = 1 - same.mean(-1)
    if n > 1:
        different = 1 - (gram.sum((-2, -1)) - same.sum(-1)) / (n * (n - 1))
    else:
        different = torch.full_like(between, math.nan)
    flat = xn.reshape(n_a * n, -1)
    dist_all = 1 - flat @ flat.T
    medoid = flat[dist_all.sum(1).argmin()]
    to_medoid = (1 - xn @ medoid).mean(-1)
    to_target = between[:, list(langs).index(target)] if target is not None else None
    return Distances(
        list(langs),
        between.float(),
        different.float(),
        to_medoid.float(),
        None if to_target is None else to_target.float(),
        target,
        centre,
    )


def pca_2d(emb: Float[Tensor, "lang n d"]) -> Float[Tensor, "lang n 2"]:
    """Coordinates on the first two principal components of all embeddings (centred)."""
    a, n, d = emb.shape
    x = emb.reshape(a * n, d).double()
    x = x - x.mean(0)
    _, _, v = torch.linalg.svd(x, full_matrices=False)
    return (x @ v[:2].T).float().reshape(a, n, 2)


@dataclass
class AlignmentComparison:
    """Embedding-space measurements before and after an intervention, per layer.

    Attributes:
        pre, post: the embeddings (post is None without an intervention).
        retrieval_pre, retrieval_post: ``[layer, lang, lang]`` top-1 accuracy of
            ``a -> b`` (see :func:`retrieval`).
        target: the intervention's target language (for the ``to_target`` distance).
        centre: whether distances and retrieval were computed after centring.
        control, retrieval_control: the same under the control intervention (e.g. the
            random-neuron clamp of the same size and values), or None.

    Arms are named ``"pre"``, ``"post"`` and ``"control"`` everywhere.
    """

    pre: Embeddings
    post: Embeddings | None
    retrieval_pre: Float[Tensor, "layer lang lang"]
    retrieval_post: Float[Tensor, "layer lang lang"] | None
    target: str | None = None
    centre: bool = False
    meta: dict[str, Any] = field(default_factory=dict)
    control: Embeddings | None = None
    retrieval_control: Float[Tensor, "layer lang lang"] | None = None

    @property
    def langs(self) -> list[str]:
        return self.pre.langs

    @property
    def layers(self) -> list[int]:
        return self.pre.layers

    def _arm(self, which: str) -> tuple[Embeddings | None, Tensor | None]:
        arms = {
            "pre": (self.pre, self.retrieval_pre),
            "post": (self.post, self.retrieval_post),
            "control": (self.control, self.retrieval_control),
        }
        if which not in arms:
            raise AlignmentError(f"unknown arm {which!r}; use 'pre', 'post' or 'control'")
        return arms[which]

    def arms(self) -> list[str]:
        """The arms measured here, of ``pre``, ``post`` and ``control``."""
        return [a for a in ("pre", "post", "control") if self._arm(a)[0] is not None]

    def distances(self, which: str = "pre", layer: int | None = None) -> Distances:
        emb = self._arm(which)[0]
        if emb is None:
            raise AlignmentError(f"no {which!r} embeddings in this comparison")
        return distances(
            emb.emb[emb.layer_slot(layer)], emb.langs, target=self.target, centre=self.centre
        )

    def pair_accuracy(self, which: str = "pre", layer: int | None = None) -> dict[str, float]:
        """``{"a->b": top-1}`` for every ordered pair of different languages."""
        r = self._arm(which)[1]
        if r is None:
            raise AlignmentError(f"no {which!r} retrieval in this comparison")
        m = r[self.pre.layer_slot(layer)]
        return {
            f"{a}->{b}": float(m[i, j])
            for i, a in enumerate(self.langs)
            for j, b in enumerate(self.langs)
            if i != j
        }

    def summary(self, layer: int | None = None) -> dict[str, Any]:
        """The CLI's ``summary.json`` core, each keyed by arm (``pre``, ``post``,
        ``control``): retrieval top-1 per ordered pair and distances at ``layer`` (default the
        last embedded), and mean off-diagonal retrieval per layer."""
        out: dict[str, Any] = {
            "layer": self.layers[self.pre.layer_slot(layer)],
            "retrieval_top1": {},
            "distance": {},
            "retrieval_mean_per_layer": {},
            "centred": self.centre,
            "n_sentences": int(self.pre.emb.shape[2]),
        }
        for arm in self.arms():
            r = self._arm(arm)[1]
            assert r is not None
            out["retrieval_top1"][arm] = self.pair_accuracy(arm, layer)
            out["distance"][arm] = self.distances(arm, layer).summary()
            out["retrieval_mean_per_layer"][arm] = _mean_offdiag(r, self.layers)
        return out

    def intervals(self, layer: int | None = None, *, seed: int = SEED) -> dict[str, Any]:
        """Bootstrap 95% intervals over sentences (``scipy.stats.bootstrap``) at ``layer``.

        ``measures[m][arm]``: the mean of :func:`per_sentence` value ``m`` (``retrieval``,
        ``between_languages``, ``to_medoid`` and, with a target, ``to_target`` and
        ``retrieval_to_target``) with its interval. ``gains[m]``: paired differences over the
        same sentences (:func:`mechlingo.kernels.significance.paired_gain`): ``post_vs_pre``,
        ``post_vs_control`` and ``control_vs_pre`` (for distances a negative gain means closer).
        ``pairs[arm][a->b]``: Wilson interval of each ordered pair's top-1. Every interval is
        an :class:`~mechlingo.kernels.significance.Interval` as JSON (``estimate``, ``lo``,
        ``hi``, ``n``, ``confidence``; a gain also ``base``, ``new``, ``relative``).

        Retrieval intervals resample the query sentences with the candidate pool fixed; the
        medoid is fixed per arm. They say how much the numbers would move on another sample
        of sentences of the same kind, not on another model or corpus.
        """

        arms = self.arms()
        vals: dict[str, dict[str, Tensor]] = {}
        pairs: dict[str, dict[str, Any]] = {}
        for arm in arms:
            emb = self._arm(arm)[0]
            assert emb is not None
            x = emb.emb[emb.layer_slot(layer)]
            vals[arm] = per_sentence(x, self.langs, target=self.target, centre=self.centre)
            hits = retrieval_hits(x, centre=self.centre)
            pairs[arm] = {
                f"{a}->{b}": wilson(int(hits[i, j].sum()), int(hits.shape[-1])).to_json()
                for i, a in enumerate(self.langs)
                for j, b in enumerate(self.langs)
                if i != j
            }
        measures = {
            m: {
                arm: bootstrap_mean(vals[arm][m].cpu().numpy(), seed=seed).to_json() for arm in arms
            }
            for m in vals["pre"]
        }
        comparisons = [("post_vs_pre", "pre", "post"), ("post_vs_control", "control", "post")]
        comparisons.append(("control_vs_pre", "pre", "control"))
        gains = {
            m: {
                name: paired_gain(
                    vals[a][m].cpu().numpy(), vals[b][m].cpu().numpy(), seed=seed
                ).to_json()
                for name, a, b in comparisons
                if a in vals and b in vals
            }
            for m in measures
        }
        return {
            "layer": self.layers[self.pre.layer_slot(layer)],
            "unit": "sentence",
            "n_sentences": int(self.pre.emb.shape[2]),
            "measures": measures,
            "gains": gains,
            "pairs": pairs,
        }

    def to_dataframe(self) -> pd.DataFrame:
        """One row per (layer, query lang, candidate lang): top-1 of every arm."""
        import pandas as pd

        rows = []
        for s, layer in enumerate(self.layers):
            for i, a in enumerate(self.langs):
                for j, b in enumerate(self.langs):
                    if i == j:
                        continue
                    row = {"layer": layer, "query": a, "candidates": b}
                    for arm in self.arms():
                        r = self._arm(arm)[1]
                        assert r is not None
                        row[f"top1_{arm}"] = float(r[s, i, j])
                    rows.append(row)
        return pd.DataFrame(rows)

    def __repr__(self) -> str:
        arms = ["pre"] + (["post"] if self.post is not None else [])
        arms += ["control"] if self.control is not None else []
        return (
            f"AlignmentComparison({len(self.langs)} languages, {int(self.pre.emb.shape[2])} "
            f"sentences each, {len(self.layers)} layers, arms {arms})"
        )

    def _repr_html_(self) -> str:
        """Per arm the mean cross-language top-1 retrieval at the last layer, with n."""
        per = self.summary()["retrieval_mean_per_layer"]
        n = int(self.pre.emb.shape[2])
        rows = [{"arm": arm, "layer": max(v, key=int), "mean top-1 retrieval": v[max(v, key=int)],
                 "sentences per language": n} for arm, v in per.items()]  # fmt: skip
        return html_summary(repr(self), rows)

    def fig_retrieval(self, layer: int | None = None) -> go.Figure:
        """Top-1 retrieval heatmaps at ``layer`` (default the last): before, after and their
        difference."""
        s = self.pre.layer_slot(layer)
        post = None if self.retrieval_post is None else self.retrieval_post[s]
        n = int(self.pre.emb.shape[2])
        return retrieval_heatmaps(self.retrieval_pre[s], post, self.langs, self.layers[s], n)

    def fig_layers(self) -> go.Figure:
        """Mean cross-language top-1 retrieval per layer, per arm."""
        return retrieval_per_layer_figure(
            self.summary()["retrieval_mean_per_layer"], int(self.pre.emb.shape[2])
        )

    def fig_pca(self, layer: int | None = None) -> go.Figure:
        """Sentence embeddings at ``layer`` on their first two principal components, before
        and after (each with its own PCA)."""
        s = self.pre.layer_slot(layer)
        pre = pca_2d(self.pre.emb[s])
        post = None if self.post is None else pca_2d(self.post.emb[s])
        return pca_figure(pre, post, self.langs, self.layers[s])


def _mean_offdiag(r: Float[Tensor, "layer lang lang"], layers: Sequence[int]) -> dict[str, float]:
    n = r.shape[-1]
    if n < 2:
        return {str(layer): math.nan for layer in layers}
    off = ~torch.eye(n, dtype=torch.bool, device=r.device)
    vals = r[:, off].mean(-1)
    return {str(layer): float(v) for layer, v in zip(layers, vals, strict=True)}


def compare_alignment(
    model: Model,
    texts: Mapping[str, Sequence[str]],
    intervention: Intervention | None = None,
    *,
    control: Intervention | None = None,
    layers: int | Sequence[int] | str | None = "all",
    target: str | None = None,
    centre: bool = False,
    batch_size: int = BATCH_SIZE,
    max_tokens: int | None = None,
    progress: bool = PROGRESS,
) -> AlignmentComparison:
    """Embed parallel sentences without and with ``intervention`` and measure retrieval (all
    embedded layers) and distances (on demand, per layer), and under ``control`` (e.g. the
    random-neuron clamp of the same size) when given; the ``pre`` pass is shared.
    ``target``: the language the intervention steers to (for the ``to_target`` distance;
    read from the clamp's metadata when not given)."""
    check_parallel(texts, 2)
    if target is not None and target not in texts:
        raise AlignmentError(f"target {target!r} is not among the languages {list(texts)}")
    if target is None and intervention is not None:
        target = (getattr(intervention, "meta", {}) or {}).get("build", {}).get("lang")
        if target is not None and target not in texts:
            target = None  # the clamp's own language is not in this data: no to-target
    kw = dict(layers=layers, batch_size=batch_size, max_tokens=max_tokens, progress=progress)
    pre = embed_parallel(model, texts, **kw)
    post = (
        embed_parallel(model, texts, intervention=intervention, **kw)
        if intervention is not None
        else None
    )
    ctl = embed_parallel(model, texts, intervention=control, **kw) if control is not None else None
    r_pre = retrieval(pre.emb, centre=centre)
    r_post = retrieval(post.emb, centre=centre) if post is not None else None
    r_ctl = retrieval(ctl.emb, centre=centre) if ctl is not None else None
    return AlignmentComparison(
        pre, post, r_pre, r_post, target, centre, control=ctl, retrieval_control=r_ctl
    )


__all__ = [
    "AlignmentComparison",
    "AlignmentError",
    "Distances",
    "Embeddings",
    "check_parallel",
    "compare_alignment",
    "distances",
    "drop_empty_lines",
    "embed_parallel",
    "pca_2d",
    "per_sentence",
    "retrieval",
    "retrieval_hits",
]
