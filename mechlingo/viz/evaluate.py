"""Figures of the evaluation: accuracy (or any proportion) per language and condition."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mechlingo.viz.common import with_n
from mechlingo.viz.palette import series_color

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = ["accuracy_bars"]


def accuracy_bars(
    accuracy: Mapping[str, Mapping[str, float]],
    title: str,
    intervals: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None,
    *,
    y_title: str = "accuracy",
    n: Any = None,
) -> go.Figure:
    """Grouped bars: ``accuracy[condition][lang]`` (a proportion; a condition, or a trace
    class, takes its palette colour: :func:`mechlingo.viz.palette.series_color`); with
    ``intervals[condition][lang]`` (dicts with ``lo`` and ``hi``, e.g.
    :func:`mechlingo.kernels.significance.wilson`), 95% error bars. The title gets the n of
    ``n`` (an int or a list of counts) or else of the intervals' ``n``."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for cond, per_lang in accuracy.items():
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
                name=cond.replace("_", " "),
                marker_color=series_color(cond),
                error_y=err,
            )
        )
    if n is None and intervals:
        n = [c.get("n") for per in intervals.values() for c in per.values()]
    fig.update_layout(
        title=with_n(title, n, "per bar" if not isinstance(n, int) else ""),
        yaxis={"range": [0, 1], "title": y_title},
        xaxis={"title": "prompt language"},
        barmode="group",
        height=380,
    )
    return fig
