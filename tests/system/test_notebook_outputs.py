"""The notebooks are committed with their outputs, stripped (``scripts/notebook_outputs.py``):
each committed notebook is a fixed point of the strip, holds no volatile bit (timestamps,
kernel metadata, progress bars, memory addresses, temp paths, plotly.js), every figure has
its plotly JSON and a PNG and is followed by a markdown cell with its numbers, and all five
stay under 3 MB. A notebook run as it is uses the committed limit, and its figures (drawn on
the embedded model) pass the semantic figure rules. The strip is checked on a hand-made
notebook."""

from __future__ import annotations

import base64
import copy
import json
import re
from pathlib import Path

import nbformat
import plotly.graph_objects as go
import pytest

from tests.scripts import load_script
from tests.system.test_figures import check_figure

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


NO = load_script("notebook_outputs")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_committed_outputs_are_stripped(path):
    nb = nbformat.read(path, as_version=4)
    assert NO.strip(copy.deepcopy(nb)) == nb, "re-run scripts/notebook_outputs.py"
    assert set(nb.metadata) == {"kernelspec", "language_info"}
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1))
    assert all(not c.metadata for c in code)  # no execution timestamps
    assert sum(len(c.outputs) for c in code) >= len(code) // 2
    text = json.dumps([c.outputs for c in code])
    volatiles = (r"0x[0-9a-f]{6,}", "/tmp/", "/work/", "/root/", r"\\r", r"%\|", "Tqdm")
    for volatile in (*volatiles, r"seconds&quot;: \d"):
        assert not re.search(volatile, text), (path.name, volatile)
    for out in (o for c in code for o in c.outputs):
        data = out.get("data", {})
        assert "text/html" not in data or "plotly" not in "".join(data["text/html"]).lower()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_each_figure_has_a_png_and_a_reading(path):
    nb = nbformat.read(path, as_version=4)
    n_figures = 0
    for i, cell in enumerate(nb.cells):
        figs = [o for o in cell.get("outputs", []) if NO.PLOTLY in o.get("data", {})]
        for out in figs:
            assert base64.b64decode(out.data["image/png"])[:8] == b"\x89PNG\r\n\x1a\n"
            assert NO.title(out.data[NO.PLOTLY]), "a figure without a title"
        if figs:
            n_figures += len(figs)
            after = nb.cells[i + 1] if i + 1 < len(nb.cells) else None
            assert after is not None and after.cell_type == "markdown", (path.name, i)
            assert re.search(r"\d", after.source), (path.name, i, "no numbers")
    assert n_figures or "reuse" in path.name
    if n_figures:  # the limits the numbers were taken under are said
        said = "".join(c.source for c in nb.cells if c.cell_type == "markdown")
        assert f"MECHLINGO_NB_LIMIT={NO.LIMIT}" in said, path.name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_default_limit_is_the_committed_limit(path):
    """Run without ``MECHLINGO_NB_LIMIT``, a notebook reads as many facts as its committed run
    did, so its "what to see" numbers are what the user gets."""
    code = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells
                     if c.cell_type == "code")  # fmt: skip
    defaults = re.findall(r"""environ\.get\(\s*["']MECHLINGO_NB_LIMIT["']\s*,\s*["'](\d+)""", code)
    assert defaults == [NO.LIMIT], (path.name, defaults)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_committed_figures_pass_the_figure_rules(path):
    """The committed figures come from the embedded model: n in every title, titled axes,
    log reversed rank axes, probabilities in [0, 1], concept colours from the palette."""
    figs = NO.figures(nbformat.read(path, as_version=4))
    for k, fig in enumerate(figs):
        check_figure(go.Figure(fig), f"{path.name} figure {k}")
    assert figs or "reuse" in path.name


def test_committed_notebooks_fit_in_three_megabytes():
    assert len(NOTEBOOKS) == 5
    assert sum(p.stat().st_size for p in NOTEBOOKS) < 3_000_000


def test_strip_on_a_hand_made_notebook():
    v4 = nbformat.v4
    fig = {"data": [], "layout": {"title": {"text": "Accuracy at layer 12 (n = 24)"}}}
    nb = v4.new_notebook()
    nb.metadata = {"kernelspec": {"name": "python3"}, "widgets": {"x": 1}}
    a = v4.new_code_cell("x", execution_count=7, metadata={"execution": {"t": "12:00"}})
    a.outputs = [
        v4.new_output("stream", name="stderr", text="50%|##   | 1/2 [00:01]\rdone\nkept\n"),
        v4.new_output(
            "stream", name="stdout", text='at 0x7f3a2b1c9d00 in /w/run1/x "seconds": 9.0\n'
        ),
        v4.new_output("stream", name="stderr", text="/v/lib/python3.11/site-packages/t.py:2: W\n"),
        v4.new_output("display_data", data={"text/html": "<script>window.PlotlyConfig"}),
    ]
    b = v4.new_code_cell("fig", execution_count=3)
    b.outputs = [
        v4.new_output("execute_result", data={NO.PLOTLY: fig, "text/html": "<div>"}, execution_count=3)
    ]  # fmt: skip
    nb.cells = [v4.new_markdown_cell("m"), a, b]
    out = NO.strip(nb, "/w/run1")
    assert out.metadata == {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    assert [c.get("execution_count") for c in out.cells] == [None, 1, 2]
    assert out.cells[1].metadata == {}
    assert [o.get("text") for o in out.cells[1].outputs] == [
        "kept\n",
        'at 0x... in $MECHLINGO_NB_OUT/x "seconds": ...\n',
        "<site-packages>/t.py:2: W\n",
    ]
    (res,) = out.cells[2].outputs
    assert set(res.data) == {NO.PLOTLY} and res.execution_count == 2
    assert NO.signature(out) == [
        [("stream", "stderr"), ("stream", "stdout"), ("stream", "stderr")],
        [("execute_result", NO.PLOTLY, "Accuracy at layer # (n = #)")],
    ]
