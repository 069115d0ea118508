"""mechlingo on a classic TransformerLens 3.9 ``HookedTransformer``: the checks of
tests/system/test_hooked_transformer.py, run by ``scripts/check_hooked_transformer.sh`` in
their own environment (.venv-tl3, which ``make test`` builds beside pytest, this test waiting
for it on a lock, and the script builds where it is missing)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_hooked_transformer_checks_pass_under_transformer_lens_3():
    env = {**os.environ, "DEV_PY": sys.executable}
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "check_hooked_transformer.sh")],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "[tl3] transformer-lens 3." in proc.stdout
    summary = re.search(r"^(\d+) passed(.*) in [\d.]+s", proc.stdout, re.M)
    assert summary is not None, out[-3000:]
    assert int(summary.group(1)) >= 9 and "skipped" not in summary.group(2), summary.group(0)
