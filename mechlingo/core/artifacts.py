"""Writing folders in one step: a kill leaves either the old folder or the new one.

Every folder mechlingo writes (a command's ``--out``, saved vectors and clamps, the model
cache) is first built in a temporary sibling named ``.NAME.building-PID-XXXX`` and then put in
place with a single rename. When the folder already exists, the two are swapped atomically
(Linux ``renameat2(RENAME_EXCHANGE)``); elsewhere the old folder is renamed aside first and a
later start puts it back if the process died between the two renames.

Leftovers of killed runs (``.NAME.building-*``, ``.NAME.old-*``) are removed by
:func:`cleanup_stale`, which every command calls at its start; a folder whose process is
still alive is left alone.

>>> with atomic_folder("results") as tmp:
...     (tmp / "summary.json").write_text("{}")
"""

from __future__ import annotations

import contextlib
import ctypes
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

__all__ = [
    "atomic_file",
    "atomic_folder",
    "cleanup_stale",
    "kill_point",
    "output_target",
    "publish_folder",
    "write_files",
]

#: Environment variable for kill tests: a comma-separated list of points
#: (``fill``, ``publish``, ``cache``) at which the process SIGKILLs itself.
KILL_ENV = "MECHLINGO_TEST_KILL_AT"

_STALE = re.compile(r"^\.(?P<name>.+)\.(?P<kind>building|old)-(?P<pid>\d+)-[^/]*$")
_CACHE_STALE = re.compile(r"^(?:\.building-(?:(?P<pid>\d+)-)?.*|.+\.stale-(?P<spid>\d+))$")
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_OLD_AGE_S = 6 * 3600


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


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux); ``False`` where the call is not available."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (38, 22, 95):  # ENOSYS, EINVAL (file system without it), EOPNOTSUPP
        return False
    raise OSError(err, os.strerror(err), str(b))


def publish_folder(new: Path, dest: Path) -> None:
    """Put the finished folder ``new`` at ``dest`` in one step. An existing ``dest`` ends up
    at ``new`` (the caller removes it)."""
    if not dest.exists() and not dest.is_symlink():
        os.rename(new, dest)
        return
    if _exchange(new, dest):
        kill_point("publish")
        return
    # Fallback: two renames; cleanup_stale() restores `old` if we die in between.
    old = dest.parent / f".{dest.name}.old-{os.getpid()}-{int(time.time())}"
    os.rename(dest, old)
    kill_point("publish")
    os.rename(new, dest)
    os.rename(old, new)


def _carry(src: Path, dst: Path) -> None:
    """Hard-link (or copy) ``src`` to ``dst``: a file or a whole folder."""
    if src.is_dir() and not src.is_symlink():
        shutil.copytree(src, dst, symlinks=True, copy_function=_link_or_copy)
    else:
        _link_or_copy(src, dst)


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
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
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
            the new folder (hard links); ``False`` replaces the folder as a whole.

    Yields:
        The temporary folder to fill. If the block raises, ``out`` is left as it was.

    A symlink at ``out`` that points to a folder is followed: the folder it points to is
    written (the link stays as it was); a symlink to anything else is refused. The new folder
    gets the mode (setgid and group bits included), group and owner of the folder it replaces
    (for a new folder: the umask's mode, and the parent's setgid bit and group).

    Raises:
        OutputError: ``out`` is an existing file, a symlink to no folder, or its parent
            cannot be created or written.
    """
    out = output_target(out)
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out} is an existing file, not a folder", fix="choose another --out")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        cleanup_stale(out.parent, out.name)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-{os.getpid()}-", dir=out.parent))
    except OSError as err:
        found = disk_error(err, what=f"creating {out}")
        if found is not None:
            raise found from err
        raise OutputError(
            f"cannot write next to {out}: {err.strerror or err}",
            fix="choose an --out in a writable folder",
        ) from err
    try:
        yield tmp
        kill_point("fill")
        if keep_others and out.is_dir():
            for entry in out.iterdir():
                target = tmp / entry.name
                if not target.exists() and not target.is_symlink():
                    _carry(entry, target)
        _match_mode(tmp, out)
        publish_folder(tmp, out)
    except OSError as err:  # a full or read-only disk: one line, the old folder kept
        found = disk_error(err, what=f"writing {out}", fix=_disk_fix(err))
        if found is None:
            raise
        raise found from err
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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
    ``NAME`` when ``NAME`` is missing, i.e. the process died between two renames). With
    ``model_cache`` (``parent`` is the model cache folder), also the cache's ``.building-*`` and ``*.stale-PID``
    folders of dead processes (or, without a process id in the name, older than six hours).
    Returns what was removed."""
    parent = Path(parent)
    removed: list[Path] = []
    try:
        entries = list(parent.iterdir())
    except OSError:
        return removed
    now = time.time()
    for entry in entries:
        m = _STALE.match(entry.name)
        if m:
            if name is not None and m["name"] != name:
                continue
            if _pid_alive(int(m["pid"])):
                continue
            dest = parent / m["name"]
            if m["kind"] == "old" and not dest.exists():
                with contextlib.suppress(OSError):
                    os.rename(entry, dest)
                    continue
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
            continue
        c = _CACHE_STALE.match(entry.name) if model_cache else None
        if c and entry.is_dir():
            pid = c["pid"] or c["spid"]
            if pid is not None and _pid_alive(int(pid)):
                continue
            if pid is None:
                try:
                    if now - entry.stat().st_mtime < _OLD_AGE_S:
                        continue
                except OSError:
                    continue
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


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
