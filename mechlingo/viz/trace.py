"""Figures of the recall-pipeline trace: the class of each query per language, and the
latent-language curves per class. The circuit diagram and the patching figures the trace
report shows are drawn from a patching sweep (:mod:`mechlingo.viz.patching`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import torch
from jaxtyping import Int
from torch import Tensor

from mechlingo.viz.common import band, rank_axis, track_label
from mechlingo.viz.palette import CLASS, class_color, track_color

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = ["class_fractions_figure", "class_profiles_figure"]


def class_fractions_figure(counts: Mapping[str, Mapping[str, int]]) -> go.Figure:
    """Stacked bars of the share of each recall-pipeline class per language (hover: count);
    ``counts[lang][class]`` is a number of queries."""
    import plotly.graph_objects as go

    langs = list(counts)
    fig = go.Figure()
    for c in CLASS:  # the palette lists the classes in the trace's order
        totals = [max(1, sum(counts[lg].values())) for lg in langs]
        ys = [counts[lg].get(c, 0) / t for lg, t in zip(langs, totals, strict=True)]
        fig.add_trace(
            go.Bar(
                x=langs,
                y=ys,
                name=c.replace("_", " "),
                marker_color=class_color(c),
                customdata=[counts[lg].get(c, 0) for lg in langs],
                hovertemplate="%{x}: %{y:.0%} (%{customdata})<extra>" + c + "</extra>",
            )
        )
    n = sum(sum(c.values()) for c in counts.values())
    fig.update_layout(
        barmode="stack",
        title=f"Recall pipeline: class of each query per language (n = {n} queries)",
        yaxis={"title": "fraction of queries", "tickformat": ".0%", "range": [0, 1]},
        xaxis={"title": "prompt language"},
        height=420,
    )
    return fig


def class_profiles_figure(
    en_rank: Int[Tensor, "layer prompt"],
    answer_rank: Int[Tensor, "layer prompt"],
    *,
    classes: Sequence[str],
    prompt_langs: Sequence[str],
    layers: Sequence[int],
    langs: Sequence[str],
    max_rank: int,
) -> go.Figure:
    """One panel per class present: median rank (log axis, interquartile band) of the English
    answer and of the prompt-language answer per lens entry, pooled over the prompts whose
    language is in ``langs``.

    Args:
        en_rank, answer_rank: rank (0 = top-1) of the English and of the prompt-language
            answer per lens entry (``layers``) and prompt.
        classes, prompt_langs: per prompt, its class and its language.
        max_rank: the rank threshold of the classification (a dotted line).
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    keep = set(langs)
    present = [
        c
        for c in CLASS
        if any(k == c and lg in keep for k, lg in zip(classes, prompt_langs, strict=True))
    ]
    if not present:
        return go.Figure().update_layout(title="no queries in the selected languages")
    cols = min(3, len(present))
    rows = math.ceil(len(present) / cols)
    titles = []
    for c in present:
        n = sum(1 for k, lg in zip(classes, prompt_langs, strict=True) if k == c and lg in keep)
        titles.append(f"{c.replace('_', ' ')} (n={n})")
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles)
    for k, c in enumerate(present):
        r, col = k // cols + 1, k % cols + 1
        idx = torch.tensor(
            [
                i
                for i, (x, lg) in enumerate(zip(classes, prompt_langs, strict=True))
                if x == c and lg in keep
            ]
        )
        for track, ranks in (("en", en_rank), ("answer", answer_rank)):
            rank = ranks[:, idx].float() + 1
            q = torch.quantile(rank, torch.tensor([0.25, 0.5, 0.75]), dim=1)
            color = track_color(track)
            x = list(layers)
            fig.add_trace(band(x, q[0].tolist(), q[2].tolist(), color), row=r, col=col)
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=q[1].tolist(),
                    mode="lines+markers",
                    marker={"size": 4},
                    line={"color": color},
                    name=track_label(track),
                    legendgroup=track,
                    showlegend=k == 0,
                ),
                row=r,
                col=col,
            )
        fig.add_hline(y=max_rank + 1, line={"dash": "dot", "color": "#999"}, row=r, col=col)
    total = sum(1 for lg in prompt_langs if lg in keep)
    worst = max(int(en_rank.max()), int(answer_rank.max()), max_rank) + 1
    rank_axis(fig, worst, title="rank + 1 (median, IQR)")  # every panel, one range
    fig.update_xaxes(title_text="lens entry (blocks applied)")
    fig.update_layout(
        title=f"Latent-language curves per class ({', '.join(langs)}; n = {total} queries); "
        f"dotted: rank {max_rank}",
        height=320 * rows + 100,
    )
    return fig
