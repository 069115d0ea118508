"""Helpers shared by the figure modules: ``rgba`` and the shaded band (the colours are in
:mod:`mechlingo.viz.palette`)."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = [
    "VALUE_LABELS",
    "band",
    "html_summary",
    "interval_text",
    "readout_label",
    "n_text",
    "plain",
    "rank_axis",
    "rgba",
    "track_label",
    "with_n",
]


def plain(text: Any) -> str:
    """``text`` shown as it is in a plotly label, hover or cell text: plotly reads a subset of
    HTML in every string (a token ``<br>`` would break the line, ``<a href>`` would be a
    link), so ``<``, ``>`` and ``&`` are escaped; plotly shows the escaped text as written."""
    return html.escape(str(text), quote=False)


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


def track_label(track: str) -> str:
    """A lens track in words: ``"answer"`` -> "prompt-language answer", ``"en"`` -> "English
    answer" (the pivot), another code -> "answer in xx"."""
    if track == "answer":
        return "prompt-language answer"
    return "English answer" if track == "en" else f"answer in {track}"


#: How the patching readouts read in figure text.
_READOUT_NAMES = {
    "answer_logprob": "log-probability of the prompt-language answer",
    "en_logprob": "log-probability of the English answer",
}


def readout_label(name: str) -> str:
    """A patching readout in words (``"answer_logprob"`` -> "log-probability of the
    prompt-language answer"); an unlisted name is returned with its underscores as spaces."""
    return _READOUT_NAMES.get(name, name.replace("_", " "))


#: How a patching grid's value reads in figure text.
VALUE_LABELS = {
    "normalized": "normalised effect",
    "effect": "effect (patched - corrupted)",
    "mean": "mean patched value",
}


def rank_axis(fig: go.Figure, max_rank: float, *, title: str = "rank + 1", **where: Any) -> None:
    """Make the y axes ``where`` selects (``row=``, ``col=``; every one by default) rank axes:
    log scale, reversed (rank 1 at the top), one shared range from 1 to ``max_rank`` and one
    tick per decade, each titled."""
    top = math.log10(max(2.0, float(max_rank)) * 1.2)
    fig.update_yaxes(
        type="log",
        range=[top, math.log10(0.8)],
        autorange=False,
        dtick=1,
        minor={"showgrid": False, "ticks": ""},
        title_text=title,
        showticklabels=True,
        **where,
    )


def n_text(ns: Any, what: str = "") -> str:
    """``"n = 12 facts"`` from the counts ``ns`` (one int or several: ``"n = 8-12 facts"``
    for unequal ones); ``""`` when no count is known."""
    vals = [int(v) for v in ([ns] if isinstance(ns, (int, float)) else list(ns or [])) if v]
    if not vals:
        return ""
    lo, hi = min(vals), max(vals)
    span = f"{lo}" if lo == hi else f"{lo}-{hi}"
    return f"n = {span}" + (f" {what}" if what else "")


def with_n(title: str, ns: Any, what: str = "") -> str:
    """``title`` with ``(n = ...)`` appended (unchanged when no count is known)."""
    n = n_text(ns, what)
    return f"{title} ({n})" if n else title


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return "n/a" if math.isnan(v) else f"{v:.3g}"
    return html.escape(str(v))


def html_summary(title: str, rows: Sequence[Mapping[str, Any]], note: str = "") -> str:
    """A result's notebook display: a bold title, a table of ``rows`` (floats to three
    significant digits, NaN as n/a) and a note; plain HTML, no tensors."""
    head = f"<b>{html.escape(title)}</b>"
    if note:
        head += f" <span style='color:#666'>{html.escape(note)}</span>"
    if not rows:
        return head
    cols = list(dict.fromkeys(k for r in rows for k in r))
    th = "".join(f"<th>{html.escape(str(c))}</th>" for c in cols)
    body = "".join(
        "<tr>" + "".join(f"<td>{_cell(r.get(c, ''))}</td>" for c in cols) + "</tr>" for r in rows
    )
    return f"{head}<table><tr>{th}</tr>{body}</table>"


def interval_text(est: float | None, lo: float | None, hi: float | None) -> str:
    """``"0.42 [0.31, 0.55]"`` (``n/a`` for a missing bound)."""

    def f(v: float | None) -> str:
        return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3g}"

    return f"{f(est)} [{f(lo)}, {f(hi)}]"
