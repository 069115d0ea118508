"""The tiered package: the architecture contract holds and catches violations, and the entry
points (console script, ``python -m``) run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import check_layers  # noqa: E402


def test_no_module_only_re_exports_a_moved_one():
    """0.1.0 keeps no shims: no module replaces itself in ``sys.modules`` or warns that it
    moved."""
    offenders = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "mechlingo").rglob("*.py"))
        if "sys.modules[__name__]" in (text := path.read_text()) or "Deprecated: moved to" in text
    ]
    assert offenders == []


def test_top_level_names():
    import mechlingo

    for name in mechlingo.__all__:
        assert getattr(mechlingo, name) is not None, name


def test_contract_holds_on_the_package():
    found = check_layers.problems(check_layers.scan())
    assert found == {"upward": [], "cycles": [], "function imports": [], "long": []}


def _fake_package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "mechlingo"
    for rel, text in {"__init__.py": "", **files}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_contract_catches_an_upward_import(tmp_path):
    root = _fake_package(
        tmp_path,
        {
            "core/__init__.py": "",
            "core/models.py": "from mechlingo.analyses.lens import x\n",
            "analyses/__init__.py": "",
            "analyses/lens.py": "x = 1\n",
        },
    )
    found = check_layers.problems(check_layers.scan(root))
    assert any("mechlingo.core.models" in u and "higher layer" in u for u in found["upward"])
    assert check_layers.main(["--root", str(root)]) == 1


def test_contract_catches_a_cycle_a_function_import_and_a_long_function(tmp_path):
    long_body = "".join(f"    y{i} = {i}\n" for i in range(85))
    root = _fake_package(
        tmp_path,
        {
            "analyses/__init__.py": "",
            "analyses/a.py": "from mechlingo.analyses.b import f\n",
            "analyses/b.py": (
                "import mechlingo.analyses.a\n\n\ndef f():\n    import json\n    "
                'import pandas\n    """not a docstring"""\n' + long_body
            ),
        },
    )
    found = check_layers.problems(check_layers.scan(root))
    assert found["cycles"] == ["mechlingo.analyses.a <-> mechlingo.analyses.b"]
    assert [f.split(" imports ")[1] for f in found["function imports"]] == ["json"]
    assert len(found["long"]) == 1 and "f has 89 lines" in found["long"][0]


@pytest.mark.parametrize(
    "argv",
    [
        [sys.executable, "-m", "mechlingo", "--help"],
        [sys.executable, "-m", "mechlingo.cli", "--help"],
        [str(Path(sys.executable).parent / "mechlingo"), "--help"],
    ],
)
def test_entry_points_run(argv):
    if not Path(argv[0]).exists():
        pytest.skip(f"{argv[0]} is not installed")
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for command in ("lens", "eval", "trace", "steer", "experts", "align"):
        assert command in out.stdout


def test_figures_load_on_first_draw_and_import_stays_light():
    """``import mechlingo`` loads neither the figures (plotly) nor TransformerLens's bridge;
    the first ``draw`` registers every figure; an unknown name says which exist."""
    code = (
        "import sys, mechlingo\n"
        "from mechlingo.core import figures\n"
        "from mechlingo.core.errors import MechlingoError\n"
        "heavy = [m for m in ('plotly', 'mechlingo.viz', 'transformer_lens.model_bridge') "
        "if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "assert figures.registered() == []\n"
        "try:\n"
        "    figures.draw('no_such_figure')\n"
        "except MechlingoError as err:\n"
        "    assert 'lens_heatmap' in str(err.fix), err.fix\n"
        "else:\n"
        "    raise SystemExit('no error')\n"
        "assert {'lens_heatmap', 'sweep_heatmap', 'side_effects_heatmap', 'k_curve_figure'} "
        "<= set(figures.registered())\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
