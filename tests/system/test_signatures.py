"""No function of mechlingo takes more than :data:`MAX_PARAMS` parameters (``self`` and
``cls`` not counted; ``*args`` and ``**kwargs`` count one each): the settings of one concern
travel as one options object (a frozen dataclass checked when made, or the typed keywords
of one), so every signature stays readable. Read from the source with :mod:`ast`."""

from __future__ import annotations

import ast
from pathlib import Path

import mechlingo

MAX_PARAMS = 10


def _counts() -> dict[str, int]:
    """``{"path:line name": parameter count}`` of every function in the package."""
    root = Path(mechlingo.__file__).parent
    out: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                a = node.args
                names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
                names += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
                where = f"{path.relative_to(root)}:{node.lineno} {node.name}"
                out[where] = len([n for n in names if n not in ("self", "cls")])
    return out


def test_no_function_takes_more_than_ten_parameters():
    counts = _counts()
    assert len(counts) > 500  # the walk found the package
    long = {where: n for where, n in counts.items() if n > MAX_PARAMS}
    assert long == {}, f"functions over {MAX_PARAMS} parameters (group them by concern): {long}"
