"""Self-contained HTML reports and atomic output folders.

A report is one HTML file with plotly's JavaScript inlined once, so it opens offline and
makes no network request. With ``plotlyjs="file"`` (the command line's ``--plotlyjs file``,
:func:`use_plotlyjs`, or ``MECHLINGO_PLOTLYJS=file`` in the environment) it loads plotly from ``plotly.min.js`` beside it instead, written once into the
output folder and shared by every report there (a report then weighs kilobytes, not 5 MB);
the default, ``"inline"``, keeps the self-contained single file. :func:`write_outputs` writes a command's files into ``--out`` only
after all of them are ready: the new folder is built beside it and put in place in one rename
(:func:`mechlingo.core.artifacts.atomic_folder`), so a failing or killed command leaves either the
old folder or the new one, never a mix.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as _dt
import html
import json
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from mechlingo.core.artifacts import write_files
from mechlingo.core.distributed import is_main
from mechlingo.core.errors import InputError
from mechlingo.kernels.significance import Interval
from mechlingo.report.tables import table_html

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;
max-width:1200px;color:#222;padding:0 16px}
h1{font-size:1.6em;margin-bottom:0}h2{font-size:1.25em;margin-top:2em;border-bottom:1px solid #ddd}
.meta{color:#666;font-size:.9em}table{border-collapse:collapse;margin:8px 0;font-size:.9em}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}th{background:#f4f4f4}
.note{background:#f8f8f0;border-left:4px solid #cc9;padding:6px 12px;margin:12px 0}
.figure{margin:12px 0;overflow-x:auto}
h2 a.anchor{color:inherit;text-decoration:none}h2 a.anchor:hover::after{content:" #";color:#999}
.headline{border:1px solid #ccd;background:#f6f8fc;padding:8px 14px;margin:12px 0}
.headline dl{display:grid;grid-template-columns:max-content auto;gap:2px 16px;margin:4px 0}
.headline dt{color:#555}.headline dd{margin:0;font-weight:600}
details.config{margin:8px 0;font-size:.85em;color:#444}
details.config pre{white-space:pre-wrap;word-break:break-all;max-height:40em;overflow:auto}
"""

#: The shared plotly.js file beside reports rendered with ``plotlyjs="file"``.
PLOTLYJS_FILE = "plotly.min.js"
#: How a report loads plotly.js: inlined (self-contained) or from :data:`PLOTLYJS_FILE`.
PLOTLYJS_MODES = ("inline", "file")


_MODE: contextvars.ContextVar[str | None] = contextvars.ContextVar("plotlyjs", default=None)


@contextlib.contextmanager
def use_plotlyjs(mode: str | None) -> Iterator[None]:
    """Inside the block, reports made without their own ``plotlyjs`` load plotly.js the
    ``mode`` way (``None``: as without the block); the ``--plotlyjs`` flag of every command.

    Raises:
        InputError: a mode other than :data:`PLOTLYJS_MODES`."""
    token = _MODE.set(None if mode is None else plotlyjs_mode(mode))
    try:
        yield
    finally:
        _MODE.reset(token)


def plotlyjs_mode(mode: str | None = None) -> str:
    """``mode``, else the mode of :func:`use_plotlyjs`, else ``MECHLINGO_PLOTLYJS`` from the
    environment, else ``"inline"``.

    Raises:
        InputError: a mode other than :data:`PLOTLYJS_MODES`."""
    got = mode or _MODE.get() or os.environ.get("MECHLINGO_PLOTLYJS") or "inline"
    if got not in PLOTLYJS_MODES:
        raise InputError(f"plotly.js mode {got!r} (MECHLINGO_PLOTLYJS): use inline or file")
    return got


_SLUG = re.compile(r"[^\w]+", re.UNICODE)

#: The ``meta`` keys named in the provenance line, in this order (with their labels).
PROVENANCE = (
    ("model", "model"),
    ("weights", "weights"),
    ("weights_fingerprint", "weights fingerprint"),
    ("device", "device"),
    ("templates", "templates"),
    ("data_format", "data"),
    ("n_facts", "facts"),
    ("vectors", "vectors"),
    ("clamp", "clamp"),
    ("mechlingo", "mechlingo"),
)


class Report:
    """An HTML report built section by section.

    The page opens with the title, the *headline* (:meth:`add_headline`: the few numbers a
    reader wants first, e.g. the effect, its interval, p and the control), one provenance
    line read from ``meta`` (model, weights, templates, data, seconds: :data:`PROVENANCE`)
    and the whole ``meta`` as JSON in a collapsed ``<details>`` block; then the sections.
    ``add_text`` takes escaped plain text (or trusted HTML with ``raw=True``), ``add_figure``
    a plotly figure, ``add_table`` a list of dict rows.
    """

    def __init__(
        self, title: str, meta: Mapping[str, Any] | None = None, *, plotlyjs: str | None = None
    ) -> None:
        self.plotlyjs = plotlyjs_mode(plotlyjs)
        self.title = title
        self.meta = dict(meta or {})
        self.headline: list[tuple[str, str]] = []
        self.parts: list[str] = []
        self.n_figures = 0
        self.figures: list[go.Figure] = []  # what add_figure drew, for tests of the figures
        self.anchors: set[str] = {"headline"}  # the ids of the sections (add_heading)

    def add_headline(self, label: str, value: Any) -> None:
        """One line of the headline block (``label``: ``value``, both plain text)."""
        self.headline.append((str(label), "n/a" if value is None else str(value)))

    def add_heading(self, text: str, anchor: str | None = None) -> str:
        """A section heading with an anchor (``anchor``, else made from the text: lower
        case, runs of other characters as ``-``; ``-2``, ``-3`` ... when taken), so
        ``report.html#anchor`` opens at the section. Returns the anchor."""
        base = anchor or (_SLUG.sub("-", text.casefold()).strip("-")[:60] or "section")
        slug, k = base, 1
        while slug in self.anchors:
            k += 1
            slug = f"{base}-{k}"
        self.anchors.add(slug)
        self.parts.append(
            f"<h2 id='{html.escape(slug)}'><a href='#{html.escape(slug)}' class='anchor'>"
            f"{html.escape(text)}</a></h2>"
        )
        return slug

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
        self.figures.append(fig)
        div = fig.to_html(
            full_html=False,
            include_plotlyjs=False,
            div_id=f"fig{self.n_figures}",
            config={"responsive": True, "displaylogo": False},
        )
        self.parts.append(f'<div class="figure">{div}</div>')

    def assets(self) -> dict[str, str]:
        """The files the page loads from beside it: :data:`PLOTLYJS_FILE` when it does not
        inline plotly.js (written once per output folder by
        :func:`mechlingo.core.artifacts.write_files`), else none."""
        from plotly.offline import get_plotlyjs

        return {PLOTLYJS_FILE: get_plotlyjs()} if self.plotlyjs == "file" else {}

    def _script(self) -> str:
        if self.plotlyjs == "file":
            return f"<script type='text/javascript' src='{PLOTLYJS_FILE}'></script>"
        from plotly.offline import get_plotlyjs

        return f"<script type='text/javascript'>{get_plotlyjs()}</script>"

    def render(self) -> str:
        """The page: plotly.js inlined, or loaded from :data:`PLOTLYJS_FILE` beside it
        (``plotlyjs``)."""
        return (
            "<!DOCTYPE html><html><head><meta charset='utf-8'>"
            f"<title>{html.escape(self.title)}</title><style>{_CSS}</style>"
            f"{self._script()}</head><body>"
            f"<h1>{html.escape(self.title)}</h1>{self._headline_html()}"
            f"{self._provenance_html()}{self._config_html()}" + "\n".join(self.parts)
            + "</body></html>"
        )  # fmt: skip

    def _headline_html(self) -> str:
        rows = "".join(
            f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in self.headline
        )
        return f'<div class="headline" id="headline"><dl>{rows}</dl></div>' if rows else ""

    def _provenance_html(self) -> str:
        stamp = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
        line = html.escape(provenance(self.meta))
        return f"<p class='meta provenance'>{line} · generated {stamp} by mechlingo</p>"

    def _config_html(self) -> str:
        if not self.meta:
            return ""
        text = json.dumps(self.meta, indent=1, ensure_ascii=False, default=str)
        return (
            '<details class="config"><summary>Full configuration (also in summary.json)'
            f"</summary><pre>{html.escape(text)}</pre></details>"
        )


def provenance(meta: Mapping[str, Any]) -> str:
    """One readable line of where the numbers come from: the :data:`PROVENANCE` keys of
    ``meta`` that are plain values, then the run's seconds (``seconds``)."""
    parts = [
        f"{label} {meta[key]}"
        for key, label in PROVENANCE
        if isinstance(meta.get(key), (str, int, float)) and meta.get(key) != ""
    ]
    if isinstance(meta.get("seconds"), (int, float)):
        parts.append(f"{meta['seconds']:g} s")
    return " · ".join(parts)


def write_outputs(
    out: str | os.PathLike[str], files: Mapping[str, Any], *, keep_others: bool = True
) -> Path:
    """Write ``{name: content}`` into the folder ``out`` all at once
    (:func:`mechlingo.core.artifacts.write_files`: ``str``, ``bytes``, a :class:`Report`, or
    anything JSON-serialisable for ``.json`` names), built in a temporary sibling and put at
    ``out`` in one rename, so a kill leaves the old folder or the new one. Existing files of
    the same names are replaced; other files in ``out`` are carried over (``keep_others``) or
    dropped. Under ``torchrun`` only rank 0 writes.
    """
    if not is_main():  # data-parallel runs: rank 0 writes, the others return the same path
        return Path(out)
    return write_files(out, files, keep_others=keep_others)


def fmt_interval(
    estimate: float | None,
    lo: float | None,
    hi: float | None,
    n: int | None = None,
    *,
    scale: float = 1.0,
    digits: int = 3,
    signed: bool = False,
    unit: str = "",
) -> str:
    """``"0.833 [0.700, 0.910] (n=48)"``
    (:meth:`~mechlingo.kernels.significance.Interval.format`), each number times ``scale``
    (100 for points), ``unit`` after the estimate (``"+3.2 points [-1.0, +7.5] (n=48)"``);
    ``n/a`` without an estimate. ``n=None`` leaves the count out."""
    if estimate is None:
        return "n/a"

    def x(v: float | None) -> float | None:
        return None if v is None else v * scale

    text = Interval(x(estimate), x(lo), x(hi), int(n or 0)).format(digits, signed=signed)
    if n is None:
        text = text.rsplit(" (n=", 1)[0]
    if not unit:
        return text
    head, _, rest = text.partition(" ")
    return f"{head} {unit} {rest}".rstrip()
