"""Plotly figures for expert neurons: experts per layer, the overlap of expert sets, the k
curve, and grouped bars with intervals. Every function takes plain data (tensors, lists,
dicts) and imports plotly when called."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from jaxtyping import Float, Int
from torch import Tensor

from mechlingo.viz.common import with_n
from mechlingo.viz.palette import OVERLAP, condition_color, language_color, series_color

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = [
    "experts_per_layer_figure",
    "interval_bars_figure",
    "k_curve_figure",
    "overlap_figure",
]


def experts_per_layer_figure(
    counts: Int[Tensor, "lang layer"], langs: Sequence[str], layers: Sequence[int], k: int
) -> go.Figure:
    """Grouped bars: how many of each language's top-``k`` experts sit in each layer."""
    import plotly.graph_objects as go

    fig = go.Figure()
    c = counts.cpu()
    for i, lang in enumerate(langs):
        fig.add_bar(x=list(layers), y=c[i].tolist(), name=lang, marker_color=language_color(lang))
    fig.update_layout(
        title=f"Top-{k} expert neurons per layer (n = {k} per language)",
        xaxis_title="layer",
        yaxis_title="experts",
        barmode="group",
        template="plotly_white",
    )
    return fig


def overlap_figure(overlap: Float[Tensor, "lang lang"], langs: Sequence[str], k: int) -> go.Figure:
    """Heatmap of the fraction of shared top-``k`` experts between languages."""
    import plotly.graph_objects as go

    z = overlap.cpu().tolist()
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=list(langs),
            y=list(langs),
            zmin=0,
            zmax=1,
            colorscale=OVERLAP,
            colorbar={"title": "shared fraction"},
            text=[[f"{v:.2f}" for v in row] for row in z],
            texttemplate="%{text}",
        )
    )
    fig.update_layout(
        title=f"Overlap of top-{k} expert sets (|A∩B|/k; n = {k} per language)",
        yaxis_autorange="reversed",
        xaxis_title="language B",
        yaxis_title="language A",
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


def _add_k_line(fig: go.Figure, d: Any, col: str, panel: int, **style: Any) -> None:
    """One arm's column ``col`` against k (the rows ``d``) in the ``panel``-th panel, with
    its interval as error bars; ``style``: the trace's name, line, marker and legend."""
    fig.add_scatter(x=d.k, y=d[col], error_y=_err(d, col), mode="lines+markers", row=1,
                    col=panel, **style)  # fmt: skip


def k_curve_figure(
    rows: Sequence[Mapping[str, Any]], lang: str, chosen: int | None = None
) -> go.Figure:
    """Left: fraction of generations in ``lang`` (the target) vs k (experts, random control;
    the dashed line is no clamp), with Wilson 95% error bars for the BOS samples. Right:
    held-out perplexity of every language vs k (experts solid, control dotted) with bootstrap
    95% error bars over lines. ``rows``: the k-curve rows (``k``, ``arm``,
    ``target_rate_bos``, ``target_rate_prompt``, ``ppl_<lang>`` and their ``_lo``/``_hi``;
    ``examples`` and ``bos_hits`` are ignored). ``chosen``: the k the rule picked (a vertical
    line)."""
    import pandas as pd
    from plotly.subplots import make_subplots

    skip = ("examples", "bos_hits")
    df = pd.DataFrame([{k: v for k, v in r.items() if k not in skip} for r in rows])
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=(f"generations in {lang}", "held-out perplexity (log scale)"),
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
        sources = (("target_rate_bos", "from BOS", "circle"),
                   ("target_rate_prompt", "from prompts", "square"))  # fmt: skip
        for col, name, symbol in sources:
            line = {"dash": dash, "color": condition_color(arm)}
            _add_k_line(fig, d, col, 1, name=f"{arm}, {name}", line=line, marker={"symbol": symbol})
        for col in ppl_cols:
            line = {"dash": dash, "color": language_color(col[4:])}
            _add_k_line(fig, d, col, 2, name=f"{arm} {col[4:]}", line=line, legendgroup=col,
                        showlegend=arm == "experts")  # fmt: skip
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
    fig.update_yaxes(range=[-0.02, 1.02], title_text=f"fraction in {lang}", row=1, col=1)
    fig.update_yaxes(type="log", title_text="perplexity", row=1, col=2)
    n_bos = [r.get("n_bos") for r in rows]
    title = f"Choosing k for {lang}" + (f" (n = {max(n_bos)} BOS samples)" if any(n_bos) else "")
    fig.update_layout(
        template="plotly_white",
        title=title + (f" (rule chose k = {chosen})" if chosen is not None else ""),
    )
    return fig


def interval_bars_figure(
    measures: Mapping[str, Mapping[str, Mapping[str, Any]]], title: str
) -> go.Figure:
    """Grouped bars ``measures[measure][arm]["estimate"]`` (one group per measure, one colour per
    arm) with their 95% intervals (``lo``/``hi``) as error bars."""
    import plotly.graph_objects as go

    arms = list(dict.fromkeys(a for per in measures.values() for a in per))
    fig = go.Figure()
    for arm in arms:
        names = [m for m in measures if arm in measures[m]]
        cells = [measures[m][arm] for m in names]
        y = [c["estimate"] for c in cells]
        fig.add_bar(
            x=names,
            y=y,
            name=arm,
            marker_color=series_color(arm),
            error_y={
                "type": "data",
                "symmetric": False,
                "array": [(c["hi"] - c["estimate"]) if c["hi"] is not None else 0 for c in cells],
                "arrayminus": [
                    (c["estimate"] - c["lo"]) if c["lo"] is not None else 0 for c in cells
                ],
            },
        )
    ns = [c.get("n") for per in measures.values() for c in per.values()]
    fig.update_layout(
        title=with_n(title, ns), barmode="group", template="plotly_white",
        xaxis_title="measure", yaxis_title="estimate (95% interval)",
    )  # fmt: skip
    return fig
