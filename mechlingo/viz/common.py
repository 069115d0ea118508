"""Helpers shared by the figure modules: ``rgba`` and the shaded band (the colours are in
:mod:`mechlingo.viz.palette`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = ["band", "rgba"]


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
