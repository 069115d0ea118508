"""Sentence embeddings, cross-lingual distances and retrieval (Sundar et al., ACL 2025).

A sentence embedding is the mean of a layer's residual stream (``resid_post``) over the
sentence's real tokens, BOS and padding excluded. :func:`embed_parallel` computes it for every
layer at once (one forward per batch, hooks on the chosen layers, stopped after the last one)
on parallel sentences (line ``i`` is the same sentence in every language).

Measurements (all on cosine similarity, batched over languages and layers):

* :func:`distances` -- mean cosine distance (``1 - cos``) between the same sentence in two
  languages, from each language to the medoid of all embeddings, to a target language, and
  the same-sentence vs different-sentence distance (is the space organised by meaning or by
  something shared by every sentence?). On this model a few residual dimensions dominate, so
  raw cosines are all close to 1; ``centre=True`` subtracts the mean embedding first.
* :func:`retrieval` -- for every ordered language pair ``a -> b``, the fraction of sentences
  of ``a`` whose nearest neighbour (cosine) among the sentences of ``b`` is its translation.
  Chance is ``1 / n_sentences``.
* :func:`compare_alignment` -- both, before and after an intervention (e.g. an expert clamp),
  per layer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from mechlingo.errors import MechlingoError
from mechlingo.runs import StopForward, run_batch
from mechlingo.sites import hook_name, resolve_layers
from mechlingo.tokens import encode, sorted_batches

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go


class AlignmentError(MechlingoError, ValueError):
    """Bad input to an embedding-space measurement (the message says what to change)."""


# Elements of the [layer, lang, lang, n, n] similarity block processed at once by retrieval.
_RETRIEVAL_CHUNK_ELEMENTS = 1 << 25


def check_parallel(texts: Mapping[str, Sequence[str]], min_langs: int = 1) -> list[str]:
    """Languages of a parallel corpus, after checking it is usable.

    Raises:
        AlignmentError: fewer than ``min_langs`` languages, a language with no sentences,
            different sentence counts, or an empty sentence.
    """
    if not isinstance(texts, Mapping):
        raise AlignmentError("texts must be a mapping {lang: [sentence, ...]}")
    langs = list(texts)
    if len(langs) < min_langs:
        raise AlignmentError(f"need at least {min_langs} languages, got {langs}")
    counts = {lang: len(texts[lang]) for lang in langs}
    empty = [lang for lang, n in counts.items() if n == 0]
    if empty:
        raise AlignmentError(f"language(s) {empty} have no sentences")
    if len(set(counts.values())) > 1:
        raise AlignmentError(f"parallel texts must have the same number of sentences: {counts}")
    for lang in langs:
        blank = [i for i, s in enumerate(texts[lang]) if not s.strip()]
        if blank:
            raise AlignmentError(
                f"{lang}: sentences {blank[:10]} are empty; drop those lines in every language"
            )
    return langs


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
    model: Any,
    texts: Mapping[str, Sequence[str]],
    *,
    layers: int | Sequence[int] | str | None = None,
    intervention: Any = None,
    batch_size: int = 16,
    max_tokens: int | None = None,
    progress: bool = False,
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
    batch = encode(model, sentences)
    if max_tokens is not None:
        if max_tokens < 1:
            raise AlignmentError(f"max_tokens must be >= 1, got {max_tokens}")
        keep = max_tokens + (1 if batch.has_bos else 0)
        batch.lengths = batch.lengths.clamp(max=keep)
        batch.prompt_lengths = batch.lengths.clone()
    if batch.has_bos and bool((batch.lengths < 2).any()):
        raise AlignmentError("some sentences tokenize to nothing but BOS")
    dev = model.W_U.device
    d = int(model.cfg.d_model)
    out = torch.empty(len(layer_list), len(sentences), d, dtype=torch.float32, device=dev)
    extra = list(intervention.fwd_hooks(model)) if intervention is not None else []
    state: dict[str, Tensor] = {}

    def make(slot: int) -> Any:
        last = slot == len(names) - 1

        def hook(t: Tensor, hook: Any) -> None:
            m = state["mask"].to(t.device)
            pooled = (t.float() * m[..., None]).sum(1) / m.sum(1, keepdim=True)
            out[slot, state["rows"].to(dev)] = pooled.to(dev)
            if last:
                raise StopForward

        return hook

    hooks = extra + [(n, make(i)) for i, n in enumerate(names)]
    for rows in tqdm(sorted_batches(batch.lengths, batch_size), "embedding", disable=not progress):
        sub = batch.select(rows)
        state["rows"] = torch.as_tensor(rows, dtype=torch.long)
        state["mask"] = sub.real_token_mask(include_bos=False).float()
        with torch.no_grad():
            run_batch(model, sub, hooks)
    n = len(texts[langs[0]])
    emb = out.reshape(len(layer_list), len(langs), n, d)
    return Embeddings(emb, langs, layer_list)


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
    """

    pre: Embeddings
    post: Embeddings | None
    retrieval_pre: Float[Tensor, "layer lang lang"]
    retrieval_post: Float[Tensor, "layer lang lang"] | None
    target: str | None = None
    centre: bool = False
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def langs(self) -> list[str]:
        return self.pre.langs

    @property
    def layers(self) -> list[int]:
        return self.pre.layers

    def distances(self, which: str = "pre", layer: int | None = None) -> Distances:
        emb = self.pre if which == "pre" else self.post
        if emb is None:
            raise AlignmentError("no post-intervention embeddings in this comparison")
        return distances(
            emb.emb[emb.layer_slot(layer)], emb.langs, target=self.target, centre=self.centre
        )

    def pair_accuracy(self, which: str = "pre", layer: int | None = None) -> dict[str, float]:
        """``{"a->b": top-1}`` for every ordered pair of different languages."""
        r = self.retrieval_pre if which == "pre" else self.retrieval_post
        if r is None:
            raise AlignmentError("no post-intervention retrieval in this comparison")
        m = r[self.pre.layer_slot(layer)]
        return {
            f"{a}->{b}": float(m[i, j])
            for i, a in enumerate(self.langs)
            for j, b in enumerate(self.langs)
            if i != j
        }

    def summary(self, layer: int | None = None) -> dict[str, Any]:
        """The CLI's ``summary.json`` core: retrieval top-1 and distances pre and post at
        ``layer`` (default the last embedded), and mean off-diagonal retrieval per layer."""
        out: dict[str, Any] = {
            "layer": self.layers[self.pre.layer_slot(layer)],
            "retrieval_top1": {"pre": self.pair_accuracy("pre", layer)},
            "distance": {"pre": self.distances("pre", layer).summary()},
            "retrieval_mean_per_layer": {"pre": _mean_offdiag(self.retrieval_pre, self.layers)},
            "centred": self.centre,
            "n_sentences": int(self.pre.emb.shape[2]),
        }
        if self.post is not None and self.retrieval_post is not None:
            out["retrieval_top1"]["post"] = self.pair_accuracy("post", layer)
            out["distance"]["post"] = self.distances("post", layer).summary()
            out["retrieval_mean_per_layer"]["post"] = _mean_offdiag(
                self.retrieval_post, self.layers
            )
        return out

    def to_dataframe(self) -> pd.DataFrame:
        """One row per (layer, query lang, candidate lang): top-1 pre and post."""
        import pandas as pd

        rows = []
        for s, layer in enumerate(self.layers):
            for i, a in enumerate(self.langs):
                for j, b in enumerate(self.langs):
                    if i == j:
                        continue
                    row = {"layer": layer, "query": a, "candidates": b}
                    row["top1_pre"] = float(self.retrieval_pre[s, i, j])
                    if self.retrieval_post is not None:
                        row["top1_post"] = float(self.retrieval_post[s, i, j])
                    rows.append(row)
        return pd.DataFrame(rows)

    def fig_retrieval(self, layer: int | None = None) -> go.Figure:
        from mechlingo.plots_experts import retrieval_heatmaps

        s = self.pre.layer_slot(layer)
        post = None if self.retrieval_post is None else self.retrieval_post[s]
        return retrieval_heatmaps(self.retrieval_pre[s], post, self.langs, self.layers[s])

    def fig_layers(self) -> go.Figure:
        from mechlingo.plots_experts import retrieval_per_layer_figure

        return retrieval_per_layer_figure(self.summary()["retrieval_mean_per_layer"])

    def fig_pca(self, layer: int | None = None) -> go.Figure:
        from mechlingo.plots_experts import pca_figure

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
    model: Any,
    texts: Mapping[str, Sequence[str]],
    intervention: Any = None,
    *,
    layers: int | Sequence[int] | str | None = "all",
    target: str | None = None,
    centre: bool = False,
    batch_size: int = 16,
    max_tokens: int | None = None,
    progress: bool = False,
) -> AlignmentComparison:
    """Embed parallel sentences without and with ``intervention`` and measure retrieval (all
    embedded layers) and distances (on demand, per layer). ``target``: the language the
    intervention steers to (for the ``to_target`` distance; read from the clamp's metadata
    when not given)."""
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
    r_pre = retrieval(pre.emb, centre=centre)
    r_post = retrieval(post.emb, centre=centre) if post is not None else None
    return AlignmentComparison(pre, post, r_pre, r_post, target, centre)


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
    "retrieval",
]
