"""plotly figures for mechlingo results (they display inline in Jupyter and go into reports)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from mechlingo.core.errors import InputError
from mechlingo.core.figures import drawer

if TYPE_CHECKING:
    import pandas as pd

    from mechlingo.analyses.lens import LensResult

PALETTE = [
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#ff7f0e",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#393b79",
    "#637939",
]


def rgba(hex_color: str, alpha: float) -> str:
    """``"#rrggbb"`` as a plotly ``rgba(r,g,b,alpha)`` colour."""
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i : i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


def band(x: Sequence[Any], lo: Sequence[float], hi: Sequence[float], color: str, **kw: Any):
    """A shaded band between ``lo`` and ``hi`` over ``x`` (no legend entry, no hover)."""
    x = list(x)
    return go.Scatter(
        x=x + x[::-1],
        y=list(hi) + list(lo)[::-1],
        fill="toself",
        fillcolor=rgba(color, 0.15),
        line={"width": 0},
        hoverinfo="skip",
        showlegend=False,
        **kw,
    )


@drawer
def latent_curves_figure(
    curves: pd.DataFrame, *, tracks: Sequence[str] | None = None, n_layers: int | None = None
) -> go.Figure:
    """One panel per prompt language; per track the mean probability over prompts per lens
    entry with a ±1 s.d. band (clipped to [0, 1])."""
    langs = sorted(curves["lang"].unique())
    tracks = list(tracks) if tracks else list(dict.fromkeys(curves["track"]))
    cols = min(4, len(langs))
    rows = math.ceil(len(langs) / cols)
    fig = make_subplots(
        rows=rows,
        cols=cols,
        subplot_titles=[f"prompts in {lg}" for lg in langs],
        shared_yaxes=True,
        horizontal_spacing=0.04,
        vertical_spacing=0.12 if rows > 1 else 0.08,
    )
    for i, lg in enumerate(langs):
        r, c = i // cols + 1, i % cols + 1
        for j, track in enumerate(tracks):
            d = curves[(curves["lang"] == lg) & (curves["track"] == track)].sort_values("layer")
            if d.empty:
                continue
            color = PALETTE[j % len(PALETTE)]
            label = f"answer in {lg}" if track == "answer" else f"answer in {track}"
            lo = (d["mean"] - d["std"]).clip(lower=0)
            hi = (d["mean"] + d["std"]).clip(upper=1)
            fig.add_trace(band(d["layer"], lo, hi, color, legendgroup=track), row=r, col=c)
            fig.add_trace(
                go.Scatter(
                    x=d["layer"],
                    y=d["mean"],
                    mode="lines+markers",
                    name="answer (prompt language)" if track == "answer" else label,
                    line={"color": color},
                    marker={"size": 4},
                    legendgroup=track,
                    showlegend=i == 0,
                ),
                row=r,
                col=c,
            )
    fig.update_yaxes(range=[0, 1], title_text="probability", col=1)
    fig.update_xaxes(title_text="layer (blocks applied)", row=rows)
    fig.update_layout(
        title="Latent-language curves: probability of the answer per layer (mean ± s.d.)",
        height=300 * rows + 80,
        margin={"t": 80, "l": 60, "r": 20, "b": 50},
        legend={"orientation": "h", "y": -0.3 if rows == 1 else -0.1},
    )
    return fig


@drawer
def lens_heatmap(result: LensResult, *, track: str = "en", value: str = "rank") -> go.Figure:
    """Layer-by-prompt heatmap of one track: ``log10(rank + 1)`` (bright = near the top) or
    the probability."""

    t = result.track_index(track)
    if value == "rank":
        z = torch.log10(result.rank[:, :, t].float() + 1).T
        colorbar = "log10(rank+1)"
        scale = "Viridis_r"
    elif value == "prob":
        z = result.logprob[:, :, t].exp().T
        colorbar = "probability"
        scale = "Viridis"
    else:
        raise InputError("value must be 'rank' or 'prob'")
    labels = [
        f"{i}:{result.langs[i]} {result.answers[track][i]}" for i in range(len(result.prompts))
    ]
    text = [
        [
            f"{result.prompts[p][-40:]!r}<br>top: {(result.top_tokens[li][p] or [''])[0]!r}"
            f"<br>rank {int(result.rank[li, p, t])}"
            for li in range(len(result.layers))
        ]
        for p in range(len(result.prompts))
    ]
    fig = go.Figure(
        go.Heatmap(
            z=z.tolist(),
            x=result.layers,
            y=labels,
            colorscale=scale,
            colorbar={"title": colorbar},
            hovertext=text,
            hoverinfo="text+z",
        )
    )
    fig.update_layout(
        title=f"Logit lens: {value} of the {track!r} answer per layer and prompt",
        xaxis={"title": "layer (blocks applied)", "dtick": 1},
        height=max(300, 14 * len(labels) + 120),
        margin={"l": 220},
    )
    return fig


@drawer
def accuracy_bars(
    accuracy: Mapping[str, Mapping[str, float]],
    title: str,
    intervals: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None,
    *,
    y_title: str = "accuracy",
) -> go.Figure:
    """Grouped bars: ``accuracy[condition][lang]`` (a proportion); with
    ``intervals[condition][lang]`` (dicts with ``lo`` and ``hi``, e.g.
    :func:`mechlingo.kernels.significance.wilson`), 95% error bars."""
    fig = go.Figure()
    for j, (cond, per_lang) in enumerate(accuracy.items()):
        langs = list(per_lang)
        y = [per_lang[lg] for lg in langs]
        err = None
        ci = (intervals or {}).get(cond)
        if ci:
            cells = [ci.get(lg) or {} for lg in langs]
            err = {
                "type": "data",
                "symmetric": False,
                "array": [
                    max(c["hi"] - v, 0) if c.get("hi") is not None else 0
                    for c, v in zip(cells, y, strict=True)
                ],
                "arrayminus": [
                    max(v - c["lo"], 0) if c.get("lo") is not None else 0
                    for c, v in zip(cells, y, strict=True)
                ],
            }
        fig.add_trace(
            go.Bar(
                x=langs,
                y=y,
                name=cond,
                marker_color=PALETTE[j % len(PALETTE)],
                error_y=err,
            )
        )
    fig.update_layout(
        title=title, yaxis={"range": [0, 1], "title": y_title}, barmode="group", height=380
    )
    return fig
