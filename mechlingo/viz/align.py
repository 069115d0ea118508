"""Plotly figures for the cross-lingual embedding space: top-1 retrieval heatmaps, retrieval
per layer and sentence embeddings on their first two principal components. Every function
takes plain data (tensors, dicts) and imports plotly when called."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from jaxtyping import Float
from torch import Tensor

from mechlingo.viz.common import with_n
from mechlingo.viz.palette import SCORE, SIGNED_EFFECT, language_color, series_color

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = ["pca_figure", "retrieval_heatmaps", "retrieval_per_layer_figure"]


def retrieval_heatmaps(
    pre: Float[Tensor, "lang lang"],
    post: Float[Tensor, "lang lang"] | None,
    langs: Sequence[str],
    layer: int,
    n: int | None = None,
) -> go.Figure:
    """Top-1 retrieval (row = query language, column = candidate language), before and after
    (and their difference); ``n``: sentences per language (the title)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    mats: list[tuple[str, Any, str]] = [("before", pre, SCORE)]
    if post is not None:
        mats += [("after", post, SCORE), ("after - before", post - pre, SIGNED_EFFECT)]
    fig = make_subplots(rows=1, cols=len(mats), subplot_titles=[m[0] for m in mats])
    for c, (_, m, scale) in enumerate(mats, start=1):
        z = m.cpu().tolist()
        diff = scale == SIGNED_EFFECT
        fig.add_trace(
            go.Heatmap(
                z=z,
                x=list(langs),
                y=list(langs),
                colorscale=scale,
                zmin=-1 if diff else 0,
                zmax=1,
                zmid=0 if diff else None,
                text=[[f"{v:.2f}" for v in row] for row in z],
                texttemplate="%{text}",
                showscale=c == len(mats),
                colorbar={"title": "top-1 retrieval"},
            ),
            row=1,
            col=c,
        )
        fig.update_yaxes(autorange="reversed", title_text="query language", row=1, col=c)
        fig.update_xaxes(title_text="candidate language", row=1, col=c)
    fig.update_layout(
        title=with_n(
            f"Top-1 retrieval, layer {layer} (row: query, column: candidates)",
            n,
            "sentences per language",
        ),  # fmt: skip
        template="plotly_white",
    )
    return fig


def retrieval_per_layer_figure(
    per_layer: Mapping[str, Mapping[str, float]], n: int | None = None
) -> go.Figure:
    """Mean off-diagonal top-1 retrieval per layer, before and after (``n``: sentences per
    language, for the title)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for which, vals in per_layer.items():
        fig.add_scatter(
            x=[int(k) for k in vals],
            y=list(vals.values()),
            mode="lines+markers",
            name=which,
            line={"color": series_color(which)},
        )
    fig.update_layout(
        title=with_n("Mean cross-language top-1 retrieval per layer", n, "sentences per language"),
        xaxis_title="layer",
        yaxis_title="top-1",
        yaxis_range=[0, 1],
        template="plotly_white",
    )
    return fig


def pca_figure(
    pre: Float[Tensor, "lang n 2"],
    post: Float[Tensor, "lang n 2"] | None,
    langs: Sequence[str],
    layer: int,
) -> go.Figure:
    """Sentence embeddings on their first two principal components, coloured by language;
    before and after side by side (each with its own PCA; n = sentences per language)."""
    from plotly.subplots import make_subplots

    panels = [("before", pre)] + ([("after", post)] if post is not None else [])
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[p[0] for p in panels])
    for c, (_, xy) in enumerate(panels, start=1):
        xy = xy.cpu()
        for i, lang in enumerate(langs):
            fig.add_scatter(
                x=xy[i, :, 0].tolist(),
                y=xy[i, :, 1].tolist(),
                mode="markers",
                name=lang,
                legendgroup=lang,
                showlegend=c == 1,
                marker={"color": language_color(lang), "size": 5, "opacity": 0.7},
                row=1,
                col=c,
            )
    fig.update_xaxes(title_text="PC 1")
    fig.update_yaxes(title_text="PC 2")
    fig.update_layout(
        title=f"Sentence embeddings, layer {layer} (PCA; n = {pre.shape[1]} per language)",
        template="plotly_white",
    )
    return fig
