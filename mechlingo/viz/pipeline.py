"""plotly figures for the recall pipeline: class fractions, per-class latent-language curves,
patching heatmaps, attention-knockout curves and the circuit diagram.

:func:`pipeline_stages` (the stage bands drawn on the circuit diagram) is computed in
:mod:`mechlingo.analyses.trace` and re-exported here."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots
from torch import Tensor

from mechlingo.analyses.trace import CLASSES, pipeline_stages
from mechlingo.core.figures import drawer
from mechlingo.viz.common import PALETTE, band, rgba

__all__ = [
    "CLASS_COLORS",
    "SITE_COLORS",
    "circuit_figure",
    "class_fractions_figure",
    "class_profiles_figure",
    "knockout_figure",
    "patching_heatmaps",
    "pipeline_stages",
]

if TYPE_CHECKING:
    from mechlingo.analyses.patching import KnockoutResult, PatchSweep
    from mechlingo.analyses.trace import TraceResult

CLASS_COLORS = {
    "correct": "#2ca02c",
    "wrong_language": "#9467bd",
    "translation_failure": "#ff7f0e",
    "recall_failure": "#d62728",
    "other": "#7f7f7f",
}
SITE_COLORS = {
    "mlp_out": "#1f77b4",
    "attn_out": "#d62728",
    "resid_pre": "#7f7f7f",
    "resid_mid": "#8c564b",
    "resid_post": "#bcbd22",
    "head": "#9467bd",
}


@drawer
def class_fractions_figure(counts: Mapping[str, Mapping[str, int]]) -> go.Figure:
    """Stacked bars of the share of each recall-pipeline class per language (hover: count)."""

    langs = list(counts)
    fig = go.Figure()
    for c in CLASSES:
        totals = [max(1, sum(counts[lg].values())) for lg in langs]
        ys = [counts[lg].get(c, 0) / t for lg, t in zip(langs, totals, strict=True)]
        fig.add_trace(
            go.Bar(
                x=langs,
                y=ys,
                name=c.replace("_", " "),
                marker_color=CLASS_COLORS[c],
                customdata=[counts[lg].get(c, 0) for lg in langs],
                hovertemplate="%{x}: %{y:.0%} (%{customdata})<extra>" + c + "</extra>",
            )
        )
    fig.update_layout(
        barmode="stack",
        title="Recall pipeline: class of each query per language",
        yaxis={"title": "fraction of queries", "tickformat": ".0%", "range": [0, 1]},
        xaxis={"title": "prompt language"},
        height=420,
    )
    return fig


@drawer
def class_profiles_figure(trace: TraceResult, *, langs: Sequence[str] | None = None) -> go.Figure:
    """One panel per class present: median rank (log axis, interquartile band) of the English
    answer and of the prompt-language answer per lens entry, pooled over ``langs`` (default:
    every language, English prompts included only when they are the only ones)."""

    lens = trace.lens
    cls = trace.classes()
    if langs is None:
        non_en = [lg for lg in trace.langs if lg != "en"]
        langs = non_en or trace.langs
    keep = set(langs)
    present = [
        c
        for c in CLASSES
        if any(k == c and lg in keep for k, lg in zip(cls, lens.langs, strict=True))
    ]
    if not present:
        return go.Figure().update_layout(title="no queries in the selected languages")
    cols = min(3, len(present))
    rows = math.ceil(len(present) / cols)
    titles = []
    for c in present:
        n = sum(1 for k, lg in zip(cls, lens.langs, strict=True) if k == c and lg in keep)
        titles.append(f"{c.replace('_', ' ')} (n={n})")
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, shared_yaxes=True)
    for k, c in enumerate(present):
        r, col = k // cols + 1, k % cols + 1
        idx = torch.tensor(
            [
                i
                for i, (x, lg) in enumerate(zip(cls, lens.langs, strict=True))
                if x == c and lg in keep
            ]
        )
        for j, track in enumerate(("en", "answer")):
            rank = lens.rank[:, idx, lens.track_index(track)].float() + 1
            q = torch.quantile(rank, torch.tensor([0.25, 0.5, 0.75]), dim=1)
            color = PALETTE[j]
            x = list(lens.layers)
            fig.add_trace(band(x, q[0].tolist(), q[2].tolist(), color), row=r, col=col)
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=q[1].tolist(),
                    mode="lines+markers",
                    marker={"size": 4},
                    line={"color": color},
                    name="English answer" if track == "en" else "prompt-language answer",
                    legendgroup=track,
                    showlegend=k == 0,
                ),
                row=r,
                col=col,
            )
        fig.add_hline(y=trace.max_rank + 1, line={"dash": "dot", "color": "#999"}, row=r, col=col)
    fig.update_yaxes(type="log", autorange="reversed", title_text="rank + 1 (median, IQR)", col=1)
    fig.update_xaxes(title_text="lens entry (blocks applied)", row=rows)
    fig.update_layout(
        title=f"Latent-language curves per class ({', '.join(langs)}); dotted: rank "
        f"{trace.max_rank}",
        height=320 * rows + 100,
    )
    return fig


@drawer
def patching_heatmaps(
    sweep: PatchSweep, *, metric: str | int = 0, value: str = "normalized"
) -> go.Figure:
    """One layer-by-position heatmap per site (``value``: normalised effect, effect or mean of
    the patched metric); a ``head`` site is shown layer-by-head, averaged over positions."""
    sites = sweep.sites
    fig = make_subplots(
        rows=1,
        cols=len(sites),
        subplot_titles=[s if s != "head" else "heads (mean over positions)" for s in sites],
        horizontal_spacing=0.06,
    )
    name = sweep.metric_names[sweep.metric_index(metric)]
    for k, s in enumerate(sites):
        z = sweep.grid(s, metric, value)
        x: list[Any] = list(sweep.position_labels)
        if s == "head":
            z = torch.nanmean(z, dim=1)
            x = [f"h{h}" for h in sweep.heads]
        fig.add_trace(
            go.Heatmap(
                z=z.tolist(),
                x=x,
                y=sweep.layers,
                colorscale="RdBu",
                zmid=0,
                coloraxis="coloraxis",
                hovertemplate="layer %{y}, %{x}: %{z:.3f}<extra>" + s + "</extra>",
            ),
            row=1,
            col=k + 1,
        )
    fig.update_yaxes(title_text="layer", col=1)
    fig.update_layout(
        title=f"Activation patching ({sweep.alignment} alignment): {value} of {name}",
        coloraxis={"colorscale": "RdBu", "cmid": 0},
        height=460,
    )
    return fig


@drawer
def knockout_figure(result: KnockoutResult) -> go.Figure:
    """Relative change of the answer metric when attention from the last token to the
    ``keys`` positions is blocked in each layer window (95% bootstrap band)."""
    rel = result.relative_change()
    lo, hi = result.bootstrap_ci()
    x = [f"{a}-{b}" for a, b in result.windows]
    fig = go.Figure(
        go.Scatter(
            x=x,
            y=rel.tolist(),
            mode="lines+markers",
            error_y={
                "type": "data",
                "symmetric": False,
                "array": (hi - rel).tolist(),
                "arrayminus": (rel - lo).tolist(),
            },
            name=f"blocked last -> {result.keys}",
        )
    )
    fig.add_hline(y=0, line={"color": "#999"})
    fig.update_layout(
        title=f"Attention knockout (last token -> {result.keys}): change of {result.metric_name}",
        xaxis={"title": "blocked layer window", "type": "category"},
        yaxis={"title": "relative change", "tickformat": ".0%"},
        height=380,
    )
    return fig


Node = tuple[Any, float]  # (cell, normalised effect)
Edge = tuple[tuple[float, float], tuple[float, float], float]  # (from, to, width)


def _circuit_nodes(sweep: PatchSweep, vals: Tensor, heads: bool, top_k: int) -> list[Node]:
    """The ``top_k`` component cells with the largest absolute normalised effect (attention
    and MLP outputs, and single heads with ``heads``; residual cells when none was swept)."""
    drawn = ("attn_out", "mlp_out", "head") if heads else ("attn_out", "mlp_out")
    comp = [i for i, c in enumerate(sweep.cells) if c.site in drawn]
    if not comp:
        comp = [i for i, c in enumerate(sweep.cells) if c.site != "head"]
    scored = sorted(
        (i for i in comp if not math.isnan(float(vals[i]))),
        key=lambda i: -abs(float(vals[i])),
    )[:top_k]
    return [(sweep.cells[i], float(vals[i])) for i in scored]


def _node_xy(cell: Any) -> tuple[float, float]:
    """A node's place: its position (attention left, MLP right of it) and its layer."""
    off = {"attn_out": -0.15, "mlp_out": 0.15, "head": -0.3}.get(cell.site, 0.0)
    return cell.position + off, float(cell.layer)


def _circuit_edges(sweep: PatchSweep, nodes: Sequence[Node]) -> list[Edge]:
    """Residual edges up each position (consecutive nodes joined), and attention edges from
    every subject-position node to the later attention nodes at the last position (or to the
    lowest later node there when no attention node was selected)."""
    labels = [str(lab) for lab in sweep.position_labels]
    subj_cols = {j for j, lab in enumerate(labels) if lab.startswith("subject")}
    last_col = next((j for j, lab in enumerate(labels) if lab in ("-1", "last")), len(labels) - 1)
    edges: list[Edge] = []
    for col in range(len(labels)):
        at = sorted((c for c, _ in nodes if c.position == col), key=lambda c: c.layer)
        for u, v in zip(at, at[1:], strict=False):
            edges.append((_node_xy(u), _node_xy(v), 1.0))
    last_nodes = sorted((c for c, _ in nodes if c.position == last_col), key=lambda c: c.layer)
    for c, _v in nodes:
        if c.position not in subj_cols:
            continue
        later = [d for d in last_nodes if d.layer > c.layer]
        targets = [d for d in later if d.site in ("attn_out", "head")] or later[:1]
        for d in targets:
            edges.append((_node_xy(c), _node_xy(d), 2.0))
    return edges


def _add_stages(fig: go.Figure, stages: Mapping[str, tuple[float, float]], n_pos: int) -> None:
    """Shaded layer bands, one per stage, labelled on the right."""
    for k, (name, (a, b)) in enumerate(stages.items()):
        fig.add_shape(
            type="rect",
            x0=-0.5,
            x1=n_pos - 0.5,
            y0=a - 0.45,
            y1=b + 0.45,
            fillcolor=rgba(PALETTE[(k + 3) % len(PALETTE)], 0.12),
            line={"width": 0},
            layer="below",
        )
        fig.add_annotation(
            x=n_pos - 0.5,
            y=(a + b) / 2,
            text=name,
            showarrow=False,
            xanchor="left",
            font={"size": 11},
        )


def _add_edges(fig: go.Figure, edges: Sequence[Edge]) -> None:
    """Arrows: grey for the residual stream, red (wider) for attention edges."""
    for (x0, y0), (x1, y1), w in edges:
        fig.add_annotation(
            x=x1,
            y=y1,
            ax=x0,
            ay=y0,
            xref="x",
            yref="y",
            axref="x",
            ayref="y",
            showarrow=True,
            arrowhead=2,
            arrowsize=1,
            arrowwidth=w,
            arrowcolor="rgba(80,80,80,0.5)" if w < 2 else "rgba(214,39,40,0.55)",
        )


def _add_nodes(
    fig: go.Figure,
    sweep: PatchSweep,
    nodes: Sequence[Node],
    labels: Sequence[str],
    exact: Mapping[tuple, float],
) -> None:
    """One marker trace per site: size ~ |effect|, hover = value (and a head's name)."""
    biggest = max((abs(v) for _, v in nodes), default=0.0) or 1.0
    for site in dict.fromkeys(c.site for c, _ in nodes):
        pts = [(c, v) for c, v in nodes if c.site == site]
        fig.add_trace(
            go.Scatter(
                x=[_node_xy(c)[0] for c, _ in pts],
                y=[_node_xy(c)[1] for c, _ in pts],
                mode="markers",
                name=site,
                marker={
                    "size": [10 + 30 * abs(v) / biggest for _, v in pts],
                    "color": SITE_COLORS.get(site, "#333"),
                    "line": {"width": 1, "color": "white"},
                },
                customdata=[[v, labels[c.position], _node_note(c, sweep, exact)] for c, v in pts],
                hovertemplate="layer %{y}, %{customdata[1]}: normalised effect "
                "%{customdata[0]:.3f}%{customdata[2]}<extra>" + site + "</extra>",
            )
        )


def circuit_figure(
    sweep: PatchSweep,
    *,
    metric: str | int = 0,
    top_k: int = 12,
    stages: Mapping[str, tuple[float, float]] | None = None,
    token_labels: Sequence[str] | None = None,
    title: str | None = None,
    heads: bool = False,
    verified: Sequence[Mapping[str, Any]] | None = None,
) -> go.Figure:
    """A circuit diagram drawn from measured patching effects.

    With ``heads`` the sweep's single attention heads (site ``head``) compete for the
    ``top_k`` nodes too (drawn left of the position, named ``L{layer}H{head}`` in the hover);
    ``verified`` rows (from :func:`mechlingo.analyses.attribution.verify_top_cells`: ``layer``,
    ``position``, ``head``, ``exact``) add each head's exact normalised effect to its hover.

    Grid: token positions (x) by layers (y). Nodes: the ``top_k`` component cells (attention
    and MLP outputs when swept, else residual cells) with the largest absolute normalised
    effect; marker size ~ |effect|, color = site, hover = value. Edges: the residual stream
    carries information up within a position (consecutive nodes of one position are joined);
    attention moves it across positions, so every node at a subject position is joined to the
    attention nodes at the last position in later layers (or to the lowest later node at the
    last position when no attention node was selected). Stages are shaded layer bands given
    by ``stages`` ``{name: (first_layer, last_layer)}`` (see :func:`pipeline_stages`).
    """
    m = sweep.metric_index(metric)
    nodes = _circuit_nodes(sweep, sweep.normalized(m), heads, top_k)
    exact = {(r["layer"], str(r["position"]), r["head"]): r["exact"] for r in verified or []}
    labels = list(token_labels) if token_labels else list(sweep.position_labels)
    n_pos = len(sweep.position_labels)
    lo_layer, hi_layer = min(sweep.layers), max(sweep.layers)
    fig = go.Figure()
    _add_stages(fig, stages or {}, n_pos)
    _add_edges(fig, _circuit_edges(sweep, nodes))
    _add_nodes(fig, sweep, nodes, labels, exact)
    fig.update_xaxes(
        tickvals=list(range(n_pos)),
        ticktext=labels,
        range=[-0.6, n_pos + 0.9],
        title="token position",
    )
    fig.update_yaxes(range=[lo_layer - 0.8, hi_layer + 0.8], title="layer", dtick=1)
    fig.update_layout(
        title=title
        or f"Circuit: top {len(nodes)} components by patching effect on {sweep.metric_names[m]}",
        height=max(420, 28 * (hi_layer - lo_layer + 1) + 120),
        showlegend=True,
    )
    return fig


def _node_note(cell: Any, sweep: PatchSweep, exact: Mapping[tuple, float]) -> str:
    """Hover suffix of a circuit node: a head's name and, when verified, its exact effect."""
    if cell.site != "head":
        return ""
    note = f" (L{cell.layer}H{cell.head})"
    key = (cell.layer, str(sweep.position_labels[cell.position]), cell.head)
    if key in exact:
        note += f", exact: {exact[key]:.3f}"
    return note
