"""Helpers shared by the figure modules: the colour palette, ``rgba`` and the shaded band."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = ["PALETTE", "band", "rgba"]

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


def band(
    x: Sequence[Any], lo: Sequence[float], hi: Sequence[float], color: str, **kw: Any
) -> go.Scatter:
    """A shaded band between ``lo`` and ``hi`` over ``x`` (no legend entry, no hover)."""
    import plotly.graph_objects as go

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
