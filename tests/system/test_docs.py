"""The docs: the API reference builds from the docstrings with warnings as errors, every
relative link between the Markdown pages points at a file that exists, the README's Python
blocks run as written on the embedded model, and its layout and getting-started match the code."""

from __future__ import annotations

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
