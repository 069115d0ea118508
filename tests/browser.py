"""Open an HTML report in headless Chromium: count rendered plotly figures, collect console
errors, save a screenshot. Used by the report tests; skipped where Chromium is missing."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    # no network at all: a report that needed one would fail to render
    "--host-resolver-rules=MAP * ~NOTFOUND",
]


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class PageCheck:
    n_figure_divs: int
    n_rendered: int
    console_errors: list[str]
    screenshot: Path
    #: the body's elements in rendered order (tag and class), up to the first section
    top: list[tuple[str, str]] = field(default_factory=list)
    #: the rendered text of the headline block ("" when there is none)
    headline: str = ""
    #: each configuration <details> block: whether it is open
    config_open: list[bool] = field(default_factory=list)


def _top_of_body(dom: str) -> tuple[list[tuple[str, str]], str, list[bool]]:
    """The first elements of the rendered ``<body>`` (tag, class), the headline's text and
    whether each ``<details class="config">`` is open."""
    body = dom.split("<body>", 1)[-1]
    top = [
        (m.group(1), m.group(3) or "")
        for m in re.finditer(
            r'<(h1|h2|div|p|details|table)\b([^>]*?class="([^"]*)")?[^>]*>', body[:200_000]
        )
    ][:6]
    head = re.search(r'<div class="headline"[^>]*>(.*?)</div>', body, re.S)
    text = re.sub(r"<[^>]+>", " ", head.group(1)) if head else ""
    opened = [
        bool(re.search(r"\bopen\b", m.group(1)))
        for m in re.finditer(r'<details([^>]*class="config"[^>]*)>', body)
    ]
    return top, " ".join(text.split()), opened


def check_report(html: Path, screenshot: Path, *, budget_ms: int = 15000) -> PageCheck:
    exe = chromium()
    if exe is None:
        raise RuntimeError("chromium is not installed (make setup installs it)")
    url = html.resolve().as_uri()
    source = html.read_text(encoding="utf-8")
    n_divs = len(re.findall(r'<div class="figure">', source))
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    # one launch writes both the DOM after the scripts ran and the screenshot
    with tempfile.TemporaryDirectory() as profile:
        dom = subprocess.run(
            [
                exe,
                *FLAGS,
                f"--user-data-dir={profile}",
                "--enable-logging=stderr",
                "--v=0",
                f"--virtual-time-budget={budget_ms}",
                "--window-size=1280,2400",
                f"--screenshot={screenshot}",
                "--dump-dom",
                url,
            ],
            capture_output=True,
            text=True,
            timeout=180,
        )
    rendered = len(re.findall(r'class="plot-container plotly"', dom.stdout))
    errors = [
        line
        for line in dom.stderr.splitlines()
        if "CONSOLE" in line and ("Uncaught" in line or "Error" in line or "error" in line)
    ]
    top, headline, opened = _top_of_body(dom.stdout)
    return PageCheck(n_divs, rendered, errors, screenshot, top, headline, opened)
