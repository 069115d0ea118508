"""Every command's report.html opened in headless Chromium: all figures render, no console
errors, no network needed (Chromium runs with every host unresolvable). Screenshots are saved
under test-output/screenshots/. The commands run on the tiny model: this tests the reports,
not the findings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mechlingo.cli import build_parser, main

from .browser import check_report, chromium

SHOTS = Path(__file__).resolve().parents[1] / "test-output" / "screenshots"

pytestmark = pytest.mark.skipif(
    chromium() is None and not os.environ.get("CI"),
    reason="chromium not installed (make setup installs it; required on CI)",
)

# command -> extra arguments (beyond --model, --out, --quiet) for a small tiny-model run
COMMANDS: dict[str, list[str]] = {
    "lens": ["--langs", "en,fr,de,ja", "--limit", "4"],
    "eval": ["--langs", "en,fr", "--limit", "4", "--max-new-tokens", "3"],
}


def _available(name: str) -> bool:
    parser = build_parser()
    return name in parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_report_renders_in_browser(command, tiny_dir, tmp_path):
    if not _available(command):
        pytest.skip(f"command {command} not available")
    out = tmp_path / command
    args = [command, "--model", str(tiny_dir), "--quiet", "--out", str(out), *COMMANDS[command]]
    assert main(args) == 0
    html = out / "report.html"
    check = check_report(html, SHOTS / f"{command}.png")
    assert check.n_figure_divs >= 1
    assert check.n_rendered == check.n_figure_divs, check
    assert check.console_errors == []
    assert check.screenshot.is_file() and check.screenshot.stat().st_size > 10_000
