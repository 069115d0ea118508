"""Writing folders in one step: a kill leaves either the old folder or the new one.

Every folder mechlingo writes (a command's ``--out``, saved vectors and clamps, the model
cache) is first built in a temporary sibling named ``.NAME.building-PID-XXXX`` and then put in
place with a single rename. When the folder already exists, the two are swapped atomically
(Linux ``renameat2(RENAME_EXCHANGE)``); elsewhere the old folder is renamed aside first and a
later start puts it back if the process died between the two renames.

Where no swap is possible (a mount point: :func:`writes_inside`) files go in one by one, each
renamed atomically; ``docs/security.md`` ("Where outputs land") has the rules. Leftovers of
killed runs are removed (or put back) by :func:`cleanup_stale` at every command's start.

>>> with atomic_folder("results") as tmp:
...     (tmp / "summary.json").write_text("{}")
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from mechlingo.core.errors import OutputError
from mechlingo.core.faults import FULL_ERRNOS, disk_error
from mechlingo.core.jsonable import jsonable
from mechlingo.core.untrusted import expand_path
from mechlingo.core.version import SUMMARY_FORMAT_VERSION

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "atomic_file",
    "atomic_folder",
    "cleanup_stale",
    "kill_point",
    "output_target",
    "publish_folder",
    "sibling_name",
    "writes_inside",
    "write_files",
]

#: Environment variable for kill tests: a comma-separated list of points
#: (``fill``, ``carry``, ``publish``, ``cache``) at which the process SIGKILLs itself.
KILL_ENV = "MECHLINGO_TEST_KILL_AT"

_STALE = re.compile(r"^\.(?P<name>.+)\.(?P<kind>building|old|carry)-(?P<pid>\d+)-[^/]*$")
#: the staging folder inside an ``--out`` that cannot be swapped (a mount point)
_INSIDE = re.compile(r"^\.mechlingo-building-(?P<pid>\d+)-[^/]*$")
_CACHE_STALE = re.compile(r"^(?:\.building-(?:(?P<pid>\d+)-)?.*|.+\.stale-(?P<spid>\d+))$")
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_OLD_AGE_S = 6 * 3600
#: bytes a sibling's name adds to the folder's name (``.``, ``.building-``, a pid, ``-`` and
#: a random suffix), with room to spare
_SIBLING_ROOM = 40
#: a folder swap is impossible here: a mount point (EBUSY), another file system (EXDEV)
_NO_SWAP = (errno.EXDEV, errno.EBUSY)


def kill_point(name: str, *, force: bool = False) -> None:
    """For kill tests only: SIGKILL this process when ``MECHLINGO_TEST_KILL_AT`` names
    ``name`` (or ``force``: the caller has checked its own kill setting). Does nothing
    otherwise."""
    wanted = os.environ.get(KILL_ENV, "")
    if force or (wanted and name in wanted.split(",")):
        os.kill(os.getpid(), signal.SIGKILL)


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _renameat2(a: Path, b: Path, flags: int) -> bool:
    """``renameat2(a, b, flags)`` (Linux); ``False`` where the call or the flag is not
    available here (the caller then does it another way)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), flags)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (38, 22, 95):  # ENOSYS, EINVAL (file system without it), EOPNOTSUPP
        return False
    raise OSError(err, os.strerror(err), str(b))


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux); ``False`` where the call is not available."""
    return _renameat2(a, b, _RENAME_EXCHANGE)


def _taken(dest: Path) -> OutputError:
    return OutputError(
        f"{dest} was written by another process while this one was running; its result is "
        "there, this run's result was not written",
        fix="rerun this command to replace it, or give it another --out",
    )


def publish_folder(new: Path, dest: Path) -> None:
    """Put the finished folder ``new`` at ``dest`` in one step. An existing ``dest`` ends up
    at ``new`` (the caller removes it). A ``dest`` that appears between the check and the
    rename (another process published it) is never replaced: an
    :class:`~mechlingo.core.errors.OutputError` says so."""
    if not dest.exists() and not dest.is_symlink():
        try:
            if not _renameat2(new, dest, _RENAME_NOREPLACE):
                os.rename(new, dest)
        except OSError as err:
            if err.errno in (errno.EEXIST, errno.ENOTEMPTY):
                raise _taken(dest) from err
            raise
        return
    if _exchange(new, dest):
        kill_point("publish")
        return
    # Fallback: two renames; cleanup_stale() restores `old` if we die in between.
    old = dest.parent / f".{sibling_name(dest.name)}.old-{os.getpid()}-{int(time.time())}"
    os.rename(dest, old)
    kill_point("publish")
    os.rename(new, dest)
    os.rename(old, new)


def sibling_name(name: str) -> str:
    """``name`` as it appears in the names of the temporary siblings of a folder
    (``.NAME.building-*``, ``.NAME.work``): itself, or, when a sibling's name would pass the
    file system's 255-byte limit, its first bytes, ``~`` and a hash of the whole name."""
    raw = os.fsencode(name)
    if len(raw) + _SIBLING_ROOM <= 255:
        return name
    digest = hashlib.sha256(raw).hexdigest()[:12]
    head = raw[: 255 - _SIBLING_ROOM - 13]
    return os.fsdecode(head.decode("utf-8", "ignore").encode()) + "~" + digest


def writes_inside(out: str | os.PathLike[str]) -> bool:
    """Whether :func:`atomic_folder` publishes ``out`` file by file inside it rather than by
    a folder swap: ``out`` is an existing folder that is a mount point (a container volume,
    a bind mount), or whose parent this process cannot write (only ``out`` itself needs to be
    writable then)."""
    path = Path(out)
    if not path.is_dir():
        return False
    return _is_mount(path) or not os.access(path.parent, os.W_OK | os.X_OK)


def _is_mount(path: Path) -> bool:
    """Whether ``path`` is a mount point (a bind mount of the same file system included),
    where a folder can be written into but never renamed or swapped."""
    if os.path.ismount(path):
        return True
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
            points = {line.split()[4] for line in fh if len(line.split()) > 4}
    except OSError:
        return False
    target = os.path.realpath(path)
    return any(_unescape(p) == target for p in points)


def _unescape(field: str) -> str:
    """A mountinfo path field with its octal escapes (``\\040`` for a space) decoded."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)


def _carry_over(tmp: Path, out: Path) -> list[str]:
    """Carry the entries of the existing ``out`` that the block did not write into ``tmp``:
    files and symlinks as hard links (the same inode), folders *moved* (their inode, owner,
    group and mode kept, and a process working inside one keeps its folder). Returns the
    moved folders' names; a ``.OUT.carry-*`` note beside ``out`` lists them first, so that
    :func:`cleanup_stale` puts them back if the process dies before the swap."""
    moved: list[str] = []
    folders: list[str] = []
    for entry in out.iterdir():
        target = tmp / entry.name
        if target.exists() or target.is_symlink() or _INSIDE.match(entry.name):
            continue
        if entry.is_dir() and not entry.is_symlink():
            folders.append(entry.name)
        else:
            _link_or_copy(entry, target)
    if not folders:
        return moved
    note = _carry_note(tmp, out)
    note.write_bytes(b"\0".join(os.fsencode(n) for n in [tmp.name, out.name, *folders]))
    try:
        for name in folders:
            os.rename(out / name, tmp / name)
            moved.append(name)
        kill_point("carry")
    except OSError:
        _put_back(tmp, out, moved)
        note.unlink(missing_ok=True)
        raise
    return moved


def _carry_note(tmp: Path, out: Path) -> Path:
    pid, suffix = tmp.name.rsplit("-", 2)[-2:]
    return out.parent / f".{sibling_name(out.name)}.carry-{pid}-{suffix}"


def _put_back(src: Path, out: Path, names: list[str]) -> None:
    """Move the carried folders ``names`` from ``src`` back into ``out`` (each one only
    where ``src`` still has it and ``out`` does not)."""
    for name in names:
        if (src / name).is_dir() and not os.path.lexists(out / name):
            with contextlib.suppress(OSError):
                os.rename(src / name, out / name)


def _swap_in(tmp: Path, out: Path, keep_others: bool) -> None:
    """Publish ``tmp`` at ``out`` with one rename or swap, carrying over the entries of an
    existing ``out`` the block did not write (``keep_others``). Where the swap turns out to be
    impossible (EXDEV, EBUSY), the carried entries go back and the files are written into
    ``out`` one by one instead (:func:`_publish_into`)."""
    moved: list[str] = []
    linked: list[str] = []
    if keep_others and out.is_dir():
        before = {p.name for p in tmp.iterdir()}
        moved = _carry_over(tmp, out)
        linked = [p.name for p in tmp.iterdir() if p.name not in before and p.name not in moved]
    _match_mode(tmp, out)
    try:
        publish_folder(tmp, out)
    except OSError as err:
        _put_back(tmp, out, moved)
        if err.errno not in _NO_SWAP:
            raise
        for name in linked:
            (tmp / name).unlink()
        _publish_into(tmp, out, keep_others=keep_others)
    finally:
        if moved:
            _carry_note(tmp, out).unlink(missing_ok=True)


def _publish_into(src: Path, dest: Path, *, keep_others: bool) -> None:
    """Publish ``src`` by writing its files into the folder ``dest`` one by one, each with
    one atomic rename from a temporary file in its own folder (moved when on the same file
    system, else copied and flushed first): for an ``--out`` that cannot be renamed (a mount
    point, another file system). A reader sees each file old or new, never half of one;
    ``summary.json`` comes last. Entries of ``dest`` that ``src`` lacks are removed when
    ``keep_others`` is false; a folder ``src`` has replaces the one in ``dest`` as a whole."""
    dest.mkdir(exist_ok=True)
    _mirror(src, dest, prune=not keep_others)


def _mirror(src: Path, dest: Path, *, prune: bool) -> None:
    names = sorted((p.name for p in src.iterdir()), key=lambda n: (n == "summary.json", n))
    for name in names:
        s, d = src / name, dest / name
        if s.is_dir() and not s.is_symlink():
            if os.path.lexists(d) and (d.is_symlink() or not d.is_dir()):
                d.unlink()
            d.mkdir(exist_ok=True)
            _mirror(s, d, prune=True)
            continue
        part = d.with_name(f".{sibling_name(name)}.{os.getpid()}.tmp")
        try:
            os.rename(s, part)
        except OSError as err:
            if err.errno != errno.EXDEV:
                raise
            _copy_flushed(s, part)
        if d.is_dir() and not d.is_symlink():
            shutil.rmtree(d)
        os.replace(part, d)
    if prune:
        for entry in dest.iterdir():
            if entry.name in names or _INSIDE.match(entry.name):
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()


def _copy_flushed(src: Path, dst: Path) -> None:
    """Copy a file (or a symlink as a symlink) and flush it to the disk."""
    if src.is_symlink():
        os.symlink(os.readlink(src), dst)
        return
    shutil.copy2(src, dst)
    fd = os.open(dst, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _link_or_copy(src: str | Path, dst: str | Path) -> None:
    if os.path.islink(src):
        os.symlink(os.readlink(src), dst)
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Write one file in one step: the block writes a temporary file beside ``path``
    (``.NAME.PID.tmp`` in the same folder, so the rename never crosses file systems), which is
    flushed to the disk (``fsync``) and moved onto ``path`` with one ``os.replace`` only when the
    block succeeds. A kill or an error inside the block leaves the old file (or none), never
    half of a new one; the temporary file is removed on an error.

    >>> with atomic_file("shard.f32") as tmp:
    ...     tmp.write_bytes(data)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{sibling_name(path.name)}.{os.getpid()}.tmp")
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_folder(out: str | os.PathLike[str], *, keep_others: bool = True) -> Iterator[Path]:
    """Build a folder in a temporary sibling and put it at ``out`` in one step.

    Args:
        out: the folder to write (its parent is created).
        keep_others: carry entries of an existing ``out`` that the block did not write into
            the new folder (files as hard links, folders moved: the same inodes);
            ``False`` replaces the folder as a whole.

    Yields:
        The temporary folder to fill. If the block raises, ``out`` is left as it was.

    A symlink at ``out`` that points to a folder is followed: the folder it points to is
    written (the link stays as it was); a symlink to anything else is refused. The new folder
    gets the mode (setgid and group bits included), group and owner of the folder it replaces
    (for a new folder: the umask's mode, and the parent's setgid bit and group).

    Where ``out`` cannot be swapped (:func:`writes_inside`: a mount point or a parent this
    process cannot write, found before the block runs; a rename refused with EXDEV or EBUSY),
    the block fills a hidden folder inside ``out`` and the
    files are then put in place one by one, each with an atomic rename
    (:func:`_publish_into`). A name too long for a sibling's name gets a shortened one
    (:func:`sibling_name`). Publishers of one ``out`` take turns (a lock on its parent);
    when ``out`` did not exist as the block started and another process published it
    meanwhile, this one's result is dropped with an
    :class:`~mechlingo.core.errors.OutputError` (the other's stays whole).

    Raises:
        OutputError: ``out`` is an existing file, a symlink to no folder, its parent
            cannot be created or written, or another process published a new ``out`` first.
    """
    out = output_target(out)
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out} is an existing file, not a folder", fix="choose another --out")
    tmp, inside = _make_staging(out)
    was_new = not os.path.lexists(out)
    try:
        yield tmp
        kill_point("fill")
        with _taking_turns(out if inside else out.parent):
            if was_new and out.is_dir() and any(out.iterdir()):
                raise _taken(out)
            if inside:
                _publish_into(tmp, out, keep_others=keep_others)
            else:
                _swap_in(tmp, out, keep_others)
    except OSError as err:  # a full or read-only disk: one line, the old folder kept
        found = disk_error(err, what=f"writing {out}", fix=_disk_fix(err))
        if found is None:
            raise
        raise found from err
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def _taking_turns(folder: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``folder`` (``flock`` on the folder itself: no lock file,
    dropped by the kernel when the process dies) while publishing, so that publishers of one
    ``--out`` take turns. Where the folder cannot be opened (a parent without read
    permission) or has no locks, publishing goes on without one."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        if fcntl is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _make_staging(out: Path) -> tuple[Path, bool]:
    """The temporary folder the block fills: a sibling ``.OUT.building-PID-*``, or, where
    :func:`writes_inside`, a hidden ``.mechlingo-building-PID-*`` inside ``out`` (``True``)."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        cleanup_stale(out.parent, out.name)
        inside = writes_inside(out)
        if inside:
            cleanup_stale(out)
            where, prefix = out, f".mechlingo-building-{os.getpid()}-"
        else:
            where, prefix = out.parent, f".{sibling_name(out.name)}.building-{os.getpid()}-"
        return Path(tempfile.mkdtemp(prefix=prefix, dir=where)), inside
    except OSError as err:
        found = disk_error(err, what=f"creating {out}")
        if found is not None:
            raise found from err
        raise OutputError(
            f"cannot write next to {out}: {err.strerror or err}",
            fix="choose an --out in a writable folder",
        ) from err


def output_target(out: str | os.PathLike[str]) -> Path:
    """The folder that writing ``out`` writes: ``out`` made absolute, or, when ``out`` is a
    symlink, the folder it points to (links followed to the end).

    Raises:
        OutputError: ``out`` is a symlink to something that is not a folder (a file, a
            missing path, a loop).
    """
    path = expand_path(out, "output folder").absolute()
    if not path.is_symlink():
        return path
    try:
        target = path.resolve(strict=True)
    except (OSError, RuntimeError):
        target = None
    if target is None or not target.is_dir():
        raise OutputError(
            f"{path} is a symlink to {os.readlink(path)!r}, which is not a folder; mechlingo "
            "writes into the folder a symlinked output points to",
            fix="create the folder it points to, or remove the link",
        )
    return target


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _match_mode(tmp: Path, out: Path) -> None:
    """Give the finished ``tmp`` the mode, group and owner of the folder it replaces (a new
    folder: the umask's mode, with the parent's setgid bit)."""
    try:
        old = out.stat() if out.is_dir() else None
    except OSError:
        old = None
    if old is None:
        parent = out.parent.stat().st_mode
        os.chmod(tmp, (0o777 & ~_umask()) | (parent & stat.S_ISGID))
        return
    now = tmp.stat()
    if (now.st_uid, now.st_gid) != (old.st_uid, old.st_gid):
        with contextlib.suppress(OSError):  # another owner: only root may give it away
            os.chown(tmp, old.st_uid, old.st_gid)
        with contextlib.suppress(OSError):  # at least the group (a group this user is in)
            os.chown(tmp, -1, old.st_gid)
    os.chmod(tmp, stat.S_IMODE(old.st_mode))


def _disk_fix(err: OSError) -> str:
    if err.errno in FULL_ERRNOS:
        return "free space on that disk (df -h shows it), or choose an --out on another disk"
    return "choose an --out in a folder you can write"


def cleanup_stale(
    parent: str | os.PathLike[str], name: str | None = None, *, model_cache: bool = False
) -> list[Path]:
    """Remove leftovers of killed writes in ``parent`` (for the folder ``name``, or all):
    ``.NAME.building-PID-*`` of dead processes, and ``.NAME.old-PID-*`` (put back at
    ``NAME`` when ``NAME`` is missing, i.e. the process died between two renames). Folders
    a killed write had moved out of ``NAME`` to carry them over (listed in its
    ``.NAME.carry-PID-*`` note) are put back first; so are ``.mechlingo-building-PID-*``
    staging folders inside a mount point ``--out`` removed. With ``model_cache`` (``parent``
    is the model cache folder), also the cache's ``.building-*`` and ``*.stale-PID`` folders of
    dead processes (or, without a process id in the name, older than six hours). Returns what
    was removed."""
    parent = Path(parent)
    removed: list[Path] = []
    try:
        entries = list(parent.iterdir())
    except OSError:
        return removed
    order = {"old": 0, "carry": 1, "building": 2}
    found = [(e, _STALE.match(e.name)) for e in entries]
    found.sort(key=lambda f: order[f[1]["kind"]] if f[1] else 3)
    for entry, m in found:
        if m:
            _clean_one(parent, entry, m, name, removed)
            continue
        inside = _INSIDE.match(entry.name)
        if inside and not _pid_alive(int(inside["pid"])):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
            continue
        c = _CACHE_STALE.match(entry.name) if model_cache else None
        if c and entry.is_dir() and _cache_leftover(entry, c["pid"] or c["spid"]):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def _clean_one(
    parent: Path, entry: Path, m: re.Match[str], name: str | None, removed: list[Path]
) -> None:
    """One ``.NAME.KIND-PID-*`` leftover of :func:`cleanup_stale`."""
    if name is not None and m["name"] != sibling_name(name):
        return
    if name is None and re.search(r"~[0-9a-f]{12}$", m["name"]):
        return  # a shortened name: only a call that names the folder can put it back
    if _pid_alive(int(m["pid"])):
        return
    dest = parent / (name if name is not None else m["name"])
    if m["kind"] == "carry":
        with contextlib.suppress(OSError):
            tmp_name, out_name, *names = [os.fsdecode(n) for n in entry.read_bytes().split(b"\0")]
            _put_back(parent / tmp_name, parent / out_name, names)
        entry.unlink(missing_ok=True)
        removed.append(entry)
        return
    if m["kind"] == "old" and not dest.exists():
        with contextlib.suppress(OSError):
            os.rename(entry, dest)
            return
    shutil.rmtree(entry, ignore_errors=True)
    removed.append(entry)


def _cache_leftover(entry: Path, pid: str | None) -> bool:
    """Whether a model cache's temporary folder is a leftover: its process is dead, or,
    without a process id in its name, it is older than six hours."""
    if pid is not None:
        return not _pid_alive(int(pid))
    try:
        return time.time() - entry.stat().st_mtime >= _OLD_AGE_S
    except OSError:
        return False


def write_files(
    out: str | os.PathLike[str], files: Mapping[str, Any], *, keep_others: bool = True
) -> Path:
    """Write ``{name: content}`` into the folder ``out`` all at once.

    Content: ``str`` (text), ``bytes``, an object with a ``render()`` method that returns the
    text (a :class:`mechlingo.report.Report`; the files its ``assets()`` names, if it has
    that method, go beside it), or anything JSON-serialisable (tensors and
    arrays as lists). The new folder is built in a temporary sibling and put at ``out`` in
    one rename (:func:`atomic_folder`), so a kill leaves the old folder or the new one.
    Existing files of the same names are replaced; other files in ``out`` are carried over
    (``keep_others``) or dropped. Every rank writes: callers under torchrun write on rank 0.
    A mapping written as ``summary.json`` (any command's headline file) gets
    ``format_version`` (:data:`mechlingo.core.version.SUMMARY_FORMAT_VERSION`) as its first key.
    """
    out = Path(out)
    with atomic_folder(out, keep_others=keep_others) as tmp:
        for i, (name, content) in enumerate(files.items()):
            if i == 1:
                kill_point("write")
            path = tmp / name
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.name == "summary.json" and isinstance(content, Mapping):
                content = {"format_version": SUMMARY_FORMAT_VERSION, **content}
            if hasattr(content, "render"):
                path.write_text(content.render(), encoding="utf-8")
                for asset, text in getattr(content, "assets", dict)().items():
                    (path.parent / asset).write_text(text, encoding="utf-8")  # shared: same text
            elif isinstance(content, bytes):
                path.write_bytes(content)
            elif isinstance(content, str):
                path.write_text(content, encoding="utf-8")
            else:
                path.write_text(
                    json.dumps(jsonable(content), indent=2, ensure_ascii=False, allow_nan=False),
                    encoding="utf-8",
                )
    return out
