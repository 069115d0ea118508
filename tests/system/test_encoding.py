"""Every text file mechlingo writes or reads is UTF-8, whatever the locale says.

- In a child process whose locale is plain ASCII (``LC_ALL=C`` with Python's UTF-8 mode and
  locale coercion off, so ``open()`` without an encoding would use ASCII), a saved intervention
  and a vectors folder with non-ASCII metadata, a steering-vector export and facts files in
  Japanese and French are written and read back unchanged.
- A static check over ``mechlingo/**``: no text-mode ``open``, ``Path.open``, ``read_text``,
  ``write_text``, ``os.fdopen``, temporary file or ``TextIOWrapper`` without an explicit
  encoding.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_ROUND_TRIP = """
import locale, sys, tempfile
from pathlib import Path
import torch
from mechlingo.analyses.recall.steering import SteeringPair
from mechlingo.data import load_facts, read_facts, write_jsonl, write_tsv
from mechlingo.interventions import SteeringVector, export, load_intervention, read_export

assert "utf" not in locale.getpreferredencoding(False).lower(), locale.getpreferredencoding(False)
tmp = Path(tempfile.mkdtemp())
meta = {"note": "café · 東京 · Москва", "build": {"langs": ["fr", "ja"]}}
sv = SteeringVector(torch.ones(2, 4), alpha=0.5, meta=meta)
sv.save(tmp / "iv")
assert load_intervention(tmp / "iv").meta == meta
build = {"unit": "raw", "prompt": "Die Hauptstadt von Österreich ist"}
SteeringPair(sv, SteeringVector(torch.ones(2, 4), meta=meta), build=build).save(tmp / "pair")
pair = SteeringPair.load(tmp / "pair")
assert pair.build == build and pair.task.meta == meta
ex = export(SteeringVector(torch.ones(4), layer=1, meta=meta), "repeng", model_type="llama")
back = read_export(ex.save(tmp / "v.gguf"))
assert back.vectors.keys() == ex.vectors.keys()
assert all(torch.equal(back.vectors[k], v) for k, v in ex.vectors.items())
facts = load_facts(langs=["ja", "fr"], relations=["capital"], limit=3)
assert any(ord(c) > 127 for f in facts for c in f.prompt + f.answer)
for name, write in (("f.jsonl", write_jsonl), ("f.tsv", write_tsv)):
    write(facts, tmp / name)
    (tmp / name).read_bytes().decode("utf-8")
    assert read_facts(tmp / name) == facts, name
print("round trip ok")
"""


def test_writers_round_trip_under_an_ascii_locale():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "PYTHONIOENCODING"))}
    env.update(LC_ALL="C", LANG="C", PYTHONUTF8="0", PYTHONCOERCECLOCALE="0",
               OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))  # fmt: skip
    script = textwrap.dedent(_ROUND_TRIP).encode("ascii", "backslashreplace").decode()
    proc = subprocess.run([sys.executable, "-c", script], env=env,
                          capture_output=True, text=True, encoding="utf-8", errors="replace",
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0 and "round trip ok" in proc.stdout, proc.stderr[-3000:]


#: calls that open a file in text mode, with the index of their ``mode`` argument (``None``:
#: always text) and of their ``encoding`` argument when given by position
_OPENERS = {"open": (1, 3), "fdopen": (1, 3), "NamedTemporaryFile": (0, 2),
            "TemporaryFile": (0, 2), "SpooledTemporaryFile": (1, 3),
            "TextIOWrapper": (None, 1)}  # fmt: skip
#: ``Path`` methods: the index of a positional ``encoding``
_PATH_TEXT = {"read_text": 0, "write_text": 1}


def _text_opens_without_encoding(tree: ast.AST) -> list[int]:
    """Line numbers of calls in ``tree`` that open a text file without ``encoding=``."""
    bad = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        receiver = func.value if isinstance(func, ast.Attribute) else None
        if isinstance(receiver, ast.Name) and receiver.id == "os" and name == "open":
            continue  # os.open: a file descriptor, no text layer
        keywords = {kw.arg for kw in node.keywords}
        if name in _PATH_TEXT and receiver is not None:
            if "encoding" not in keywords and len(node.args) <= _PATH_TEXT[name]:
                bad.append(node.lineno)
            continue
        if name not in _OPENERS:
            continue
        mode_at, enc_at = _OPENERS[name]
        if name == "open" and receiver is not None:
            mode_at, enc_at = 0, 2  # Path.open(mode, buffering, encoding)
        mode: object = "r" if mode_at is not None else "t"
        for kw in node.keywords:
            if kw.arg == "mode":
                mode = kw.value.value if isinstance(kw.value, ast.Constant) else "?"
        if mode_at is not None and len(node.args) > mode_at:
            arg = node.args[mode_at]
            mode = arg.value if isinstance(arg, ast.Constant) else "?"
        if name in ("NamedTemporaryFile", "TemporaryFile", "SpooledTemporaryFile"):
            mode = mode if mode != "r" else "w+b"  # their default mode is binary
        binary = isinstance(mode, str) and "b" in mode
        if not binary and "encoding" not in keywords and len(node.args) <= enc_at:
            bad.append(node.lineno)
    return bad


def test_the_static_check_finds_text_opens_without_encoding():
    sample = textwrap.dedent("""
        open(p)
        open(p, "w")
        open(p, "rb")
        open(p, "w", encoding="utf-8")
        path.open()
        path.open("rb")
        path.write_text(s)
        path.write_text(s, "utf-8")
        path.read_text()
        resources.files(x).joinpath(y).read_text("utf-8")
        os.open(p, os.O_RDONLY)
        os.fdopen(fd, "w")
        tempfile.NamedTemporaryFile()
        tempfile.NamedTemporaryFile("w")
        io.TextIOWrapper(buf)
    """)
    assert _text_opens_without_encoding(ast.parse(sample)) == [2, 3, 6, 8, 10, 13, 15, 16]


def test_every_text_file_is_opened_with_an_explicit_encoding():
    found = []
    for path in sorted((REPO / "mechlingo").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found += [f"{path.relative_to(REPO)}:{n}" for n in _text_opens_without_encoding(tree)]
    assert found == [], "text files opened in the locale's encoding (add encoding='utf-8'): " + (
        ", ".join(found)
    )
