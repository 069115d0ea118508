"""Figures of the repair-vector protocol: the dev sweep's heatmap, accuracy with Wilson
intervals per condition, the headroom check, and the transfer matrix. Every function takes
plain data (the rows, dicts and lists the results hold)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from mechlingo.core.errors import InputError
from mechlingo.viz.common import n_text, plain, with_n
from mechlingo.viz.palette import SCORE, SIGNED_EFFECT, series_color

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = [
    "accuracy_ci_figure",
    "ci_bars",
    "headroom_figure",
    "sweep_heatmap",
    "transfer_heatmap",
]


def sweep_heatmap(rows: Sequence[Mapping[str, Any]], *, vector: str, unit: str) -> go.Figure:
    """Screen-stage mean non-English accuracy over layer x alpha for one vector alone.

    ``rows``: the sweep's scored settings (dicts with ``stage``, ``vector``, ``layer``,
    ``alpha``, ``score``; only ``stage == "screen"`` rows of ``vector`` are drawn), ``unit``:
    what the alphas are measured in (the y axis)."""
    import plotly.graph_objects as go

    rows = [r for r in rows if r["vector"] == vector and r["stage"] == "screen"]
    layers = sorted({r["layer"] for r in rows})
    alphas = sorted({r["alpha"] for r in rows})
    grid = [[None] * len(layers) for _ in alphas]
    for r in rows:
        grid[alphas.index(r["alpha"])][layers.index(r["layer"])] = r["score"]
    fig = go.Figure(
        go.Heatmap(
            z=grid,
            x=[str(x) for x in layers],
            y=[f"{a:g}" for a in alphas],
            colorscale=SCORE,
            zmin=0,
            text=[[("" if v is None else f"{v:.2f}") for v in row] for row in grid],
            texttemplate="%{text}",
            colorbar={"title": "mean non-English<br>accuracy"},
        )
    )
    fig.update_layout(
        title=with_n(
            f"{vector} vector alone: dev screen, mean non-English accuracy",
            [r.get("n") for r in rows],
            "items per setting",
        ),  # fmt: skip
        xaxis_title="layer",
        yaxis_title=f"alpha ({unit})",
        height=360,
    )
    return fig


def ci_bars(
    fig: go.Figure,
    name: str,
    cells: Mapping[str, Mapping[str, Any]],
    langs: Sequence[str],
    condition: str | None = None,
) -> None:
    """Add one bar trace ``name`` to ``fig``: ``cells[lang]["estimate"]`` per language with error
    bars to ``lo`` and ``hi`` (none where they are ``None``), in the palette colour of
    ``condition`` (default: ``name``)."""
    import plotly.graph_objects as go

    ps = [cells.get(lg, {}).get("estimate") for lg in langs]
    up = [None if c.get("hi") is None else c["hi"] - c["estimate"] for c in map(cells.get, langs)]
    down = [None if c.get("lo") is None else c["estimate"] - c["lo"] for c in map(cells.get, langs)]
    fig.add_trace(
        go.Bar(
            name=name,
            x=langs,
            y=ps,
            error_y={"type": "data", "array": up, "arrayminus": down, "visible": True},
            marker_color=series_color(condition or name),
        )
    )


def accuracy_ci_figure(intervals: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> go.Figure:
    """Grouped bars of accuracy per language and condition with Wilson error bars
    (``intervals[condition][lang]``: dicts with ``estimate``, ``lo``, ``hi``, as in the protocol's
    summary)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    langs = sorted({lg for cells in intervals.values() for lg in cells})
    for cond, cells in intervals.items():
        ci_bars(fig, cond, cells, langs)
    ns = [c.get("n") for cells in intervals.values() for c in cells.values()]
    fig.update_layout(
        title=with_n("Test accuracy per language and condition (Wilson 95%)", ns, "per bar"),
        barmode="group",
        yaxis={"range": [0, 1], "title": "accuracy"},
        xaxis={"title": "prompt language"},
        height=380,
    )
    return fig


def headroom_figure(hr: Mapping[str, Any]) -> go.Figure:
    """Zero-shot vs k-shot accuracy per language with Wilson error bars (``hr``: ``k`` and
    ``zero_shot``/``k_shot`` cells per language, as in :func:`accuracy_ci_figure`)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    langs = sorted(hr.get("zero_shot", {}))
    for name in ("zero_shot", "k_shot"):
        label = f"{hr.get('k', '?')}-shot" if name == "k_shot" else "zero-shot"
        ci_bars(fig, label, hr.get(name, {}), langs, condition=name)
    ns = [c.get("n") for name in ("zero_shot", "k_shot") for c in hr.get(name, {}).values()]
    fig.update_layout(
        title=with_n("Headroom: zero-shot and k-shot accuracy (Wilson 95%)", ns, "per bar"),
        barmode="group",
        yaxis={"range": [0, 1], "title": "accuracy"},
        xaxis={"title": "prompt language"},
        height=340,
    )
    return fig


def transfer_heatmap(
    cells: Sequence[Mapping[str, Any]],
    *,
    rows: Sequence[str],
    cols: Sequence[str],
    by: str,
    value: str = "gain",
) -> go.Figure:
    """Rows (how the vectors were built) x columns (the test relation or language, ``by``)
    of a transfer matrix: colour = ``value`` (``"gain"`` or ``"control_gain"``, accuracy
    points over ``orig``), text = estimate, 95% interval, n; cells not measured are blank.

    ``cells``: one dict per measured cell with ``row``, ``col``, ``n`` and ``value``
    (``{"estimate", "lo", "hi"}``, proportions; the first cell of a row and column counts).
    Row and column names (relations from a user's facts file) are shown as text, not HTML."""
    import plotly.graph_objects as go

    if value not in ("gain", "control_gain"):
        raise InputError(f'value must be "gain" or "control_gain", got {value!r}')
    by_place: dict[tuple[str, str], Mapping[str, Any]] = {}
    for c in cells:
        by_place.setdefault((c["row"], c["col"]), c)
    z, text = [], []
    for r in rows:
        zr, tr = [], []
        for c in cols:
            cell = by_place.get((r, c))
            g = cell[value] if cell else None
            est = None if g is None or g["estimate"] is None else 100 * g["estimate"]
            zr.append(est)
            if est is None:
                tr.append("")
            else:
                lo, hi = (100 * g[k] if g[k] is not None else float("nan") for k in ("lo", "hi"))
                tr.append(f"{est:+.1f}<br>[{lo:+.1f}, {hi:+.1f}]<br>n={cell['n']}")
        z.append(zr)
        text.append(tr)
    vals = [abs(v) for row in z for v in row if v is not None]
    top = max(vals) if vals else 1.0
    fig = go.Figure(
        go.Heatmap(
            z=z, x=[plain(c) for c in cols], y=[plain(r) for r in rows], text=text,
            texttemplate="%{text}",
            colorscale=SIGNED_EFFECT, zmid=0, zmin=-top, zmax=top,
            colorbar={"title": "gain over orig<br>(accuracy points)"},
        )
    )  # fmt: skip
    what = "norm-matched random control" if value == "control_gain" else "repair vectors"
    ns = n_text([c.get("n") for c in cells], "per cell")
    fig.update_layout(
        title=f"Transfer by {by}: test gain over orig, {what} (95% CI; {ns or 'n unknown'})",
        xaxis_title=f"test {by}",
        yaxis_title="built on",
        yaxis={"autorange": "reversed"},
        height=max(320, 40 * len(rows) + 160),
    )
    return fig
