"""The docs: the API reference builds from the docstrings with warnings as errors, and every
relative link between the Markdown pages points at a file that exists."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_api_reference_builds_without_warnings(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build_docs.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for module in (
        "analyses/lens",
        "core/tokens",
        "interventions",
        "analyses/patching",
        "analyses/experts",
        "analyses/align",
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
