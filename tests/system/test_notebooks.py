"""Every notebook runs top to bottom on the embedded model (at :data:`TEST_LIMIT` facts per
language, a third of the committed run's limit, via MECHLINGO_NB_LIMIT) in a kernel forked
from a warm interpreter (:mod:`tests.notebook_kernels`), renders to the HTML page ``make docs``
publishes (outputs and figures included), and is committed with the outputs of such a run: a
re-execution gives the same output types and figure titles per cell (numbers excluded: they
are masked in the titles, and text outputs are compared by type only). The notebooks use the
public API; what the committed outputs may hold: tests/system/test_notebook_outputs.py."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.notebook_kernels import ForkedKernelManager, _context
from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
#: the limit the test runs each notebook at: a third of the committed run's (6), where every
#: cell still gives the committed run's output types and figure titles
TEST_LIMIT = "2"


def _code(path: Path) -> str:
    cells = json.loads(path.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_committed_with_outputs(path):
    import nbformat

    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code), path.name
    assert code[-1].outputs, f"{path.name}: run scripts/notebook_outputs.py"
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]


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
    import nbformat

    docs, nbo = load_script("build_docs"), load_script("notebook_outputs")
    monkeypatch.setenv("MECHLINGO_NB_LIMIT", os.environ.get("MECHLINGO_NB_LIMIT", TEST_LIMIT))
    monkeypatch.setenv("MECHLINGO_NB_OUT", str(tmp_path))
    # a kernel forked from a warm interpreter (tests/notebook_kernels.py); raises naming a
    # failing cell
    nb = docs.execute_notebook(path, tmp_path, timeout=900, kernel_manager=ForkedKernelManager)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    figures = [o for o in outputs if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert figures or "reuse" in path.name, "expected inline plotly figures"
    page = docs.notebook_html(nb)
    assert len(page) > 20_000 and "<html" in page
    if figures:  # the figures are in the page with plotly.js, not only as JSON
        assert "plotly-graph-div" in page and "Plotly.newPlot" in page
    committed = nbformat.read(path, as_version=4)
    assert nbo.signature(nbo.strip(nb, str(tmp_path))) == nbo.signature(committed)


def test_a_forked_kernel_starts_clean(tmp_path, monkeypatch, capfd):
    """The forked kernel has the folder and environment jupyter_client asked for, a new
    interpreter's module path (the checkout is not on it: a notebook cannot import tests/ or
    scripts/), torch on the asked thread count and plotly on the asked renderer, and nothing
    of the test process: no shape-check hook, no test module."""
    import nbformat

    docs = load_script("build_docs")
    monkeypatch.setenv("MECHLINGO_KERNEL_PROBE", "yes")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    probe = (
        "import os, sys, json, torch, plotly.io\n"
        "print(json.dumps([os.getcwd(), os.environ.get('MECHLINGO_KERNEL_PROBE'), os.getpid(),\n"
        "    torch.get_num_threads(), plotly.io.renderers.default,\n"
        "    sorted(m for m in sys.modules if m.startswith('tests')),\n"
        "    [type(f).__module__ for f in sys.meta_path], sys.path]))"
    )
    path = tmp_path / "probe.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(probe)]), path)
    nb = docs.execute_notebook(path, tmp_path, timeout=300, kernel_manager=ForkedKernelManager)
    got = json.loads(nb.cells[0].outputs[0]["text"])
    cwd, env, pid, threads, renderer, tests, finders, path = got
    assert "Ctrl-C will not work" not in capfd.readouterr().out  # it knows its parent
    assert (cwd, env, threads) == (str(tmp_path), "yes", 1)
    assert pid != os.getpid() and renderer == "plotly_mimetype+notebook"
    assert tests in ([], ["tests", "tests.notebook_kernels"]), tests  # the fork's own target
    assert not [f for f in finders if "jaxtyping" in f], finders
    assert str(ROOT) not in path and [p for p in path if p] == _context()[1], path
