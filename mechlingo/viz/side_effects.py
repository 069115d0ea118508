"""The side-effects matrix of an intervention: language x metric heatmaps of the change."""

from __future__ import annotations

import math
from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from mechlingo.analyses.side_effects import METRICS, SideEffects, _cell_text
from mechlingo.core.figures import drawer


@drawer
def side_effects_heatmap(result: SideEffects, arms: Sequence[str] | None = None) -> go.Figure:
    """Language x metric heatmaps of the change (one panel per arm: intervention and
    control), colour = change (red = up, blue = down), text = change and its interval.
    Perplexity is a relative change, the others differences of shares."""

    present = list(dict.fromkeys(r["arm"] for r in result.rows))
    arms = [a for a in (arms or ("intervention", "control")) if a in present]
    fig = make_subplots(
        rows=1, cols=max(1, len(arms)), subplot_titles=arms, horizontal_spacing=0.08
    )
    cols = [m for m in METRICS if any(r["metric"] == m for r in result.rows)]
    labels = {
        "accuracy": "Δ accuracy",
        "perplexity": "Δ perplexity (rel.)",
        "output_lang": "Δ own-language output",
    }
    for k, arm in enumerate(arms):
        z, text = [], []
        for lg in result.langs:
            zr, tr = [], []
            for m in cols:
                try:
                    r = result.get(lg, m, arm)
                except KeyError:
                    zr.append(None)
                    tr.append("")
                    continue
                d = r["delta"]
                zr.append(None if not math.isfinite(d) else d)
                tr.append(_cell_text(r))
            z.append(zr)
            text.append(tr)
        fig.add_trace(
            go.Heatmap(
                z=z,
                x=[labels[m] for m in cols],
                y=result.langs,
                text=text,
                texttemplate="%{text}",
                coloraxis="coloraxis",
                hovertemplate="%{y}, %{x}: %{z:.3f}<extra>" + arm + "</extra>",
            ),
            row=1,
            col=k + 1,
        )
    fig.update_yaxes(autorange="reversed")
    level = result.meta.get("confidence", 0.95)
    fig.update_layout(
        title=f"Side effects of {result.meta.get('intervention', 'the intervention')} "
        f"({level:.0%} intervals)",
        coloraxis={"colorscale": "RdBu_r", "cmid": 0},
        height=max(320, 34 * len(result.langs) + 160),
    )
    return fig
