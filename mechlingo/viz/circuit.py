"""A circuit drawn only from measurements: every line is a measured edge.

:func:`measured_circuit_figure` takes the JSON of a
:class:`~mechlingo.analyses.circuits.CircuitResult` (``to_json()``): each edge of
``edges`` is one line trace (its ``meta`` names the edge), its width the edge's absolute mean
score, its hover the score with its 95% interval and n, and the exact effect where the edge
was verified by exact edge patching. Nodes sit at (position group, layer); an edge joins a
sender and a receiver at the same position. ``phases`` (``{name: (first_layer,
last_layer)}``) are shaded as layer bands.

Across languages: :func:`faithfulness_curves_figure` (each language's faithfulness against
circuit size with its 95% interval) and :func:`language_matrix_figure` (a language-by-language
heatmap: the circuits' edge overlap with its permutation p, or one language's circuit run on
another's prompts).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mechlingo.viz.common import band, interval_text, plain
from mechlingo.viz.palette import SCORE, language_color, site_color
from mechlingo.viz.patching import add_phases

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = [
    "faithfulness_curves_figure",
    "language_matrix_figure",
    "measured_circuit_figure",
    "node_xy",
]


def node_xy(name: str, position: int, n_layers: int) -> tuple[float, float]:
    """Where a sender or receiver (by name) sits in the column of ``position``."""
    if name == "embed":
        return float(position), -1.0
    if name == "logits":
        return float(position), float(n_layers)
    if name.startswith("attn"):
        return position - 0.15, float(name[4:])
    if name.startswith("block"):
        return float(position), float(name[5:])
    if name.startswith("mlp"):
        return position + 0.15, float(name[3:]) + 0.5
    if name.startswith("m"):
        return position + 0.15, float(name[1:]) + 0.5
    layer, _, head = name[1:].partition(".h")
    shift = 0.04 * (int(head) + 1) if head else 0.0
    return position - 0.15 - shift, float(layer) + shift


def _color(sender: str) -> str:
    if sender == "embed":
        return site_color("resid_pre")
    if sender.startswith("m"):
        return site_color("mlp_out")
    return site_color("head" if ".h" in sender else "attn_out")


def _hover(e: Mapping[str, Any]) -> str:
    text = (
        f"{e['sender']} → {e['receiver']} at {e['position']}<br>"
        f"estimated effect {interval_text(e['score'], e['lo'], e['hi'])}, n = {e['n']} facts"
    )
    if "exact" in e:
        text += f"<br>exact edge patching: {e['exact']:.3g}"
    return text


def measured_circuit_figure(
    data: Mapping[str, Any],
    *,
    title: str | None = None,
    phases: Mapping[str, tuple[float, float]] | None = None,
) -> go.Figure:
    """The circuit of ``data`` (a ``CircuitResult.to_json()``); see the module docstring.
    The title gives n and the circuit's faithfulness with its interval; ``phases`` are
    shaded layer bands (none by default)."""
    import plotly.graph_objects as go

    positions = list(data["positions"])
    col = {p: i for i, p in enumerate(positions)}
    n_layers = int(data["n_layers"])
    edges = list(data["edges"])
    top = max((abs(float(e["score"])) for e in edges), default=1.0) or 1.0
    fig = go.Figure()
    nodes: dict[tuple[float, float], str] = {}
    for e in edges:
        k = col[e["position"]]
        x0, y0 = node_xy(e["sender"], k, n_layers)
        x1, y1 = node_xy(e["receiver"], k, n_layers)
        nodes[(x0, y0)], nodes[(x1, y1)] = e["sender"], e["receiver"]
        fig.add_trace(
            go.Scatter(
                x=[x0, x1], y=[y0, y1], mode="lines", name=e["edge"], meta={"edge": e["edge"]},
                line={"width": 1 + 7 * abs(float(e["score"])) / top, "color": _color(e["sender"])},
                hovertext=_hover(e), hoverinfo="text", showlegend=False,
                opacity=1.0 if float(e["score"]) < 0 else 0.55,
            )
        )  # fmt: skip
    fig.add_trace(
        go.Scatter(
            x=[p[0] for p in nodes], y=[p[1] for p in nodes], mode="markers+text",
            text=list(nodes.values()), textposition="middle right", name="components",
            marker={"size": 9, "color": "#444444"}, hoverinfo="text", showlegend=False,
        )
    )  # fmt: skip
    f = data.get("faithfulness") or {}
    head = title or "Measured circuit"
    fig.update_layout(
        title=f"{head}: {len(edges)} edges, faithfulness "
        f"{interval_text(f.get('faithfulness'), f.get('lo'), f.get('hi'))}, n = {data['n']} facts",
        height=max(420, 60 * (n_layers + 2)),
    )
    fig.update_xaxes(
        title_text="token position (group)", tickvals=list(range(len(positions))),
        ticktext=positions, range=[-0.6, len(positions) - 0.4],
    )  # fmt: skip
    fig.update_yaxes(
        title_text="layer (embeddings -1, logits on top)", range=[-1.5, n_layers + 0.5]
    )
    add_phases(fig, phases or {}, len(positions))
    return fig


def _ns(ns: Mapping[str, int]) -> str:
    return ", ".join(f"{lg} n = {int(n)}" for lg, n in ns.items())


def faithfulness_curves_figure(
    curves: Mapping[str, Mapping[str, Any]], *, title: str | None = None
) -> go.Figure:
    """Each language's faithfulness curve: ``curves[lang]`` holds ``curve`` (points with
    ``n_edges``, ``faithfulness``, ``lo``, ``hi``), ``n`` (facts) and optionally ``areas``
    (CPR and CMD, shown in the legend). The x axis is logarithmic (the 0-edge point, the
    corrupted run, is left out); the shaded band is the 95% interval clustered by fact."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for lg, c in curves.items():
        pts = [p for p in c["curve"] if int(p["n_edges"]) > 0]
        x = [int(p["n_edges"]) for p in pts]
        color = language_color(lg)
        lo = [p["lo"] if p["lo"] == p["lo"] else p["faithfulness"] for p in pts]
        hi = [p["hi"] if p["hi"] == p["hi"] else p["faithfulness"] for p in pts]
        fig.add_trace(band(x, lo, hi, color))
        areas = c.get("areas") or {}
        extra = ""
        if areas.get("cpr"):
            extra = f" (CPR {areas['cpr']['value']:.2f}, CMD {areas['cmd']['value']:.2f})"
        fig.add_trace(
            go.Scatter(
                x=x, y=[p["faithfulness"] for p in pts], mode="lines+markers",
                name=f"{plain(lg)}{extra}", line={"color": color},
                hovertext=[
                    f"{plain(lg)}, {p['n_edges']} edges: "
                    f"{interval_text(p['faithfulness'], p['lo'], p['hi'])}, n = {c['n']} facts"
                    for p in pts
                ],
                hoverinfo="text",
            )
        )  # fmt: skip
    ns = {lg: c["n"] for lg, c in curves.items()}
    fig.update_layout(
        title=f"{title or 'Faithfulness against circuit size'} ({_ns(ns)} facts; 95% "
        "intervals clustered by fact)"
    )
    fig.update_xaxes(title_text="edges in the circuit (log scale)", type="log")
    fig.update_yaxes(title_text="faithfulness (0 corrupted run, 1 clean run)")
    return fig


def language_matrix_figure(
    values: Mapping[str, Mapping[str, float]],
    ns: Mapping[str, int],
    *,
    title: str,
    colorbar: str,
    text: Mapping[str, Mapping[str, str]] | None = None,
    y_title: str = "circuit of language",
    x_title: str = "language",
    colorscale: str = SCORE,
) -> go.Figure:
    """A language-by-language heatmap of ``values[row][col]`` (a missing cell is blank),
    with ``text[row][col]`` in each cell and its hover (an interval, a p-value); the title
    gets each language's n. ``colorscale``: the palette's scale of what the cells are
    (:data:`~mechlingo.viz.palette.SCORE`, a faithfulness; :data:`~mechlingo.viz.palette.OVERLAP`,
    an edge Jaccard)."""
    import plotly.graph_objects as go

    langs = list(ns)
    z = [[values.get(a, {}).get(b) for b in langs] for a in langs]
    cells = [[(text or {}).get(a, {}).get(b, "") for b in langs] for a in langs]
    fig = go.Figure(
        go.Heatmap(
            z=z, x=langs, y=langs, text=cells, texttemplate="%{text}", hoverinfo="text",
            colorscale=colorscale, colorbar={"title": {"text": colorbar}},
        )
    )  # fmt: skip
    fig.update_layout(title=f"{title} ({_ns(ns)} facts)")
    fig.update_xaxes(title_text=x_title)
    fig.update_yaxes(title_text=y_title, autorange="reversed")
    return fig
