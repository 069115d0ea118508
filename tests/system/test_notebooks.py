"""Every notebook runs top to bottom on the embedded model (small limits via
MECHLINGO_NB_LIMIT), renders to the HTML page ``make docs`` publishes (outputs and figures
included), and is committed without outputs; the notebooks use the public API."""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _build_docs():
    spec = importlib.util.spec_from_file_location("build_docs", ROOT / "scripts" / "build_docs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _code(path: Path) -> str:
    cells = json.loads(path.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_committed_without_outputs(path):
    import nbformat

    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, path.name


def test_notebooks_use_the_public_api():
    """No private names (``_x``) and no reaching into internals: notebook 02 takes its
    patching pairs from ``corrupted_pairs``, notebook 05 applies hooks with ``intervene``."""
    for path in NOTEBOOKS:
        code = _code(path)
        private = re.findall(r"(?:import|\.)\s*(_[a-z]\w*)", code)
        assert not private, (path.name, private)
        assert "mechlingo.interventions.hf" not in code and "activations.runs" not in code
    assert "corrupted_pairs(trace, facts" in _code(ROOT / "notebooks/02_recall_pipeline.ipynb")
    assert "mechlingo.intervene(model, repair" in _code(ROOT / "notebooks/05_reuse_hooks.ipynb")


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_and_renders(path, monkeypatch, tmp_path):
    docs = _build_docs()
    monkeypatch.setenv("MECHLINGO_NB_LIMIT", os.environ.get("MECHLINGO_NB_LIMIT", "6"))
    monkeypatch.setenv("MECHLINGO_NB_OUT", str(tmp_path))
    nb = docs.execute_notebook(path, tmp_path, timeout=900)  # raises naming a failing cell
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    figures = [o for o in outputs if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert figures or "reuse" in path.name, "expected inline plotly figures"
    page = docs.notebook_html(nb)
    assert len(page) > 20_000 and "<html" in page
    if figures:  # the figures are in the page with plotly.js, not only as JSON
        assert "plotly-graph-div" in page and "Plotly.newPlot" in page
