"""Every command's report.html opened in headless Chromium: all figures render, no console
errors, no network needed (Chromium runs with every host unresolvable). Screenshots are saved
under test-output/screenshots/. The commands run on the tiny model: this tests the reports,
not the findings."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from mechlingo.cli import main
from tests.browser import check_report, chromium

SHOTS = Path(__file__).resolve().parents[2] / "test-output" / "screenshots"
COMMANDS = ["lens", "tokens", "eval", "trace", "steer", "experts", "align"]

pytestmark = pytest.mark.skipif(
    chromium() is None and not os.environ.get("CI"),
    reason="chromium not installed (make setup installs it; required on CI)",
)


@pytest.fixture(scope="module")
def reports(tiny_dir, tmp_path_factory) -> dict[str, Path]:
    """Run every command once on the tiny model; their output folders by command."""
    root = tmp_path_factory.mktemp("reports")
    model = ["--model", str(tiny_dir), "--quiet"]
    facts = ["--langs", "en,fr", "--relation", "capital"]
    data = root / "sentences"
    data.mkdir()
    for lang, words in {
        "en": "The city is old",
        "es": "La ciudad es vieja",
        "fr": "La ville",
    }.items():
        (data / f"{lang}.txt").write_text("\n".join(f"{words} {i}." for i in range(6)) + "\n")
    runs = {
        "lens": ["lens", *model, *facts, "--limit", "4"],
        "tokens": ["lens", *model, "--prompt", "The capital of France is", "--prompt", "東京"],
        "eval": ["eval", *model, *facts, "--limit", "4", "--max-new-tokens", "3"],
        "trace": ["trace", *model, *facts, "--limit", "4", "--patch-prompts", "2", "--patch-unanswered",
                  "--max-new-tokens", "3"],
        "vectors": ["steer", "build", *model, *facts, "--limit", "24", "--k-shot", "2"],
        "steer": ["steer", "eval", *model, *facts, "--limit", "24", "--vectors",
                  str(root / "vectors"), "--config", "0,1,1,1", "--test-per-lang", "2",
                  "--max-new-tokens", "2"],
        "experts": ["experts", *model, "--target", "es", "--k", "3", "--parallel", str(data),
                    "--lines", "4", "--heldout", "2", "--samples", "2", "--sample-tokens", "3"],
        "align": ["align", *model, "--clamp", str(root / "experts" / "es-k3"), "--parallel",
                  str(data), "--offset", "2", "--lines", "4"],
    }  # fmt: skip
    for name, args in runs.items():
        assert main([*args, "--out", str(root / name)]) == 0, name
    return {c: root / c for c in COMMANDS}


@pytest.mark.parametrize("command", COMMANDS)
def test_report_renders_in_browser(command, reports):
    html = reports[command] / "report.html"
    check = check_report(html, SHOTS / f"{command}.png")
    assert check.n_figure_divs >= 1
    assert check.n_rendered == check.n_figure_divs, check
    assert check.console_errors == []
    assert check.screenshot.is_file() and check.screenshot.stat().st_size > 10_000
    # the page opens with the title, the headline numbers, one provenance line and the
    # configuration collapsed
    assert [t for t, _ in check.top[:4]] == ["h1", "div", "p", "details"], check.top
    assert check.top[1][1] == "headline" and "provenance" in check.top[2][1]
    assert check.top[3][1] == "config" and check.config_open == [False]
    assert len(check.headline) > 10 and any(c.isdigit() for c in check.headline)


def test_steer_report_header_is_short(reports):
    """The steer eval page no longer dumps the configuration (fact ids, raw norms, the unit's
    text) in its header: the provenance is one short line, the rest is collapsed."""
    text = (reports["steer"] / "report.html").read_text()
    head = text.split("<body>", 1)[1].split("<details", 1)[0]
    assert "fact_ids" not in head and "raw_norms" not in head and "{" not in head
    prov = re.search(r"<p class='meta provenance'>(.*?)</p>", head).group(1)
    assert len(prov) < 300 and "model" in prov and " s" in prov
    assert "Effect: gain of" in head and "McNemar p" in head and "Control" in head
    assert "fact_ids" in text.split("<details", 1)[1]  # the full configuration is kept
