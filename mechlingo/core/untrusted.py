"""Reading files that may have been made to cause harm (see ``docs/security.md``).

Every artifact mechlingo reads can come from a stranger. These are the checks the loaders
share, each made *before* anything large is allocated or anything outside the given folder is
touched: :func:`read_json` / :func:`loads` (JSON only, with size and nesting-depth limits
checked by a linear scan before parsing), :func:`inside` (a name resolved under its folder;
``../``, absolute names and escaping symlinks refused), :func:`check_links` (no symlink under
a folder points outside it), :func:`safetensors_header` and :func:`load_tensors` (a header
fully checked against the file's real size and the expected names and shapes; NaN and
infinite tensors refused), and :func:`gguf_header` (a GGUF header walked without allocating
what it declares).

Each raises the error class the caller gives (an :class:`~mechlingo.core.errors.ArtifactError`
for artifacts, a :class:`~mechlingo.core.errors.DataError` for data files), one line that says
what is wrong and what to do."""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import stat
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO, TypeGuard

import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from safetensors.torch import load_file
from torch import Tensor

from mechlingo.core.errors import InputError

__all__ = [
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
    "check_depth",
    "check_finite_tensors",
    "check_links",
    "check_numbers",
    "expand_path",
    "gguf_header",
    "inside",
    "json_depth",
    "load_tensors",
    "loads",
    "read_json",
    "refuse_special",
    "safetensors_header",
    "special_kind",
]

#: the largest JSON description mechlingo reads from an artifact (its tensors are separate)
MAX_JSON_BYTES = 64 * 2**20
#: the deepest nesting of a JSON document mechlingo parses (its own files nest < 10)
MAX_JSON_DEPTH = 64
#: the largest safetensors header (JSON) of an artifact
MAX_HEADER_BYTES = 16 * 2**20
#: the most dimensions of one tensor (safetensors and GGUF)
MAX_DIMS = 8
#: the longest key or tensor name in a GGUF file
MAX_GGUF_NAME = 65536
#: the most entries walked under a folder when looking for escaping links
MAX_ENTRIES = 1_000_000

#: the largest integer an artifact's description may hold (a signed 64-bit integer)
MAX_JSON_INT = 2**63 - 1

_ST_DTYPES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2,
              "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8,
              "F64": 8}  # fmt: skip


_SPECIAL = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def expand_path(text: str | os.PathLike[str], what: str = "path") -> Path:
    """``text`` with ``~``/``~user`` expanded (not resolved); ``what`` names it in the error.

    Raises:
        InputError: a ``~user`` that does not exist or a ``~`` with no home directory.
    """
    try:
        return Path(text).expanduser()
    except (RuntimeError, KeyError):
        head = str(text).split("/", 1)[0]
        why = "no home directory is known" if head == "~" else f"there is no user {head[1:]!r}"
        raise InputError(
            f"{what} {text}: {head} cannot be expanded ({why})",
            where=what,
            fix="write the path in full (or set HOME)",
        ) from None


def special_kind(path: str | os.PathLike[str]) -> str | None:
    """What ``path`` is when it is neither a regular file nor a folder (``"a named pipe
    (FIFO)"``, ``"a socket"``, ``"a character device"``, ``"a block device"``), symlinks
    followed; ``None`` for a regular file, a folder or a path that does not exist. Only
    ``os.stat`` is called: nothing is opened, so a pipe never blocks."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return next((name for test, name in _SPECIAL if test(mode)), "not a regular file")


def refuse_special(
    path: str | os.PathLike[str],
    error: type[Exception],
    *,
    what: str | None = None,
    fix: str | None = None,
) -> None:
    """Refuse a named pipe, socket or device before it is opened (reading a pipe with no
    writer blocks forever; a device can be endless). ``what`` names the path in the message
    (default: the path itself)."""
    kind = special_kind(path)
    if kind is not None:
        raise _err(error, f"{what or path} is {kind}, not a regular file: mechlingo reads only "
                   "regular files and folders", fix or "give the path of a regular file (copy "
                   "the data into one)")  # fmt: skip


def check_numbers(
    doc: Any,
    error: type[Exception],
    what: str,
    *,
    fix: str | None = None,
    max_int: int = MAX_JSON_INT,
) -> None:
    """Refuse a NaN or infinite number (``NaN``, ``Infinity`` parse in Python) or an integer
    beyond ``±max_int`` anywhere in a parsed JSON document (iteratively: no recursion)."""
    stack: list[tuple[Any, str]] = [(doc, "")]
    while stack:
        x, at = stack.pop()
        if isinstance(x, dict):
            stack.extend((v, f"{at}.{str(k)[:40]}") for k, v in x.items())
        elif isinstance(x, list):
            stack.extend((v, f"{at}[{i}]") for i, v in enumerate(x))
        elif isinstance(x, float) and not math.isfinite(x):
            raise _err(error, f"{what}: {at.lstrip('.') or 'the value'} is {x!r}; mechlingo "
                       "reads only finite numbers", fix)  # fmt: skip
        elif isinstance(x, int) and not isinstance(x, bool) and abs(x) > max_int:
            raise _err(error, f"{what}: {at.lstrip('.') or 'the value'} is an integer of "
                       f"{len(str(abs(x)))} digits, beyond {max_int:,}", fix)  # fmt: skip


_JSON_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(rb"[\[\]{}]")


def json_depth(text: str | bytes) -> int:
    """The deepest ``[``/``{`` nesting of a JSON text (brackets inside strings not counted),
    without parsing it (so without recursion)."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    steps = [1 if b in b"[{" else -1 for b in _BRACKETS.findall(_JSON_STRINGS.sub(b"", data))]
    return max(itertools.accumulate(steps), default=0)


def _fast_depth_ok(data: bytes, limit: int) -> bool:
    """Cheap pre-check: fewer opening brackets than the limit means no deeper nesting."""
    return data.count(b"[") + data.count(b"{") <= limit


def check_depth(
    text: str | bytes,
    error: type[Exception],
    what: str,
    *,
    fix: str | None = None,
    max_depth: int = MAX_JSON_DEPTH,
) -> None:
    """Refuse JSON text nested deeper than ``max_depth`` before it is parsed."""
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if not _fast_depth_ok(raw, max_depth) and json_depth(raw) > max_depth:
        raise _err(error, f"{what} nests JSON deeper than {max_depth} levels: mechlingo does "
                   "not parse it (its own files nest a few levels)", fix)  # fmt: skip


def loads(
    text: str | bytes,
    error: type[Exception],
    what: str,
    *,
    fix: str | None = None,
    max_depth: int = MAX_JSON_DEPTH,
) -> Any:
    """``json.loads(text)`` for text from a stranger: refused (``error``, naming ``what``)
    when nested deeper than ``max_depth`` or not valid JSON; never a ``RecursionError``."""
    check_depth(text, error, what, fix=fix, max_depth=max_depth)
    try:
        return json.loads(text)
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        msg = getattr(err, "msg", None) or str(err)
        raise _err(error, f"{what} is not valid JSON ({msg})", fix) from None


def read_json(
    path: str | os.PathLike[str],
    error: type[Exception],
    *,
    fix: str | None = None,
    max_bytes: int = MAX_JSON_BYTES,
    root: str | os.PathLike[str] | None = None,
    numbers: bool = True,
) -> Any:
    """The JSON document in ``path`` (UTF-8), read only when it is a regular file of at most
    ``max_bytes`` (a pipe, socket or device is refused before it is opened); with ``root``,
    only when ``path`` resolves inside ``root``; with ``numbers``, refused when it holds a
    NaN, an infinity or an integer beyond 64 bits (:func:`check_numbers`)."""
    p = Path(path)
    if root is not None:
        inside(root, p, error, fix=fix)
    refuse_special(p, error, fix=fix)
    try:
        size = p.stat().st_size
        if size > max_bytes:
            raise _err(error, f"{p} is {size:,} bytes; a mechlingo description file is at most "
                       f"{max_bytes:,}", fix)  # fmt: skip
        data = p.read_bytes()
    except OSError as err:
        raise _err(error, f"{p} cannot be read ({err.strerror or err})", fix) from None
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise _err(error, f"{p} is not valid JSON (not UTF-8: {err.reason})", fix) from None
    doc = loads(data, error, str(p), fix=fix)
    if numbers:
        check_numbers(doc, error, str(p), fix=fix)
    return doc


def inside(
    root: str | os.PathLike[str],
    path: str | os.PathLike[str],
    error: type[Exception],
    *,
    fix: str | None = None,
) -> Path:
    """``path`` (absolute, or relative to ``root``) resolved, symlinks followed; refused
    when it lands outside ``root`` (a ``../`` name, an absolute name elsewhere, a symlink
    pointing out)."""
    base = Path(root).resolve()
    p = Path(path)
    if not p.is_absolute():
        p = Path(root) / p
    real = p.resolve()
    if real != base and base not in real.parents:
        raise _err(error, f"{p} points outside {base} (to {real}); mechlingo reads nothing "
                   "outside the folder it is given", fix or "copy the files into the folder "
                   "instead of linking them")  # fmt: skip
    return real


def check_links(
    folder: str | os.PathLike[str], error: type[Exception], *, fix: str | None = None
) -> None:
    """Refuse a folder that holds a symlink (at any depth) pointing outside it."""
    root = Path(folder)
    if not root.is_dir():
        return
    base = root.resolve()
    count = 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in (*dirnames, *filenames):
            count += 1
            if count > MAX_ENTRIES:
                raise _err(error, f"{root} holds more than {MAX_ENTRIES:,} entries", fix)
            p = Path(dirpath) / name
            if p.is_symlink():
                inside(base, p, error, fix=fix)


def safetensors_header(
    path: str | os.PathLike[str],
    error: type[Exception],
    *,
    fix: str | None = None,
    max_header: int = MAX_HEADER_BYTES,
) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{name: (dtype, shape)}`` of a safetensors file, after checking its header against
    the file: the header length, a JSON object of known dtypes, shapes of at most
    :data:`MAX_DIMS` non-negative ints, each tensor's byte span equal to its shape's size
    and inside the file, spans not overlapping. Nothing but the header is read."""
    p = Path(path)

    def bad(why: str) -> Exception:
        return _err(error, f"{p} is not a valid safetensors file ({why})", fix)

    refuse_special(p, error, fix=fix)
    try:
        size = p.stat().st_size
        with p.open("rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else 0
            if len(head) < 8 or n <= 1:
                raise bad("empty, zeroed or truncated")
            if n > min(size - 8, max_header):
                raise bad(f"its header claims {n:,} bytes; the file has {size:,}")
            raw = f.read(n)
    except OSError as err:
        raise bad(f"unreadable: {err.strerror or err}") from None
    header = loads(raw, error, f"the header of {p}", fix=fix, max_depth=4)
    if not isinstance(header, dict):
        raise bad("its header is not a JSON object")
    data_size = size - 8 - n
    spans: list[tuple[int, int, str]] = []
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name, v in header.items():
        if name == "__metadata__":
            if not isinstance(v, dict) or not all(isinstance(x, str) for x in v.values()):
                raise bad("__metadata__ is not a map of strings")
            continue
        if not isinstance(v, dict):
            raise bad(f"entry {name[:80]!r} is not an object")
        dtype, shape, offs = v.get("dtype"), v.get("shape"), v.get("data_offsets")
        if dtype not in _ST_DTYPES:
            raise bad(f"tensor {name[:80]!r} has an unknown dtype {str(dtype)[:20]!r}")
        if not _ints(shape, MAX_DIMS) or not _ints(offs, 2) or len(offs) != 2:
            raise bad(f"tensor {name[:80]!r} has a malformed shape or data_offsets")
        start, end = offs
        need = math.prod(shape) * _ST_DTYPES[dtype]
        if not 0 <= start <= end <= data_size or end - start != need:
            why = "truncated or made up" if end > data_size else "inconsistent"
            raise bad(f"tensor {name[:80]!r} declares {need:,} bytes at {start}..{end}; the "
                      f"file holds {data_size:,} bytes of data: {why}")  # fmt: skip
        spans.append((start, end, name))
        out[name] = (dtype, tuple(shape))
    spans.sort()
    for (_, e1, a), (s2, _, b) in zip(spans, spans[1:], strict=False):
        if s2 < e1:
            raise bad(f"tensors {a[:40]!r} and {b[:40]!r} overlap")
    return out


def _ints(x: Any, most: int) -> TypeGuard[list[int]]:
    return (
        isinstance(x, list)
        and len(x) <= most
        and all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 2**62 for i in x)
    )


def load_tensors(
    path: str | os.PathLike[str],
    error: type[Exception],
    *,
    fix: str | None = None,
    expect: Mapping[str, tuple[int | None, ...] | None] | None = None,
    only: Iterable[str] | None = None,
    finite: bool = True,
    device: str = "cpu",
) -> dict[str, Tensor]:
    """The tensors of a safetensors file from a stranger: the header checked
    (:func:`safetensors_header`), the names and shapes of ``expect`` (``None`` in a shape:
    any size there; a shape of ``None``: any shape) present, no name outside ``only`` (when
    given), then the data read and refused when a float tensor holds NaN or infinity."""
    header = safetensors_header(path, error, fix=fix)
    p = Path(path)
    allowed = None if only is None else set(only)
    for name in header:
        if allowed is not None and name not in allowed:
            raise _err(error, f"{p} holds an unexpected tensor {name[:80]!r}", fix)
    for name, shape in (expect or {}).items():
        if name not in header:
            raise _err(error, f"{p} has no tensor {name!r}", fix)
        got = header[name][1]
        if shape is not None and (
            len(got) != len(shape)
            or any(s is not None and s != g for s, g in zip(shape, got, strict=False))
        ):
            want = "x".join("*" if s is None else str(s) for s in shape)
            have = "x".join(str(g) for g in got)
            raise _err(error, f"{p}: tensor {name!r} is {have or 'a scalar'}, expected {want}",
                       fix)  # fmt: skip
    try:
        tensors = load_file(str(p), device=device)
    except Exception as err:  # the library's own checks: one line, not its traceback
        raise _err(error, f"{p} cannot be read ({type(err).__name__}: {err})", fix) from None
    if finite:
        check_finite_tensors(tensors, error, str(p), fix=fix)
    return tensors


def check_finite_tensors(
    tensors: Mapping[str, Tensor], error: type[Exception], what: str, *, fix: str | None = None
) -> None:
    """Refuse NaN or infinite values in any float tensor (they turn every logit into NaN)."""
    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise _err(error, f"{what}: tensor {name!r} holds NaN or infinite values", fix)


# --------------------------------------------------------------------------------------
# GGUF
# --------------------------------------------------------------------------------------

_GGUF_SCALARS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


class _Reader:
    """Sequential little-endian reads that never go past the file's end."""

    def __init__(self, f: BinaryIO, size: int, what: str, error: type[Exception], fix: Any):
        self.f, self.size, self.what, self.error, self.fix = f, size, what, error, fix

    def left(self) -> int:
        return self.size - self.f.tell()

    def fail(self, why: str) -> Exception:
        return _err(self.error, f"{self.what} is not a valid GGUF file ({why})", self.fix)

    def take(self, n: int, why: str) -> bytes:
        if n > self.left():
            raise self.fail(f"{why} needs {n:,} bytes; {self.left():,} are left in the file")
        return self.f.read(n)

    def u32(self, why: str) -> int:
        return struct.unpack("<I", self.take(4, why))[0]

    def u64(self, why: str) -> int:
        return struct.unpack("<Q", self.take(8, why))[0]

    def string(self, why: str, most: int | None = None) -> bytes | None:
        """A string; read when at most ``most`` bytes (else skipped, ``None``)."""
        n = self.u64(why)
        if n > self.left():
            raise self.fail(f"{why} declares a string of {n:,} bytes; {self.left():,} are left")
        if most is not None and n > most:
            if most == MAX_GGUF_NAME:
                raise self.fail(f"{why} is a name of {n:,} bytes")
            self.f.seek(n, os.SEEK_CUR)
            return None
        return self.f.read(n)

    def skip_value(self, vtype: int, why: str, depth: int = 0) -> None:
        if vtype in _GGUF_SCALARS:
            self.take(_GGUF_SCALARS[vtype], why)
        elif vtype == _STRING:
            self.string(why, most=0)
        elif vtype == _ARRAY:
            if depth > 2:
                raise self.fail(f"{why} nests arrays deeper than 2")
            item, count = self.u32(why), self.u64(why)
            if item in _GGUF_SCALARS:
                need = count * _GGUF_SCALARS[item]
                if need > self.left():
                    raise self.fail(f"{why} declares {count:,} items ({need:,} bytes); "
                                    f"{self.left():,} are left")  # fmt: skip
                self.f.seek(need, os.SEEK_CUR)
                return
            if count * 8 > self.left():  # every string or array item takes >= 8 bytes
                raise self.fail(f"{why} declares {count:,} items; {self.left():,} bytes are left")
            for _ in range(count):
                self.skip_value(item, why, depth + 1)
        else:
            raise self.fail(f"{why} has an unknown value type {vtype}")


def gguf_header(
    path: str | os.PathLike[str],
    error: type[Exception],
    *,
    fix: str | None = None,
    keep: Iterable[str] = (),
    max_string: int = MAX_JSON_BYTES,
) -> tuple[dict[str, str], list[tuple[str, tuple[int, ...], int]]]:
    """Walk a GGUF file's header without allocating what it declares.

    Every key/value count, string length, array length, tensor count, dimension count and
    tensor size is checked against the bytes the file really has (a 1 KB file that claims a
    billion tensors or a 100 GB string is refused at once). Returns ``({key: string value}``
    for the string keys in ``keep``, ``[(tensor name, shape, ggml type), ...])``."""
    p = Path(path)
    wanted = set(keep)
    strings: dict[str, str] = {}
    tensors: list[tuple[str, tuple[int, ...], int]] = []
    refuse_special(p, error, fix=fix)
    try:
        size = p.stat().st_size
        with p.open("rb") as f:
            r = _Reader(f, size, str(p), error, fix)
            if r.take(4, "the magic") != b"GGUF":
                raise r.fail("no GGUF magic at its start")
            version = r.u32("the version")
            if version not in (2, 3):
                raise r.fail(f"version {version}; mechlingo reads GGUF versions 2 and 3")
            n_tensors, n_kv = r.u64("the tensor count"), r.u64("the key count")
            if n_kv * 13 > r.left() or n_tensors * 28 > r.left():  # smallest entries
                raise r.fail(f"it declares {n_kv:,} keys and {n_tensors:,} tensors in "
                             f"{size:,} bytes")  # fmt: skip
            alignment = 32
            for i in range(n_kv):
                key = (r.string(f"key {i}", MAX_GGUF_NAME) or b"").decode("utf-8", "replace")
                vtype = r.u32(f"key {key[:60]!r}")
                if vtype == _STRING and key in wanted:
                    val = r.string(f"key {key[:60]!r}", max_string)
                    if val is None:
                        raise r.fail(f"key {key[:60]!r} is longer than {max_string:,} bytes")
                    strings[key] = val.decode("utf-8", "replace")
                elif key == "general.alignment" and vtype == 4:
                    alignment = r.u32(key)
                else:
                    r.skip_value(vtype, f"key {key[:60]!r}")
            total = 0
            for i in range(n_tensors):
                name = (r.string(f"tensor {i}", MAX_GGUF_NAME) or b"").decode("utf-8", "replace")
                n_dims = r.u32(f"tensor {name[:60]!r}")
                if not 1 <= n_dims <= MAX_DIMS:
                    raise r.fail(f"tensor {name[:60]!r} has {n_dims} dimensions")
                shape = tuple(r.u64(f"tensor {name[:60]!r}") for _ in range(n_dims))
                gtype, offset = r.u32(f"tensor {name[:60]!r}"), r.u64(f"tensor {name[:60]!r}")
                nbytes = _gguf_nbytes(r, name, shape, gtype)
                total = max(total, offset + nbytes)
                tensors.append((name, shape, gtype))
            if alignment < 1 or alignment > 2**16:
                raise r.fail(f"alignment {alignment}")
            start = -(-f.tell() // alignment) * alignment
            if start + total > size:
                raise r.fail(f"its tensors need {start + total:,} bytes; the file has {size:,}")
    except OSError as err:
        raise _err(error, f"{p} cannot be read ({err.strerror or err})", fix) from None
    return strings, tensors


def _gguf_nbytes(r: _Reader, name: str, shape: tuple[int, ...], gtype: int) -> int:
    try:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(gtype)]
    except (ValueError, KeyError):
        raise r.fail(f"tensor {name[:60]!r} has an unknown type {gtype}") from None
    n = math.prod(shape)
    if n > r.size * max(1, block) or shape[0] % block:
        raise r.fail(f"tensor {name[:60]!r} declares shape {list(shape)} in {r.size:,} bytes")
    return n // block * type_size


def _err(error: type[Exception], msg: str, fix: str | None) -> Exception:
    """``error(msg, fix=fix)`` for mechlingo errors, ``error(msg)`` for others."""
    try:
        return error(msg, fix=fix) if fix else error(msg)  # type: ignore[call-arg]
    except TypeError:
        return error(msg)
