"""The package's prose: every module docstring is short (what the module is for, its entry points
and where the longer explanation lives, at most ``MAX_MODULE_DOCSTRING`` lines), and every name
that a comment, docstring or docs page cites (a dotted ``mechlingo.x.y`` or a Sphinx role such as
``:func:`name```) still exists in the package, so prose cannot outlive the code it describes."""

from __future__ import annotations

import ast
import builtins
import dataclasses
import functools
import importlib
import inspect
import re
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "mechlingo"
MAX_MODULE_DOCSTRING = 15

#: Modules whose docstring may stay over the limit (none now); the test fails on an entry that
#: is no longer needed.
LONG_DOCSTRING_ALLOWED: frozenset[str] = frozenset()

#: Cited names that no longer resolve, all in files other work owns at present (file, name).
STALE_ALLOWED = frozenset({})

#: Files that still cite the issue tracker by number, all owned by other work at present.
ISSUE_NUMBER_ALLOWED: frozenset[str] = frozenset()

#: The history pages: they record what the package was, so the names they cite may be gone,
#: and they are the only docs pages that carry dated history.
HISTORY_PAGES = frozenset({"docs/devlog.md", "docs/replicate-log.md"})

#: Dotted strings that look like references but name something else: the metadata key of an
#: exported steering vector, and the placeholder in the layer contract's help text.
NOT_REFERENCES = frozenset({"mechlingo.export", "mechlingo.x"})

_ISSUE = re.compile(
    r"\bissues? ?#?\d+|\bissue-\d+|\(#\d+\)|\b(?:this|last|earlier|previous) round\b"
    r"|\bround (?:one|two|three|four|five|six|seven|eight|nine|ten)\b",
    re.IGNORECASE,
)
_DOTTED = re.compile(r"\bmechlingo(?:\.[A-Za-z_]\w*)+")
_ROLE = re.compile(r":(?:func|meth|class|mod|attr|data|obj|exc):`~?([A-Za-z_][\w.]*)`")


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__main__.py")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def docstring_lines(source: str) -> int:
    """Lines of a module's docstring as written (0 when it has none)."""
    doc = ast.get_docstring(ast.parse(source), clean=False)
    return len(doc.splitlines()) if doc else 0


def long_module_docstrings() -> dict[str, int]:
    """Package files (relative paths) whose module docstring is over the limit, with its lines."""
    out = {}
    for path in _modules():
        n = docstring_lines(path.read_text())
        if n > MAX_MODULE_DOCSTRING:
            out[path.relative_to(ROOT).as_posix()] = n
    return out


def _has(obj: object, name: str) -> bool:
    if hasattr(obj, name):
        return True
    if inspect.isclass(obj):
        fields = obj.__dataclass_fields__ if dataclasses.is_dataclass(obj) else {}
        annotated = {k for klass in obj.__mro__ for k in getattr(klass, "__annotations__", {})}
        return name in fields or name in annotated
    return False


def _walk(obj: object, names: list[str]) -> bool:
    for name in names:
        if not _has(obj, name):
            return False
        obj = getattr(obj, name, None)
    return True


def resolves(dotted: str) -> bool:
    """Whether ``mechlingo.a.b.c`` names a module or an attribute reachable from one."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        return _walk(module, parts[i:])
    return False


def _imported_names(module: ModuleType, source: str) -> dict[str, str]:
    """Names a module imports anywhere (``TYPE_CHECKING`` blocks included), to their dotted path."""
    return _imports_of(module.__name__, source)


@functools.cache
def _imports_of(name: str, source: str) -> dict[str, str]:
    module = importlib.import_module(name)
    out = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = module.__name__ if hasattr(module, "__path__") else module.__package__
                pkg_parts = (pkg or "").split(".")
                up = pkg_parts[: len(pkg_parts) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            for alias in node.names:
                out[alias.asname or alias.name] = f"{base}.{alias.name}"
    return out


def resolves_in(name: str, module: ModuleType, source: str) -> bool:
    """Whether a role's target resolves from the module it is written in: absolute, a builtin, a
    module global or import, or a name (``Class.member`` too) defined somewhere in the package."""
    if name.startswith("mechlingo"):
        return resolves(name)
    head, *rest = name.split(".")
    if hasattr(builtins, head):
        return _walk(getattr(builtins, head), rest)
    if hasattr(module, head) and _walk(getattr(module, head), rest):
        return True
    imported = _imported_names(module, source)
    if head in imported and resolves(imported[head]) and _walk(_target(imported[head]), rest):
        return True
    return name in package_names()


@functools.cache
def package_names() -> frozenset[str]:
    """Every name the package defines, by its source: module-level names, and each class's
    members (methods, class attributes, fields, ``self.x`` set in a method) bare and as
    ``Class.member``."""
    names: set[str] = set()
    for path in _modules():
        tree = ast.parse(path.read_text())
        for node in tree.body:
            names.update(_bound(node))
            if isinstance(node, ast.ClassDef):
                for member in _class_members(node):
                    names.update({member, f"{node.name}.{member}"})
    return frozenset(names)


def _bound(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
    return {t.id for t in targets if isinstance(t, ast.Name)}


def _class_members(klass: ast.ClassDef) -> set[str]:
    members = set()
    for node in klass.body:
        members.update(_bound(node))
    for node in ast.walk(klass):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                members.add(node.attr)
    return members


def _target(dotted: str) -> object:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name, None)
        return obj
    return None


def stale_references(files: list[Path]) -> list[tuple[str, int, str]]:
    """(file, line, name) for every cited name that does not resolve."""
    out = []
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        source = path.read_text()
        module = None
        if path.suffix == ".py" and path.is_relative_to(PACKAGE) and path.name != "__main__.py":
            module = importlib.import_module(_module_name(path))
        for lineno, line in enumerate(source.splitlines(), 1):
            for m in _DOTTED.finditer(line):
                name = m.group(0)
                if name not in NOT_REFERENCES and ".__main__" not in name and not resolves(name):
                    out.append((rel, lineno, name))
            if module is None:
                continue
            for m in _ROLE.finditer(line):
                if not resolves_in(m.group(1), module, source):
                    out.append((rel, lineno, m.group(1)))
    return out


def _prose_files() -> list[Path]:
    return [
        *_modules(),
        *sorted((ROOT / "docs").rglob("*.md")),
        *sorted((ROOT / "scripts").glob("*.py")),
        *sorted((ROOT / "benchmarks").glob("*.py")),
        ROOT / "README.md",
    ]


def test_module_docstrings_are_short():
    long = long_module_docstrings()
    over = {f: n for f, n in long.items() if f not in LONG_DOCSTRING_ALLOWED}
    assert not over, (
        f"module docstrings over {MAX_MODULE_DOCSTRING} lines (move the why to docs/): {over}"
    )
    fixed = sorted(LONG_DOCSTRING_ALLOWED - set(long))
    assert not fixed, f"now short, remove from LONG_DOCSTRING_ALLOWED: {fixed}"


def test_cited_names_exist():
    files = [p for p in _prose_files() if p.relative_to(ROOT).as_posix() != "docs/devlog.md"]
    stale = stale_references(files)
    new = [s for s in stale if (s[0], s[2]) not in STALE_ALLOWED]
    assert not new, "prose cites names the package no longer has:\n" + "\n".join(map(str, new))
    fixed = sorted(STALE_ALLOWED - {(s[0], s[2]) for s in stale})
    assert not fixed, f"now resolved, remove from STALE_ALLOWED: {fixed}"


def issue_numbers(files: list[Path]) -> list[tuple[str, int, str]]:
    """(file, line, text) for every citation of the issue tracker (name the concept instead)."""
    out = []
    for path in files:
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            out += [
                (path.relative_to(ROOT).as_posix(), lineno, m.group(0))
                for m in _ISSUE.finditer(line)
            ]
    return out


def test_no_issue_numbers():
    files = [*_prose_files(), ROOT / "CHANGELOG.md", *sorted((ROOT / "tests").rglob("*.py")),
              *sorted((ROOT / "tests").rglob("*.md"))]  # fmt: skip
    files = [p for p in files if p.name != "test_prose.py"]  # its planted examples
    found = issue_numbers(files)
    new = [f for f in found if f[0] not in ISSUE_NUMBER_ALLOWED]
    assert not new, "prose cites the issue tracker; name the concept instead:\n" + "\n".join(
        map(str, new)
    )
    fixed = sorted(ISSUE_NUMBER_ALLOWED - {f[0] for f in found})
    assert not fixed, f"no longer cites an issue, remove from ISSUE_NUMBER_ALLOWED: {fixed}"


_DOC_PATH = re.compile(r"(?<![\w/.])docs/[\w/.-]+?\.md\b")


def missing_doc_pages(files: list[Path]) -> list[tuple[str, int, str]]:
    """(file, line, path) for every ``docs/....md`` a file names that does not exist."""
    out = []
    for path in files:
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            for m in _DOC_PATH.finditer(line):
                if not (ROOT / m.group(0)).is_file():
                    out.append((path.as_posix(), lineno, m.group(0)))
    return out


def test_named_doc_pages_exist():
    missing = missing_doc_pages([p for p in _prose_files() if p.suffix == ".py"])
    assert not missing, "prose names docs pages that do not exist:\n" + "\n".join(map(str, missing))


def test_checks_catch_a_planted_violation(tmp_path):
    assert (
        docstring_lines('"""one\n' + "line\n" * MAX_MODULE_DOCSTRING + '"""\nx = 1\n')
        > MAX_MODULE_DOCSTRING
    )
    assert resolves("mechlingo.core.errors.DataError")
    assert not resolves("mechlingo.core.errors.NoSuchError")
    assert not resolves("mechlingo.no_such_module")
    errors = importlib.import_module("mechlingo.core.errors")
    source = Path(errors.__file__).read_text()
    assert resolves_in("DataError", errors, source)
    assert resolves_in("ValueError", errors, source)
    assert not resolves_in("no_such_function", errors, source)
    planted = "Since issue 36 the readout, as in round three (#33), keeps issue-25's target."
    assert [m.group(0) for m in _ISSUE.finditer(planted)] == [
        "issue 36",
        "round three",
        "(#33)",
        "issue-25",
    ]
    assert not _ISSUE.findall("colour #222, 36 issues of the journal, a round trip")
    planted_file = tmp_path / "planted.py"
    planted_file.write_text("# see docs/patching.md and docs/scaling.md\n")
    assert [m[2] for m in missing_doc_pages([planted_file])] == ["docs/patching.md"]


_DATE = re.compile(
    r"\b20\d\d-\d\d-\d\d\b|\b\d{1,2} (?:January|February|March|April|May|June|July|August"
    r"|September|October|November|December) 20\d\d\b"
)
#: Pages that may carry dates: the history pages and the benchmark docs (when a timing was
#: measured is part of the timing).
DATED_PAGES = HISTORY_PAGES | {"docs/benchmarks.md"}
#: Dates that are not history: the day the bundled currencies were read at.
DATE_ALLOWED = frozenset({("docs/data.md", "2025-01-01")})


def dated_lines(files: list[Path]) -> list[tuple[str, int, str]]:
    """(file, line, date) for every calendar date a page writes."""
    out = []
    for path in files:
        rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            out += [(rel, lineno, m.group(0)) for m in _DATE.finditer(line)]
    return out


def test_dated_history_is_only_on_the_log_pages():
    """The user docs say what is, not when it changed: a date belongs on the log pages (the
    development log, the card's log) or beside a timing in the benchmark docs."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    pages = [p for p in pages if p.relative_to(ROOT).as_posix() not in DATED_PAGES]
    found = [d for d in dated_lines(pages) if (d[0], d[2]) not in DATE_ALLOWED]
    assert found == [], "move dated history to docs/devlog.md, timings to docs/benchmarks.md"
    for page in HISTORY_PAGES:
        assert (ROOT / page).is_file(), page


def test_the_date_check_finds_a_planted_date(tmp_path):
    planted = tmp_path / "page.md"
    planted.write_text("Since 6 December 2026 and 2026-12-07 it works; 2026 alone is no date.\n",
                       encoding="utf-8")  # fmt: skip
    assert dated_lines([planted]) == [
        ("page.md", 1, "6 December 2026"),
        ("page.md", 1, "2026-12-07"),
    ]
