"""Plotly figures for expert neurons and the cross-lingual embedding space."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go
from jaxtyping import Float, Int
from plotly.subplots import make_subplots
from torch import Tensor

if TYPE_CHECKING:
    from mechlingo.experts import KCurve

_PALETTE = (
    "#1f77b4 #ff7f0e #2ca02c #d62728 #9467bd #8c564b #e377c2 #7f7f7f #bcbd22 #17becf "
    "#393b79 #637939"
).split()


def experts_per_layer_figure(
    counts: Int[Tensor, "lang layer"], langs: Sequence[str], layers: Sequence[int], k: int
) -> go.Figure:
    """Grouped bars: how many of each language's top-``k`` experts sit in each layer."""
    fig = go.Figure()
    c = counts.cpu()
    for i, lang in enumerate(langs):
        fig.add_bar(x=list(layers), y=c[i].tolist(), name=lang, marker_color=_PALETTE[i % 12])
    fig.update_layout(
        title=f"Top-{k} expert neurons per layer",
        xaxis_title="layer",
        yaxis_title="experts",
        barmode="group",
        template="plotly_white",
    )
    return fig


def overlap_figure(overlap: Float[Tensor, "lang lang"], langs: Sequence[str], k: int) -> go.Figure:
    """Heatmap of the fraction of shared top-``k`` experts between languages."""
    z = overlap.cpu().tolist()
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=list(langs),
            y=list(langs),
            zmin=0,
            zmax=1,
            colorscale="Blues",
            text=[[f"{v:.2f}" for v in row] for row in z],
            texttemplate="%{text}",
        )
    )
    fig.update_layout(
        title=f"Overlap of top-{k} expert sets (|A∩B|/k)",
        yaxis_autorange="reversed",
        template="plotly_white",
    )
    return fig


def k_curve_figure(curve: KCurve) -> go.Figure:
    """Left: fraction of generations in the target language vs k (experts, random control,
    no clamp). Right: held-out perplexity of every language vs k (experts solid, control
    dotted)."""
    df = curve.to_dataframe()
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=(f"generations in {curve.lang}", "held-out perplexity (log scale)"),
    )
    base = df[df.arm == "none"]
    for arm, dash in (("experts", "solid"), ("random", "dot")):
        d = df[df.arm == arm].sort_values("k")
        if d.empty:
            continue
        for col, name in (("target_rate_bos", "from BOS"), ("target_rate_prompt", "from prompts")):
            fig.add_scatter(
                x=d.k,
                y=d[col],
                mode="lines+markers",
                name=f"{arm}, {name}",
                line={"dash": dash},
                row=1,
                col=1,
            )
        for i, col in enumerate(c for c in df.columns if c.startswith("ppl_")):
            fig.add_scatter(
                x=d.k,
                y=d[col],
                mode="lines+markers",
                name=f"{arm} {col[4:]}",
                line={"dash": dash, "color": _PALETTE[i % 12]},
                legendgroup=col,
                showlegend=arm == "experts",
                row=1,
                col=2,
            )
    if not base.empty:
        fig.add_hline(y=float(base.target_rate_bos.iloc[0]), line_dash="dash", row=1, col=1)
    fig.update_xaxes(type="log", title_text="k")
    fig.update_yaxes(range=[-0.02, 1.02], row=1, col=1)
    fig.update_yaxes(type="log", row=1, col=2)
    fig.update_layout(template="plotly_white", title=f"Choosing k for {curve.lang}")
    return fig


def retrieval_heatmaps(
    pre: Float[Tensor, "lang lang"],
    post: Float[Tensor, "lang lang"] | None,
    langs: Sequence[str],
    layer: int,
) -> go.Figure:
    """Top-1 retrieval (row = query language, column = candidate language), before and after
    (and their difference)."""
    mats: list[tuple[str, Any, str]] = [("before", pre, "Viridis")]
    if post is not None:
        mats += [("after", post, "Viridis"), ("after - before", post - pre, "RdBu")]
    fig = make_subplots(rows=1, cols=len(mats), subplot_titles=[m[0] for m in mats])
    for c, (_, m, scale) in enumerate(mats, start=1):
        z = m.cpu().tolist()
        diff = scale == "RdBu"
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
            ),
            row=1,
            col=c,
        )
        fig.update_yaxes(autorange="reversed", row=1, col=c)
    fig.update_layout(
        title=f"Top-1 retrieval, layer {layer} (row: query, column: candidates)",
        template="plotly_white",
    )
    return fig


def retrieval_per_layer_figure(per_layer: Mapping[str, Mapping[str, float]]) -> go.Figure:
    """Mean off-diagonal top-1 retrieval per layer, before and after."""
    fig = go.Figure()
    for which, vals in per_layer.items():
        fig.add_scatter(
            x=[int(k) for k in vals], y=list(vals.values()), mode="lines+markers", name=which
        )
    fig.update_layout(
        title="Mean cross-language top-1 retrieval per layer",
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
    before and after side by side (each with its own PCA)."""
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
                marker={"color": _PALETTE[i % 12], "size": 5, "opacity": 0.7},
                row=1,
                col=c,
            )
    fig.update_layout(title=f"Sentence embeddings, layer {layer} (PCA)", template="plotly_white")
    return fig
