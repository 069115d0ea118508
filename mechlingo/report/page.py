"""Self-contained HTML reports and atomic output folders.

A report is one HTML file with plotly's JavaScript inlined once, so it opens offline and
makes no network request. :func:`write_outputs` writes a command's files into ``--out`` only
after all of them are ready: the new folder is built beside it and put in place in one rename
(:func:`mechlingo.core.artifacts.atomic_folder`), so a failing or killed command leaves either the
old folder or the new one, never a mix.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import torch

from mechlingo.activations.distributed import is_main
from mechlingo.core.artifacts import atomic_folder, kill_point
from mechlingo.report.tables import table_html

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;
max-width:1200px;color:#222;padding:0 16px}
h1{font-size:1.6em;margin-bottom:0}h2{font-size:1.25em;margin-top:2em;border-bottom:1px solid #ddd}
.meta{color:#666;font-size:.9em}table{border-collapse:collapse;margin:8px 0;font-size:.9em}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}th{background:#f4f4f4}
.note{background:#f8f8f0;border-left:4px solid #cc9;padding:6px 12px;margin:12px 0}
.figure{margin:12px 0}
"""


class Report:
    """An HTML report built section by section.

    ``add_text`` takes escaped plain text (or trusted HTML with ``raw=True``), ``add_figure``
    a plotly figure, ``add_table`` a list of dict rows.
    """

    def __init__(self, title: str, meta: Mapping[str, Any] | None = None) -> None:
        self.title = title
        self.meta = dict(meta or {})
        self.parts: list[str] = []
        self.n_figures = 0

    def add_heading(self, text: str) -> None:
        self.parts.append(f"<h2>{html.escape(text)}</h2>")

    def add_text(self, text: str, *, raw: bool = False, note: bool = False) -> None:
        body = text if raw else html.escape(text)
        cls = ' class="note"' if note else ""
        self.parts.append(f"<p{cls}>{body}</p>")

    def add_table(
        self, rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None
    ) -> None:

        self.parts.append(table_html(rows, columns))

    def add_figure(self, fig: go.Figure) -> None:
        self.n_figures += 1
        div = fig.to_html(
            full_html=False,
            include_plotlyjs=False,
            div_id=f"fig{self.n_figures}",
            config={"responsive": True, "displaylogo": False},
        )
        self.parts.append(f'<div class="figure">{div}</div>')

    def render(self) -> str:
        from plotly.offline import get_plotlyjs

        meta = " · ".join(
            f"{html.escape(str(k))}: {html.escape(str(v))}" for k, v in self.meta.items()
        )
        stamp = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
        return (
            "<!DOCTYPE html><html><head><meta charset='utf-8'>"
            f"<title>{html.escape(self.title)}</title><style>{_CSS}</style>"
            f"<script type='text/javascript'>{get_plotlyjs()}</script></head><body>"
            f"<h1>{html.escape(self.title)}</h1><p class='meta'>{meta} · generated {stamp} by "
            "mechlingo</p>" + "\n".join(self.parts) + "</body></html>"
        )


def _json_default(obj: Any) -> Any:
    try:
        if isinstance(obj, torch.Tensor):
            return obj.tolist()
    except ImportError:  # pragma: no cover
        pass
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cannot write {type(obj).__name__} to JSON")


def write_outputs(
    out: str | os.PathLike[str], files: Mapping[str, Any], *, keep_others: bool = True
) -> Path:
    """Write ``{name: content}`` into the folder ``out`` all at once.

    Content: ``str`` (text), ``bytes``, a :class:`Report`, or anything JSON-serialisable (for
    ``.json`` names). The new folder is built in a temporary sibling and put at ``out`` in
    one rename, so a kill leaves the old folder or the new one. Existing files of the same
    names are replaced; other files in ``out`` are carried over (``keep_others``) or dropped.
    Under ``torchrun`` only rank 0 writes.
    """

    out = Path(out)
    if not is_main():  # data-parallel runs: rank 0 writes, the others return the same path
        return out
    with atomic_folder(out, keep_others=keep_others) as tmp:
        for i, (name, content) in enumerate(files.items()):
            if i == 1:
                kill_point("write")
            path = tmp / name
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, Report):
                path.write_text(content.render(), encoding="utf-8")
            elif isinstance(content, bytes):
                path.write_bytes(content)
            elif isinstance(content, str):
                path.write_text(content, encoding="utf-8")
            else:
                path.write_text(
                    json.dumps(content, indent=2, ensure_ascii=False, default=_json_default),
                    encoding="utf-8",
                )
    return out
