"""One name per concept, for classes and modules: no class name is defined twice in the package,
and no two modules share a file name, except where the allow-lists below say why."""

from __future__ import annotations

import ast
import re
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


def _words(name: str) -> set[str]:
    """The lower-case words of an identifier or a file name (``snake_case`` and ``CamelCase``
    split; ``readouts`` also gives ``readout``)."""
    parts = re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+", name.removesuffix(".py"))
    words = {p.lower() for p in parts}
    return words | {w[:-1] for w in words if w.endswith("s")}


def defined_names(path: Path) -> set[str]:
    """The module's file name, every class, function (and method) and module-level constant
    it defines, and every key it writes in a dict literal (the keys of the JSON it stores)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = {path.name}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            out.add(node.name)
        if isinstance(node, ast.Dict):
            out |= {k.value for k in node.keys if isinstance(k, ast.Constant)
                    and isinstance(k.value, str) and k.value.isidentifier()}  # fmt: skip
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        out |= {t.id for t in targets if isinstance(t, ast.Name)}
    return out


def concept_violations(root: Path, concepts: dict) -> list[str]:
    """What breaks one word per concept under ``root`` (the ``mechlingo`` folder): a name in a
    concept's modules carrying a forbidden word, or a concept whose word names nothing there."""
    bad = []
    for concept, (word, forbidden, modules) in concepts.items():
        found = False
        for module in modules:
            base = root.parent / module.replace(".", "/")
            paths = sorted(base.rglob("*.py")) if base.is_dir() else [base.with_suffix(".py")]
            assert paths and paths[0].is_file(), f"{concept}: no module {module}"
            for path in paths:
                for name in sorted(defined_names(path)):
                    words = _words(name)
                    found |= word in words
                    bad += [f"{concept}: {name} ({path.name}) says {w!r}, not {word!r}"
                            for w in forbidden if w in words]  # fmt: skip
        if not found:
            bad.append(f"{concept}: no name in {modules} says {word!r}")
    return bad


def test_each_concept_has_one_word_in_its_names():
    from mechlingo.cli.glossary import CONCEPT_WORDS

    assert not concept_violations(PKG, CONCEPT_WORDS)


def test_the_concept_check_finds_a_forbidden_synonym(tmp_path):
    root = tmp_path / "mechlingo"
    (root / "core").mkdir(parents=True)
    (root / "core" / "checkpoints.py").write_text(
        "class Checkpoints:\n    pass\nclass StageStore:\n    pass\n", encoding="utf-8"
    )
    (root / "core" / "phases.py").write_text("LIMIT = 1\n", encoding="utf-8")
    (root / "core" / "align.py").write_text(
        "def means():\n    return {'measures': 1, 'n': 2, 3: 'metrics', 'metric-x': 0}\n"
        "def old():\n    return {'metrics': 1}\n",
        encoding="utf-8",
    )
    concepts = {
        "checkpoint": ("checkpoint", ("stage",), ("mechlingo.core.checkpoints",)),
        "phase": ("phase", ("stage",), ("mechlingo.core.phases",)),
        "measure": ("measure", ("metric",), ("mechlingo.core.align",)),
    }
    assert concept_violations(root, concepts) == [
        "checkpoint: StageStore (checkpoints.py) says 'stage', not 'checkpoint'",
        "measure: metrics (align.py) says 'metric', not 'measure'",
    ]
    concepts["phase"] = ("band", ("stage",), ("mechlingo.core.phases",))
    assert concept_violations(root, concepts)[1].startswith("phase: no name in")
    assert _words("PackedReadouts") >= {"packed", "readout"} and "stage" in _words("STAGE_LOG")
