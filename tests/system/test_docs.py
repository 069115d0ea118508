"""The docs: the API reference builds from the docstrings with warnings as errors, every
relative link between the Markdown pages points at a file that exists, the README's Python
blocks run as written on the embedded model, and its layout and getting-started match the code."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_api_reference_builds_without_warnings(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build_docs.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for module in (
        "analyses/decoders/lens",
        "core/tokens",
        "interventions",
        "analyses/recall/patching",
        "analyses/experts",
        "analyses/experts/align",
    ):
        page = tmp_path / "mechlingo" / f"{module}.html"
        assert page.is_file(), module
        assert len(page.read_text()) > 5000


def test_markdown_links_resolve():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    nxt = text.find("\n## ", start + len(heading))
    return text[start : nxt if nxt >= 0 else len(text)]


def python_blocks(text: str) -> list[str]:
    """The fenced ```python blocks of a Markdown text, in order."""
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


@pytest.mark.slow
def test_readme_python_blocks_run_as_written(gemma, monkeypatch, capsys):
    """Every ```python block of the README, in order, in one namespace, as a reader pastes
    them into one session. The only change: ``mechlingo.load_model()`` returns the session's
    already loaded embedded model (the same weights it would load) to save the load."""
    import mechlingo

    monkeypatch.setattr(mechlingo, "load_model", lambda *a, **k: gemma)
    blocks = python_blocks((ROOT / "README.md").read_text())
    assert len(blocks) >= 2
    namespace: dict = {"__name__": "__readme__"}
    for i, block in enumerate(blocks):
        exec(compile(block, f"README.md python block {i + 1}", "exec"), namespace)
    assert set(namespace["trace"].counts()) == {"en", "es", "fr", "ja"}
    assert sum(namespace["trace"].counts()["ja"].values()) == 6
    assert capsys.readouterr().out.strip().startswith("{")
    logits = namespace["logits"]
    assert logits.shape[0] == 6 and logits.shape[-1] == gemma.cfg.d_vocab
    assert bool(logits.isfinite().all())


def test_readme_layout_names_every_subpackage_and_analysis():
    layout = _section((ROOT / "README.md").read_text(), "## Layout")
    pkg = ROOT / "mechlingo"
    missing = [
        d.name
        for d in pkg.iterdir()
        if (d / "__init__.py").is_file() and f"{d.name}/" not in layout
    ]
    rooms = [d for d in (pkg / "analyses").iterdir() if (d / "__init__.py").is_file()]
    for room in [*rooms, pkg / "card", pkg / "scoring"]:
        if room.parent.name == "analyses" and f"{room.name}/" not in layout:
            missing.append(f"analyses/{room.name}/")
        for mod in room.iterdir():
            name = mod.stem
            if (
                name.startswith("_")
                or name in ("entries", "results")
                or mod.suffix not in (".py", "")
            ):
                continue  # shared result plumbing, not an analysis
            if not re.search(rf"\b{name}\b", layout):
                missing.append(f"{room.name}/{name}")
    for gone in ("pipeline", "alignment"):
        if re.search(rf"\b{gone}\b", layout):
            missing.append(f"stale name {gone}")
    assert not missing, missing


def test_getting_started_matches_make_demo():
    """getting-started describes what ``make demo`` runs (the tracer), and its Python block
    names functions that exist."""
    make = (ROOT / "Makefile").read_text()
    demo = re.search(r"^demo:.*\n\t\$\(BIN\)/mechlingo (\w+)", make, flags=re.M)
    assert demo is not None
    page = (ROOT / "docs" / "getting-started.md").read_text()
    assert f"mechlingo {demo.group(1)}" in page
    for block in python_blocks(page):
        compile(block, "getting-started.md", "exec")


def imports_of(code: str) -> list[tuple[str, str]]:
    """``(module, name)`` for every import of a code block (``name`` empty for ``import m``);
    a block that is not whole Python (a ``...`` placeholder line) is read statement by
    statement."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        stmts = re.findall(r"^(?:from \S+ import (?:\([^)]*\)|[^\n]*)|import [^\n]*)", code, re.M)
        tree = ast.parse("\n".join(s.split("#")[0] for s in stmts))
    out: list[tuple[str, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            out += [(node.module or "", a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(a.name, "") for a in node.names]
    return out


def _notebook_code(path: Path) -> str:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


def _deep_imports(code: str) -> list[str]:
    return [f"{m}:{n}" for m, n in imports_of(code) if m.startswith("mechlingo.")]


def test_the_readme_getting_started_and_notebooks_import_only_from_mechlingo():
    """What a newcomer reads first uses the top-level API: ``import mechlingo`` or ``from
    mechlingo import name``, never a module path, and every name it imports is public."""
    import mechlingo

    found = {}
    for page in (ROOT / "README.md", ROOT / "docs" / "getting-started.md"):
        for block in python_blocks(page.read_text(encoding="utf-8")):
            found[page.name] = found.get(page.name, []) + _deep_imports(block)
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        code = _notebook_code(path)
        found[path.name] = _deep_imports(code)
        names = [n for m, n in imports_of(code) if m == "mechlingo" and n]
        assert names and set(names) <= set(mechlingo.__all__), path.name
    assert {k: v for k, v in found.items() if v} == {}


def test_the_docs_import_a_top_level_name_from_the_top_level():
    """A name that ``mechlingo`` exports has one path in the docs: ``from mechlingo import
    name`` (a page may still import what only a module holds from that module)."""
    import mechlingo

    public = set(mechlingo.__all__)
    found = [
        f"{page.relative_to(ROOT)}: from {m} import {n}"
        for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
        for block in python_blocks(page.read_text(encoding="utf-8"))
        for m, n in imports_of(block)
        if m.startswith("mechlingo.") and n in public
    ]
    assert found == []


def test_the_import_checks_read_a_planted_block():
    block = "import mechlingo\nfrom mechlingo.core.tokens import (\n    encode,\n)\n...\nx = 1\n"
    assert _deep_imports(block) == ["mechlingo.core.tokens:encode"]
    assert imports_of("from mechlingo import load_facts\n") == [("mechlingo", "load_facts")]


def test_import_mechlingo_loads_no_torch_and_lists_its_names():
    code = (
        "import sys, mechlingo\n"
        "assert 'torch' not in sys.modules, 'import mechlingo loaded torch'\n"
        "assert set(mechlingo.__all__) <= set(dir(mechlingo))\n"
        "assert 'torch' not in sys.modules\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
