"""Plotly figures for expert neurons and the cross-lingual embedding space."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go
from jaxtyping import Float, Int
from plotly.subplots import make_subplots
from torch import Tensor

from mechlingo.core.figures import drawer

if TYPE_CHECKING:
    from mechlingo.analyses.experts import KCurve

_PALETTE = (
    "#1f77b4 #ff7f0e #2ca02c #d62728 #9467bd #8c564b #e377c2 #7f7f7f #bcbd22 #17becf "
    "#393b79 #637939"
).split()


@drawer
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


@drawer
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


def _err(d: Any, col: str) -> dict[str, Any] | None:
    """Asymmetric plotly error bars from ``col_lo``/``col_hi`` columns (None without them)."""
    lo, hi = f"{col}_lo", f"{col}_hi"
    if lo not in d or hi not in d:
        return None
    y = d[col].astype(float)
    return {
        "type": "data",
        "symmetric": False,
        "array": (d[hi].astype(float) - y).clip(lower=0).fillna(0).tolist(),
        "arrayminus": (y - d[lo].astype(float)).clip(lower=0).fillna(0).tolist(),
    }


@drawer
def k_curve_figure(curve: KCurve, chosen: int | None = None) -> go.Figure:
    """Left: fraction of generations in the target language vs k (experts, random control;
    the dashed line is no clamp), with Wilson 95% error bars for the BOS samples. Right:
    held-out perplexity of every language vs k (experts solid, control dotted) with bootstrap
    95% error bars over lines. ``chosen``: the k the rule picked (a vertical line)."""
    df = curve.to_dataframe()
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=(f"generations in {curve.lang}", "held-out perplexity (log scale)"),
    )
    base = df[df.arm == "none"]
    ppl_cols = [  # ppl_<lang>, not ppl_<lang>_lo/_hi nor ppl_ratio_* (ppl_hi is Hindi)
        c
        for c in df.columns
        if c.startswith("ppl_")
        and not c.startswith("ppl_ratio_")
        and not c[4:].endswith(("_lo", "_hi"))
    ]
    for arm, dash in (("experts", "solid"), ("random", "dot")):
        d = df[df.arm == arm].sort_values("k")
        if d.empty:
            continue
        for col, name in (("target_rate_bos", "from BOS"), ("target_rate_prompt", "from prompts")):
            fig.add_scatter(
                x=d.k,
                y=d[col],
                error_y=_err(d, col),
                mode="lines+markers",
                name=f"{arm}, {name}",
                line={"dash": dash},
                row=1,
                col=1,
            )
        for i, col in enumerate(ppl_cols):
            fig.add_scatter(
                x=d.k,
                y=d[col],
                error_y=_err(d, col),
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
    if chosen is not None:  # a trace, not add_vline: shapes on log axes take log10(x)
        fig.add_scatter(
            x=[chosen, chosen],
            y=[0, 1],
            mode="lines",
            name=f"chosen k = {chosen}",
            line={"color": "black", "width": 1},
            row=1,
            col=1,
        )
    fig.update_xaxes(type="log", title_text="k")
    fig.update_yaxes(range=[-0.02, 1.02], row=1, col=1)
    fig.update_yaxes(type="log", row=1, col=2)
    title = f"Choosing k for {curve.lang}"
    fig.update_layout(
        template="plotly_white",
        title=title + (f" (rule chose k = {chosen})" if chosen is not None else ""),
    )
    return fig


@drawer
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


@drawer
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


@drawer
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


def interval_bars_figure(
    metrics: Mapping[str, Mapping[str, Mapping[str, Any]]], title: str
) -> go.Figure:
    """Grouped bars ``metrics[metric][arm]["mean"]`` (one group per metric, one colour per
    arm) with their 95% intervals (``lo``/``hi``) as error bars."""
    arms = list(dict.fromkeys(a for per in metrics.values() for a in per))
    fig = go.Figure()
    for i, arm in enumerate(arms):
        names = [m for m in metrics if arm in metrics[m]]
        cells = [metrics[m][arm] for m in names]
        y = [c["mean"] for c in cells]
        fig.add_bar(
            x=names,
            y=y,
            name=arm,
            marker_color=_PALETTE[i % 12],
            error_y={
                "type": "data",
                "symmetric": False,
                "array": [(c["hi"] - c["mean"]) if c["hi"] is not None else 0 for c in cells],
                "arrayminus": [(c["mean"] - c["lo"]) if c["lo"] is not None else 0 for c in cells],
            },
        )
    fig.update_layout(title=title, barmode="group", template="plotly_white")
    return fig
