"""Figures of activation patching: the layer-by-position heatmaps, the attention-knockout
curve and the circuit diagram drawn from measured patching effects. Every function takes
plain data (tensors, lists, dicts)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypedDict, Unpack

import torch
from jaxtyping import Float
from torch import Tensor

from mechlingo.viz.common import VALUE_LABELS, plain, readout_label, rgba
from mechlingo.viz.palette import SEQUENCE, SIGNED_EFFECT, effect_color, site_color

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = [
    "CircuitOptions",
    "Component",
    "circuit_figure",
    "add_phases",
    "knockout_figure",
    "patching_heatmaps",
]


class Component(NamedTuple):
    """One patched place of a sweep: site, layer, position (an index into the position
    labels) and head (``-1`` for a whole-site patch). A plain 4-tuple works as well."""

    site: str
    layer: int
    position: int
    head: int = -1


def patching_heatmaps(
    grids: Mapping[str, Float[Tensor, "layer position ..."]],
    *,
    layers: Sequence[int],
    position_labels: Sequence[Any],
    heads: Sequence[int],
    readout_name: str,
    alignment: str,
    value: str = "normalized",
    n_examples: int | None = None,
) -> go.Figure:
    """One layer-by-position heatmap per site (``grids[site]``, in order; ``value`` names
    what the grids hold: normalised effect, effect or mean of the patched readout, for the
    title and the colour bar); a ``head`` grid (``[layer, position, head]``) is shown
    layer-by-head, averaged over positions. ``n_examples`` (the clean prompts averaged)
    goes into the title."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    sites = list(grids)
    fig = make_subplots(
        rows=1,
        cols=len(sites),
        subplot_titles=[s if s != "head" else "heads (mean over positions)" for s in sites],
        horizontal_spacing=0.06,
    )
    for k, s in enumerate(sites):
        z = grids[s]
        x: list[Any] = [plain(p) if isinstance(p, str) else p for p in position_labels]
        if s == "head":
            z = torch.nanmean(z, dim=1)
            x = [f"h{h}" for h in heads]
        fig.add_trace(
            go.Heatmap(
                z=z.tolist(),
                x=x,
                y=list(layers),
                colorscale=SIGNED_EFFECT,
                zmid=0,
                coloraxis="coloraxis",
                hovertemplate="layer %{y}, %{x}: %{z:.3f}<extra>" + s + "</extra>",
            ),
            row=1,
            col=k + 1,
        )
    what = VALUE_LABELS.get(value, value)
    fig.update_yaxes(title_text="layer")
    for k, s in enumerate(sites):
        fig.update_xaxes(title_text="head" if s == "head" else "token position", col=k + 1)
    n = f"; n = {n_examples} clean prompts" if n_examples is not None else ""
    fig.update_layout(
        title=f"Activation patching ({alignment} alignment{n}): {what} on the "
        f"{readout_label(readout_name)}",
        coloraxis={"colorscale": SIGNED_EFFECT, "cmid": 0, "colorbar": {"title": {"text": what}}},
        height=460,
    )
    return fig


def knockout_figure(
    relative_change: Float[Tensor, " window"],
    lo: Float[Tensor, " window"],
    hi: Float[Tensor, " window"],
    *,
    windows: Sequence[tuple[int, int]],
    keys: str,
    readout_name: str,
    n_examples: int | None = None,
) -> go.Figure:
    """Relative change of the answer readout when attention from the last token to the
    ``keys`` positions is blocked in each layer window (``(first, last)``), with its 95%
    interval ``[lo, hi]`` as error bars; ``n_examples`` (the prompts) goes into the title."""
    import plotly.graph_objects as go

    x = [f"{a}-{b}" for a, b in windows]
    fig = go.Figure(
        go.Scatter(
            x=x,
            y=relative_change.tolist(),
            mode="lines+markers",
            error_y={
                "type": "data",
                "symmetric": False,
                "array": (hi - relative_change).tolist(),
                "arrayminus": (relative_change - lo).tolist(),
            },
            name=f"blocked last -> {keys}",
            line={"color": effect_color("knockout")},
            marker={"color": effect_color("knockout")},
        )
    )
    fig.add_hline(y=0, line={"color": "#999"})
    n = f" (n = {n_examples} prompts)" if n_examples is not None else ""
    fig.update_layout(
        title=f"Attention knockout (last token -> {keys}): change of the "
        f"{readout_label(readout_name)}{n}",
        xaxis={"title": "blocked layer window", "type": "category"},
        yaxis={"title": "relative change", "tickformat": ".0%"},
        height=380,
    )
    return fig


Node = tuple[Component, float]  # (component, normalised effect)


def _circuit_nodes(cells: Sequence[Component], vals: Tensor, heads: bool, top_k: int) -> list[Node]:
    """The ``top_k`` component cells with the largest absolute normalised effect (attention
    and MLP outputs, and single heads with ``heads``; residual cells when none was swept)."""
    drawn = ("attn_out", "mlp_out", "head") if heads else ("attn_out", "mlp_out")
    comp = [i for i, c in enumerate(cells) if c.site in drawn]
    if not comp:
        comp = [i for i, c in enumerate(cells) if c.site != "head"]
    scored = sorted(
        (i for i in comp if not math.isnan(float(vals[i]))),
        key=lambda i: -abs(float(vals[i])),
    )[:top_k]
    return [(cells[i], float(vals[i])) for i in scored]


def _node_xy(cell: Component) -> tuple[float, float]:
    """A node's place: its position (attention left, MLP right of it) and its layer."""
    off = {"attn_out": -0.15, "mlp_out": 0.15, "head": -0.3}.get(cell.site, 0.0)
    return cell.position + off, float(cell.layer)


def _label_heights(phases: Mapping[str, tuple[float, float]], gap: float) -> list[float]:
    """Heights of the phase labels: each at its band's middle, moved up just enough to sit
    ``gap`` layers above the label below it, so that no two labels overlap."""
    mids = [(a + b) / 2 for a, b in phases.values()]
    order = sorted(range(len(mids)), key=lambda i: mids[i])
    out = list(mids)
    for prev, cur in zip(order, order[1:], strict=False):
        out[cur] = max(out[cur], out[prev] + gap)
    return out


def add_phases(fig: go.Figure, phases: Mapping[str, tuple[float, float]], n_pos: int) -> None:
    """Shaded layer bands, one per phase, labelled on the right (labels kept apart)."""
    heights = _label_heights(phases, gap=1.0)
    for k, (name, (a, b)) in enumerate(phases.items()):
        fig.add_shape(
            type="rect",
            x0=-0.5,
            x1=n_pos - 0.5,
            y0=a - 0.45,
            y1=b + 0.45,
            fillcolor=rgba(SEQUENCE[(k + 3) % len(SEQUENCE)], 0.12),
            line={"width": 0},
            layer="below",
        )
        fig.add_annotation(
            x=n_pos - 0.5,
            y=heights[k],
            text=name,
            showarrow=False,
            xanchor="left",
            font={"size": 11},
        )


def _add_nodes(
    fig: go.Figure,
    position_labels: Sequence[Any],
    nodes: Sequence[Node],
    labels: Sequence[str],
    exact: Mapping[tuple, float],
) -> None:
    """One marker trace per site: size ~ |effect|, hover = value (and a head's name)."""
    import plotly.graph_objects as go

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
                    "color": site_color(site),
                    "line": {"width": 1, "color": "white"},
                },
                customdata=[
                    [v, labels[c.position], _node_note(c, position_labels, exact)] for c, v in pts
                ],
                hovertemplate="layer %{y}, %{customdata[1]}: normalised effect "
                "%{customdata[0]:.3f}%{customdata[2]}<extra>" + site + "</extra>",
            )
        )


#: The note under a patching circuit diagram: why it draws no edges.
EDGES_NOTE = (
    "Nodes: measured patching effects. No edges are drawn: a patching sweep measures "
    "components, not paths (find_circuit measures edges)."
)


class CircuitOptions(TypedDict, total=False):
    """The keywords of :func:`circuit_figure` after the sweep's data and axes, which
    :meth:`~mechlingo.analyses.recall.patching.PatchingResult.fig_circuit` passes on (their
    defaults and meaning are :func:`circuit_figure`'s)."""

    top_k: int
    phases: Mapping[str, tuple[float, float]] | None
    token_labels: Sequence[str] | None
    title: str | None
    heads: bool
    verified: Sequence[Mapping[str, Any]] | None
    n_examples: int | None


def circuit_figure(
    cells: Sequence[Component | tuple[str, int, int, int]],
    effects: Float[Tensor, " cell"],
    *,
    layers: Sequence[int],
    position_labels: Sequence[Any],
    readout_name: str,
    **options: Unpack[CircuitOptions],
) -> go.Figure:
    """A circuit diagram drawn from measured patching effects (``options``:
    :class:`CircuitOptions`, each unset one its default here: ``top_k`` 12, ``heads``
    ``False``, the others ``None``; ``n_examples``: the clean prompts averaged, appended to
    the title).

    ``cells`` are the sweep's patched places (:class:`Component`: site, layer, position
    index, head) and ``effects`` their normalised effects on ``readout_name``; ``layers``
    and ``position_labels`` are the sweep's axes.

    With ``heads`` the sweep's single attention heads (site ``head``) compete for the
    ``top_k`` nodes too (drawn left of the position, named ``L{layer}H{head}`` in the hover);
    ``verified`` rows (from :func:`mechlingo.analyses.recall.attribution.verify_top_cells`: ``layer``,
    ``position``, ``head``, ``exact``) add each head's exact normalised effect to its hover.

    Grid: token positions (x) by layers (y). Nodes: the ``top_k`` component cells (attention
    and MLP outputs when swept, else residual cells) with the largest absolute normalised
    effect; marker size ~ |effect|, color = site, hover = value. No edges: a patching sweep
    measures components, not the paths between them, and a line drawn by a rule would read as
    a measured path (a note under the grid says so; :func:`mechlingo.analyses.circuits.find_circuit`
    measures edges and :func:`mechlingo.viz.circuit.measured_circuit_figure` draws them).
    Phases are shaded layer bands given
    by ``phases`` ``{name: (first_layer, last_layer)}`` (see
    :func:`mechlingo.analyses.recall.trace_patching.pipeline_phases`).
    """
    import plotly.graph_objects as go

    top_k, heads = options.get("top_k", 12), options.get("heads", False)
    phases, token_labels = options.get("phases"), options.get("token_labels")
    title, n_examples = options.get("title"), options.get("n_examples")
    comps = [Component(*c) for c in cells]
    nodes = _circuit_nodes(comps, effects, heads, top_k)
    verified = options.get("verified") or []
    exact = {(r["layer"], str(r["position"]), r["head"]): r["exact"] for r in verified}
    labels = [plain(x) for x in (token_labels or position_labels)]
    n_pos = len(position_labels)
    lo_layer, hi_layer = min(layers), max(layers)
    fig = go.Figure()
    add_phases(fig, phases or {}, n_pos)
    fig.add_annotation(text=EDGES_NOTE, x=0, y=-0.3, xref="paper", yref="paper",
                       xanchor="left", yanchor="top", showarrow=False, font={"size": 11})  # fmt: skip
    _add_nodes(fig, position_labels, nodes, labels, exact)
    fig.update_xaxes(
        tickvals=list(range(n_pos)),
        ticktext=labels,
        range=[-0.6, n_pos + 0.9],
        title="token position",
    )
    fig.update_yaxes(range=[lo_layer - 0.8, hi_layer + 0.8], title="layer", dtick=1)
    head = title or (
        f"Circuit: top {len(nodes)} components by patching effect on the "
        f"{readout_label(readout_name)}"
    )
    if n_examples is not None:
        head += f" (n = {n_examples} clean prompts)"
    fig.update_layout(
        title=head,
        height=max(420, 28 * (hi_layer - lo_layer + 1) + 120),
        margin={"b": 130},
        showlegend=True,
    )
    return fig


def _node_note(
    cell: Component, position_labels: Sequence[Any], exact: Mapping[tuple, float]
) -> str:
    """Hover suffix of a circuit node: a head's name and, when verified, its exact effect."""
    if cell.site != "head":
        return ""
    note = f" (L{cell.layer}H{cell.head})"
    key = (cell.layer, str(position_labels[cell.position]), cell.head)
    if key in exact:
        note += f", exact: {exact[key]:.3f}"
    return note
