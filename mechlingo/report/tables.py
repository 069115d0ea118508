"""HTML tables for reports."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any


def table_html(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """A plain HTML table of dict rows (escaped); floats are shown with 3 decimals."""
    if not rows:
        return "<p><em>(empty)</em></p>"
    columns = list(columns or rows[0].keys())
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)
    body = []
    for r in rows:
        cells = []
        for c in columns:
            v = r.get(c, "")
            if isinstance(v, float):
                v = f"{v:.3f}"
            cells.append(f"<td>{html.escape(str(v))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
