"""The claims card's forest plot: each claim's estimate and 95% interval against its
threshold and its control, coloured by verdict. Takes the card's rows (plain dicts)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from mechlingo.viz.palette import condition_color, verdict_color

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = ["forest_figure", "forest_rows"]

_FAMILY_ORDER = {"primary": 0, "secondary": 1}


def _interval(cell: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """The ``{estimate, lo, hi, n}`` of a row's ``value`` or ``control`` (a test's JSON
    holds it under ``estimate``; a bare interval is itself)."""
    if not cell:
        return {}
    inner = cell.get("estimate")
    return inner if isinstance(inner, Mapping) else cell


def forest_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The drawable rows, primary family first (then secondary, then rows without a
    family), each with ``label``, ``family``, ``verdict``, ``estimate``, ``lo``, ``hi``,
    ``n``, ``threshold`` and ``control`` (``None`` where the card has none)."""
    out = []
    for r in rows:
        v = _interval(r.get("value"))
        if v.get("estimate") is None:
            continue
        c = _interval(r.get("control"))
        label = r["id"] + (f" / {r['variant']}" if r.get("variant") else "")
        out.append({
            "label": label, "family": r.get("family"), "verdict": r.get("verdict", "?"),
            "estimate": v["estimate"], "lo": v.get("lo"), "hi": v.get("hi"), "n": v.get("n"),
            "threshold": (r.get("rule") or {}).get("threshold"),
            "control": c.get("estimate"),
        })  # fmt: skip
    return sorted(out, key=lambda r: _FAMILY_ORDER.get(r["family"] or "", 2))


def forest_figure(rows: Sequence[Mapping[str, Any]]) -> go.Figure:
    """One line per claim (:func:`forest_rows`, primary family first, top to bottom): the
    estimate with its 95% interval in its verdict's colour, the claim's threshold (grey
    bar) and its control's estimate (open diamond)."""
    import plotly.graph_objects as go

    drawn = forest_rows(rows)
    fig = go.Figure()
    labels = [f"{r['label']} ({r['family']})" if r["family"] else r["label"] for r in drawn]
    for verdict in dict.fromkeys(r["verdict"] for r in drawn):
        pts = [(lab, r) for lab, r in zip(labels, drawn, strict=True) if r["verdict"] == verdict]
        est = [r["estimate"] for _, r in pts]
        fig.add_trace(go.Scatter(
            x=est, y=[lab for lab, _ in pts], mode="markers", name=verdict,
            marker={"color": verdict_color(verdict), "size": 10},
            error_x={"type": "data", "symmetric": False,
                     "array": [(r["hi"] - r["estimate"]) if r["hi"] is not None else 0
                               for _, r in pts],
                     "arrayminus": [(r["estimate"] - r["lo"]) if r["lo"] is not None else 0
                                    for _, r in pts]},
            customdata=[r["n"] for _, r in pts],
            hovertemplate="%{y}: %{x:.3g} (n=%{customdata})<extra>" + verdict + "</extra>",
        ))  # fmt: skip
    marks = {
        "threshold": {"symbol": "line-ns-open", "size": 18, "color": "#777777",
                      "line": {"width": 2}},
        "control": {"symbol": "diamond-open", "size": 10, "color": condition_color("control")},
    }  # fmt: skip
    for key, marker in marks.items():  # each row's threshold and control beside its estimate
        at = [(lab, r[key]) for lab, r in zip(labels, drawn, strict=True) if r[key] is not None]
        if at:
            fig.add_trace(go.Scatter(x=[v for _, v in at], y=[lab for lab, _ in at],
                                     mode="markers", name=key, marker=marker))  # fmt: skip
    fig.update_layout(
        title=f"Claims: estimate and 95% interval against threshold and control "
        f"(n = {len(drawn)} claims; primary family first)",
        xaxis={"title": "estimate of the claim's measure", "zeroline": True},
        yaxis={"title": "claim (family)", "autorange": "reversed", "type": "category"},
        height=max(320, 28 * len(drawn) + 160),
        margin={"l": 260},
    )
    return fig
