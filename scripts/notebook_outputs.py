"""Execute the notebooks and commit them with their outputs, stripped of what changes per run.

Usage:
    python scripts/notebook_outputs.py [NAME.ipynb ...]          re-execute, rewrite notebooks/
    python scripts/notebook_outputs.py --strip [NAME.ipynb ...]  only re-strip what is committed

Each notebook runs in a fresh kernel on the embedded model at its own default limit,
:data:`LIMIT` (what a user who just runs it gets; ``MECHLINGO_NB_LIMIT`` overrides it; the
notebook test runs at half of it, tests/system/test_notebooks.py). :func:`strip` then
normalises execution counts, drops timing and kernel metadata, progress bars, memory
addresses, the run's temp folder and plotly.js; each plotly figure keeps its JSON
(interactive in Jupyter, offline) and gets a static PNG drawn by headless Chromium (what
GitHub shows). :func:`signature` is what a re-execution
must reproduce: each cell's output types and figure titles (numbers masked).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
#: the data limit of the committed outputs: each notebook's default
LIMIT = "6"
PLOTLY = "application/vnd.plotly.v1+json"
WIDGET = "application/vnd.jupyter.widget-view+json"
#: mime types a plotly figure output keeps (the HTML with plotly.js is dropped)
FIGURE_KEEP = (PLOTLY, "image/png", "text/plain")
ADDRESS = re.compile(r"\b0x[0-9a-fA-F]{6,}\b")
#: an installed package's folder (in warnings): the same on every machine once masked
SITE = re.compile(r"/[^\s'\"]*/(?:site|dist)-packages/")
#: a recorded duration (a vector's build metadata shows ``"seconds": 9.0``)
SECONDS = re.compile(r"((?:&quot;|\")seconds(?:&quot;|\"): )\d+(?:\.\d+)?")
#: a stderr line of tqdm: a bar (carriage return, ``NN%|``) or its no-widgets warning
PROGRESS = re.compile(r"\r|\d+%\||TqdmWarning|from \.autonotebook import")
#: the PNG's size when the figure sets none
PNG_SIZE = (960, 520)


def _drop_progress(out: dict[str, Any]) -> bool:
    """Remove tqdm's lines from a stderr stream; whether nothing is left (or it is a widget)."""
    if out.get("output_type") != "stream":
        return WIDGET in out.get("data", {})
    if out.get("name") != "stderr":
        return False
    lines = "".join(out.get("text", "")).split("\n")
    out["text"] = "\n".join(line for line in lines if not PROGRESS.search(line))
    return not out["text"].strip()


def _clean_text(text: Any, workdir: str | None) -> Any:
    if not isinstance(text, str):
        return [_clean_text(t, workdir) for t in text] if isinstance(text, list) else text
    if workdir:
        text = text.replace(workdir, "$MECHLINGO_NB_OUT")
    text = text.replace(str(ROOT), "<repo>").replace(str(Path.home()), "~")
    text = SITE.sub("<site-packages>/", text)
    return SECONDS.sub(r"\1...", ADDRESS.sub("0x...", text))


def _is_plotly_init(out: dict[str, Any]) -> bool:
    """The output that loads plotly.js into the page (the ``notebook`` renderer)."""
    html = "".join(out.get("data", {}).get("text/html", ""))
    return PLOTLY not in out.get("data", {}) and "PlotlyConfig" in html


def strip(nb: Any, workdir: str | None = None) -> Any:
    """``nb`` (an executed notebook, changed in place and returned) without volatile bits:
    execution counts 1, 2, ... over the code cells, no per-cell metadata but tags, notebook
    metadata the kernelspec and language name only, no progress bars or plotly.js loader,
    plotly outputs with their JSON, PNG and text only, paths and addresses masked."""
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    count = 0
    for cell in nb.cells:
        tags = cell.get("metadata", {}).get("tags")
        cell["metadata"] = {"tags": tags} if tags else {}
        if cell.cell_type != "code":
            continue
        count += 1
        cell.execution_count = count
        kept = []
        for out in cell.get("outputs", []):
            if _drop_progress(out) or _is_plotly_init(out):
                continue
            out["metadata"] = {}
            if "execution_count" in out:
                out["execution_count"] = count
            data = out.get("data")
            if data is not None and PLOTLY in data:
                for key in [k for k in data if k not in FIGURE_KEEP]:
                    del data[key]
            if data is not None:
                for key in ("text/plain", "text/html", "text/markdown"):
                    if key in data:
                        data[key] = _clean_text(data[key], workdir)
            if "text" in out:
                out["text"] = _clean_text(out["text"], workdir)
            kept.append(out)
        cell.outputs = kept
    return nb


def figures(nb: Any) -> list[dict[str, Any]]:
    """Every plotly figure output's JSON, in order."""
    return [
        o["data"][PLOTLY]
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if PLOTLY in o.get("data", {})
    ]


def title(fig: dict[str, Any]) -> str:
    """A figure's title text ("" without one)."""
    t = fig.get("layout", {}).get("title", {})
    return str(t.get("text", "") if isinstance(t, dict) else t or "")


def signature(nb: Any) -> list[list[tuple[str, ...]]]:
    """What a re-execution must reproduce, per code cell: each output's type (stream name,
    or its mime types but the PNG) and, for a figure, its title with every number masked."""
    sig = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        row: list[tuple[str, ...]] = []
        for out in cell.get("outputs", []):
            kind = out["output_type"]
            if kind == "stream":
                row.append((kind, out["name"]))
                continue
            data = out.get("data", {})
            mimes = tuple(sorted(k for k in data if k != "image/png"))
            if PLOTLY in data:
                row.append((kind, *mimes, re.sub(r"\d+(\.\d+)?", "#", title(data[PLOTLY]))))
            else:
                row.append((kind, *mimes))
        sig.append(row)
    return sig


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def png(fig: dict[str, Any], browser: str, work: Path) -> bytes:
    """A static PNG of one plotly figure (JSON), drawn offline by headless Chromium."""
    import plotly

    js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    layout = dict(fig.get("layout", {}))
    w, h = int(layout.get("width") or PNG_SIZE[0]), int(layout.get("height") or PNG_SIZE[1])
    layout.update(width=w, height=h)
    spec = json.dumps({"data": fig.get("data", []), "layout": layout})
    page = work / "figure.html"
    page.write_text(
        f'<!doctype html><html><body style="margin:0"><script src="{js.as_uri()}"></script>'
        f'<div id="f"></div><script>Plotly.newPlot("f", {spec}.data, {spec}.layout,'
        "{staticPlot: true});</script></body></html>",
        encoding="utf-8",
    )
    shot = work / "figure.png"
    shot.unlink(missing_ok=True)
    subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--host-resolver-rules=MAP * ~NOTFOUND", "--allow-file-access-from-files",
         f"--window-size={w},{h}", "--virtual-time-budget=5000",
         f"--screenshot={shot}", page.as_uri()],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    return shot.read_bytes()


def add_pngs(nb: Any) -> int:
    """Give every plotly figure output of ``nb`` its static PNG (none without Chromium: a
    warning); the number drawn."""
    browser = _chromium()
    if browser is None:
        print("warning: no Chromium, the figures get no static PNG", file=sys.stderr)
        return 0
    n = 0
    with tempfile.TemporaryDirectory() as work:
        for cell in nb.cells:
            for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
                if PLOTLY in out.get("data", {}):
                    raw = png(out["data"][PLOTLY], browser, Path(work))
                    out["data"]["image/png"] = base64.b64encode(raw).decode("ascii")
                    n += 1
    return n


def commit(nb: Any, path: Path, workdir: str | None = None) -> Any:
    """Strip an executed notebook, draw its PNGs and write it to ``path`` (the notebook)."""
    import nbformat

    strip(nb, workdir)
    add_pngs(nb)
    nbformat.write(nb, path)
    return nb


def refresh(path: Path) -> Any:
    """Execute ``path`` in a fresh kernel at its default limit (:data:`LIMIT`; unless
    ``MECHLINGO_NB_LIMIT`` is set) and :func:`commit` it in place; the committed notebook."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from build_docs import execute_notebook

    with tempfile.TemporaryDirectory() as work:
        os.environ["MECHLINGO_NB_OUT"] = work
        return commit(execute_notebook(path, Path(work)), path, work)


if __name__ == "__main__":
    import nbformat

    only_strip = sys.argv[1:2] == ["--strip"]
    names = sys.argv[2:] if only_strip else sys.argv[1:]
    for path in [NOTEBOOKS / n for n in names] or sorted(NOTEBOOKS.glob("*.ipynb")):
        if not path.is_file():
            sys.exit(f"error: no notebook {path}; give names from {NOTEBOOKS}")
        if only_strip:
            nb = strip(nbformat.read(path, as_version=4))
            nbformat.write(nb, path)
        else:
            nb = refresh(path)
        print(f"{path.name}: {len(figures(nb))} figures, {path.stat().st_size // 1024} KiB")
