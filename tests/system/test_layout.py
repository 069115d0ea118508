"""The tiered package: the architecture contract holds and catches violations (upward
imports, cycles, imports inside functions, long functions, eager plotly imports below the
report layer, modules imported by a run-time name; no module length cap: that is a review habit); figures are plain function calls (no string registry: a result's ``fig_*``
method calls :mod:`mechlingo.viz` directly, viz imports no higher layer and plotly only when it
draws); and the entry points (console script, ``python -m``) run. What each figure draws is
checked against its result's arrays in ``test_viz.py``."""

from __future__ import annotations

import ast
import collections
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
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
    assert found == {
        "upward": [],
        "cycles": [],
        "function imports": [],
        "long": [],
        "eager imports": [],
        "dynamic imports": [],
    }


def test_contract_sets_no_module_length_cap(tmp_path):
    """How long a module is, is a review habit (split by idea), not a gate."""
    root = _fake_package(tmp_path, {"core/__init__.py": "", "core/big.py": "x = 1\n" * 5000})
    found = check_layers.problems(check_layers.scan(root))
    assert not any(found.values()), found
    assert check_layers.main(["--root", str(root)]) == 0


def test_contract_refuses_a_mechlingo_module_imported_by_a_run_time_name(tmp_path):
    root = _fake_package(
        tmp_path,
        {
            "core/__init__.py": "",
            "core/x.py": "y = 1\n",
            "core/a.py": 'import importlib\n\nm = importlib.import_module("mechlingo.core.x")\n',
            "core/b.py": "from importlib import import_module\n\n\ndef f(name):\n"
            "    return import_module(name)\n",
            "core/c.py": 'm = __import__("mechlingo.core.x")\n',
            "core/d.py": 'import importlib\n\nm = importlib.import_module(".x", "mechlingo.core")\n',
            "core/ok.py": 'import importlib\n\nj = importlib.import_module("json")\n',
        },
    )
    found = check_layers.problems(check_layers.scan(root))
    assert [f.split(" by ")[0] for f in found["dynamic imports"]] == [
        "mechlingo.core.a:3 imports 'mechlingo.core.x'",
        "mechlingo.core.b:5 imports a name computed at run time",
        "mechlingo.core.c:1 imports 'mechlingo.core.x'",
        "mechlingo.core.d:3 imports '.x'",
    ]
    assert check_layers.main(["--root", str(root)]) == 1


def test_contract_lets_only_the_package_init_load_mechlingo_modules_lazily(tmp_path):
    """``mechlingo/__init__.py`` may import mechlingo modules inside functions (its PEP 562
    loaders); those imports still count for the layers and cycles; no other module may."""
    loader = "\n\ndef _x():\n    from mechlingo.core import x\n\n    return x\n"
    root = _fake_package(
        tmp_path,
        {
            "__init__.py": loader,
            "core/__init__.py": "",
            "core/x.py": "y = 1\n",
            "data/__init__.py": "",
            "data/late.py": loader,
        },
    )
    scans = check_layers.scan(root)
    found = check_layers.problems(scans)
    assert found["function imports"] == ["mechlingo.data.late:4 imports mechlingo.core.x"]
    assert "mechlingo.core.x" in check_layers.graph(scans)["mechlingo"]


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
            "core/models.py": "from mechlingo.analyses.decoders.lens import x\n",
            "analyses/__init__.py": "",
            "analyses/decoders/lens.py": "x = 1\n",
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


def test_contract_keeps_viz_below_the_analyses_and_plotly_lazy(tmp_path):
    """A viz module may not import an analysis (not even for a type hint), and below the
    report layer plotly is imported inside the drawing function or under TYPE_CHECKING."""
    root = _fake_package(
        tmp_path,
        {
            "viz/__init__.py": "",
            "viz/ok.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    import plotly.graph_objects as go\n\n\n"
                "def fig() -> 'go.Figure':\n    import plotly.graph_objects as go\n\n"
                "    return go.Figure()\n"
            ),
            "viz/eager.py": "import plotly.graph_objects as go\n",
            "viz/hint.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from mechlingo.analyses.decoders.lens import x\n"
            ),
            "analyses/__init__.py": "",
            "analyses/decoders/lens.py": "from mechlingo.viz.ok import fig\nx = 1\n",
            "report/__init__.py": "",
            "report/page.py": "import plotly.graph_objects as go\n",
        },
    )
    found = check_layers.problems(check_layers.scan(root))
    assert found["eager imports"] == [
        "mechlingo.viz.eager:1 imports plotly.graph_objects at import time "
        "(import it in the function)"
    ]
    assert found["upward"] == [
        "mechlingo.viz.hint:3 imports mechlingo.analyses.decoders.lens (a higher layer)"
    ]
    assert found["function imports"] == [] and found["cycles"] == []


def _source_files() -> list[Path]:
    folders = ("mechlingo", "tests", "scripts", "benchmarks", "notebooks")
    return [
        p
        for folder in folders
        for p in sorted((ROOT / folder).rglob("*"))
        if p.suffix in (".py", ".ipynb") and p != Path(__file__)
    ]


def test_no_figure_is_looked_up_by_name():
    """The string registry is gone: no ``draw("name", ...)``, no ``@drawer``, no
    ``core.figures`` anywhere in the code, tests or notebooks."""
    assert not (ROOT / "mechlingo" / "core" / "figures.py").exists()
    pattern = re.compile(r"""\bdraw\(\s*\\?["']|@drawer\b|core\.figures|core import figures""")
    hits = [
        f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
        for p in _source_files()
        for i, line in enumerate(p.read_text().splitlines(), start=1)
        if pattern.search(line)
    ]
    assert hits == []


def test_import_stays_light_and_plotly_loads_on_first_figure():
    """``import mechlingo`` loads neither plotly nor TransformerLens's bridge; importing every
    analysis and every figure module still loads no plotly; drawing a figure does."""
    code = (
        "import importlib, pkgutil, sys, mechlingo\n"
        "heavy = [m for m in ('plotly', 'mechlingo.viz', 'transformer_lens.model_bridge') "
        "if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "import mechlingo.analyses, mechlingo.viz\n"
        "for pkg in (mechlingo.analyses, mechlingo.viz):\n"
        "    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        "        importlib.import_module(m.name)\n"
        "assert 'plotly' not in sys.modules, 'plotly loaded before any figure was drawn'\n"
        "from mechlingo.scoring.evaluate import EvalResult\n"
        "EvalResult([{'lang': 'en', 'correct': True}]).fig_accuracy()\n"
        "assert 'plotly' in sys.modules\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def _fig_methods() -> dict[str, str]:
    """``{"Class.fig_x": path}`` for every ``fig_*`` method (or function) of the analyses."""
    found = {}
    for path in sorted((ROOT / "mechlingo" / "analyses").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            owners = [(node.name, node.body)] if isinstance(node, ast.ClassDef) else []
            if isinstance(node, ast.FunctionDef) and node.name.startswith("fig_"):
                found[node.name] = str(path.relative_to(ROOT))
            for owner, body in owners:
                for fn in body:
                    if isinstance(fn, ast.FunctionDef) and fn.name.startswith("fig_"):
                        found[f"{owner}.{fn.name}"] = str(path.relative_to(ROOT))
    return found


def test_every_fig_method_is_drawn_by_a_test():
    """Every ``fig_*`` of the analyses is called by some test (a typo in a figure then fails
    a test, not a report)."""
    methods = _fig_methods()
    assert "LensResult.fig_heatmap" in methods and "PatchingResult.fig_circuit" in methods
    tests = "\n".join(
        p.read_text() for p in sorted((ROOT / "tests").rglob("test_*.py")) if p != Path(__file__)
    )
    called = set(re.findall(r"\b(fig_\w+)\(", tests))
    untested = {m: path for m, path in methods.items() if m.split(".")[-1] not in called}
    assert untested == {}


def _words(path: Path) -> str:
    """A file's text with comment markers dropped and whitespace collapsed."""
    text = path.read_text(encoding="utf-8").replace("@#", " ")
    return " ".join(text.split())


@pytest.mark.parametrize("where", ["Makefile", "mechlingo/__init__.py", "docs/architecture.md"])
def test_the_tier_order_is_quoted_from_the_contract(where: str) -> None:
    # The order is stated once (check_layers.LAYERS); every other statement quotes it.
    top = Path(__file__).resolve().parents[2]
    assert check_layers.order_text() in _words(top / where), where
    assert check_layers.order_text().startswith("core -> kernels -> data")


def test_no_private_function_is_unreferenced() -> None:
    # Dead code: a module-level private function or class that nothing in the package names
    # (only its own definition) is deleted, not kept "in case".
    top = Path(__file__).resolve().parents[2] / "mechlingo"
    texts = {p: p.read_text(encoding="utf-8") for p in top.rglob("*.py")}
    # every word of the package counted once: the count of ``name`` is what the search for
    # ``\bname\b`` finds (a name is all word characters, so it must be a whole word)
    words = collections.Counter(re.findall(r"\w+", "\n".join(texts.values())))
    dead = []
    for path, text in texts.items():
        for node in ast.parse(text).body:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            name = node.name
            if name.startswith("_") and not name.startswith("__"):
                if words[name] <= 1:
                    dead.append(f"{path.relative_to(top.parent)}:{node.lineno} {name}")
    assert not dead, f"unreferenced private definitions: {dead}"
