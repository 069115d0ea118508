"""The fault classes of user input, each tried as an attacker would, for every command and
every reader it applies to (see ``docs/security.md``, "What a command line may not do").

1. ``--out`` equal to, holding or inside an input: refused before any work, inputs unchanged.
2. A symlinked ``--out`` writes its target; a replaced folder keeps mode, group, owner.
3. Named pipes, sockets and devices: refused by every reader before it opens them.
4. Paths that cannot be expanded (``~nosuchuser``, ``~`` with no home): one line, exit 2.
5. Every JSON read of a user's file is bounded (a static check over the source).
6. Numbers of saved artifacts and flags: type, range and finiteness checked at load/parse.
7. A partial model description in an artifact is refused.
8. A repeated item in a list-valued flag is refused.
9. A failed checkpoint leaves nothing reused; every fix that names a command leads on.

Every CLI refusal here happens before the model loads: the loader is replaced by one that
fails the test.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import pwd
import re
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from mechlingo.cli.main import build_parser, main
from mechlingo.cli.paths import INPUT_FLAGS, LIST_FLAGS, OUTPUT_FLAGS
from mechlingo.core.checkpoints import Checkpoints
from mechlingo.core.errors import ArtifactError, MechlingoError, ModelMismatchError

ROOT = Path(__file__).resolve().parents[2]

#: every command with the inputs it reads, all inside the folder ``{d}``
BASE: dict[str, list[str]] = {
    "lens": ["lens", "--facts", "{d}/facts.jsonl"],
    "eval": ["eval", "--facts", "{d}/facts.jsonl"],
    "trace": ["trace", "--facts", "{d}/facts.jsonl"],
    "circuit": ["circuit", "--facts", "{d}/facts.jsonl"],
    "steer build": ["steer", "build", "--facts", "{d}/facts.jsonl"],
    "steer eval": ["steer", "eval", "--facts", "{d}/facts.jsonl", "--vectors", "{d}/vec"],
    "experts": ["experts", "--parallel", "{d}/par", "--langs", "en,es", "--target", "es"],
    "align": ["align", "--parallel", "{d}/par", "--langs", "en,es", "--clamp", "{d}/clamp"],
    "tuned-lens": ["tuned-lens", "--text-file", "{d}/text.txt"],
    "replicate": ["replicate", "--paper", "lu2025", "--facts", "{d}/facts.jsonl"],
}
#: the data flag of each command and the input it names (replaced by special files below)
DATA_FLAG = {name: (argv[-2], argv[-1]) for name, argv in BASE.items()}
DATA_FLAG |= {
    "steer eval": ("--facts", "{d}/facts.jsonl"),
    "experts": ("--parallel", "{d}/par"),
    "align": ("--parallel", "{d}/par"),
    "replicate": ("--facts", "{d}/facts.jsonl"),
}


def _commands() -> list[str]:
    """Every command of the parser (``steer`` as its two subcommands)."""
    names = []
    for action in build_parser()._subparsers._group_actions:  # type: ignore[union-attr]
        for name in action.choices:
            if name == "steer":
                names += [f"steer {s}" for s in ("build", "eval")]
            else:
                names.append(name)
    return sorted(names)


COMMANDS = _commands()


def test_every_command_is_tried():
    assert sorted(BASE) == COMMANDS


def _dests(command: str) -> set[str]:
    """The ``args`` attributes of a command's flags."""
    parser = build_parser()
    words = command.split()
    sub = parser._subparsers._group_actions[0].choices[words[0]]  # type: ignore[union-attr]
    if len(words) > 1:
        sub = sub._subparsers._group_actions[0].choices[words[1]]
    return {a.dest for a in sub._actions if a.option_strings}


# --------------------------------------------------------------------------------------
# fixtures: one folder with every input, and a loader that must not be reached
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved(tiny, tmp_path_factory) -> dict[str, Path]:
    """A valid clamp and vectors folder of the tiny model, and facts/text files."""
    from mechlingo.data import load_facts
    from mechlingo.interventions import NeuronClamp, SteeringVector

    root = tmp_path_factory.mktemp("saved")
    d_model, n = int(tiny.cfg.d_model), int(tiny.cfg.n_layers)
    NeuronClamp({0: [1, 2]}, 1.0).save(root / "clamp", tiny)
    for part in ("task", "diff"):
        SteeringVector(torch.ones(n, d_model), None, 1.0).save(root / "vec" / part, tiny)
    (root / "vec" / "build.json").write_text(json.dumps({"unit": "resid"}))
    facts = load_facts(langs=["en", "es", "fr"], relations=["capital"], limit=3)
    (root / "facts.jsonl").write_text("".join(json.dumps(f.to_json()) + "\n" for f in facts))
    (root / "par").mkdir()
    for lang, word in (("en", "house"), ("es", "casa"), ("fr", "maison")):
        (root / "par" / f"{lang}.txt").write_text("".join(f"{word} {i}\n" for i in range(8)))
    (root / "text.txt").write_text("".join(f"line {i}\n" for i in range(8)))
    return {"root": root}


@pytest.fixture()
def d(saved, tiny_dir, tmp_path) -> Path:
    """A fresh folder holding every input of :data:`BASE` and the tiny model (``model``)."""
    import shutil

    folder = tmp_path / "d"
    shutil.copytree(saved["root"], folder)
    shutil.copytree(tiny_dir, folder / "model")
    return folder


@pytest.fixture()
def no_model(monkeypatch) -> list[str]:
    """Every model loader replaced by one that records the call and fails."""
    import sys

    calls: list[str] = []

    def boom(*args: Any, **kw: Any) -> Any:
        calls.append(str(args[:1]))
        raise AssertionError("the model was loaded before the refusal")

    from mechlingo.core import models

    real = models.load_model
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("mechlingo") and (
            getattr(mod, "load_model", None) is real
        ):
            monkeypatch.setattr(mod, "load_model", boom)
    return calls


def _argv(command: str, d: Path, *extra: str, model: bool = True) -> list[str]:
    argv = [a.format(d=d) for a in BASE[command]]
    return argv + (["--model", str(d / "model")] if model else []) + list(extra)


def _run(argv: list[str], capsys) -> tuple[int, str]:
    try:
        code = int(main(argv))
    except SystemExit as exc:  # argparse
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    return code, err


def _refused(argv: list[str], capsys, no_model: list[str], match: str) -> str:
    """Run the command line: exit 2, one line on stderr matching ``match``, no model."""
    t0 = time.time()
    code, err = _run(argv, capsys)
    assert code == 2, f"{argv}: exit {code}\n{err[-2000:]}"
    assert no_model == [], "refused only after the model loaded"
    assert len(err.strip().splitlines()) == 1, err
    assert re.search(match, err), err
    assert time.time() - t0 < 30
    return err


def _hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


# --------------------------------------------------------------------------------------
# 1. --out equal to, holding or inside an input
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["holds", "is", "inside", "link-holds", "parent"])
@pytest.mark.parametrize("command", COMMANDS)
def test_out_over_an_input_is_refused(command, where, d, tmp_path, capsys, no_model):
    """The property: for every command, an --out over its own inputs is refused before
    any work and every input's sha256 is unchanged."""
    out = {
        "holds": d,  # the folder of the command's own inputs
        "is": d / "model",  # the model folder itself
        "inside": d / "model" / "results",
        "parent": tmp_path,  # a parent of every input
    }.get(where)
    if where == "link-holds":
        out = tmp_path / "link"
        out.symlink_to(d, target_is_directory=True)
    before = _hashes(d)
    _refused(_argv(command, d, "--out", str(out)), capsys, no_model,
             r"--out .* (holds|is|is inside) the input")  # fmt: skip
    assert _hashes(d) == before
    assert not (d / "model" / "results").exists()


@pytest.mark.parametrize("command", [c for c in COMMANDS if "work" in _dests(c)])
def test_work_folder_over_an_input_is_refused(command, d, tmp_path, capsys, no_model):
    before = _hashes(d)
    argv = _argv(command, d, "--out", str(tmp_path / "out"), "--work", str(d))
    _refused(argv, capsys, no_model, r"--work .* holds the input")
    assert _hashes(d) == before


# --------------------------------------------------------------------------------------
# 2. a symlinked --out, the mode and group of a replaced folder
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["missing", "file"])
@pytest.mark.parametrize("command", COMMANDS)
def test_out_symlink_to_no_folder_is_refused(command, target, d, tmp_path, capsys, no_model):
    dest = tmp_path / "elsewhere"
    if target == "file":
        dest.write_text("keep")
    link = tmp_path / "link"
    link.symlink_to(dest)
    _refused(_argv(command, d, "--out", str(link)), capsys, no_model, "which is not a folder")
    assert link.is_symlink() and (dest.read_text() == "keep" if target == "file" else True)


def _tree(root: Path) -> dict[str, tuple]:
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        body = p.read_bytes() if p.is_file() and not p.is_symlink() else None
        out[str(p.relative_to(root))] = (stat.S_IFMT(st.st_mode), st.st_mode, st.st_gid, body)
    return out


def test_symlinked_out_writes_its_target_and_keeps_mode_and_group(tmp_path):
    from mechlingo.core.artifacts import write_files

    real = tmp_path / "shared" / "results"
    real.mkdir(parents=True)
    (real / "old.txt").write_text("old")
    groups = os.getgroups()
    gid = groups[-1] if groups else os.getgid()
    os.chown(real, -1, gid)
    os.chmod(real, 0o2775)
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    (tmp_path / "other.txt").write_text("other")
    outside = {k: v for k, v in _tree(tmp_path).items() if not k.startswith("shared/results")}

    write_files(link, {"summary.json": {"a": 1}})

    assert link.is_symlink() and os.readlink(link) == str(real)  # the link is as it was
    assert json.loads((real / "summary.json").read_text())["a"] == 1  # its target written
    assert (real / "old.txt").read_text() == "old"
    st = real.stat()
    assert stat.S_IMODE(st.st_mode) == 0o2775 and st.st_gid == gid
    after = {k: v for k, v in _tree(tmp_path).items() if not k.startswith("shared/results")}
    assert after == outside  # nothing outside --out changed


def test_new_out_folder_gets_the_umask_mode_and_the_parents_setgid(tmp_path):
    from mechlingo.core.artifacts import write_files

    parent = tmp_path / "group"
    parent.mkdir()
    os.chmod(parent, 0o2775)
    old = os.umask(0o002)
    try:
        write_files(parent / "out", {"a.txt": "x"})
    finally:
        os.umask(old)
    mode = stat.S_IMODE((parent / "out").stat().st_mode)
    assert mode == 0o2775, oct(mode)  # not the 0700 of a temporary folder


def test_cli_run_into_a_symlinked_setgid_out(tiny_dir, saved, tmp_path, capsys):
    real = tmp_path / "team" / "results"
    real.mkdir(parents=True)
    os.chmod(real, 0o2770)
    link = tmp_path / "out"
    link.symlink_to(real, target_is_directory=True)
    argv = ["eval", "--model", str(tiny_dir), "--facts", str(saved["root"] / "facts.jsonl"),
            "--limit", "1", "--langs", "en", "--max-new-tokens", "1", "--quiet",
            "--out", str(link)]  # fmt: skip
    code, err = _run(argv, capsys)
    assert code == 0, err
    assert link.is_symlink() and (real / "summary.json").is_file()
    assert stat.S_IMODE(real.stat().st_mode) == 0o2770


# --------------------------------------------------------------------------------------
# 3. named pipes, sockets, devices
# --------------------------------------------------------------------------------------


@pytest.fixture(params=["fifo", "socket", "device"])
def special(request, tmp_path) -> Iterator[tuple[str, Callable[[Path], None], str]]:
    """A maker of one kind of special file at a path, and the words the refusal uses."""
    socks: list[socket.socket] = []

    def make(path: Path) -> None:
        if request.param == "fifo":
            os.mkfifo(path)
        elif request.param == "socket":
            s = socket.socket(socket.AF_UNIX)
            s.bind(str(path))
            socks.append(s)
        else:
            path.symlink_to("/dev/null")  # symlinks are followed: a character device

    words = {"fifo": "named pipe", "socket": "socket", "device": "character device"}
    yield request.param, make, words[request.param]
    for s in socks:
        s.close()


def _no_hang(fn: Callable[[], Any], pipes: list[Path], timeout: float = 20.0) -> BaseException:
    """Call ``fn`` in a thread; fail if it blocks (then unblock it by opening the pipes for
    writing) or returns without an error; the error it raised."""
    box: dict[str, BaseException] = {}

    def target() -> None:
        try:
            fn()
        except BaseException as err:  # noqa: BLE001 - handed to the test
            box["err"] = err

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        for p in pipes:
            try:
                os.close(os.open(p, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        t.join(5)
        pytest.fail(f"{fn} blocked on a special file")
    assert "err" in box, "no error"
    return box["err"]


def _readers(tmp: Path) -> dict[str, tuple[Path, Callable[[Path], Any]]]:
    """Every reader of a user's file: ``name -> (where the special file goes, call)``."""
    from mechlingo.analyses.decoders.tuned_lens import load_tuned_lens
    from mechlingo.analyses.decoders.tuned_lens_interop import load_package_lens
    from mechlingo.analyses.recall.steering import SteeringPair
    from mechlingo.core.checks import check_gguf_file, check_model_folder
    from mechlingo.core.untrusted import gguf_header, load_tensors, read_json
    from mechlingo.data import load_benchmark, load_facts, read_facts, read_parallel_dir
    from mechlingo.data.io import read_text
    from mechlingo.interventions import load_intervention
    from mechlingo.interventions.export import read_export

    def folder(name: str) -> Path:
        return tmp / name

    return {
        "read_facts": (tmp / "f.jsonl", read_facts),
        "load_facts": (tmp / "g.jsonl", lambda p: load_facts(path=p)),
        "load_benchmark": (tmp / "b.jsonl", load_benchmark),
        "read_text": (tmp / "t.txt", read_text),
        "read_parallel_dir": (folder("par") / "en.txt",
                              lambda p: read_parallel_dir(p.parent, langs=["en"])),
        "read_json": (tmp / "x.json", lambda p: read_json(p, ArtifactError)),
        "load_tensors": (tmp / "x.safetensors", lambda p: load_tensors(p, ArtifactError)),
        "gguf_header": (tmp / "x.gguf", lambda p: gguf_header(p, ArtifactError)),
        "check_gguf_file": (tmp / "m.gguf", check_gguf_file),
        "check_model_folder": (folder("model") / "config.json",
                               lambda p: check_model_folder(p.parent)),
        "load_intervention": (folder("iv") / "intervention.json",
                              lambda p: load_intervention(p.parent)),
        "load_tuned_lens": (folder("lens") / "tuned_lens.json",
                            lambda p: load_tuned_lens(p.parent)),
        "load_package_lens": (folder("pkg") / "params.pt", lambda p: load_package_lens(p.parent)),
        "read_export": (tmp / "v.gguf", read_export),
        "SteeringPair.load": (folder("vec") / "build.json", lambda p: SteeringPair.load(p.parent)),
        "Checkpoints.load": (tmp / "work", _stage_reader),
    }  # fmt: skip


def _stage_reader(path: Path) -> Any:
    """A checkpoint whose result.json is the special file (made by the test at ``path``)."""
    return Checkpoints(path.parent / "checkpoints", {"k": 1}).load("a")


READERS = sorted(_readers(Path("/nonexistent")))


@pytest.mark.parametrize("reader", READERS)
def test_every_reader_refuses_special_files(reader, special, tmp_path, saved, tiny, work_dir):
    kind, make, words = special
    where, call = _readers(tmp_path)[reader]
    where.parent.mkdir(parents=True, exist_ok=True)
    if reader == "load_intervention":
        from mechlingo.interventions import NeuronClamp

        NeuronClamp({0: [1]}, 1.0).save(where.parent, tiny)
        where.unlink()
    if reader == "SteeringPair.load":
        import shutil

        shutil.rmtree(where.parent)
        shutil.copytree(saved["root"] / "vec", where.parent)
        where.unlink()
    if reader == "load_tuned_lens":
        (where.parent / "translators.safetensors").write_bytes(b"x")
    if reader == "check_model_folder":
        pass
    if reader == "Checkpoints.load":
        # a short folder: a socket's path has at most 107 bytes (xdist's tmp_path is deeper)
        checkpoints = Checkpoints(work_dir / "checkpoints", {"k": 1})
        checkpoints.run("a", lambda: {"v": 1})
        result = checkpoints.path("a") / "result.json"
        result.unlink()
        where = result
        call = _stage_reader
        where_for_call = work_dir / "work"
    else:
        where_for_call = where
    make(where)
    err = _no_hang(lambda: call(where_for_call), [where])
    assert isinstance(err, MechlingoError), repr(err)
    # a device is linked here: a reader that refuses links out of its folder may say so first
    assert words in str(err) or (kind == "device" and "points outside" in str(err)), str(err)


@pytest.mark.parametrize("command", COMMANDS)
def test_cli_refuses_special_files(command, special, d, tmp_path, capsys, no_model):
    kind, make, words = special
    flag, value = DATA_FLAG[command]
    path = tmp_path / ("fifo.jsonl" if flag == "--facts" else "fifo.txt")
    make(path)
    argv = _argv(command, d, "--out", str(tmp_path / "out"))
    argv[argv.index(value.format(d=d))] = str(path)
    _refused(argv, capsys, no_model, f"{flag} .* is an? {words}")


# --------------------------------------------------------------------------------------
# 4. paths that cannot be expanded
# --------------------------------------------------------------------------------------


def _path_flags(command: str) -> list[str]:
    dests = _dests(command)
    return sorted(k for k in {**INPUT_FLAGS, **OUTPUT_FLAGS} if k in dests)


PATH_CASES = [(c, f) for c in COMMANDS for f in _path_flags(c)]


@pytest.mark.parametrize("home", ["nosuchuser", "no-home"])
@pytest.mark.parametrize(("command", "dest"), PATH_CASES, ids=[f"{c}-{f}" for c, f in PATH_CASES])
def test_unexpandable_path_flags(command, dest, home, d, tmp_path, capsys, no_model,
                                 monkeypatch):  # fmt: skip
    if home == "no-home":
        monkeypatch.delenv("HOME", raising=False)

        def no_entry(uid: int) -> Any:
            raise KeyError(uid)

        monkeypatch.setattr(pwd, "getpwuid", no_entry)
        value = "~/x"
    else:
        value = "~nosuchuser-mechlingo/x"
    flag = {**INPUT_FLAGS, **OUTPUT_FLAGS}[dest]
    flag = "--control-seeds" if dest == "seeds" else flag
    argv = _argv(command, d, "--out", str(tmp_path / "out"))
    option = "--" + dest.replace("_", "-") if dest != "side_effects" else "--parallel"
    if option in argv:
        argv[argv.index(option) + 1] = value
    else:
        argv += [option, value]
    if command == "steer eval" and option == "--parallel":
        argv.append("--side-effects")
    _refused(argv, capsys, no_model, r"cannot be expanded")


# --------------------------------------------------------------------------------------
# 5. every JSON read of a user's file is bounded
# --------------------------------------------------------------------------------------

#: ``(file, function)`` where a plain json.load(s) is allowed, and why
JSON_ALLOWED = {
    ("mechlingo/core/untrusted.py", "loads"): "the bounded reader itself",
    ("mechlingo/data/io.py", "json_record"): "check_depth runs first (a facts line)",
    ("mechlingo/data/benchmarks/klar.py", "_klar_json"): "check_depth runs first",
    ("mechlingo/data/io.py", "natural_templates"): "a file of the mechlingo package",
    ("mechlingo/data/__init__.py", "template_info"): "a file of the mechlingo package",
    ("mechlingo/data/langid.py", "lexicon"): "files of the mechlingo package",
    ("mechlingo/core/models.py", "_cache_is_valid"): "the manifest mechlingo wrote in its cache",
    ("mechlingo/card/stages/transfer.py", "stage_transfer"): "a string mechlingo made (to_json)",
}


def _json_calls() -> list[tuple[str, str, int]]:
    """``(file, enclosing function, line)`` of every json.load/json.loads in mechlingo."""
    found = []
    for path in sorted((ROOT / "mechlingo").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef | ast.Module):
                continue
            name = getattr(fn, "name", "<module>")
            body = fn.body if isinstance(fn, ast.Module) else [fn]
            for node in (n for b in body for n in ast.walk(b)):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("load", "loads")
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "json"
                ):
                    found.append((rel, name, node.lineno))
    # the innermost function of each call
    best: dict[tuple[str, int], str] = {}
    for rel, name, line in found:
        if name != "<module>" or (rel, line) not in best:
            best[(rel, line)] = name
    return sorted((rel, name, line) for (rel, line), name in best.items())


def test_no_unbounded_json_read_of_a_users_file():
    calls = _json_calls()
    assert calls, "the scan found no json call at all: it is broken"
    unexplained = [c for c in calls if (c[0], c[1]) not in JSON_ALLOWED]
    assert unexplained == [], (
        "json.load/json.loads outside the bounded reader (use mechlingo.core.untrusted."
        f"read_json/loads, or allow-list an internal one with its reason): {unexplained}"
    )


def _deep(path: Path) -> None:
    path.write_text("[" * 200_000 + "]" * 200_000)


@pytest.mark.parametrize("reader", ["load_intervention", "SteeringPair.load", "load_tuned_lens",
                                    "read_json", "check_model_folder", "load_package_lens"])  # fmt: skip
def test_deep_json_in_every_json_reader(reader, tmp_path, saved, tiny):
    import shutil

    from mechlingo.analyses.decoders.tuned_lens import TunedLens, load_tuned_lens
    from mechlingo.analyses.decoders.tuned_lens_interop import load_package_lens
    from mechlingo.analyses.recall.steering import SteeringPair
    from mechlingo.core.checks import check_model_folder
    from mechlingo.core.untrusted import read_json
    from mechlingo.interventions import load_intervention

    if reader == "load_intervention":
        shutil.copytree(saved["root"] / "clamp", tmp_path / "x")
        _deep(tmp_path / "x" / "intervention.json")
        call = lambda: load_intervention(tmp_path / "x")  # noqa: E731
    elif reader == "SteeringPair.load":
        shutil.copytree(saved["root"] / "vec", tmp_path / "x")
        _deep(tmp_path / "x" / "build.json")
        call = lambda: SteeringPair.load(tmp_path / "x")  # noqa: E731
    elif reader == "load_tuned_lens":
        TunedLens.for_model(tiny).save(tmp_path / "x")
        _deep(tmp_path / "x" / "tuned_lens.json")
        call = lambda: load_tuned_lens(tmp_path / "x")  # noqa: E731
    elif reader == "read_json":
        _deep(tmp_path / "x.json")
        call = lambda: read_json(tmp_path / "x.json", ArtifactError)  # noqa: E731
    elif reader == "check_model_folder":
        (tmp_path / "x").mkdir()
        _deep(tmp_path / "x" / "config.json")
        call = lambda: check_model_folder(tmp_path / "x")  # noqa: E731
    else:
        (tmp_path / "x").mkdir()
        _deep(tmp_path / "x" / "config.json")
        (tmp_path / "x" / "params.pt").write_bytes(b"x")
        call = lambda: load_package_lens(tmp_path / "x")  # noqa: E731
    with pytest.raises(MechlingoError, match="deeper than"):
        call()


def test_deep_json_settings_and_experts_summary(d, tmp_path, capsys, no_model):
    _deep(tmp_path / "s.json")
    argv = _argv("replicate", d, "--out", str(tmp_path / "o"), "--settings",
                 str(tmp_path / "s.json"))  # fmt: skip
    code, err = _run(argv, capsys)
    assert code == 2 and "deeper than" in err and "Traceback" not in err, err
    # an experts folder given to align: its summary.json
    edir = tmp_path / "edir"
    edir.mkdir()
    _deep(edir / "summary.json")
    argv = _argv("align", d, "--out", str(tmp_path / "o"))
    argv[argv.index("--clamp") + 1] = str(edir)
    code, err = _run(argv, capsys)
    assert code == 2 and "Traceback" not in err, err


# --------------------------------------------------------------------------------------
# 6. numbers of saved artifacts and flags
# --------------------------------------------------------------------------------------


def _edit_json(path: Path, fn: Callable[[dict], Any]) -> None:
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc))


ABSURD = {
    "layer-huge": lambda doc: doc["config"].update(layer=10**30),
    "layer-beyond-models": lambda doc: doc["config"].update(layer=2**40),
    "position-huge": lambda doc: doc["config"].update(positions=[2**40]),
    "position-int-huge": lambda doc: doc["config"].update(positions=10**25),
    "alpha-string": lambda doc: doc["config"].update(alpha="1e3"),
    "layer-float": lambda doc: doc["config"].update(layer=1.5),
    "layer-bool": lambda doc: doc["config"].update(layer=True),
}


@pytest.mark.parametrize("case", sorted(ABSURD))
def test_saved_intervention_numbers_checked_at_load(case, saved, tmp_path):
    import shutil

    from mechlingo.interventions import load_intervention

    folder = tmp_path / "task"
    shutil.copytree(saved["root"] / "vec" / "task", folder)
    _edit_json(folder / "intervention.json", ABSURD[case])
    with pytest.raises(MechlingoError):
        load_intervention(folder)  # no model: refused at load, not at a forward pass


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity", "1" + "0" * 30])
@pytest.mark.parametrize("reader", ["intervention", "build.json", "tuned_lens", "stage"])
def test_non_finite_or_huge_numbers_in_every_artifact(reader, text, saved, tmp_path, tiny):
    import shutil

    from mechlingo.analyses.decoders.tuned_lens import TunedLens, load_tuned_lens
    from mechlingo.analyses.recall.steering import SteeringPair
    from mechlingo.interventions import load_intervention

    marker = 987654.25
    if reader == "intervention":
        shutil.copytree(saved["root"] / "clamp", tmp_path / "x")
        path = tmp_path / "x" / "intervention.json"
        _edit_json(path, lambda doc: doc["meta"].update(extra=marker))
        call = lambda: load_intervention(tmp_path / "x")  # noqa: E731
    elif reader == "build.json":
        shutil.copytree(saved["root"] / "vec", tmp_path / "x")
        path = tmp_path / "x" / "build.json"
        path.write_text(json.dumps({"unit": "resid", "resid_norm": marker}))
        call = lambda: SteeringPair.load(tmp_path / "x")  # noqa: E731
    elif reader == "tuned_lens":
        TunedLens.for_model(tiny).save(tmp_path / "x")
        path = tmp_path / "x" / "tuned_lens.json"
        _edit_json(path, lambda doc: doc.update(meta={"lr": marker}))
        call = lambda: load_tuned_lens(tmp_path / "x")  # noqa: E731
    else:
        checkpoints = Checkpoints(tmp_path / "w", {"k": 1})
        checkpoints.run("a", lambda: {"v": marker})
        path = checkpoints.path("a") / "result.json"
        call = lambda: Checkpoints(tmp_path / "w", {"k": 1}).load("a")  # noqa: E731
    call()  # the untouched file loads
    path.write_text(path.read_text().replace(str(marker), text))
    with pytest.raises(MechlingoError, match="finite|digits"):
        call()


def test_alpha_that_overflows_float32_is_refused_with_the_model(saved, tmp_path, tiny):
    import shutil

    from mechlingo.interventions import load_intervention

    folder = tmp_path / "task"
    shutil.copytree(saved["root"] / "vec" / "task", folder)
    _edit_json(folder / "intervention.json", lambda doc: doc["config"].update(layer=0, alpha=1e300))
    with pytest.raises(MechlingoError, match="overflows float32|NaN or infinite"):
        load_intervention(folder, tiny)
    from mechlingo.interventions import SteeringVector

    # a finite alpha whose product with the vector is beyond float32: refused at the hooks
    big = SteeringVector(torch.full((int(tiny.cfg.d_model),), 10.0), 0, 3e38)
    with pytest.raises(MechlingoError, match="overflows float32"):
        big.fwd_hooks(tiny)


def _numeric_flags(command: str) -> list[tuple[str, str, str]]:
    """``(option, bad value, what the error says)`` for every numeric flag of a command."""
    parser = build_parser()
    words = command.split()
    sub = parser._subparsers._group_actions[0].choices[words[0]]  # type: ignore[union-attr]
    if len(words) > 1:
        sub = sub._subparsers._group_actions[0].choices[words[1]]
    cases = []
    for a in sub._actions:
        if not a.option_strings:
            continue
        option = a.option_strings[0]
        if a.type is float:
            cases.append((option, "nan", "nan|above|at least"))
            cases.append((option, "inf", "inf|at most"))
        elif a.type is int or getattr(a.type, "__name__", "") == "count_or_all":
            cases.append((option, str(10**30), "out of range|64-bit"))
    comma = {"k": "5,1" + "0" * 30, "layers": "0,1" + "0" * 30, "task_layers": "1" + "0" * 30,
             "diff_layers": "1" + "0" * 30, "seeds": "0,1" + "0" * 30,
             "task_alphas": "0.1,nan", "diff_alphas": "inf", "mid_layers": "0-99999999999"}  # fmt: skip
    for a in sub._actions:
        if a.dest in comma and a.option_strings:
            cases.append((a.option_strings[0], comma[a.dest], "beyond|nan|inf|spans"))
    return cases


NUMERIC = [(c, *x) for c in COMMANDS for x in _numeric_flags(c)]


@pytest.mark.parametrize(("command", "option", "value", "says"), NUMERIC,
                         ids=[f"{c}{o}={v[:8]}" for c, o, v, _ in NUMERIC])  # fmt: skip
def test_every_numeric_flag_is_checked_at_parse(command, option, value, says, d, tmp_path,
                                                capsys, no_model):  # fmt: skip
    argv = _argv(command, d, "--out", str(tmp_path / "out"), f"{option}={value}")
    _refused(argv, capsys, no_model, says)


def test_nan_learning_rate_refused_at_parse(d, tmp_path, capsys, no_model):
    for lr in ("nan", "0", "-1e-3", "inf"):
        _refused(_argv("tuned-lens", d, "--out", str(tmp_path / "o"), f"--lr={lr}"), capsys,
                 no_model, "--lr")  # fmt: skip


# --------------------------------------------------------------------------------------
# 7. a partial model description
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("keep", [("model_name",), ("model_name", "d_model", "n_layers", "d_mlp"),
                                  ("model_name", "d_model", "n_layers", "d_mlp", "weights")])  # fmt: skip
def test_partial_model_description_is_refused(keep, saved, tmp_path, tiny, d, capsys, no_model):
    import shutil

    from mechlingo.analyses.decoders.tuned_lens import TunedLens, load_tuned_lens
    from mechlingo.interventions import load_intervention

    folder = tmp_path / "clamp"
    shutil.copytree(saved["root"] / "clamp", folder)
    trim = lambda info: {k: v for k, v in info.items() if k in keep}  # noqa: E731
    _edit_json(
        folder / "intervention.json",
        lambda doc: doc["meta"].update(model=trim(doc["meta"]["model"])),
    )
    with pytest.raises(ModelMismatchError, match="without .*re-save"):
        load_intervention(folder, tiny)
    # the command line: refused before the model loads
    argv = _argv("align", d, "--out", str(tmp_path / "out"))
    argv[argv.index("--clamp") + 1] = str(folder)
    _refused(argv, capsys, no_model, "records its model without .*re-save")
    # a tuned lens
    TunedLens.for_model(tiny).save(tmp_path / "lens")
    _edit_json(
        tmp_path / "lens" / "tuned_lens.json", lambda doc: doc.update(model=trim(doc["model"]))
    )
    with pytest.raises(ModelMismatchError, match="without"):
        load_tuned_lens(tmp_path / "lens", tiny)


# --------------------------------------------------------------------------------------
# 8. repeated items in list-valued flags
# --------------------------------------------------------------------------------------

REPEATS = {"langs": "en,es,en", "relation": "capital,capital", "track": "en,en",
           "target": "es,es", "k": "5,05", "layers": "0,0", "task_layers": "1,1",
           "diff_layers": "1,1", "task_alphas": "0.5,0.50", "diff_alphas": "1,1.0",
           "seeds": "0,1,0", "mid_layers": "0,0", "patch_sites": "resid_pre,resid_pre",
           "decoder": "logit,logit", "tuned_lens": "a={d}/x,a={d}/y"}  # fmt: skip
LIST_CASES = [(c, dest) for c in COMMANDS for dest in sorted(LIST_FLAGS) if dest in _dests(c)]


def test_every_list_flag_has_a_repeat_case():
    assert set(REPEATS) == set(LIST_FLAGS)


@pytest.mark.parametrize(("command", "dest"), LIST_CASES, ids=[f"{c}-{x}" for c, x in LIST_CASES])
def test_repeated_items_are_refused(command, dest, d, tmp_path, capsys, no_model):
    option = LIST_FLAGS[dest]
    argv = _argv(command, d, "--out", str(tmp_path / "out"))
    value = REPEATS[dest].format(d=d)
    if option in argv:
        argv[argv.index(option) + 1] = value
    else:
        argv += [option, value]
    _refused(argv, capsys, no_model, "more than once")


# --------------------------------------------------------------------------------------
# 9. a failed checkpoint leaves nothing reused; each fix that names a command leads on
# --------------------------------------------------------------------------------------


def test_stage_that_raises_stores_nothing(tmp_path):
    checkpoints = Checkpoints(tmp_path / "w", {"k": 1})

    def broken(tmp: Path) -> dict:
        (tmp / "half.bin").write_bytes(b"x")
        raise RuntimeError("failed half way")

    with pytest.raises(RuntimeError):
        checkpoints.run("a", broken, folder=True)
    assert not checkpoints.done("a") and not checkpoints.path("a").exists()
    assert Checkpoints(tmp_path / "w", {"k": 1}).run("a", lambda tmp: {"v": 2}, folder=True) == {
        "v": 2
    }


def test_stage_with_nan_weights_or_result_is_not_kept(tmp_path, tiny):
    from mechlingo.analyses.decoders.tuned_lens import TunedLens

    checkpoints = Checkpoints(tmp_path / "w", {"k": 1})

    def diverged(tmp: Path) -> dict:
        lens = TunedLens.for_model(tiny)
        with torch.no_grad():
            lens.weight.fill_(float("nan"))
        lens.save(tmp / "lens")
        return {"loss": [1.0]}

    with pytest.raises(ArtifactError, match="not kept"):
        checkpoints.run("train", diverged, folder=True)
    assert not checkpoints.path("train").exists()

    # other checkpoint tensors may hold NaN on purpose (an undefined statistic)
    def stats(tmp: Path) -> dict:
        save_file({"auroc": torch.tensor([float("nan")])}, str(tmp / "stats.safetensors"))
        return {}

    assert checkpoints.run("c", stats, folder=True) == {}


def test_unreadable_stage_is_recomputed_not_reused(tmp_path):
    checkpoints = Checkpoints(tmp_path / "w", {"k": 1})
    checkpoints.run("a", lambda: {"v": 1})
    (checkpoints.path("a") / "result.json").write_text('{"v": NaN}')
    calls = []
    again = Checkpoints(tmp_path / "w", {"k": 1})
    assert again.run("a", lambda: calls.append(1) or {"v": 2}) == {"v": 2}
    assert calls == [1]


_FIX = re.compile(r"fix=f?\"([^\"]*(?:`mechlingo [a-z-]+[^`]*`|--fresh)[^\"]*)\"")


def _fix_strings() -> set[str]:
    found = set()
    for path in sorted((ROOT / "mechlingo").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        for m in _FIX.finditer(text):
            found.add(m.group(1))
        for m in re.finditer(r"^\s*fix = \"([^\"]*`mechlingo [^\"]*)\"", text, re.M):
            found.add(m.group(1))
    return found


def _follow_steer_build(vdir: Path, ctx: dict) -> None:
    code = int(main(["steer", "build", "--model", ctx["tiny"], "--langs", "en,es",
                     "--relation", "capital", "--limit", "20", "--k-shot", "1", "--quiet",
                     "--out", str(vdir)]))  # fmt: skip
    assert code == 0


def _follow_tuned_lens(out: Path, ctx: dict) -> None:
    code = int(main(["tuned-lens", "--model", ctx["tiny"], "--text-file", ctx["text"],
                     "--steps", "1", "--texts-per-step", "2", "--max-tokens", "8",
                     "--lines", "4", "--quiet", "--out", str(out)]))  # fmt: skip
    assert code == 0


def test_every_fix_that_names_a_command_leads_on(tiny_dir, saved, tmp_path, capsys, monkeypatch):
    """Each error whose fix names a command: raised, the fix followed, the same command
    run again: it no longer fails with that error (the loader is then replaced, so 'leads
    on' is 'got past every check before the model loads')."""
    facts, text = str(saved["root"] / "facts.jsonl"), str(saved["root"] / "text.txt")
    ctx = {"tiny": str(tiny_dir), "facts": facts, "text": text}
    scenarios: dict[str, tuple[Callable[[Path], list[str]], Callable[[Path, dict], None], str]] = {}

    def steer_eval(vdir: Path) -> list[str]:
        return ["steer", "eval", "--model", str(tiny_dir), "--facts", facts,
                "--vectors", str(vdir), "--out", str(tmp_path / "o")]  # fmt: skip

    def no_unit(vdir: Path) -> None:
        import shutil

        shutil.copytree(saved["root"] / "vec", vdir)
        (vdir / "build.json").unlink()

    def lens_cmd(folder: Path) -> list[str]:
        return ["lens", "--model", str(tiny_dir), "--facts", facts, "--decoder", "tuned",
                "--tuned-lens", str(folder), "--out", str(tmp_path / "o")]  # fmt: skip

    def fresh_cmd(work: Path) -> list[str]:
        return ["--fresh"]

    scenarios["pass a folder written by `mechlingo steer build`"] = (
        steer_eval,
        _follow_steer_build,
        "is not a folder",
    )
    scenarios["rebuild it with `mechlingo steer build --out {path_text}`"] = (
        steer_eval,
        _follow_steer_build,
        "records no unit",
    )
    scenarios["rebuild it with `mechlingo steer build --out {folder}`"] = (
        steer_eval,
        _follow_steer_build,
        "records no unit",
    )
    scenarios["rebuild them with `mechlingo steer build --out VDIR` (or "] = (
        steer_eval,
        _follow_steer_build,
        "records no unit",
    )
    scenarios["train one with `mechlingo tuned-lens --out DIR`"] = (
        lens_cmd,
        _follow_tuned_lens,
        "holds no tuned lens",
    )
    scenarios["train it again with `mechlingo tuned-lens --out DIR`"] = (
        lens_cmd,
        _follow_tuned_lens,
        "holds no tuned lens",
    )
    scenarios["delete the work folder (or rerun with --fresh)"] = (fresh_cmd, None, "")  # type: ignore[assignment]
    # --resume with --fresh: dropping one flag is the fix (tests/cli/test_work.py follows it)
    scenarios["give one: --fresh starts over, --resume only goes on"] = (fresh_cmd, None, "")  # type: ignore[assignment]
    found = _fix_strings()
    assert found == set(scenarios), f"a fix string without a scenario: {found - set(scenarios)}"

    from mechlingo.cli import common

    for i, (fix, (make_argv, follow, error)) in enumerate(sorted(scenarios.items())):
        if follow is None:
            continue  # --fresh: test_fresh_fix_leads_on
        folder = tmp_path / f"art{i}"
        if error == "records no unit":
            no_unit(folder)
        code, err = _run(make_argv(folder), capsys)
        assert code == 2 and error in err, (fix, err)
        follow(folder, ctx)  # the fix, as its text says
        capsys.readouterr()
        calls: list[int] = []

        def stop(*a: Any, calls: list[int] = calls, **k: Any) -> Any:
            calls.append(1)
            raise MechlingoError("stopped at the model load")

        monkeypatch.setattr(common, "load_model", stop)
        code, err = _run(make_argv(folder), capsys)
        monkeypatch.undo()
        assert error not in err, (fix, err)
        assert calls == [1], (fix, err)  # got past every check, to the model


def test_fresh_fix_leads_on(tmp_path):
    """'rerun with --fresh': a checkpoint whose tensors cannot be read is recomputed."""
    from mechlingo.core.untrusted import load_tensors

    key = {"k": 1}
    checkpoints = Checkpoints(tmp_path / "w", key)
    checkpoints.run("s", lambda tmp: save_file({"x": torch.ones(2)}, str(tmp / "t.safetensors")) or {},
               folder=True)  # fmt: skip
    (checkpoints.path("s") / "t.safetensors").write_bytes(b"broken")
    with pytest.raises(ArtifactError, match="--fresh"):
        load_tensors(checkpoints.path("s") / "t.safetensors", ArtifactError,
                     fix="delete the work folder (or rerun with --fresh)")  # fmt: skip
    again = Checkpoints(tmp_path / "w", key)
    again.clear()  # what --fresh does (mechlingo.cli.work.open_checkpoints)
    again.run("s", lambda tmp: save_file({"x": torch.ones(2)}, str(tmp / "t.safetensors")) or {},
              folder=True)  # fmt: skip
    assert torch.equal(load_tensors(again.path("s") / "t.safetensors", ArtifactError)["x"],
                       torch.ones(2))  # fmt: skip


@pytest.mark.parametrize("k", [10**12, -5, 2.5, "500", True])
def test_experts_folder_chosen_k_is_checked(k, tmp_path):
    from mechlingo.cli.experts import _resolve_clamp

    edir = tmp_path / "edir"
    edir.mkdir()
    (edir / "summary.json").write_text(json.dumps({"chosen_k": {"es": 500}}))
    assert _resolve_clamp(str(edir), "es") == str(edir / "es-k500")
    (edir / "summary.json").write_text(json.dumps({"chosen_k": {"es": k}}))
    with pytest.raises(ArtifactError, match="chosen_k"):
        _resolve_clamp(str(edir), "es")


def test_python_readers_refuse_repeated_names(saved):
    from mechlingo.core.errors import InputError
    from mechlingo.data import load_facts, read_parallel_dir

    with pytest.raises(InputError, match="more than once"):
        load_facts(langs=["en", "fr", "en"], relations=["capital"], limit=2)
    with pytest.raises(InputError, match="more than once"):
        load_facts(langs=["en"], relations=["capital", "capital"], limit=2)
    with pytest.raises(InputError, match="more than once"):
        read_parallel_dir(saved["root"] / "par", langs=["en", "en"])
    assert len(read_parallel_dir(saved["root"] / "par", langs=["en", "es"])["es"]) == 8


@pytest.mark.parametrize(
    "call",
    [
        lambda p: __import__("mechlingo.core.checkpoints", fromlist=["Checkpoints"]).Checkpoints(
            p, {}
        ),
        lambda p: __import__("mechlingo.core.models", fromlist=["load_model"]).load_model(p),
        lambda p: __import__("mechlingo.data.benchmarks.load", fromlist=["x"]).load_benchmark(p),
    ],
    ids=["Checkpoints", "load_model", "load_benchmark"],
)
def test_python_entry_points_refuse_an_unexpandable_path(call) -> None:
    # class 4 from Python: a MechlingoError with one line, never a RuntimeError or KeyError
    from mechlingo.core.errors import InputError

    with pytest.raises(InputError, match="cannot be expanded"):
        call("~mechlingo-no-such-user/x")
