"""Out-of-core pooled activations: rows stream to disk shards, read back in feature blocks.

Scoring needs every sentence of a neuron together, never every neuron of a sentence, so the
pooled rows go to disk as they are pooled and are read one block of neurons at a time:

* :class:`ShardWriter` -- buffers pooled rows and writes each full buffer as one
  feature-major *shard*;
* :class:`PooledShards` -- the ``[n_sentences, n_features]`` matrix of a folder's shards
  (every rank's), read as feature blocks (:meth:`PooledShards.blocks`) or as a few neurons'
  columns (``shards[:, features]``);
* :func:`shard_scores` -- AUROC and AP of every neuron and language, equal to the in-memory
  path exactly; :func:`memory_budget` and :func:`parse_memory` -- the ``--max-memory`` cap;
  :func:`shared_directory` -- one temporary folder seen by every rank.

The design, the file layout and the defaults: ``docs/scaling.md`` ("out of core")."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from jaxtyping import Float, Int
from torch import Tensor

from mechlingo.core.artifacts import atomic_file
from mechlingo.core.distributed import (
    all_gather_rows,
    barrier,
    dist_info,
    is_distributed,
    shard_bounds,
)
from mechlingo.core.errors import DataError, InputError
from mechlingo.kernels.grouped import grouped_auroc_and_average_precision

__all__ = [
    "PooledShards",
    "ShardWriter",
    "memory_budget",
    "parse_memory",
    "shard_scores",
    "shared_directory",
]

_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
#: The smallest cap accepted: below it a 7B model's row buffer and one neuron block no longer fit.
MIN_MEMORY = 64 * 2**20


def parse_memory(text: str | int) -> int:
    """Bytes of a size such as ``"2G"``, ``"512M"``, ``"1.5GiB"`` or ``3000000`` (binary units).

    Raises:
        InputError: not a size, or below :data:`MIN_MEMORY` (64 MiB).
    """
    if isinstance(text, int):
        value = text
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(?:I?B)?\s*", str(text).upper())
        if m is None:
            raise InputError(
                f"not a memory size: {text!r}", where="--max-memory", fix="e.g. 2G, 512M"
            )
        value = int(float(m.group(1)) * _UNITS[m.group(2)])
    if value < MIN_MEMORY:
        raise InputError(
            f"memory cap {value} bytes is below the minimum of {MIN_MEMORY // 2**20} MiB",
            where="--max-memory",
            fix="give at least 64M",
        )
    return value


def _available_bytes() -> int:
    """Memory this process may still use: the lower of the host's available memory and the
    room left under a cgroup (container) limit."""
    try:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        avail = 8 * 2**30
    try:
        meminfo = Path("/proc/meminfo").read_text(encoding="utf-8")
        m = re.search(r"MemAvailable:\s+(\d+) kB", meminfo)
        if m:
            avail = int(m.group(1)) * 1024
    except OSError:
        pass
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ):
        try:
            raw = Path(limit_file).read_text(encoding="utf-8").strip()
            if raw != "max" and int(raw) < 2**60:
                avail = min(
                    avail, int(raw) - int(Path(usage_file).read_text(encoding="utf-8").strip())
                )
            break
        except (OSError, ValueError):
            continue
    return max(avail, 0)


def memory_budget(max_memory: str | int | None = None) -> int:
    """The cap in bytes for the out-of-core statistics of this process.

    ``None`` means the machine's default: a quarter of the memory available now (host or
    cgroup, whichever is lower), divided among the ranks on this machine (``LOCAL_WORLD_SIZE``
    under ``torchrun``), and at least 64 MiB. A string or integer is parsed by
    :func:`parse_memory`.
    """
    if max_memory is not None:
        return parse_memory(max_memory)
    local = max(int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1), 1)
    return max(_available_bytes() // 4 // local, MIN_MEMORY)


@contextlib.contextmanager
def shared_directory(parent: str | Path | None = None) -> Iterator[Path]:
    """A fresh temporary folder, the same on every rank (rank 0 creates it and tells the
    others), removed when the block ends (after every rank is done with it).

    Args:
        parent: where to create it (default the system's temporary folder, ``$TMPDIR``).
    """
    info = dist_info()
    made: list[Any] = [None]
    if info.rank == 0:
        if parent is not None:
            Path(parent).mkdir(parents=True, exist_ok=True)
        made[0] = tempfile.mkdtemp(prefix="mechlingo-shards-", dir=parent)
    if is_distributed():
        dist.broadcast_object_list(made, src=0)
    path = Path(made[0])
    try:
        yield path
    finally:
        barrier()
        if info.rank == 0:
            shutil.rmtree(path, ignore_errors=True)


class ShardWriter:
    """Streams pooled rows to feature-major float32 shards under a memory cap.

    Rows are appended with :meth:`add` (any order; each with its sentence index and language
    index) into a buffer of at most ``max_memory // 4`` bytes; a full buffer is transposed and
    written as one shard. :meth:`close` writes the last partial shard. Memory does not grow
    with the number of rows.

    Args:
        directory: the shard folder (created if missing).
        n_features: features per row.
        max_memory: the cap in bytes (see :func:`memory_budget`); the buffer takes a quarter.
        prefix: the shard names' prefix (default ``r{rank}``, so ranks never collide).
    """

    def __init__(
        self, directory: str | Path, n_features: int, max_memory: int, prefix: str | None = None
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.n_features = int(n_features)
        self.max_memory = int(max_memory)
        self.rows_per_shard = max(1, int(max_memory) // 4 // (4 * self.n_features))
        self.prefix = prefix or f"r{dist_info().rank:05d}"
        self._buf = np.empty((self.rows_per_shard, self.n_features), dtype=np.float32)
        self._ids = np.empty((self.rows_per_shard, 2), dtype=np.int64)
        self._fill = 0
        self.n_shards = 0
        self.n_rows = 0

    def add(
        self,
        rows: Float[Tensor, "row feature"],
        row_ids: Int[Tensor, " row"],
        lang_ids: Int[Tensor, " row"],
    ) -> None:
        """Append pooled rows with their sentence and language indices."""
        values = rows.detach().to("cpu", torch.float32).numpy()
        if values.ndim != 2 or values.shape[1] != self.n_features:
            raise DataError(
                f"rows of {self.n_features} features expected, got shape {values.shape}"
            )
        ids = np.stack([row_ids.cpu().numpy(), lang_ids.cpu().numpy()], axis=1)
        i = 0
        while i < values.shape[0]:
            take = min(values.shape[0] - i, self.rows_per_shard - self._fill)
            self._buf[self._fill : self._fill + take] = values[i : i + take]
            self._ids[self._fill : self._fill + take] = ids[i : i + take]
            self._fill += take
            i += take
            if self._fill == self.rows_per_shard:
                self._flush()

    def _flush(self) -> None:
        if self._fill == 0:
            return
        stem = self.directory / f"{self.prefix}-{self.n_shards:06d}"
        with atomic_file(stem.with_suffix(".rows.npy")) as tmp, open(tmp, "wb") as f:
            np.save(f, self._ids[: self._fill].copy())
        # the .f32 file last: a shard is complete or absent
        with atomic_file(stem.with_suffix(".f32")) as tmp, open(tmp, "wb") as f:
            # feature-major: one feature's rows of this shard are contiguous on disk
            for j0 in range(0, self.n_features, 4096):
                block = self._buf[: self._fill, j0 : j0 + 4096]
                f.write(np.ascontiguousarray(block.T).astype("<f4", copy=False).tobytes())
        self.n_rows += self._fill
        self.n_shards += 1
        self._fill = 0

    def close(self) -> None:
        """Write the last partial shard and free the buffer."""
        self._flush()
        self._buf = np.empty((0, self.n_features), dtype=np.float32)


class PooledShards:
    """The pooled ``[n_sentences, n_features]`` float32 matrix kept in the shards of a folder.

    It stands in for the in-memory ``NeuronStats.pooled`` tensor: ``shape``, ``device`` (CPU)
    and ``shards[:, features]`` (the columns of ``features``, rows in sentence order) behave as
    on the tensor; :meth:`blocks` reads every neuron once, a block at a time, for the scores.

    Args:
        directory: the folder the :class:`ShardWriter` (s) wrote (every rank's shards).
        n_features: features per row.

    Raises:
        DataError: no shard, a shard of the wrong size, or sentence indices that are not
            ``0..n-1`` exactly once.
    """

    def __init__(self, directory: str | Path, n_features: int) -> None:
        self.directory = Path(directory)
        self.n_features = int(n_features)
        stems = sorted(p.with_suffix("").with_suffix("") for p in self.directory.glob("*.rows.npy"))
        self._stems = [s for s in stems if s.with_suffix(".f32").is_file()]
        ids = [np.load(s.with_suffix(".rows.npy")) for s in self._stems]
        self._counts = [int(x.shape[0]) for x in ids]
        for s, n in zip(self._stems, self._counts, strict=True):
            size = s.with_suffix(".f32").stat().st_size
            if size != 4 * n * self.n_features:
                raise DataError(
                    f"shard {s.name} holds {size} bytes, expected {4 * n * self.n_features} "
                    f"({n} rows x {self.n_features} features): a shard was cut short",
                    fix="rerun the statistics into a fresh folder",
                )
        both = np.concatenate(ids) if ids else np.zeros((0, 2), dtype=np.int64)
        self.storage_row_ids = torch.from_numpy(both[:, 0].copy())
        self.storage_lang_ids = torch.from_numpy(both[:, 1].copy())
        n = int(both.shape[0])
        if n == 0:
            raise DataError(f"no pooled shards in {self.directory}")
        if not torch.equal(torch.sort(self.storage_row_ids).values, torch.arange(n)):
            raise DataError(
                f"the shards in {self.directory} do not hold sentences 0..{n - 1} exactly once",
                fix="write each run's shards into a fresh folder",
            )
        #: position in storage order of each sentence
        self._where = torch.empty(n, dtype=torch.long)
        self._where[self.storage_row_ids] = torch.arange(n)
        self.lang_ids = self.storage_lang_ids[self._where]

    @property
    def n_shards(self) -> int:
        return len(self._stems)

    @property
    def shape(self) -> torch.Size:
        return torch.Size([int(self.storage_row_ids.numel()), self.n_features])

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def nbytes(self) -> int:
        return 4 * self.shape[0] * self.n_features

    def block_width(self, max_memory: int, bytes_per_element: int = 16) -> int:
        """Features per block so that one block and the scores' working memory
        (``bytes_per_element`` per sentence and feature) stay within ``max_memory``."""
        return max(1, min(self.n_features, max_memory // (bytes_per_element * self.shape[0])))

    def read_block(self, j0: int, j1: int) -> Float[Tensor, "feature sentence"]:
        """Features ``j0..j1-1`` of every sentence, feature-major ``[j1 - j0, n]``, columns in
        storage order (:attr:`storage_lang_ids` labels them): one read per shard."""
        if not 0 <= j0 < j1 <= self.n_features:
            raise DataError(f"feature block {j0}:{j1} is outside 0:{self.n_features}")
        c = j1 - j0
        out = np.empty((c, self.shape[0]), dtype=np.float32)
        col = 0
        for stem, rows in zip(self._stems, self._counts, strict=True):
            part = np.empty((c, rows), dtype=np.float32)
            with open(stem.with_suffix(".f32"), "rb") as f:
                f.seek(4 * j0 * rows)
                if f.readinto(memoryview(part).cast("B")) != part.nbytes:  # type: ignore[arg-type]
                    raise DataError(f"shard {stem.name} ended early", fix="rerun the statistics")
            out[:, col : col + rows] = part
            col += rows
        return torch.from_numpy(out)

    def blocks(
        self, width: int, start: int = 0, stop: int | None = None
    ) -> Iterator[tuple[int, int, Float[Tensor, "feature sentence"]]]:
        """``(j0, j1, block)`` for consecutive feature blocks of ``width`` in ``start..stop``
        (see :meth:`read_block`)."""
        stop = self.n_features if stop is None else stop
        for j0 in range(start, stop, max(1, width)):
            j1 = min(j0 + width, stop)
            yield j0, j1, self.read_block(j0, j1)

    def columns(self, features: Int[Tensor, " k"] | Sequence[int]) -> Float[Tensor, "row k"]:
        """``[n_sentences, k]``: the pooled values of ``features``, rows in sentence order."""
        feats = torch.as_tensor(features, dtype=torch.long).cpu().flatten()
        if feats.numel() and (int(feats.min()) < 0 or int(feats.max()) >= self.n_features):
            raise DataError(f"feature indices must be in [0, {self.n_features})")
        order = np.argsort(feats.numpy(), kind="stable")
        sorted_f = feats.numpy()[order]
        out = np.empty((feats.numel(), self.shape[0]), dtype=np.float32)
        col = 0
        for stem, rows in zip(self._stems, self._counts, strict=True):
            mm = np.memmap(stem.with_suffix(".f32"), dtype="<f4", mode="r")
            out[order, col : col + rows] = mm.reshape(self.n_features, rows)[sorted_f]
            del mm
            col += rows
        return torch.from_numpy(out).T[self._where]

    def __getitem__(self, key: Any) -> Tensor:
        if not (isinstance(key, tuple) and len(key) == 2 and key[0] == slice(None)):
            raise InputError(
                "pooled activations on disk are read by columns only: shards[:, features]"
            )
        cols = key[1]
        if isinstance(cols, slice):
            cols = range(*cols.indices(self.n_features))
        return self.columns(cols)

    def to_tensor(self) -> Float[Tensor, "row feature"]:
        """The whole matrix in memory, rows in sentence order (small data and tests only)."""
        return self.read_block(0, self.n_features).T[self._where].contiguous()

    def __repr__(self) -> str:
        return (
            f"PooledShards({self.shape[0]} sentences x {self.n_features} features, "
            f"{len(self._stems)} shards in {self.directory})"
        )


def shard_scores(
    pooled: PooledShards,
    n_langs: int,
    max_memory: int | str | None = None,
    *,
    width: int | None = None,
) -> tuple[Float[Tensor, "lang feature"], Float[Tensor, "lang feature"]]:
    """AUROC and average precision of every neuron for every language against the others,
    read from disk one block of neurons at a time under ``max_memory``.

    Each block ``[width, n_sentences]`` is scored by the same kernel as the in-memory path
    (:func:`mechlingo.kernels.grouped.grouped_auroc_and_average_precision`; a feature's
    scores do not depend on the other features of its block), so the scores are equal to it exactly. The
    block width is the cap over 8 bytes per sentence (the block and the kernel's working
    memory), or ``width`` when given. Under ``torchrun`` every rank scores a contiguous share of the neurons and the
    shares are gathered, so every rank returns all scores.

    Returns:
        ``(auroc, ap)``, each float64 ``[n_langs, n_features]`` on the CPU.
    """
    if width is None:
        width = pooled.block_width(memory_budget(max_memory), bytes_per_element=8)
    mine = shard_bounds(pooled.n_features)
    out = torch.empty(mine.stop - mine.start, 2 * n_langs, dtype=torch.float64)
    for j0, j1, block in pooled.blocks(width, mine.start, mine.stop):
        rows = block.T  # [n_sentences, width] view: the kernel copies small tiles of it
        a, p = grouped_auroc_and_average_precision(rows, pooled.storage_lang_ids, n_langs)
        out[j0 - mine.start : j1 - mine.start, :n_langs] = a.T
        out[j0 - mine.start : j1 - mine.start, n_langs:] = p.T
        del block, rows
    full = all_gather_rows(out).T
    return full[:n_langs].contiguous(), full[n_langs:].contiguous()
