"""The side-effects matrix of an intervention: language x measure heatmaps of the change.

The function takes plain data (the rows of a side-effects measurement) and imports plotly
when called."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from mechlingo.viz.palette import CHANGE

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = ["cell_text", "side_effects_heatmap"]

_LABELS = {
    "accuracy": "Δ accuracy",
    "perplexity": "Δ perplexity (rel.)",
    "output_lang": "Δ own-language output",
}


def cell_text(r: Mapping[str, Any]) -> str:
    """A cell's text: the change and its interval (``"+0.12<br>[+0.03, +0.20]"``), the change
    alone when the interval is undefined, ``"n/a"`` when the change is."""
    d, lo, hi = r["delta"], r["ci_low"], r["ci_high"]
    if not math.isfinite(d):
        return "n/a"
    if math.isfinite(lo) and math.isfinite(hi):
        return f"{d:+.2f}<br>[{lo:+.2f}, {hi:+.2f}]"
    return f"{d:+.2f}"


def _panel(
    cells: Mapping[tuple[str, str, str], Mapping[str, Any]],
    langs: Sequence[str],
    cols: Sequence[str],
    arm: str,
) -> tuple[list[list[float | None]], list[list[str]]]:
    """One arm's ``z`` (the change, None where missing or undefined) and cell texts."""
    z, text = [], []
    for lg in langs:
        zr: list[float | None] = []
        tr: list[str] = []
        for m in cols:
            r = cells.get((lg, m, arm))
            if r is None:
                zr.append(None)
                tr.append("")
                continue
            d = r["delta"]
            zr.append(None if not math.isfinite(d) else d)
            tr.append(cell_text(r))
        z.append(zr)
        text.append(tr)
    return z, text


def side_effects_heatmap(
    rows: Sequence[Mapping[str, Any]],
    langs: Sequence[str],
    measures: Sequence[str],
    *,
    arms: Sequence[str] | None = None,
    intervention: str = "the intervention",
    confidence: float = 0.95,
) -> go.Figure:
    """Language x measure heatmaps of the change (one panel per arm: intervention and
    control), colour = change (red = up, blue = down), text = change and its interval.
    Perplexity is a relative change, the others differences of shares.

    Args:
        rows: one dict per (arm, language, measure) with ``arm``, ``lang``, ``measure``,
            ``delta``, ``ci_low`` and ``ci_high`` (NaN where undefined).
        langs: languages, top to bottom.
        measures: measure columns in order (those with no row are left out).
        arms: panels (default ``("intervention", "control")``, those present).
        intervention: the intervention's description, for the title.
        confidence: the interval level, for the title.
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    present = list(dict.fromkeys(r["arm"] for r in rows))
    arms = [a for a in (arms or ("intervention", "control")) if a in present]
    fig = make_subplots(
        rows=1, cols=max(1, len(arms)), subplot_titles=arms, horizontal_spacing=0.08
    )
    cols = [m for m in measures if any(r["measure"] == m for r in rows)]
    cells: dict[tuple[str, str, str], Mapping[str, Any]] = {}
    for r in rows:  # the first row of a cell wins
        cells.setdefault((r["lang"], r["measure"], r["arm"]), r)
    for k, arm in enumerate(arms):
        z, text = _panel(cells, langs, cols, arm)
        fig.add_trace(
            go.Heatmap(
                z=z,
                x=[_LABELS[m] for m in cols],
                y=list(langs),
                text=text,
                texttemplate="%{text}",
                coloraxis="coloraxis",
                hovertemplate="%{y}, %{x}: %{z:.3f}<extra>" + arm + "</extra>",
            ),
            row=1,
            col=k + 1,
        )
    fig.update_yaxes(autorange="reversed", title_text="language")
    fig.update_xaxes(title_text="measure")
    ns = [r.get("n") for r in rows]
    n = f"; n = {min(v for v in ns if v)}-{max(v for v in ns if v)} per cell" if any(ns) else ""
    fig.update_layout(
        title=f"Side effects of {intervention} ({confidence:.0%} intervals{n})",
        coloraxis={"colorscale": CHANGE, "cmid": 0, "colorbar": {"title": {"text": "change"}}},
        height=max(320, 34 * len(langs) + 160),
    )
    return fig
