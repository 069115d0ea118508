"""One name per concept, for classes and modules: no class name is defined twice in the package,
and no two modules share a file name, except where the allow-lists below say why."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "mechlingo"

#: The tiers that compute (below them, a feature's module in ``viz``, ``report``, ``cli`` and the
#: card's stages mirrors its analysis and takes its name: ``viz/lens.py``, ``report/lens.py``,
#: ``cli/lens.py`` beside ``analyses/decoders/lens.py``).
COMPUTING = {"core", "kernels", "data", "activations", "interventions", "scoring", "analyses"}

#: Class names defined twice on purpose, with the reason.
CLASS_ALLOWED: dict[str, str] = {
    "DecodeArgs": "the decoder's and the scorer's keyword sets, merged by the one decoding "
    "options object",
}

#: File names that more than one computing module carries, with the reason: each is a room's
#: module of the same role, always read with its room (``circuits.result``, ``decoders.run``).
MODULE_ALLOWED: dict[str, str] = {
    "compare.py": "each room's comparison of its own results (circuits: overlap and cross "
    "faithfulness; decoders: agreement between decoders)",
    "errors.py": "the package's error classes (core) and the patching room's own",
    "languages.py": "the language registry (core) and the circuits room's per-language run",
    "result.py": "each room's result class (recall patching, circuits)",
    "run.py": "each room's whole command (experts, decoders)",
    "runs.py": "hooked runs (activations) and each room's runs over its grid (recall "
    "patching, circuits)",
    "steering.py": "the steering vector as an intervention, and building and scoring it",
    "tokens.py": "padded batches (core) and the decoders' token tables",
}


def class_names(root: Path) -> dict[str, list[str]]:
    """``{public class name: [where it is defined]}`` over every module under ``root``."""
    out: dict[str, list[str]] = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                out[node.name].append(f"{path.relative_to(root.parent)}:{node.lineno}")
    return out


def shared_module_names(root: Path) -> dict[str, list[str]]:
    """``{file name: [modules]}`` for the names that more than one module in a computing tier
    carries (``__init__.py`` and ``__main__.py`` left out)."""
    out: dict[str, list[str]] = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if path.name in ("__init__.py", "__main__.py") or len(rel.parts) < 2:
            continue
        if rel.parts[0] in COMPUTING:
            out[path.name].append(str(rel))
    return {name: mods for name, mods in out.items() if len(mods) > 1}


def test_no_class_name_is_defined_twice():
    twice = {
        name: where
        for name, where in class_names(PKG).items()
        if len(where) > 1 and name not in CLASS_ALLOWED
    }
    assert not twice, f"one name per class (rename, or allow-list with the reason): {twice}"


def test_no_two_computing_modules_share_a_file_name():
    shared = {n: m for n, m in shared_module_names(PKG).items() if n not in MODULE_ALLOWED}
    assert not shared, f"one name per module (rename, or allow-list with the reason): {shared}"


def test_the_name_checks_find_a_planted_twin(tmp_path):
    root = tmp_path / "mechlingo"
    for rel, text in {
        "core/costs.py": "class Plan:\n    pass\n",
        "cli/cost.py": "class Plan:\n    pass\nclass _Private:\n    pass\n",
        "activations/pooled.py": "class _Private:\n    pass\n",
        "analyses/recall/pooled.py": "",
        "viz/lens.py": "",
        "analyses/decoders/lens.py": "",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    names = class_names(root)
    assert names["Plan"] == ["mechlingo/cli/cost.py:1", "mechlingo/core/costs.py:1"]
    assert "_Private" not in names
    assert shared_module_names(root) == {
        "pooled.py": ["activations/pooled.py", "analyses/recall/pooled.py"]
    }
