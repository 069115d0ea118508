"""Publishing an output folder where a swap is impossible, as an attacker (or a container
volume) arranges it: ``--out`` a mount point, a rename refused with EBUSY or EXDEV, a name
near the 255-byte limit, two publishers of one new ``--out`` at once, a carried-over
subfolder somebody works in (:mod:`mechlingo.core.artifacts`)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import mechlingo.core.artifacts as artifacts
from mechlingo.core.artifacts import cleanup_stale, write_files
from mechlingo.core.errors import OutputError, ResourceError
from tests.forks import fork_call

NEW = {"summary.json": {"new": True}, "report.html": "new report", "tables/a.csv": "x,y\n1,2\n"}


def _tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` (relative name: text)."""
    return {
        str(p.relative_to(root)): p.read_text(encoding="utf-8")
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _old_out(out: Path) -> os.stat_result:
    """An existing ``--out`` with an old result, a file of the user's and a subfolder of the
    user's (owner, group and mode set apart from the defaults); the subfolder's stat."""
    (out / "notes").mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text('{"old": true}', encoding="utf-8")
    (out / "report.html").write_text("old report", encoding="utf-8")
    (out / "stale.txt").write_text("mine", encoding="utf-8")
    (out / "notes" / "todo.md").write_text("keep me", encoding="utf-8")
    os.chown(out / "notes", 4321, 8765)
    os.chmod(out / "notes", 0o2750)
    return os.stat(out / "notes")


def _same_folder(a: os.stat_result, b: os.stat_result) -> None:
    assert (b.st_ino, b.st_dev, b.st_uid, b.st_gid, b.st_mode) == (
        a.st_ino,
        a.st_dev,
        a.st_uid,
        a.st_gid,
        a.st_mode,
    )


def _check_new(out: Path, *, kept: bool = True) -> None:
    got = _tree(out)
    assert json.loads(got.pop("summary.json")) == {"format_version": 1, "new": True}
    assert got.pop("report.html") == "new report"
    assert got.pop("tables/a.csv") == "x,y\n1,2\n"
    assert got == ({"stale.txt": "mine", "notes/todo.md": "keep me"} if kept else {})


def _no_leftovers(*folders: Path) -> None:
    for folder in folders:
        hidden = [p.name for p in folder.iterdir() if p.name.startswith(".")]
        assert hidden == [], hidden


@contextlib.contextmanager
def _mounted(kind: str, target: Path, source: Path) -> Iterator[None]:
    """A real tmpfs or bind mount at ``target`` for the block (skips where the machine
    refuses mounts: not root, no CAP_SYS_ADMIN)."""
    target.mkdir()
    args = ["-t", "tmpfs", "-o", "size=8m", "mechlingo-test"] if kind == "tmpfs" else ["--bind"]
    cmd = ["mount", *args, *([str(source)] if kind == "bind" else []), str(target)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        pytest.skip(f"cannot mount here: {err}")
    if done.returncode != 0:
        pytest.skip(f"cannot mount here: {done.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(target)], capture_output=True, timeout=30)


@pytest.mark.parametrize("kind", ["tmpfs", "bind"])
def test_out_on_a_real_mount_point_gets_the_outputs(tmp_path, kind):
    """A container volume as ``--out``: the folder cannot be renamed (EBUSY), yet every
    output lands in it, the user's other files and subfolder stay (same inode), and nothing
    is left beside or inside it. A bind mount of the same file system included (which
    ``os.path.ismount`` does not see)."""
    out = tmp_path / "out"
    (tmp_path / "src").mkdir()
    with _mounted(kind, out, tmp_path / "src"):
        notes = _old_out(out)
        write_files(out, NEW)
        _check_new(out)
        _same_folder(notes, os.stat(out / "notes"))
        _no_leftovers(tmp_path, out)
        write_files(out, NEW, keep_others=False)  # the folder replaced as a whole
        _check_new(out, kept=False)
        _no_leftovers(tmp_path, out)


@pytest.mark.parametrize("code", [errno.EBUSY, errno.EXDEV])
@pytest.mark.parametrize("existing", [True, False])
def test_a_refused_folder_swap_publishes_file_by_file(tmp_path, monkeypatch, code, existing):
    """Every way of renaming the finished folder onto ``--out`` fails with EBUSY or EXDEV
    (an overlay or network file system, a mount the check did not see): the outputs still
    land, the carried-over subfolder is the same one, nothing is left over."""
    out = tmp_path / "out"
    notes = _old_out(out) if existing else None

    def refuse(dest: object) -> None:
        if Path(str(dest)) == out:
            raise OSError(code, os.strerror(code), str(dest))

    real_rename, real_renameat2 = os.rename, getattr(artifacts, "_renameat2", None)

    def rename(src, dst, *a, **k):
        refuse(dst)
        return real_rename(src, dst, *a, **k)

    def renameat2(a, b, flags):
        refuse(b)
        return real_renameat2(a, b, flags)

    monkeypatch.setattr(artifacts.os, "rename", rename)
    monkeypatch.setattr(artifacts, "_exchange", lambda a, b: refuse(b) or False)
    monkeypatch.setattr(artifacts, "_renameat2", renameat2, raising=False)
    write_files(out, NEW)
    _check_new(out, kept=existing)
    if notes is not None:
        _same_folder(notes, os.stat(out / "notes"))
    _no_leftovers(tmp_path, out)


def test_an_out_in_a_folder_this_user_cannot_write_is_published(tmp_path, monkeypatch):
    """``--out`` is a folder the user may write inside a parent they may not (a shared
    project root): no sibling can be made there, so the outputs go in file by file, the
    user's subfolder stays the same folder, and nothing is left in the parent."""
    out = tmp_path / "out"
    notes = _old_out(out)
    real_access, real_mkdtemp = os.access, artifacts.tempfile.mkdtemp

    def access(path, mode, *a, **k):
        return False if Path(path) == tmp_path else real_access(path, mode, *a, **k)

    def mkdtemp(*a, dir=None, **k):  # what the kernel says in that parent
        if dir is not None and Path(dir) == tmp_path:
            raise PermissionError(errno.EACCES, "Permission denied", str(dir))
        return real_mkdtemp(*a, dir=dir, **k)

    monkeypatch.setattr(os, "access", access)
    monkeypatch.setattr(artifacts.tempfile, "mkdtemp", mkdtemp)
    write_files(out, NEW)
    _check_new(out)
    _same_folder(notes, os.stat(out / "notes"))
    _no_leftovers(tmp_path, out)


def test_a_name_near_the_limit_is_published(tmp_path):
    """A legal 250-byte name (multi-byte characters, so a byte cut could split one): the
    temporary sibling gets a shortened name of its own, the swap stays one step."""
    name = "é" * 125
    assert len(os.fsencode(name)) == 250
    out = tmp_path / name
    write_files(out, {"summary.json": {"old": True}, "stale.txt": "mine"})
    (out / "notes").mkdir()
    (out / "notes" / "todo.md").write_text("keep me", encoding="utf-8")
    write_files(out, NEW)
    _check_new(out)
    _no_leftovers(tmp_path)
    short = artifacts.sibling_name(name)
    assert short != name and len(os.fsencode(f".{short}.building-4194304-abcdefgh")) <= 255
    assert artifacts.sibling_name(name + "x") != short  # the hash tells long names apart


def _publish(who: str, out: Path, both_in: threading.Barrier, outcome: dict) -> None:
    """One publisher: fill the folder, wait until the other has filled its own, publish."""
    files = {"summary.json": {"who": who}, f"{who}.csv": who, "shared.txt": who}
    try:
        with artifacts.atomic_folder(out) as tmp:
            for name, text in files.items():
                (tmp / name).write_text(json.dumps(text), encoding="utf-8")
            both_in.wait()
        outcome[who] = "ok"
    except BaseException as err:  # noqa: BLE001 - the test looks at what was raised
        outcome[who] = err


def test_two_publishers_of_one_new_out_leave_one_whole_result(tmp_path):
    """Two publishers of one new ``--out`` finish at the same instant: one result is there
    whole (never files of both), the other gets one line that says so, not an OSError."""
    for round_ in range(4):
        out = tmp_path / f"out{round_}"
        both_in = threading.Barrier(2, timeout=30)
        outcome: dict[str, object] = {}
        threads = [threading.Thread(target=_publish, args=(w, out, both_in, outcome)) for w in "ab"]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        won = [w for w, o in outcome.items() if o == "ok"]
        lost = [o for o in outcome.values() if o != "ok"]
        assert len(won) == 1 and len(lost) == 1, outcome
        err = lost[0]
        assert isinstance(err, OutputError), repr(err)
        assert "\n" not in str(err) and "another process" in str(err)
        w = won[0]
        want = {"summary.json": {"who": w}, f"{w}.csv": w, "shared.txt": w}
        assert {k: json.loads(v) for k, v in _tree(out).items()} == want
        _no_leftovers(tmp_path)


def test_carried_subfolder_keeps_inode_owner_mode_and_its_workers(tmp_path):
    """A subfolder of the user's inside ``--out`` is the same folder after a run (inode,
    owner, group, mode, contents), and a process whose working folder is inside it still
    has that folder (not a deleted copy)."""
    out = tmp_path / "out"
    before = _old_out(out)
    (out / "notes" / "deep").mkdir()
    worker = subprocess.Popen(["sleep", "60"], cwd=out / "notes" / "deep")
    try:
        write_files(out, NEW)
        cwd = os.readlink(f"/proc/{worker.pid}/cwd")
    finally:
        worker.kill()
        worker.wait()
    assert cwd == str(out / "notes" / "deep")
    _same_folder(before, os.stat(out / "notes"))
    _check_new(out)
    _no_leftovers(tmp_path)


def test_a_failed_swap_gives_the_carried_subfolder_back(tmp_path, monkeypatch):
    """The swap fails for another reason (a full disk): one line, and the subfolder that
    was moved aside to be carried over is back in ``--out``, the same folder."""
    out = tmp_path / "out"
    before = _old_out(out)

    def full(a, b):
        raise OSError(errno.ENOSPC, "No space left on device", str(b))

    monkeypatch.setattr(artifacts, "_exchange", full)
    with pytest.raises(ResourceError):
        write_files(out, NEW)
    _same_folder(before, os.stat(out / "notes"))
    assert (out / "notes" / "todo.md").read_text(encoding="utf-8") == "keep me"
    assert json.loads((out / "summary.json").read_text(encoding="utf-8")) == {"old": True}
    _no_leftovers(tmp_path)


def test_a_kill_between_carry_and_swap_is_repaired(tmp_path):
    """SIGKILL after the subfolder was moved aside and before the swap: the next start
    (:func:`cleanup_stale`) puts the same folder back, and removes the leftovers."""
    out = tmp_path / "out"
    before = _old_out(out)
    code = fork_call(
        lambda: write_files(out, NEW) and None,
        tmp_path / "killed.log",
        {artifacts.KILL_ENV: "carry"},
    )
    assert code == -signal.SIGKILL, (tmp_path / "killed.log").read_text()
    (tmp_path / "killed.log").unlink()
    assert not (out / "notes").exists()  # moved aside when the process died
    cleanup_stale(tmp_path, "out")
    _same_folder(before, os.stat(out / "notes"))
    assert json.loads((out / "summary.json").read_text(encoding="utf-8")) == {"old": True}
    _no_leftovers(tmp_path)
    shutil.rmtree(out)
