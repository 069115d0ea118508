"""Resumable checkpoints: a long run split into named steps whose results are kept on disk.

A :class:`Checkpoints` folder holds one subfolder per *key* (a JSON-able description of what the
results depend on: the model's fingerprint, the data, the settings). ``run(name, fn)`` returns
the stored result of ``name`` under that key when there is one, and otherwise calls ``fn()``,
stores its JSON-able result atomically and returns it, so a run stopped at any moment leaves
every checkpoint whole and the next run with the same key resumes after it::

    checkpoints = Checkpoints("work", {"model": fingerprint, "data": data_hash, "settings": cfg})
    trace = checkpoints.run("trace", lambda: compute_trace())   # computed once, then read back

``run(name, fn, folder=True)`` is for checkpoints that also leave files: ``fn(tmp)`` fills a
temporary folder, put at ``checkpoints.path(name)`` in one rename together with the result. What
a failed, non-finite or unreadable checkpoint does: ``docs/gotchas.md`` ("Going on after a stop")."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mechlingo.core.artifacts import atomic_file, cleanup_stale, kill_point
from mechlingo.core.errors import ArtifactError, OutputError
from mechlingo.core.jsonable import jsonable
from mechlingo.core.untrusted import expand_path, load_tensors, read_json, refuse_special
from mechlingo.core.version import __version__

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["CHECKPOINT_LOG_ENV", "Checkpoints", "key_hash", "release_free_locks"]

_RESULT = "result.json"
_KEY = "key.json"
#: For tests: a file to which every checkpoint appends ``computed NAME`` or ``reused NAME``.
CHECKPOINT_LOG_ENV = "MECHLINGO_CHECKPOINT_LOG"
#: For kill tests: SIGKILL the process when its N-th computed checkpoint (1-based) is about to be
#: stored (its result computed, not yet renamed into place).
KILL_CHECKPOINT_ENV = "MECHLINGO_TEST_KILL_CHECKPOINT"
_FIX = "delete the work folder (or rerun with --fresh) to recompute it"
#: the locks of the checkpoint folders this process holds: lock file -> [fd, holders]
_HELD: dict[Path, list[int]] = {}
_HELD_GUARD = threading.Lock()


def key_hash(key: Mapping[str, Any]) -> str:
    """A short stable hash of a JSON-able key (sorted keys, so order does not matter)."""
    text = json.dumps(jsonable(key), sort_keys=True, ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Checkpoints:
    """Named, cached, resumable steps under ``folder/<key hash>/``.

    Args:
        folder: the work folder (created on first write).
        key: what every stage's result depends on; another key is another subfolder, so
            results of another model, data or settings are never reused. The mechlingo
            version is added to it, and the folder's ``key.json`` must equal it: a folder
            whose ``key.json`` says otherwise (another version, a copied or edited folder)
            is removed and its checkpoints recomputed, never reused.
        agree: under torchrun, a function that turns this rank's "stage finished" into the
            answer of every rank (true only when all ranks have it): a checkpoint is read back
            only when every rank can read it back, and otherwise recomputed by all of them,
            so that the ranks run the same collective steps.

    One key's checkpoints are used by one process at a time: the first use (or :meth:`lock`)
    takes an exclusive lock on ``folder/.<key hash>.lock`` (``fcntl.flock``, which the
    kernel drops when the process dies, so a killed run never leaves it stuck), held while
    this object lives or until :meth:`unlock`. A second process of the same key is refused
    with an :class:`~mechlingo.core.errors.OutputError` naming the holder, instead of deleting
    the other's unfinished checkpoint.
    """

    def __init__(
        self,
        folder: str | os.PathLike[str],
        key: Mapping[str, Any],
        *,
        agree: Callable[[bool], bool] | None = None,
    ) -> None:
        self.key = jsonable({**dict(key), "mechlingo_version": __version__})
        self.root = expand_path(folder, "work folder").absolute()
        self.folder = self.root / key_hash(self.key)
        self.agree = agree
        self.computed = 0
        self._checked = False
        self._lock_file: Path | None = None

    def lock(self) -> None:
        """Take this key's lock (see the class); nothing when this object holds it already.

        Raises:
            OutputError: a live process (another run of the same command, model, data and
                settings) holds it.
        """
        if self._lock_file is not None:
            return
        path = self.root / f".{self.folder.name}.lock"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            _acquire(path)
        except OSError as err:
            if err.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
                return  # a folder this run cannot write: it cannot remove a checkpoint either
            raise OutputError(
                f"cannot lock the work folder {self.root}: {err.strerror or err}",
                fix="choose a writable work folder (--work)",
            ) from err
        self._lock_file = path
        self._unlocker = weakref.finalize(self, _release, path)

    def unlock(self) -> None:
        """Give this key's lock back (another process may then use its checkpoints)."""
        if self._lock_file is not None:
            self._unlocker()  # runs _release once, and never again at garbage collection
            self._lock_file = None

    def path(self, name: str) -> Path:
        """The folder of checkpoint ``name`` (its result and any files it left)."""
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"a checkpoint name is a plain file name, got {name!r}")
        return self.folder / name

    def done(self, name: str) -> bool:
        """Whether ``name`` has a stored result under this key."""
        self._check_folder()
        return (self.path(name) / _RESULT).is_file()

    def load(self, name: str) -> Any:
        """The stored result of ``name`` (``KeyError`` when it has none). The checkpoint folder
        is checked first: the result resolves inside the checkpoint folder (no symlink out), at most
        64 MiB and of a sane nesting depth (:mod:`mechlingo.core.untrusted`); an
        :class:`~mechlingo.core.errors.ArtifactError` otherwise."""
        p = self.path(name) / _RESULT
        refuse_special(p, ArtifactError, fix=_FIX)
        if not p.is_file():
            raise KeyError(name)
        return read_json(p, ArtifactError, fix=_FIX, root=self.folder)

    def _check_folder(self) -> None:
        """Once: a folder whose ``key.json`` is not this key is not reused (removed)."""
        if self._checked:
            return
        self.lock()
        self._checked = True
        key_file = self.folder / _KEY
        if self.folder.is_symlink():
            raise ArtifactError(f"the checkpoint folder {self.folder} is a symlink", fix=_FIX)
        if not self.folder.is_dir():
            return
        try:
            stored = read_json(key_file, ArtifactError, root=self.folder, max_bytes=2**22)
        except ArtifactError:
            stored = None
        if stored != self.key:
            shutil.rmtree(self.folder, ignore_errors=True)

    def run(self, name: str, fn: Callable[..., Any], *, folder: bool = False) -> Any:
        """The result of checkpoint ``name``: read back when stored, else ``fn()`` (or ``fn(tmp)``
        with ``folder``), stored atomically and returned. An exception of ``fn`` propagates
        and stores nothing. The returned value is always the stored JSON (so a fresh result
        and a read-back one are equal)."""
        done = self.done(name)
        if self.agree is not None:
            done = self.agree(done)
        if done:
            try:
                value = self.load(name)
            except ArtifactError:  # unreadable: never reused, recomputed below
                if self.agree is not None:
                    raise
                self.discard(name)
            else:
                _log("reused", name)
                return value
        self._prepare()
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.building-{os.getpid()}-", dir=self.folder))
        try:
            value = fn(tmp) if folder else fn()
            _check_checkpoint_files(tmp, name)
            text = json.dumps(jsonable(value), indent=1, ensure_ascii=False, allow_nan=False)
            (tmp / _RESULT).write_text(text, encoding="utf-8")
            self.computed += 1
            kill_point("stage")
            if os.environ.get(KILL_CHECKPOINT_ENV) == str(self.computed):
                kill_point(f"stage-{self.computed}", force=True)
            dest = self.path(name)
            if dest.exists():  # a stale folder without a result (an older layout): replace
                shutil.rmtree(dest)
            os.rename(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        _log("computed", name)
        return self.load(name)

    def _prepare(self) -> None:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            key_file = self.folder / _KEY
            if not key_file.is_file():
                with atomic_file(key_file) as part:
                    part.write_text(
                        json.dumps(self.key, indent=1, sort_keys=True), encoding="utf-8"
                    )
        except OSError as err:
            raise OutputError(
                f"cannot write the checkpoint folder {self.folder}: {err.strerror or err}",
                fix="choose a writable work folder",
            ) from err
        cleanup_stale(self.folder)  # temporary folders of checkpoints whose process died

    def clear(self) -> None:
        """Forget every stored checkpoint of this key."""
        self.lock()
        shutil.rmtree(self.folder, ignore_errors=True)

    def discard(self, name: str) -> None:
        """Forget the stored checkpoint ``name`` (its result and files): the next run computes
        it again. Callers use it when what a checkpoint left turns out unusable."""
        shutil.rmtree(self.path(name), ignore_errors=True)


#: description files of the artifacts whose loaders refuse non-finite tensors
_ARTIFACT_DESCRIPTIONS = ("intervention.json", "tuned_lens.json")


def _check_checkpoint_files(tmp: Path, name: str) -> None:
    """The tensors of a saved artifact a checkpoint left (an intervention, a tuned lens: the
    folders whose loaders refuse NaN) must be finite: a checkpoint whose weights came out NaN (a
    diverged training) raises here and stores nothing, so no later run reuses it. Other
    checkpoint tensors may hold NaN on purpose (an undefined statistic)."""
    for path in sorted(tmp.rglob("*.safetensors")):
        if not any((path.parent / d).is_file() for d in _ARTIFACT_DESCRIPTIONS):
            continue
        try:
            load_tensors(path, ArtifactError)
        except ArtifactError as err:
            raise ArtifactError(
                f"stage {name!r} left unusable tensors ({err.message}); it is not kept",
                fix="check the settings that feed it (a learning rate, a scale) and run again",
            ) from None


def _log(what: str, name: str) -> None:
    """For tests: ``what name`` appended to the file named by ``MECHLINGO_CHECKPOINT_LOG``
    (``{rank}`` in it: the torchrun rank)."""
    target = os.environ.get(CHECKPOINT_LOG_ENV)
    if target:
        target = target.replace("{rank}", os.environ.get("RANK", "0"))
        with open(target, "a", encoding="utf-8") as fh:
            fh.write(f"{what} {name}\n")


def _acquire(path: Path) -> None:
    """Hold the lock file ``path`` for this process (counted: a second holder in this
    process shares it); an :class:`OutputError` when another live process holds it."""
    with _HELD_GUARD:
        held = _HELD.get(path)
        if held is not None:
            held[1] += 1
            return
        if fcntl is None:  # pragma: no cover - Windows: no lock
            return
        for _ in range(10):
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
                os.close(fd)
                if err.errno == errno.ENOLCK:  # a file system without locks: go on unlocked
                    return
                raise _busy(path, holder) from None
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if same:  # not a file its last holder removed while we opened it
                os.ftruncate(fd, 0)
                os.pwrite(fd, str(os.getpid()).encode(), 0)
                _HELD[path] = [fd, 1]
                return
            os.close(fd)
        raise _busy(path, "")


def _busy(path: Path, holder: str) -> OutputError:
    who = f" (process {holder})" if holder.isdigit() else ""
    return OutputError(
        f"the work folder {path.parent} is in use by another run{who} of this command with "
        "the same model, data and settings",
        fix="wait for that run to finish, or give this one another --work or --out",
    )


def _release(path: Path) -> None:
    """Drop one holder of ``path``; the last one removes the lock file and unlocks it."""
    with _HELD_GUARD:
        held = _HELD.get(path)
        if held is None:
            return
        held[1] -= 1
        if held[1] > 0:
            return
        del _HELD[path]
        with contextlib.suppress(OSError):
            path.unlink()
        os.close(held[0])


def release_free_locks(root: str | os.PathLike[str]) -> None:
    """Remove the lock files in the work folder ``root`` that no live process holds (those
    of this process included, which are given back): a finished run leaves no ``.*.lock``
    behind, and a killed run's lock file goes with the next finish."""
    root = Path(root)
    for path in sorted(root.glob(".*.lock")):
        with _HELD_GUARD:
            held = _HELD.pop(path, None)
        if held is not None:
            with contextlib.suppress(OSError):
                path.unlink()
            os.close(held[0])
            continue
        if fcntl is None:  # pragma: no cover - Windows
            continue
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            path.unlink()
        except OSError:
            pass
        finally:
            os.close(fd)
