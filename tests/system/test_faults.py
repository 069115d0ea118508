"""Faults of the machine, files from other tools, reruns and signals.

- Machine faults (a full or read-only disk, a denied write, a model cache that cannot be
  created, a conversion killed halfway, two processes converting at once, a GPU out of
  memory) end in one line and exit status 2 with ``--out`` and the cache as they were. The
  disk faults are mocked ``OSError``s raised where the write happens; the conversion is a
  small stand-in for the real one-minute dequantization (``_convert_default_gguf``).
- Files saved by other tools (a UTF-8 byte-order mark, CRLF line ends, trailing blank
  lines, spreadsheet-quoted TSV cells) read as the plain file does; UTF-16 and Latin-1 files
  get a message naming the encoding and the ``iconv`` command. The fixture files are written
  here from the bundled facts.
- Reruns: the same command twice (once in this process, once in a fresh interpreter with
  another ``PYTHONHASHSEED``) gives identical ``summary.json`` numbers; a k, a seed or a
  condition gives the same numbers whatever else runs beside it.
- SIGINT and SIGTERM end a running command with one line, exit status 130 / 143, ``--out``
  as it was and no temporary folder left.
"""

from __future__ import annotations

import csv
import errno
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from mechlingo.cli import main
from mechlingo.core import models
from mechlingo.core.errors import DataError, DeviceMemoryError, ResourceError
from mechlingo.testing import build_tiny_folder

REPO = Path(__file__).resolve().parents[2]


def _env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path, **extra)


def _tree(root: Path) -> dict[str, bytes | str]:
    """Every path under ``root`` with its bytes (``"dir"`` for folders)."""
    return {
        str(p.relative_to(root)): "dir" if p.is_dir() else p.read_bytes()
        for p in sorted(root.rglob("*"))
    }


def _cli(argv: list[str], capsys: Any) -> tuple[int, str]:
    try:
        code = int(main(argv))
    except SystemExit as exc:  # argparse
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("mechlingo")]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


@pytest.fixture()
def work(tmp_path, monkeypatch):
    """A working folder with an old ``out`` and an empty model cache."""
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "summary.json").write_text('{"old": true}')
    (tmp_path / "out" / "report.html").write_text("old report")
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("MECHLINGO_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _lens(tiny_dir: Any, *more: str) -> list[str]:
    return ["lens", "--model", str(tiny_dir), "--langs", "en,fr", "--limit", "2", "--quiet",
            "--out", "out", *more]  # fmt: skip


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".building-" in p.name or ".old-" in p.name)


# --------------------------------------------------------------------------------------
# 1. Machine faults
# --------------------------------------------------------------------------------------


def _fail_writes_in_building(monkeypatch: Any, code: int) -> None:
    """Writes into a ``.out.building-*`` folder raise ``OSError(code)`` after the first file
    (a disk that fills, or turns read-only, while the report is written)."""
    real = Path.write_text
    seen: list[Path] = []

    def write_text(self: Path, *a: Any, **k: Any) -> int:
        if ".out.building-" in str(self):
            seen.append(self)
            if len(seen) > 1:
                raise OSError(code, os.strerror(code), str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "write_text", write_text)


@pytest.mark.parametrize(
    "code,fragment,fix",
    [
        (errno.ENOSPC, "no space left on the device", "free space"),
        (errno.EDQUOT, "quota", "free space"),
        (errno.EROFS, "read-only", "choose an --out"),
        (errno.EACCES, "permission denied", "choose an --out"),
    ],
)
def test_disk_fault_in_out_is_one_line_and_keeps_out(work, tiny_dir, capsys, monkeypatch, code,
                                                      fragment, fix):  # fmt: skip
    old = _tree(work / "out")
    _fail_writes_in_building(monkeypatch, code)
    status, err = _cli(_lens(tiny_dir), capsys)
    line = _one_line(err)
    assert status == 2, err
    assert fragment in line and fix in line and errno.errorcode[code] in line, line
    assert _tree(work / "out") == old
    assert _leftovers(work) == []


@pytest.fixture()
def small_disk(tmp_path):
    """A 1 MB tmpfs (root only; skipped where mounting is not possible)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                          capture_output=True)  # fmt: skip
    if done.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_real_full_disk(small_disk, tiny_dir, capsys, monkeypatch):
    """A real full disk (the report's ~4 MB do not fit in 1 MB): one line, exit 2, the old
    ``--out`` intact, no temporary folder left."""
    out = small_disk / "out"
    out.mkdir()
    (out / "summary.json").write_text('{"old": true}')
    old = _tree(out)
    monkeypatch.chdir(small_disk.parent)
    argv = [*_lens(tiny_dir)[:-1], str(out)]
    status, err = _cli(argv, capsys)
    assert status == 2 and "no space left on the device" in _one_line(err), err
    assert _tree(out) == old
    assert _leftovers(small_disk) == []


def test_out_parent_that_refuses_a_folder(work, tiny_dir, capsys, monkeypatch):
    import mechlingo.core.artifacts as artifacts

    def denied(*a: Any, **k: Any) -> str:
        raise PermissionError(errno.EACCES, "Permission denied", str(work))

    monkeypatch.setattr(artifacts.tempfile, "mkdtemp", denied)
    old = _tree(work / "out")
    status, err = _cli(_lens(tiny_dir), capsys)
    assert status == 2 and "permission denied" in _one_line(err), err
    assert _tree(work / "out") == old


def test_disk_fault_outside_out_is_still_one_line(work, tiny_dir, capsys, monkeypatch):
    """A full disk anywhere (here: inside the analysis) is exit 2, not a bug report."""
    import mechlingo.cli.lens

    def full(*a: Any, **k: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", "/tmp/x")

    monkeypatch.setattr(mechlingo.cli.lens, "lens_facts", full)
    status, err = _cli(_lens(tiny_dir), capsys)
    assert status == 2 and "no space left" in _one_line(err), err


def _default_lens() -> list[str]:
    return ["lens", "--langs", "en,fr", "--limit", "2", "--quiet", "--out", "out"]


@pytest.mark.parametrize("kind", ["under-a-file", "read-only", "denied"])
def test_model_cache_that_cannot_be_created(work, capsys, monkeypatch, kind):
    """``MECHLINGO_CACHE`` under a file, on a read-only disk or denied: one line naming
    ``MECHLINGO_CACHE`` and what to do, exit 2, ``--out`` untouched."""
    if kind == "under-a-file":
        (work / "afile").write_text("x")
        monkeypatch.setenv("MECHLINGO_CACHE", str(work / "afile" / "cache"))
    else:
        code = errno.EROFS if kind == "read-only" else errno.EACCES
        monkeypatch.setenv("MECHLINGO_CACHE", str(work / "nocache" / "sub"))
        real = Path.mkdir

        def mkdir(self: Path, *a: Any, **k: Any) -> None:
            if "nocache" in str(self):
                raise OSError(code, os.strerror(code), str(self))
            return real(self, *a, **k)

        monkeypatch.setattr(Path, "mkdir", mkdir)
    old = _tree(work / "out")
    status, err = _cli(_default_lens(), capsys)
    line = _one_line(err)
    assert status == 2, err
    assert "MECHLINGO_CACHE" in line and "ResourceError" in line, line
    assert _tree(work / "out") == old


def test_disk_full_during_conversion_leaves_no_partial_cache(work, capsys, monkeypatch):
    def full(pkg: Any, w: Path) -> Path:
        (w / "model").mkdir()
        (w / "model" / "model.safetensors").write_bytes(b"\0" * 100)
        raise OSError(errno.ENOSPC, "No space left on device", str(w / "model"))

    monkeypatch.setattr(models, "_convert_default_gguf", full)
    with pytest.raises(ResourceError, match="free about 2 GB"):
        models.ensure_default_model()
    assert list((work / "cache").iterdir()) == []
    status, err = _cli(_default_lens(), capsys)
    assert status == 2 and "no space left" in _one_line(err), err


def test_read_only_cache_with_a_good_model_loads(work, monkeypatch):
    """A cache that holds a good model is used without a single write (no lock, no
    cleanup), so a read-only cache works."""

    def convert(pkg: Any, w: Path) -> Path:
        (w / "model").mkdir()
        (w / "model" / "model.safetensors").write_bytes(b"\x02" * 512)
        return w / "model"

    monkeypatch.setattr(models, "_convert_default_gguf", convert)
    folder = models.ensure_default_model()
    before = _tree(work / "cache")

    def refuse(*a: Any, **k: Any) -> Any:
        raise OSError(errno.EROFS, "Read-only file system", str(work / "cache"))

    monkeypatch.setattr(models, "file_lock", refuse)
    monkeypatch.setattr(models.tempfile, "mkdtemp", refuse)
    monkeypatch.setattr(Path, "mkdir", refuse)
    assert models.ensure_default_model() == folder
    assert _tree(work / "cache") == before
    # the same cache with a broken model: the rebuild is refused in one line
    (folder / "model.safetensors").write_bytes(b"\x00")
    with pytest.raises(ResourceError, match="read-only.*MECHLINGO_CACHE"):
        models.ensure_default_model()


_STAND_IN = """
import os, sys, time
from pathlib import Path
from mechlingo.core import models

def convert(pkg, work):
    with open(os.environ["COUNT_FILE"], "a") as f:
        f.write(f"{os.getpid()}\\n")
    out = work / "model"
    out.mkdir(parents=True)
    (out / "config.json").write_text('{"x": 1}')
    time.sleep(float(os.environ.get("CONVERT_SLEEP", "0")))
    (out / "model.safetensors").write_bytes(b"\\x01" * 65536)
    return out

models._convert_default_gguf = convert
folder = models.ensure_default_model()
ok, why = models._cache_is_valid(folder, models._gguf_package().EXPECTED_SHA256)
data = (folder / "model.safetensors").read_bytes()
print("RESULT", ok, why, len(data), set(data) == {1})
"""


def _stand_in(cache: Path, count: Path, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _STAND_IN],
        env=_env(MECHLINGO_CACHE=str(cache), COUNT_FILE=str(count), **env),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_conversion_killed_halfway_is_rebuilt(tmp_path):
    """A SIGKILL after the weights are written but before the manifest (the completion
    marker) leaves no model folder; the next run rebuilds it and removes the leftover."""
    cache, count = tmp_path / "cache", tmp_path / "count"
    proc = _stand_in(cache, count, MECHLINGO_TEST_KILL_AT="cache")
    proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL
    assert not (cache / "gemma-3-270m").exists()
    assert [p.name for p in cache.iterdir() if p.name.startswith(".building-")]
    proc = _stand_in(cache, count)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    assert "RESULT True ok 65536 True" in out
    assert len(count.read_text().split()) == 2
    assert [p.name for p in cache.iterdir()] == ["gemma-3-270m"]


def test_two_processes_converting_at_once(tmp_path):
    """Two processes start converting into one empty cache: both end with a good model,
    neither reads a partial one, and the model is converted once (the second waits on the
    cache lock and finds the first one's model)."""
    cache, count = tmp_path / "cache", tmp_path / "count"
    procs = [_stand_in(cache, count, CONVERT_SLEEP="1.5") for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
        assert "RESULT True ok 65536 True" in out, out
    assert len(count.read_text().split()) == 1
    assert [p.name for p in cache.iterdir()] == ["gemma-3-270m"]


def test_file_lock_without_locks_still_runs(tmp_path, monkeypatch):
    """A file system without locks (some NFS mounts) does not stop the conversion."""
    import mechlingo.core.faults as faults

    def no_locks(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(faults.fcntl, "flock", no_locks)
    ran = []
    with faults.file_lock(tmp_path):
        ran.append(1)
    assert ran == [1]


@pytest.mark.parametrize(
    "batch,expect",
    [("16", "try --batch-size 8"), ("1", "bfloat16")],
)
def test_gpu_out_of_memory_names_the_batch_size(work, tiny_dir, capsys, monkeypatch, batch,
                                                 expect):  # fmt: skip
    import mechlingo.cli.lens

    def oom(*a: Any, **k: Any) -> None:
        raise torch.cuda.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total capacity)"
        )

    monkeypatch.setattr(mechlingo.cli.lens, "lens_facts", oom)
    old = _tree(work / "out")
    status, err = _cli(_lens(tiny_dir, "--batch-size", batch), capsys)
    line = _one_line(err)
    assert status == 2, err
    assert "DeviceMemoryError" in line and "GPU ran out of memory" in line, line
    assert f"--batch-size {batch}" in line and expect in line, line
    assert _tree(work / "out") == old


#: out-of-memory errors as torch, cuBLAS, C++ and the OS word them
OOM_ERRORS = [
    torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate "
                 "memory: you tried to allocate 85899345920 bytes. Error code 12 (Cannot "
                 "allocate memory)"),
    RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
    RuntimeError("std::bad_alloc"),
    RuntimeError("MPS backend out of memory (MPS allocated: 17.00 GB)"),
    OSError(errno.ENOMEM, "Cannot allocate memory"),
    RuntimeError("forward hook failed"),  # raised from a MemoryError: see __cause__ below
]  # fmt: skip
OOM_ERRORS[-1].__cause__ = MemoryError()


@pytest.mark.parametrize("err", OOM_ERRORS, ids=lambda e: str(e)[:30])
def test_every_out_of_memory_wording_is_one_line(work, tiny_dir, capsys, monkeypatch, err):
    import mechlingo.cli.lens

    def oom(*a: Any, **k: Any) -> None:
        raise err

    monkeypatch.setattr(mechlingo.cli.lens, "lens_facts", oom)
    old = _tree(work / "out")
    status, out = _cli(_lens(tiny_dir, "--batch-size", "4"), capsys)
    line = _one_line(out)
    assert status == 2 and "ran out of memory" in line and "try --batch-size 2" in line, out
    assert _tree(work / "out") == old


def test_memory_error_helpers():
    from mechlingo.core.faults import is_out_of_memory, memory_error

    assert is_out_of_memory(torch.cuda.OutOfMemoryError("CUDA out of memory"))
    assert is_out_of_memory(RuntimeError("DefaultCPUAllocator: not enough memory: you tried"))
    assert is_out_of_memory(MemoryError())
    assert not is_out_of_memory(RuntimeError("shape mismatch"))
    err = memory_error(RuntimeError("out of memory"), 64, extra_flags=("--cells-per-batch",))
    assert isinstance(err, DeviceMemoryError) and isinstance(err, MemoryError)
    assert "try --batch-size 32 (or lower --cells-per-batch)" in str(err)


# --------------------------------------------------------------------------------------
# 2. Files from other tools
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def facts() -> list[Any]:
    from mechlingo.data import load_facts

    return load_facts(langs=["en", "fr"], relations=["capital"], limit=4)


def _as_other_tool(text: str) -> bytes:
    """``text`` as a Windows editor saves it: a UTF-8 byte-order mark, CRLF line ends and
    trailing blank lines."""
    return b"\xef\xbb\xbf" + (text.rstrip("\n") + "\n\n\n").replace("\n", "\r\n").encode()


def test_bom_crlf_trailing_blank_lines_read_in_facts_files(facts, tmp_path):
    from mechlingo.data import read_facts, write_jsonl, write_tsv

    for name, write in (("f.jsonl", write_jsonl), ("f.tsv", write_tsv)):
        plain = tmp_path / name
        write(facts, plain)
        other = tmp_path / f"other-{name}"
        other.write_bytes(_as_other_tool(plain.read_text("utf-8")))
        assert read_facts(other) == read_facts(plain) == facts, name


def test_quoted_tsv_cells_are_read(facts, tmp_path):
    """A TSV written by a spreadsheet or Python's csv module (every cell quoted, quotes
    doubled, a tab and a line break inside a quoted prompt) reads back to the same facts."""
    from mechlingo.data import FIELDS, read_tsv
    from mechlingo.data.facts import fact_from_mapping

    rows = [f.to_json() for f in facts]
    rows[0]["prompt"] = 'He said "the capital\tof\nFrance" is'
    rows[0]["subject_span"] = [
        rows[0]["prompt"].index("France"),
        rows[0]["prompt"].index("France") + 6,
    ]
    rows[0]["subject"] = "France"
    buf = io.StringIO()
    w = csv.writer(buf, delimiter="\t", quoting=csv.QUOTE_ALL, lineterminator="\r\n")
    w.writerow(FIELDS)
    for r in rows:
        w.writerow([
            "|".join(r[k]) if k == "aliases" else
            ",".join(map(str, r[k])) if k == "subject_span" else r[k]
            for k in FIELDS
        ])  # fmt: skip
    path = tmp_path / "quoted.tsv"
    path.write_bytes(b"\xef\xbb\xbf" + buf.getvalue().encode())
    got = read_tsv(path)
    want = [fact_from_mapping(r, "x", 1) for r in rows]
    assert got == want
    assert got[0].prompt == 'He said "the capital\tof\nFrance" is'
    # a quote inside an unquoted cell stays an ordinary character
    from mechlingo.data.io import tsv_rows

    assert tsv_rows('a\tb\n"Paris" is\tx\n') == [
        (1, ["a", "b"], [False, False]),
        (2, ['"Paris" is', "x"], [False, False]),
    ]


@pytest.mark.parametrize(
    "encoding,bom,name,cmd",
    [
        ("utf-16-le", b"\xff\xfe", "UTF-16 little-endian", "iconv -f UTF-16LE"),
        ("utf-16-be", b"\xfe\xff", "UTF-16 big-endian", "iconv -f UTF-16BE"),
        ("utf-16-le", b"", "UTF-16 little-endian (no byte-order mark", "iconv -f UTF-16LE"),
        ("cp1252", b"", "Latin-1 / Windows-1252", "iconv -f cp1252"),
    ],
)
def test_other_encodings_are_named_with_the_fix(facts, tmp_path, encoding, bom, name, cmd):
    from mechlingo.data import read_facts, read_parallel_dir, write_jsonl

    plain = tmp_path / "f.jsonl"
    write_jsonl(facts, plain)
    text = plain.read_text("utf-8").replace("Paris", "Paris é")
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(bom + text.encode(encoding))
    with pytest.raises(DataError) as info:
        read_facts(bad)
    assert name in str(info.value) and cmd in str(info.value), str(info.value)
    folder = tmp_path / "par"
    folder.mkdir()
    (folder / "en.txt").write_text("one\ntwo\n", "utf-8")
    (folder / "fr.txt").write_bytes(bom + "un é\ndeux\n".encode(encoding))
    with pytest.raises(DataError, match="fr.txt") as info:
        read_parallel_dir(folder)
    assert name in str(info.value) and cmd in str(info.value)


def test_parallel_folder_from_other_tools(tmp_path):
    from mechlingo.data import read_parallel_dir

    texts = {"en": ["The cat.", "A dog."], "fr": ["Le chat.", "Un chien."]}
    plain, other = tmp_path / "plain", tmp_path / "other"
    for folder in (plain, other):
        folder.mkdir()
    for lg, lines in texts.items():
        (plain / f"{lg}.txt").write_text("\n".join(lines) + "\n", "utf-8")
        (other / f"{lg}.txt").write_bytes(_as_other_tool("\n".join(lines)))
    assert read_parallel_dir(other) == read_parallel_dir(plain) == texts


def test_utf16_data_file_on_the_command_line(work, tiny_dir, facts, capsys):
    from mechlingo.data import write_jsonl

    write_jsonl(facts, work / "f.jsonl")
    (work / "f16.jsonl").write_bytes((work / "f.jsonl").read_text("utf-8").encode("utf-16"))
    old = _tree(work / "out")
    status, err = _cli(_lens(tiny_dir, "--facts", "f16.jsonl"), capsys)
    assert status == 2 and "UTF-16" in _one_line(err) and "iconv" in err, err
    assert _tree(work / "out") == old
    (work / "fbom.jsonl").write_bytes(_as_other_tool((work / "f.jsonl").read_text("utf-8")))
    status, err = _cli(_lens(tiny_dir, "--facts", "fbom.jsonl"), capsys)
    assert status == 0, err[-3000:]


# --------------------------------------------------------------------------------------
# 3. Determinism: reruns and streams
# --------------------------------------------------------------------------------------


def _commands(T: str) -> list[list[str]]:
    """Small ``eval``, ``trace``, ``steer build`` + ``steer eval`` and ``experts`` runs on the
    tiny model (relative paths, so that two working folders give the same summaries)."""
    common = ["--model", T, "--quiet"]
    return [
        ["eval", *common, "--langs", "en,fr", "--limit", "3", "--max-new-tokens", "2",
         "--out", "eval"],
        ["trace", *common, "--langs", "en,fr", "--limit", "2", "--patch-prompts", "2", "--patch-unanswered",
         "--max-new-tokens", "2", "--out", "trace"],
        ["steer", "build", *common, "--langs", "en,fr", "--limit", "16",
         "--split", "0.6,0.2,0.2", "--out", "vec"],
        ["steer", "eval", *common, "--vectors", "vec", "--langs", "en,fr", "--limit", "16",
         "--split", "0.6,0.2,0.2", "--config", "0,4,1,4", "--max-new-tokens", "3",
         "--control-seeds", "0,1", "--out", "steer"],
        ["experts", *common, "--langs", "en,es,fr", "--target", "es", "--lines", "8",
         "--k", "5,10", "--heldout", "4", "--samples", "4", "--sample-tokens", "3",
         "--out", "experts"],
    ]  # fmt: skip


def _numbers(doc: Any) -> Any:
    """``doc`` without the wall-clock timings (``seconds*`` keys)."""
    if isinstance(doc, dict):
        return {k: _numbers(v) for k, v in doc.items() if "seconds" not in str(k)}
    if isinstance(doc, list):
        return [_numbers(v) for v in doc]
    return doc


_OUTS = ("eval", "trace", "steer", "experts")


@pytest.fixture(scope="module")
def reruns(tiny_dir, tmp_path_factory) -> tuple[Path, Path, str]:
    """The commands of :func:`_commands` run in this process (folder ``a``) and in a fresh
    interpreter with another ``PYTHONHASHSEED`` (folder ``b``), at the same time."""
    root = tmp_path_factory.mktemp("reruns")
    here, there = root / "a", root / "b"
    here.mkdir()
    there.mkdir()
    cmds = _commands(str(tiny_dir))
    code = "import sys\nfrom mechlingo.cli import main\n" + "".join(
        f"assert main({c!r}) == 0\n" for c in cmds
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=there,
                            env=_env(PYTHONHASHSEED="4321"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    cwd = Path.cwd()
    os.chdir(here)
    try:
        for c in cmds:
            assert main(c) == 0, c
    finally:
        os.chdir(cwd)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return here, there, str(tiny_dir)


def test_same_command_twice_gives_identical_outputs(reruns):
    """Each command twice: ``summary.json`` and the other JSON files equal number for number
    (the wall-clock ``seconds`` aside), every other file but the HTML report (generations,
    expert scores, k curve, clamp weights) byte for byte; the summaries record every seed and the library
    versions."""
    here, there, _ = reruns
    for name in _OUTS:
        a = json.loads((here / name / "summary.json").read_text())
        b = json.loads((there / name / "summary.json").read_text())
        assert _numbers(a) == _numbers(b), name
        files_a, files_b = _tree(here / name), _tree(there / name)
        assert files_a.keys() == files_b.keys(), name
        for f in files_a:
            if f.endswith(".json") and files_a[f] != "dir":
                assert _numbers(json.loads(files_a[f])) == _numbers(json.loads(files_b[f])), f
            elif not f.endswith(".html"):
                assert files_a[f] == files_b[f], f"{name}/{f}"
        meta = a["meta"]
        assert {"mechlingo", "python", "torch", "transformers", "transformer-lens"} <= set(
            meta["versions"]
        ), name
        assert meta["versions"]["torch"].split("+")[0] == torch.__version__.split("+")[0]
        assert "bootstrap" in meta["seeds"], name
    steer = json.loads((here / "steer" / "summary.json").read_text())
    assert steer["meta"]["seeds"]["seeds"] == [0, 1]
    experts = json.loads((here / "experts" / "summary.json").read_text())
    assert experts["meta"]["seeds"] == {"seed": 0, "bootstrap": 0}
    assert len(_tree(here / "experts")) > 6  # the clamps were compared too


def test_k_numbers_do_not_depend_on_the_other_ks(reruns, monkeypatch):
    """``experts --k 5,10`` and ``--k 5,10,20``: the k = 5 and k = 10 rows of the k curve
    (rates, perplexities, intervals) and their clamps (expert and random control) are
    identical."""
    here, _, T = reruns
    monkeypatch.chdir(here)
    argv = _commands(T)[-1]
    argv[argv.index("--k") + 1] = "5,10,20"
    argv[argv.index("--out") + 1] = "experts20"
    assert main(argv) == 0
    runs = {
        ks: json.loads((here / out / "summary.json").read_text())
        for ks, out in (("5,10", "experts"), ("5,10,20", "experts20"))
    }
    curve = {ks: {(r["k"], r["arm"]): r for r in s["k_curve"]["es"]} for ks, s in runs.items()}
    assert set(curve["5,10,20"]) - set(curve["5,10"]) == {(20, "experts"), (20, "random")}
    for arm, row in curve["5,10"].items():
        assert row == curve["5,10,20"][arm], arm
    for clamp in ("es-k5", "es-k10", "es-k10-random"):
        a = _tree(here / "experts" / clamp)
        b = _tree(here / "experts20" / clamp)
        assert (
            a.keys() == b.keys() and a["intervention.safetensors"] == b["intervention.safetensors"]
        ), clamp


def test_random_control_seed_does_not_depend_on_the_other_seeds(reruns, monkeypatch):
    """``steer eval --control-seeds 0,1`` and ``--control-seeds 1,2``: every number and every generation of
    ``random_s1`` (and of the other conditions) is identical; at this alpha the two seeds'
    generations differ, so the comparison can fail."""
    here, _, T = reruns
    monkeypatch.chdir(here)
    argv = _commands(T)[3]
    argv[argv.index("--control-seeds") + 1] = "1,2"
    argv[argv.index("--out") + 1] = "steer12"
    assert main(argv) == 0
    a = json.loads((here / "steer" / "summary.json").read_text())
    b = json.loads((here / "steer12" / "summary.json").read_text())
    for cond in ("orig", "task", "diff", "both", "random_s1"):
        assert _find(a, "accuracy")[cond] == _find(b, "accuracy")[cond], cond
        assert _find(a, "intervals")[cond] == _find(b, "intervals")[cond], cond
        if cond != "orig":
            assert _find(a, "mcnemar_vs_orig")[cond] == _find(b, "mcnemar_vs_orig")[cond]
    gen = {run: _generations(here / run) for run in ("steer", "steer12")}
    for cond in ("orig", "task", "diff", "both", "random_s1"):
        assert gen["steer"][cond] == gen["steer12"][cond], cond
    assert gen["steer"]["random_s0"] != gen["steer"]["random_s1"]


def _generations(folder: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in (folder / "generations.jsonl").read_text("utf-8").splitlines():
        if line.strip():
            r = json.loads(line)
            out.setdefault(r["condition"], []).append(r["generation"])
    return out


def _find(doc: Any, key: str) -> Any:
    """The first value of ``key`` anywhere in ``doc`` (depth first)."""
    if isinstance(doc, dict):
        if key in doc:
            return doc[key]
        for v in doc.values():
            found = _find(v, key)
            if found is not None:
                return found
    if isinstance(doc, list):
        for v in doc:
            found = _find(v, key)
            if found is not None:
                return found
    return None


def test_streams_do_not_collide(tiny):
    """The roles of one seed and the seeds of one role draw from unrelated streams (they
    used to be ``seed`` and ``seed + 1``: the diff control of seed 0 was the task control of
    seed 1), and a neuron clamp's random control picks each layer's neurons from that
    layer's own stream."""
    from mechlingo.core.faults import derive_seed
    from mechlingo.interventions import Compose, NeuronClamp, SteeringVector, random_like
    from mechlingo.scoring.side_effects import random_control

    v = torch.randn(64, generator=torch.Generator().manual_seed(0))
    keys = [derive_seed(s, role) for s in range(50) for role in ("task", "diff")]
    assert len(set(keys)) == len(keys) and derive_seed(7) == 7
    r0 = random_like(v, derive_seed(0, "diff"))
    r1 = random_like(v, derive_seed(1, "task"))
    assert abs(float(torch.nn.functional.cosine_similarity(r0, r1, dim=0))) < 0.6
    assert torch.allclose(r0.norm(), v.norm())
    sv = SteeringVector(v, 1, alpha=2.0)
    comp = random_control(Compose([sv, sv]), tiny, seed=0)
    alone = random_control(sv, tiny, seed=1)
    assert not torch.equal(comp.parts[0].vector, alone.vector)
    both = NeuronClamp({0: torch.tensor([1, 2, 3]), 1: torch.tensor([4, 5])},
                       {0: torch.ones(3), 1: torch.ones(2)}, "set")  # fmt: skip
    one = NeuronClamp({1: torch.tensor([4, 5])}, {1: torch.ones(2)}, "set")
    c_both, c_one = random_control(both, tiny, seed=3), random_control(one, tiny, seed=3)
    assert torch.equal(c_both.neurons[1], c_one.neurons[1])


def test_tiny_model_build_keeps_the_global_generator(tmp_path):
    torch.manual_seed(5)
    want = torch.rand(3)
    torch.manual_seed(5)
    build_tiny_folder(tmp_path / "t", n_layers=1, d_model=16, d_mlp=32, n_heads=2)
    assert torch.equal(torch.rand(3), want)
    torch.manual_seed(5)
    build_tiny_folder(tmp_path / "f", "llama")  # a family's tiny model too
    assert torch.equal(torch.rand(3), want)


# --------------------------------------------------------------------------------------
# 4. SIGINT and SIGTERM
# --------------------------------------------------------------------------------------

_SLOW = """
import signal, sys, time
from pathlib import Path
import mechlingo.cli.lens as lens_cli
import mechlingo.report.page as page
from mechlingo.cli import main

signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
where = sys.argv[1]

def started():
    Path("started").write_text("1")
    time.sleep(120)

if where == "analysis":
    real = lens_cli.lens_facts
    def slow(*a, **k):
        started()
        return real(*a, **k)
    lens_cli.lens_facts = slow
else:  # while the new --out is being filled
    real_render = page.Report.render
    def render(self):
        started()
        return real_render(self)
    page.Report.render = render
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize(
    "sig,status,where",
    [(signal.SIGINT, 130, "analysis"), (signal.SIGTERM, 143, "write")],
)  # fmt: skip
def test_signal_ends_with_one_line_and_keeps_out(tiny_dir, tmp_path, sig, status, where):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "summary.json").write_text('{"old": true}')
    old = _tree(tmp_path / "out")
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_SLOW), where, *_lens(tiny_dir)],
        cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.time() + 240
    while not (tmp_path / "started").exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() < deadline, "the command never started"
        time.sleep(0.2)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == status, err[-3000:]
    line = _one_line(err)
    assert f"stopped by {signal.Signals(sig).name}" in line and "out was left as it was" in line
    assert _tree(tmp_path / "out") == old
    assert _leftovers(tmp_path) == []
    if where == "write":
        shutil.rmtree(tmp_path / "out")
