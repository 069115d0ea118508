"""The layered package: the architecture contract holds and catches violations, every old
import path still works for one release (with a DeprecationWarning), and the entry points
(console script, ``python -m``) run."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import check_layers  # noqa: E402

MOVED = {
    "mechlingo.errors": "mechlingo.core.errors",
    "mechlingo.models": "mechlingo.core.models",
    "mechlingo.sites": "mechlingo.core.sites",
    "mechlingo.tokens": "mechlingo.core.tokens",
    "mechlingo.families": "mechlingo.core.families",
    "mechlingo.artifacts": "mechlingo.core.artifacts",
    "mechlingo.stats": "mechlingo.kernels.significance",
    "mechlingo.runs": "mechlingo.activations.runs",
    "mechlingo.kernels.means": "mechlingo.activations.means",
    "mechlingo.decoding": "mechlingo.activations.decoding",
    "mechlingo.evaluate": "mechlingo.analyses.evaluate",
    "mechlingo.lens": "mechlingo.analyses.lens",
    "mechlingo.patching": "mechlingo.analyses.patching",
    "mechlingo.attribution": "mechlingo.analyses.attribution",
    "mechlingo.pipeline": "mechlingo.analyses.pipeline",
    "mechlingo.steering": "mechlingo.analyses.repair",
    "mechlingo.protocol": "mechlingo.analyses.protocol",
    "mechlingo.experts": "mechlingo.analyses.experts",
    "mechlingo.alignment": "mechlingo.analyses.alignment",
    "mechlingo.side_effects": "mechlingo.analyses.side_effects",
    "mechlingo.plots_pipeline": "mechlingo.viz.pipeline",
    "mechlingo.plots_experts": "mechlingo.viz.experts",
    "mechlingo.pipeline_cli": "mechlingo.cli.trace",
    "mechlingo.experts_cli": "mechlingo.cli.experts",
    "mechlingo.steering_cli": "mechlingo.cli.steer",
    "mechlingo.validate": "mechlingo.cli.validate",
}


def _fresh_import(name: str):
    sys.modules.pop(name, None)
    with pytest.warns(DeprecationWarning, match=name.replace(".", r"\.") + " moved to"):
        return importlib.import_module(name)


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_path_gives_the_moved_module(old):
    new = importlib.import_module(MOVED[old])
    assert _fresh_import(old) is new
    assert new.__file__ and Path(new.__file__).exists()


def test_old_plots_path_keeps_table_html():
    mod = _fresh_import("mechlingo.plots")
    from mechlingo.report.tables import table_html
    from mechlingo.viz.common import accuracy_bars

    assert mod.table_html is table_html and mod.accuracy_bars is accuracy_bars


def test_old_distributed_path_keeps_its_names():
    mod = _fresh_import("mechlingo.distributed")
    from mechlingo.activations.means import last_token_means
    from mechlingo.activations.pooled import pooled_neuron_acts

    assert mod.distributed_last_token_means is last_token_means
    assert mod.distributed_pooled_neuron_acts is pooled_neuron_acts
    for name in ("process_group", "is_main", "shard", "all_reduce_state", "dist_info"):
        assert callable(getattr(mod, name))


def test_old_star_names_still_resolve():
    """Names the README and notebooks import from the old flat modules."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from mechlingo.lens import lens_facts
        from mechlingo.models import load_model
        from mechlingo.steering import build_repair_vectors
    import mechlingo

    assert mechlingo.lens_facts is lens_facts and mechlingo.load_model is load_model
    assert callable(build_repair_vectors)


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


def test_shims_are_skipped_by_the_contract():
    text = (ROOT / "mechlingo" / "models.py").read_text()
    assert check_layers.SHIM_MARK in text


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
