"""Build the docs site: the API reference from the docstrings (pdoc, warnings as errors) and
the notebooks, executed, with their outputs and figures.

Usage:
    python scripts/build_docs.py [OUT]                   API reference (default site/api)
    python scripts/build_docs.py --notebooks [OUT]       notebooks (default site/notebooks)

Every module of the package gets a page; any pdoc warning (a module that fails to import, a
duplicate, a broken reference it detects) fails the build. Each notebook of ``notebooks/``
is executed top to bottom in a fresh kernel (nbclient; ``MECHLINGO_NB_LIMIT`` sets its data
limits, by default those of the committed outputs, ``scripts/notebook_outputs.py``) and
written as one HTML page with its outputs; plotly figures are embedded as interactive figures
with plotly.js inline, so the pages work offline. The same run is committed back into
``notebooks/``, stripped (``notebook_outputs.commit``), so pages and notebooks agree.
"""

from __future__ import annotations

import html
import importlib
import os
import pkgutil
import sys
import warnings
from pathlib import Path


def modules() -> list[str]:
    """The package and its tiers (pdoc documents each package's submodules)."""
    import mechlingo

    for name in mechlingo.__all__:  # resolve the lazily loaded top-level names for pdoc
        getattr(mechlingo, name)
    names = ["mechlingo"]
    for info in pkgutil.iter_modules(mechlingo.__path__, "mechlingo."):
        if info.name == "mechlingo.__main__":
            continue
        names.append(info.name)
    # A room of the analyses with ``__all__`` (e.g. analyses.experts) hides its other
    # submodules from pdoc, so those are named explicitly.
    for info in pkgutil.walk_packages(mechlingo.__path__, "mechlingo."):
        # the rooms of the analyses tier (scoring, decoders, recall, experts) and the card
        if not info.ispkg or not (
            info.name.count(".") == 2 and info.name.startswith("mechlingo.analyses.")
        ):
            continue
        package = importlib.import_module(info.name)
        shown = set(getattr(package, "__all__", ()))
        if shown:
            for sub in pkgutil.iter_modules(package.__path__, info.name + "."):
                if sub.name.rsplit(".", 1)[1] not in shown | {"__main__"}:
                    names.append(sub.name)
    return names


def build(out: Path) -> list[str]:
    import pdoc
    import pdoc.render

    pdoc.render.configure(docformat="google", show_source=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pdoc.pdoc(*modules(), output_directory=out)
    return modules()


NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def execute_notebook(path: Path, workdir: Path, timeout: int = 1800, kernel_manager=None):
    """``path`` run top to bottom in a fresh ``python3`` kernel in ``workdir``; the notebook
    with its outputs (raises ``CellExecutionError`` naming the failing cell). Figures come out
    both as plotly JSON and as HTML (``PLOTLY_RENDERER``), for the tests and the pages.
    ``kernel_manager``: a jupyter_client kernel manager class other than the default."""
    import nbformat
    from nbclient import NotebookClient

    os.environ["PLOTLY_RENDERER"] = "plotly_mimetype+notebook"
    os.environ.setdefault("MECHLINGO_NB_OUT", str(workdir))
    nb = nbformat.read(path, as_version=4)
    more = {} if kernel_manager is None else {"kernel_manager_class": kernel_manager}
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(workdir)}},
        **more,
    )
    client.execute()
    return nb


def notebook_html(nb) -> str:
    """One self-contained HTML page of an executed notebook (nbconvert's ``lab`` template)."""
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
    return body


def render_notebooks(
    out: Path, paths: list[Path] | None = None, write_back: bool = True
) -> list[Path]:
    """Execute each notebook and write ``out/<name>.html`` and an index page; the pages.
    With ``write_back`` the executed notebook also replaces ``path``, stripped."""
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import notebook_outputs

    out.mkdir(parents=True, exist_ok=True)
    pages = []
    for path in paths or sorted(NOTEBOOKS.glob("*.ipynb")):
        with tempfile.TemporaryDirectory() as work:
            os.environ["MECHLINGO_NB_OUT"] = work
            nb = execute_notebook(path, Path(work))
            page = out / f"{path.stem}.html"
            page.write_text(notebook_html(nb), encoding="utf-8")
            if write_back:
                notebook_outputs.commit(nb, path, work)
        pages.append(page)
        print(f"rendered {path.name} -> {page}")
    items = "\n".join(
        f'<li><a href="{html.escape(p.name)}">{html.escape(p.stem.replace("_", " "))}</a></li>'
        for p in pages
    )
    (out / "index.html").write_text(
        "<!doctype html><meta charset=utf-8><title>mechlingo notebooks</title>"
        "<h1>mechlingo notebooks</h1><p>Executed on the embedded model when the docs were "
        f"built (small data limits).</p><ul>{items}</ul>\n",
        encoding="utf-8",
    )
    return pages


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--notebooks"]:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from notebook_outputs import LIMIT

        limit = os.environ.setdefault("MECHLINGO_NB_LIMIT", LIMIT)
        target = Path(args[1]) if len(args) > 1 else Path("site/notebooks")
        if limit != LIMIT:  # the notebooks' markdown cites the numbers of LIMIT
            print(f"MECHLINGO_NB_LIMIT={limit}: notebooks/ is left as committed (at {LIMIT})")
        pages = render_notebooks(target, write_back=limit == LIMIT)
        print(f"{len(pages)} notebooks rendered in {target}")
    else:
        target = Path(args[0]) if args else Path("site/api")
        names = build(target)
        print(f"API reference for {len(names)} modules in {target}")
