"""AUROC and average precision of every feature for every group at once, from one sort.

Expert neurons are scored one language against the rest for every language
(:func:`mechlingo.analyses.experts.score_neurons`). The order of a neuron's samples does not
depend on the language, so :func:`grouped_auroc_and_average_precision` sorts each feature
once (an int64 key: the float's order-preserving bits high, the sample index low), sorts the
sorted samples' groups again, stably (every group's sorted positions in a fixed column range),
and reads every group's counts off that order. The values are those of
:mod:`mechlingo.kernels.ranking`: AUROC identical, AP equal up to the order of a float64 sum
(~1e-16). On accelerators the one-group kernel runs once per group. The counting identities:
``docs/methods/expert-neurons.md``."""

from __future__ import annotations

import numpy as np
import torch
from jaxtyping import Float, Int, Real
from torch import Tensor

from mechlingo.core.errors import InputError
from mechlingo.kernels.ranking import auroc_and_average_precision

__all__ = ["grouped_auroc_and_average_precision"]

# Elements (samples x features) per block on CPU: ~45 bytes each of working memory (~12 MB).
_BLOCK_ELEMENTS = 1 << 18


def _check(scores: Tensor, groups: Tensor, n_groups: int) -> tuple[Tensor, np.ndarray]:
    if not isinstance(scores, Tensor) or scores.ndim != 2:
        raise InputError("scores must be a 2-D tensor [n_samples, n_features]")
    if groups.ndim != 1 or groups.shape[0] != scores.shape[0]:
        raise InputError(
            f"groups must be 1-D with one entry per row of scores: scores {tuple(scores.shape)}, "
            f"groups {tuple(groups.shape)}"
        )
    g = groups.to("cpu", torch.int64)
    if g.numel() and (int(g.min()) < 0 or int(g.max()) >= n_groups):
        raise InputError(f"group indices must be in [0, {n_groups})")
    counts = torch.bincount(g, minlength=n_groups).numpy()
    bad = [i for i in range(n_groups) if counts[i] == 0 or counts[i] == g.numel()]
    if bad:
        raise InputError(
            f"group(s) {bad} have no samples or all of them: one group against the rest is "
            "undefined; every group needs samples, and so do the others"
        )
    if scores.is_floating_point() and bool(torch.isnan(scores).any()):
        raise InputError("scores contain NaN; the ranking is undefined")
    return g, counts


def _sorted_order(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted value keys ``[c, n]`` (int64) and the sample index at each sorted position."""
    c, n = x.shape
    bits = (x + np.float32(0.0)).view(np.int32)  # -0.0 + 0.0 = +0.0
    key = (bits ^ ((bits >> 31) & 0x7FFFFFFF)).astype(np.int64)
    key <<= 32
    key |= np.arange(n, dtype=np.int64)
    key.sort(axis=-1)
    idx = key & 0xFFFFFFFF
    key >>= 32
    return key, idx


def _block(
    x: np.ndarray, g: np.ndarray, counts: np.ndarray, offsets: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(auroc, ap)`` ``[n_groups, c]`` of one block ``x`` ``[c, n]`` float32."""
    c, n = x.shape
    vkey, idx = _sorted_order(x)
    small = np.int8 if counts.size < 128 else np.int16
    gs = g.astype(small)[idx]
    pos = np.argsort(gs, axis=-1, kind="stable")  # per group, its sorted positions, ascending
    del gs, idx
    col_group = np.repeat(np.arange(counts.size), counts)
    k = np.arange(n) - offsets[col_group]  # rank of each sample within its group
    n_own = counts[col_group].astype(np.int64)
    # default (no ties): #own < v = k, first(v) = p, #others < v = #others <= v = p - k
    own_lt = np.broadcast_to(k, (c, n)).copy()
    first = pos.copy()
    others2 = 2 * (pos - k)
    same = vkey[:, 1:] == vkey[:, :-1]
    tied = same.any(axis=1).nonzero()[0]
    if tied.size:
        own_lt[tied], first[tied], others2[tied] = _tied_rows(
            vkey[tied], same[tied], pos[tied], col_group, offsets
        )
    s = np.add.reduceat(others2, offsets, axis=1)
    au = s.astype(np.float64) / (2.0 * counts * (n - counts)).astype(np.float64)
    precision = (n_own - own_lt).astype(np.float64) / (n - first).astype(np.float64)
    ap = np.add.reduceat(precision, offsets, axis=1) / counts
    return au.T, ap.T


def _tied_rows(
    vkey: np.ndarray, same: np.ndarray, pos: np.ndarray, col_group: np.ndarray, offsets: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``#own < v``, ``first(v)`` and ``#others < v + #others <= v`` for rows with ties."""
    r, n = vkey.shape
    ar = np.arange(n)
    start = np.ones((r, n), dtype=bool)
    start[:, 1:] = ~same
    end = np.ones((r, n), dtype=bool)
    end[:, :-1] = ~same
    first_at = np.maximum.accumulate(np.where(start, ar, 0), axis=1)
    last_at = np.minimum.accumulate(np.where(end, ar, n)[:, ::-1], axis=1)[:, ::-1]
    first = np.take_along_axis(first_at, pos, axis=1)
    last = np.take_along_axis(last_at, pos, axis=1)
    # positions made ascending over the whole row: group g's segment shifted by g * n
    shift = col_group.astype(np.int64) * n
    q = torch.from_numpy(pos + shift)
    lt = torch.searchsorted(q, torch.from_numpy(first + shift), side="left").numpy()
    le = torch.searchsorted(q, torch.from_numpy(last + shift), side="right").numpy()
    own_lt = lt - offsets[col_group]
    own_le = le - offsets[col_group]
    others2 = (first - own_lt) + (last + 1 - own_le)
    return own_lt, first, others2


def grouped_auroc_and_average_precision(
    scores: Real[Tensor, "n_samples n_features"],
    groups: Int[Tensor, " n_samples"],
    n_groups: int,
) -> tuple[Float[Tensor, "group feature"], Float[Tensor, "group feature"]]:
    """AUROC and average precision of every feature (column) for every group against the
    rest, ``[n_groups, n_features]`` each, from one sort of each feature's samples.

    Row ``i`` of the results equals
    ``auroc_and_average_precision(scores, groups == i)`` (AUROC exactly, AP to ~1e-16): 1.0
    = the feature is higher on every sample of the group than on any other, 0.5 = no
    separation. Floats of up to 32 bits are sorted by their bit pattern; other dtypes and
    accelerators use the one-group kernel once per group.

    Raises:
        InputError: shapes, NaN scores, group indices out of range, or a group with no
            samples (or with all of them).
    """
    g, counts = _check(scores, groups, n_groups)
    if scores.device.type != "cpu" or scores.dtype not in (
        torch.float32,
        torch.float16,
        torch.bfloat16,
    ):
        pairs = [auroc_and_average_precision(scores, groups.to(scores.device) == i)
                 for i in range(n_groups)]  # fmt: skip
        return torch.stack([a for a, _ in pairs]), torch.stack([p for _, p in pairs])
    n, f = scores.shape
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    gn = g.numpy()
    width = max(1, min(f, _BLOCK_ELEMENTS // max(n, 1)))
    au = np.empty((n_groups, f), dtype=np.float64)
    ap = np.empty((n_groups, f), dtype=np.float64)
    for j0 in range(0, f, width):
        j1 = min(j0 + width, f)
        # copy the column slice row-contiguous first, then transpose the small copy
        x = scores[:, j0:j1].contiguous().T.to(torch.float32).contiguous().numpy()
        au[:, j0:j1], ap[:, j0:j1] = _block(x, gn, counts, offsets)
    return torch.from_numpy(au), torch.from_numpy(ap)
