"""Distributed statistics over several processes (``torchrun``), CPU or GPU.

Launch a script that uses these helpers with ``torchrun --nproc_per_node N script.py``;
:func:`process_group` turns ``torchrun``'s environment into a process group (``nccl`` with
CUDA, ``gloo`` otherwise). Without ``torchrun`` every helper is the one-process computation,
so a script needs no separate code path. mechlingo's statistics are sums (streaming means,
pooled activations and firing counts), so data parallelism is exact up to float rounding:

* :func:`shard_bounds` / :func:`shard` -- this rank's contiguous share of the data;
* :func:`all_reduce_state` -- sums of a state dict over all ranks;
* :func:`all_gather_rows` -- rows of every rank, in rank order;
* :func:`sharded_scoring` -- scoring passes shared out among the ranks, gathered in order.

Each returns the global result on every rank; write artifacts only where :func:`is_main`.
Usage: ``docs/scaling.md`` ("Several processes")."""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import torch
import torch.distributed as dist
from jaxtyping import Shaped
from torch import Tensor

from mechlingo.core.errors import MechlingoError

T = TypeVar("T")
U = TypeVar("U")

__all__ = [
    "DistInfo",
    "DistributedError",
    "all_gather_rows",
    "all_reduce_state",
    "barrier",
    "dist_info",
    "gather_lists",
    "is_distributed",
    "is_main",
    "process_group",
    "map_sharded",
    "scoring_sharded",
    "shard",
    "shard_bounds",
    "shard_by_cost",
    "share_scoring",
    "sharded_scoring",
]


class DistributedError(MechlingoError, RuntimeError):
    """The distributed environment is inconsistent (bad env variables, mismatched shapes)."""


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands.

    Attributes:
        rank: global index of this process (0 in a single process).
        world_size: number of processes (1 in a single process).
        local_rank: index on this machine (selects the CUDA device under ``nccl``).
        backend: ``"nccl"``, ``"gloo"``, or ``None`` when no process group is in use.
        device: the device this rank computes on (``cuda:{local_rank}`` or ``cpu``).
    """

    rank: int
    world_size: int
    local_rank: int
    backend: str | None
    device: torch.device


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError as err:
        raise DistributedError(f"environment variable {name}={raw!r} is not an integer") from err


def is_distributed() -> bool:
    """Whether a process group is initialised with more than one process."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def dist_info() -> DistInfo:
    """This process's rank, world size and device, from the live process group or, before one
    exists, from the ``torchrun`` environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``)."""
    if dist.is_available() and dist.is_initialized():
        rank, world, backend = dist.get_rank(), dist.get_world_size(), dist.get_backend()
    else:
        rank, world, backend = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1), None
    local = _env_int("LOCAL_RANK", rank)
    use_cuda = torch.cuda.is_available() and backend != "gloo"
    device = torch.device("cuda", local % torch.cuda.device_count()) if use_cuda else None
    return DistInfo(rank, world, local, backend, device or torch.device("cpu"))


def is_main() -> bool:
    """True on rank 0 (and in a single process): the rank that writes files and prints."""
    return dist_info().rank == 0


@contextlib.contextmanager
def process_group(
    backend: Literal["gloo", "nccl"] | None = None,
    *,
    timeout_s: float = 1800.0,
) -> Iterator[DistInfo]:
    """Initialise the process group from the ``torchrun`` environment for the block's
    duration, and destroy it afterwards (also after an exception).

    Without ``torchrun`` (no ``WORLD_SIZE`` or ``WORLD_SIZE=1``) nothing is initialised and
    the block runs as a single process. A group that already exists is used as it is and left
    alone.

    Args:
        backend: default ``"nccl"`` when CUDA is available, else ``"gloo"``.
        timeout_s: how long a collective waits for the other ranks before failing.

    Yields:
        :class:`DistInfo` of this process. Under ``nccl`` the current CUDA device is set to
        ``cuda:{LOCAL_RANK}``; load the model on ``info.device``.
    """
    if dist.is_available() and dist.is_initialized():
        yield dist_info()
        return
    world = _env_int("WORLD_SIZE", 1)
    if world <= 1:
        yield dist_info()
        return
    if not dist.is_available():
        raise DistributedError("this torch build has no torch.distributed support")
    missing = [v for v in ("RANK", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
    if missing:
        raise DistributedError(
            f"WORLD_SIZE={world} but {missing} are not set: launch with torchrun "
            "(torchrun --nproc_per_node N script.py), which sets them"
        )
    chosen = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if chosen == "nccl":
        if not torch.cuda.is_available():
            raise DistributedError("backend 'nccl' needs CUDA; use 'gloo' on CPU")
        torch.cuda.set_device(_env_int("LOCAL_RANK", 0) % torch.cuda.device_count())
    dist.init_process_group(
        backend=chosen, init_method="env://", timeout=datetime.timedelta(seconds=timeout_s)
    )
    try:
        yield dist_info()
    finally:
        dist.destroy_process_group()


# --------------------------------------------------------------------------------------
# Sharding and collectives
# --------------------------------------------------------------------------------------


def barrier() -> None:
    """Wait until every rank gets here (nothing in a single process)."""
    if is_distributed():
        dist.barrier()


def shard_bounds(n: int, rank: int | None = None, world_size: int | None = None) -> range:
    """The contiguous index range of ``n`` items that ``rank`` owns: balanced (sizes differ by
    at most one), covering ``0..n`` exactly once over all ranks, in rank order, so gathering
    per-rank results in rank order restores the original order."""
    if rank is None or world_size is None:
        info = dist_info()
        rank = info.rank if rank is None else rank
        world_size = info.world_size if world_size is None else world_size
    r, w = int(rank), int(world_size)
    if n < 0 or w < 1 or not 0 <= r < w:
        raise DistributedError(f"rank {r} is not in a world of size {w}")
    return range(r * n // w, (r + 1) * n // w)


def shard(items: Sequence[T], rank: int | None = None, world_size: int | None = None) -> list[T]:
    """This rank's contiguous slice of ``items`` (see :func:`shard_bounds`); all items in a
    single process. A rank may get an empty slice when there are fewer items than ranks."""
    bounds = shard_bounds(len(items), rank, world_size)
    return list(items[bounds.start : bounds.stop])


def shard_by_cost(
    costs: Sequence[float], rank: int | None = None, world_size: int | None = None
) -> list[int]:
    """The indices of the items that ``rank`` owns when items of unequal cost are shared out:
    the costliest first, each to the rank with the least cost so far (ties: the lower rank,
    then the lower index), so every rank computes the same assignment and the ranks' totals
    differ by at most one item's cost. The indices come back in increasing order; all of them
    in a single process. Use it where the results are gathered by index, not by position."""
    if rank is None or world_size is None:
        info = dist_info()
        rank = info.rank if rank is None else rank
        world_size = info.world_size if world_size is None else world_size
    r, w = int(rank), int(world_size)
    if w < 1 or not 0 <= r < w:
        raise DistributedError(f"rank {r} is not in a world of size {w}")
    load = [0.0] * w
    mine: list[int] = []
    for i in sorted(range(len(costs)), key=lambda i: (-float(costs[i]), i)):
        owner = min(range(w), key=lambda j: (load[j], j))
        load[owner] += float(costs[i])
        if owner == r:
            mine.append(i)
    return sorted(mine)


def _comm_device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_state(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Sum every tensor of an accumulator state over all ranks.

    Use with the ``state_dict()`` of :class:`~mechlingo.kernels.streaming.StreamingMean`
    (``sum``, ``count``) or :class:`~mechlingo.kernels.streaming.ActivationProbability`
    (``active``, ``tokens``): their entries are sums, so the SUM of the states is the state
    of one accumulator fed every rank's data. Rebuild with ``from_state``.

    Returns:
        A new dict with the summed tensors (same dtypes and devices as the input); the input
        is not modified. In a single process, copies of the input.

    Raises:
        DistributedError: the ranks hold different keys or shapes.
    """
    out = {k: v.detach().clone() for k, v in state.items()}
    if not is_distributed():
        return out
    keys = sorted(out)
    desc = [(k, tuple(out[k].shape), str(out[k].dtype)) for k in keys]
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, desc)
    if any(d != desc for d in everyone):
        raise DistributedError(
            f"ranks hold different accumulator states: {everyone}; preallocate accumulators "
            "with the same shape on every rank (e.g. StreamingMean(shape=...))"
        )
    comm = _comm_device()
    for k in keys:
        t = out[k].to(comm)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        out[k] = t.to(out[k].device)
    return out


def all_gather_rows(tensor: Shaped[Tensor, "rows ..."]) -> Shaped[Tensor, "all_rows ..."]:
    """Concatenate every rank's rows in rank order (ranks may hold different row counts,
    including zero): row counts are gathered first, rows are padded to the largest count for
    the collective, and the padding is dropped.

    Returns:
        ``[sum of rows over ranks, *feature]`` on the input's device; the input itself in a
        single process.

    Raises:
        DistributedError: ranks disagree on the trailing shape or the dtype.
    """
    if not is_distributed():
        return tensor
    world = dist.get_world_size()
    meta = (tuple(tensor.shape[1:]), str(tensor.dtype))
    metas: list[Any] = [None] * world
    dist.all_gather_object(metas, meta)
    if any(m != meta for m in metas):
        raise DistributedError(f"ranks gather tensors of different feature shapes/dtypes: {metas}")
    comm = _comm_device()
    n = torch.tensor([tensor.shape[0]], dtype=torch.int64, device=comm)
    counts = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(counts, n)
    sizes = [int(c) for c in counts]  # one host sync per call, not per row
    most = max(sizes)
    padded = torch.zeros((most, *tensor.shape[1:]), dtype=tensor.dtype, device=comm)
    padded[: tensor.shape[0]] = tensor.to(comm)
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    return torch.cat([p[:s] for p, s in zip(parts, sizes, strict=True)]).to(tensor.device)


# --------------------------------------------------------------------------------------
# Building blocks: last-token means and pooled neuron activations
# --------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------
# Scoring sharded by item
# --------------------------------------------------------------------------------------

_SHARDED_SCORING: ContextVar[bool] = ContextVar("mechlingo_sharded_scoring", default=False)


@contextlib.contextmanager
def sharded_scoring(enabled: bool = True) -> Iterator[None]:
    """Inside the block, under ``torchrun`` with more than one process, mechlingo's scoring
    (greedy generation, :func:`mechlingo.scoring.evaluate.evaluate_conditions`, candidate
    ranking) gives each rank a contiguous share of its batches and gathers the per-item
    outcomes back in order on every rank, so every rank holds the whole result and goes on
    identically. Every rank must make the same scoring calls with the same inputs (as
    ``steer eval`` does); in a single process it changes nothing."""
    token = _SHARDED_SCORING.set(bool(enabled))
    try:
        yield
    finally:
        _SHARDED_SCORING.reset(token)


def scoring_sharded() -> bool:
    """Whether scoring is sharded across ranks now (inside :func:`sharded_scoring` with a
    process group of more than one process)."""
    return _SHARDED_SCORING.get() and is_distributed()


def gather_lists(items: list[T]) -> list[T]:
    """Every rank's ``items`` (picklable) concatenated in rank order, on every rank; the
    list itself in a single process."""
    if not is_distributed():
        return items
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, items)
    return [x for part in parts for x in part]


def map_sharded(
    fn: Callable[[T], U], items: Sequence[T], costs: Sequence[float] | None = None
) -> list[U]:
    """``[fn(x) for x in items]``, in order, with the items shared out among the ranks inside
    :func:`sharded_scoring` under torchrun (by :func:`shard_by_cost` when ``costs`` are given,
    else in equal contiguous parts) and the results (picklable) gathered on every rank. Every
    rank must call it with the same items; in a single process it is the plain loop."""
    items = list(items)
    if not scoring_sharded():
        return [fn(x) for x in items]
    idx = shard_by_cost(costs) if costs is not None else list(shard_bounds(len(items)))
    with sharded_scoring(False):  # each rank's own items: no collective inside fn
        mine = [(i, fn(items[i])) for i in idx]
    got = dict(gather_lists(mine))
    return [got[i] for i in range(len(items))]


def share_scoring(costs: Sequence[float], n_conditions: int) -> tuple[list[int], list[int]]:
    """This rank's share of a scoring call of passes (``costs``, one per pass) under
    ``n_conditions`` conditions: ``(passes, conditions)`` to run. Outside
    :func:`sharded_scoring` (or in one process) everything. With at least as many passes as
    ranks, the passes by :func:`shard_by_cost` under every condition (each pass exactly as in
    one process); with fewer passes than ranks (a dev screen of a few items under many
    settings) every pass under an equal contiguous share of the conditions, so no rank waits
    while another scores the whole call."""
    everything = (list(range(len(costs))), list(range(n_conditions)))
    if not scoring_sharded():
        return everything
    if len(costs) < dist_info().world_size and n_conditions > 1:
        return everything[0], list(shard_bounds(n_conditions))
    return shard_by_cost(costs), everything[1]


def gather_conditions(
    local: Mapping[int, list[T]], n_conditions: int, by_condition: bool
) -> list[list[T]]:
    """Each condition's gathered list after :func:`share_scoring`: ``local`` holds this rank's
    per-condition items; ``by_condition`` says that the conditions were shared out (each
    rank holds whole lists of its conditions), else the passes were (each rank holds its
    items of every condition, concatenated in rank order). Outside sharding, ``local`` itself."""
    if not scoring_sharded():
        return [local[c] for c in range(n_conditions)]
    if by_condition:
        got = dict(gather_lists(list(local.items())))
        return [got[c] for c in range(n_conditions)]
    return [gather_lists(local[c]) for c in range(n_conditions)]
