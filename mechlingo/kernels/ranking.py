"""Pure-torch rank metrics for neuron-level analyses: separation scores of every feature
(column) at once, language specificity, and the selection of the best features.

* :func:`auroc`, :func:`average_precision` and :func:`auroc_and_average_precision` (both
  from one sort) -- equal to scikit-learn's, ties included;
* :func:`lape` -- language activation probability entropy (Tang et al. 2024), from
  :class:`mechlingo.kernels.streaming.ActivationProbability`;
* :func:`top_k_per_language`, :func:`feature_mean`, :func:`feature_median` -- the best ``k``
  features of each language and the per-feature mean or median over a subset of rows (the
  value an expert neuron is clamped to).

Tensors only, on the inputs' device. Three kernels count the same pairs exactly: sorted
halves and binary search on CPU (:func:`_host_sorted`), one int64-key sort on accelerators
(:func:`_device_statistics`), binary search for float64/int64 (:func:`_rank_statistics`).
Exactness and speed: ``docs/methods/expert-neurons.md``."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from jaxtyping import Bool, Float, Int, Real
from torch import Tensor

from mechlingo.core.errors import InputError

__all__ = [
    "auroc",
    "auroc_and_average_precision",
    "average_precision",
    "feature_mean",
    "feature_median",
    "lape",
    "top_k_per_language",
]

# Elements (n_samples * features) processed at once by the rank kernels when ``chunk_size`` is
# not given. Peak extra memory on CPU is roughly 12 bytes per element (the gathered block,
# its sorted float32 copy, search results for the positives): ~12 MB (the size was timed:
# docs/benchmarks.md); on accelerators about 40 bytes per
# element (int64 sort keys and working arrays), ~320 MB, where larger blocks amortise kernel
# launches.
_DEFAULT_CHUNK_ELEMENTS = {"cpu": 1 << 20, "other": 1 << 23}

# dtypes whose values are exactly float32 or int32 values (the rows the CPU kernel sorts) and
# map order-preservingly into an int64 sort key with one spare low bit for the label (the
# accelerator kernel). float64 and int64 inputs use the binary-search kernel instead.
_KEY_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_KEY_INTS = (torch.uint8, torch.int8, torch.int16, torch.int32)


# --------------------------------------------------------------------------------------------
# input checks
# --------------------------------------------------------------------------------------------


def _nan_error(scores: Tensor) -> InputError:
    n_bad_cols = int(torch.isnan(scores).any(dim=0).sum())
    return InputError(
        f"scores contain NaN in {n_bad_cols} of {scores.shape[1]} features; the ranking is "
        "undefined. Check the activations (e.g. pooling over an all-padding row) or drop "
        "those columns"
    )


def _check_scores_labels(
    scores: Tensor, labels: Tensor, check_nan: bool = True
) -> tuple[Tensor, int, int]:
    """Validate inputs of the separation scores; return labels on the scores' device. With
    ``check_nan=False`` the caller checks for NaN itself (the host kernel reads it off its
    sorted rows, where NaN sorts last, instead of a pass over the whole input)."""
    if not isinstance(scores, Tensor) or not isinstance(labels, Tensor):
        raise TypeError(
            f"scores and labels must be torch tensors, got {type(scores).__name__} and "
            f"{type(labels).__name__}"
        )
    if scores.ndim != 2:
        raise InputError(
            f"scores must be 2-D [n_samples, n_features], got shape {tuple(scores.shape)}; "
            "for a single feature use scores[:, None]"
        )
    if labels.ndim != 1 or labels.shape[0] != scores.shape[0]:
        raise InputError(
            f"labels must be 1-D with one entry per row of scores: scores has shape "
            f"{tuple(scores.shape)}, labels has shape {tuple(labels.shape)}"
        )
    if scores.is_complex():
        raise InputError(f"scores must be real-valued, got dtype {scores.dtype}")
    labels = labels.to(scores.device)
    if labels.dtype != torch.bool:
        bad = ~((labels == 0) | (labels == 1))
        if bool(bad.any()):
            raise InputError(
                f"labels must be boolean (or 0/1 valued), got dtype {labels.dtype} with values "
                "other than 0 and 1; pass e.g. `labels == target_language_id`"
            )
        labels = labels != 0
    if check_nan and scores.is_floating_point() and bool(torch.isnan(scores).any()):
        raise _nan_error(scores)
    n_pos = int(labels.sum())
    n_neg = labels.shape[0] - n_pos
    if n_pos == 0:
        raise InputError(
            f"labels have no positives (all {labels.shape[0]} are False): the score is "
            "undefined. Include samples of the target class (e.g. sentences of the target "
            "language)"
        )
    if n_neg == 0:
        raise InputError(
            f"labels have no negatives (all {labels.shape[0]} are True): the score is "
            "undefined. Include samples of other classes (e.g. sentences of other languages)"
        )
    return labels, n_pos, n_neg


def _resolve_chunk(
    chunk_size: int | None, n_samples: int, n_features: int, device: torch.device
) -> int:
    if chunk_size is None:
        budget = _DEFAULT_CHUNK_ELEMENTS["cpu" if device.type == "cpu" else "other"]
        return max(1, min(n_features, budget // max(n_samples, 1)))
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise InputError(f"chunk_size must be a positive integer or None, got {chunk_size!r}")
    return chunk_size


# --------------------------------------------------------------------------------------------
# AUROC / average precision
# --------------------------------------------------------------------------------------------


def _sort_keys(block: Tensor, labels: Tensor) -> Tensor:
    """``[n_samples, c]`` scores -> ``[c, n_samples]`` int64 keys ``2 * key(value) + label``.

    ``key`` is an order-preserving integer image of the value (for floats, the IEEE-754 bit
    pattern with the negative half flipped, after ``+ 0.0`` so that -0.0 and 0.0 share a key),
    so sorting the keys sorts the values, and among equal values the negatives (label 0) come
    before the positives.
    """
    if block.dtype in _KEY_FLOATS:
        x = (block.T.to(torch.float32) + 0.0).contiguous()
        bits = x.view(torch.int32)
        key = (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(torch.int64)
    else:
        key = block.T.to(torch.int64).contiguous()
    return (key << 1) | labels.to(torch.int64)


_SORT_POOL: ThreadPoolExecutor | None = None
_SORT_POOL_LOCK = threading.Lock()


def _sort_pool(n_threads: int) -> ThreadPoolExecutor:
    global _SORT_POOL
    with _SORT_POOL_LOCK:
        if _SORT_POOL is None or _SORT_POOL._max_workers < n_threads:
            _SORT_POOL = ThreadPoolExecutor(n_threads, thread_name_prefix="mechlingo-sort")
        return _SORT_POOL


def _run_rows(work: Callable[[int, int], None], c: int, n: int) -> None:
    """``work(i0, i1)`` over the rows ``0 .. c`` of a block, split over
    ``torch.get_num_threads()`` threads (numpy's sorts release the GIL)."""
    n_threads = min(torch.get_num_threads(), c)
    if n_threads <= 1 or c * n < 1 << 15:
        work(0, c)
        return
    bounds = np.linspace(0, c, n_threads + 1).astype(int)
    pool = _sort_pool(n_threads)
    futures = [pool.submit(work, int(bounds[i]), int(bounds[i + 1])) for i in range(n_threads)]
    for f in futures:
        f.result()


def _host_sorted(block: Tensor, neg_idx: Tensor, pos_idx: Tensor) -> tuple[Tensor, Tensor]:
    """Each feature's negatives ``[c, n_neg]`` and positives ``[c, n_pos]``, one feature per
    row, each row sorted ascending (float32 for floats of up to 32 bits, int32 for integers of
    up to 32 bits: both exact images of the values, so ties are those of the input dtype).

    The rows are gathered from the row-contiguous samples (``index_select`` of the column
    slice, then a transposed copy of that small block, rather than transposing the strided
    slice, whose rows are far apart) and sorted by ``numpy``'s SIMD sorting networks (numpy
    >= 2, faster than ``torch.sort`` on the same rows; timings in ``docs/benchmarks.md``)."""
    dt = torch.float32 if block.dtype in _KEY_FLOATS else torch.int32
    c = block.shape[1]
    neg = torch.empty((c, neg_idx.numel()), dtype=dt)
    neg.copy_(block.index_select(0, neg_idx).T)
    pos = torch.empty((c, pos_idx.numel()), dtype=dt)
    pos.copy_(block.index_select(0, pos_idx).T)
    neg_np, pos_np = neg.numpy(), pos.numpy()

    def work(i0: int, i1: int) -> None:
        neg_np[i0:i1].sort(axis=-1)
        pos_np[i0:i1].sort(axis=-1)

    _run_rows(work, c, block.shape[0])
    return neg, pos


def _host_statistics(neg: Tensor, pos: Tensor) -> tuple[Tensor, Tensor]:
    """AUROC and AP of one block from its sorted negatives and positives (see
    :func:`_host_sorted`), with the counts of :func:`_negatives_below` and, for each positive
    ``v_k`` (the k-th, 0-based, ascending), ``#{positives < v_k}``: ``k`` unless ``v_k`` is
    tied with another positive (a binary search in those rows only)."""
    c, n_pos = pos.shape
    neg_lt, neg_le = _negatives_below(neg, pos)
    pos_lt = torch.arange(n_pos).expand(c, n_pos)
    tied = (pos[:, 1:] == pos[:, :-1]).any(dim=-1).nonzero().flatten()
    if tied.numel():
        pos_lt = pos_lt.clone()
        pos_lt[tied] = torch.searchsorted(pos[tied], pos[tied])
    return _auc_ap(neg_lt, neg_le, pos_lt, n_pos, neg.shape[1])


def _negatives_below(neg: Tensor, pos: Tensor) -> tuple[Tensor, Tensor]:
    """``#{negatives < v_k}`` and ``#{negatives <= v_k}`` ``[c, n_pos]`` for each sorted
    positive ``v_k``, by binary searches of the smaller side in the larger one.

    Fewer positives: ``#{negatives < v_k}`` is ``v_k``'s left insertion point among the
    negatives. Fewer negatives: each negative ``y`` is located among the positives, and since
    ``y < v_k`` iff ``k >= #{positives <= y}``, the counts are cumulative sums of a per-row
    histogram of those insertion points. The two counts differ only where a positive ties
    with a negative; the second search runs on those rows only (continuous activations: a
    few % of rows)."""
    n_neg, n_pos = neg.shape[1], pos.shape[1]
    if n_pos <= n_neg:
        lt = torch.searchsorted(neg, pos)
        # lt == n_neg reads the largest negative, which is then below v_k: no false tie
        tied = (neg.gather(1, lt.clamp(max=n_neg - 1)) == pos).any(dim=-1).nonzero().flatten()
        le = lt
        if tied.numel():
            le = lt.clone()
            le[tied] = torch.searchsorted(neg[tied], pos[tied], right=True)
        return lt, le
    up = torch.searchsorted(pos, neg, right=True)  # #{positives <= y}
    # up == 0 reads the smallest positive, which is then above y: no false tie
    tied = (pos.gather(1, (up - 1).clamp(min=0)) == neg).any(dim=-1).nonzero().flatten()
    lo = up
    if tied.numel():
        lo = up.clone()
        lo[tied] = torch.searchsorted(pos[tied], neg[tied])  # #{positives < y}
    lt = _count_at_most(up, n_pos)
    return lt, (lt if lo is up else _count_at_most(lo, n_pos))


def _count_at_most(r: Tensor, n_pos: int) -> Tensor:
    """``[c, n_pos]``: for each ``k``, how many entries of each row of ``r`` are ``<= k``."""
    hist = torch.zeros(r.shape[0], n_pos + 1, dtype=torch.int64, device=r.device)
    hist.scatter_add_(1, r, torch.ones_like(r))
    return hist[:, :n_pos].cumsum(dim=-1)


def _auc_ap(
    neg_lt: Tensor, neg_le: Tensor, pos_lt: Tensor, n_pos: int, n_neg: int
) -> tuple[Tensor, Tensor]:
    """AUROC and AP of each row from the exact counts of each positive ``v_k`` (``[c, n_pos]``,
    ascending): ``#{negatives < v_k}``, ``#{negatives <= v_k}`` and ``#{positives < v_k}``.

    AUROC (ties count one half) ``= sum_k (#neg < v_k + #neg <= v_k) / (2 n_pos n_neg)``; AP
    (one threshold ``score >= v`` per distinct value, as scikit-learn) ``= mean_k of
    (n_pos - #pos < v_k) / (n - #samples < v_k)``, the precision at each positive's own
    threshold. All counts are exact int64; only the final ratios are float64."""
    n = n_pos + n_neg
    auc = (neg_lt.sum(dim=-1) + neg_le.sum(dim=-1)).to(torch.float64) / (2.0 * n_pos * n_neg)
    precision = (n_pos - pos_lt).to(torch.float64) / (n - neg_lt - pos_lt).to(torch.float64)
    return auc, precision.sum(dim=-1) / n_pos


def _device_statistics(
    block: Tensor, labels: Tensor, n_pos: int, n_neg: int
) -> tuple[Tensor, Tensor]:
    """AUROC and AP of one block ``[n_samples, c]`` in torch alone, with no host round trip
    (the accelerator path): one sort of each feature's keys ``2 * key(value) + label`` (see
    :func:`_sort_keys`): by value, negatives before positives among equal values.

    For the k-th positive (0-based, ascending) at sorted position ``i_k`` with value ``v_k``,
    ``#{negatives <= v_k} = i_k - k``; the first position holding ``v_k`` is
    ``#{samples < v_k}`` and the first positive with that value ``#{positives < v_k}`` (two
    binary searches on every row), see :func:`_auc_ap`.
    """
    c, n = block.shape[1], block.shape[0]
    srt = torch.sort(_sort_keys(block, labels), dim=-1).values
    is_pos = srt & 1
    # exactly n_pos positives per row: the j-th goes to column j, negatives to a spare
    # column that is dropped (no data-dependent shape, so no host round trip)
    col = torch.where(is_pos.bool(), is_pos.cumsum(dim=-1) - 1, n_pos)
    where = torch.arange(n, device=srt.device).expand(c, n)
    pos_at = torch.zeros(c, n_pos + 1, dtype=torch.int64, device=srt.device)
    pos_at.scatter_(1, col, where)
    pos_at = pos_at[:, :n_pos]
    vals = srt.gather(1, pos_at) >> 1
    first = torch.searchsorted(srt, vals << 1, side="left")  # #samples < v_k
    pos_lt = torch.searchsorted(vals, vals, side="left")  # #positives < v_k
    k = torch.arange(n_pos, device=srt.device)
    return _auc_ap(first - pos_lt, pos_at - k, pos_lt, n_pos, n_neg)


def _rank_statistics(
    pos: Tensor, neg: Tensor, want_auroc: bool, want_ap: bool
) -> tuple[Tensor | None, Tensor | None]:
    """AUROC and/or AP for one block of features, given as ``pos`` [c, n_pos] (scores of the
    positive samples, one feature per row) and ``neg`` [c, n_neg]. Used for float64 and int64
    scores, which do not fit the float32 / int32 rows of :func:`_host_sorted` or the sort keys
    of :func:`_device_statistics`.

    The positives are sorted and every negative is located among them by binary search:
    ``r(y) = #{positives <= y}`` and ``l(y) = #{positives < y}``. Then, exactly:

    * AUROC. Pairs (positive, negative) where the negative is higher number ``sum l``, ties
      ``sum (r - l)``, so ``AUROC = 1 - (sum l + sum r) / (2 n_pos n_neg)``.
    * AP. One threshold "score >= v" per distinct value, as in scikit-learn; ``sum_k (R_k -
      R_{k-1}) P_k`` equals the mean over positives of the precision at their own value's
      threshold. For the k-th smallest positive ``v_k``: true positives ``TP = n_pos -
      #{positives < v_k}``, false positives ``FP = #{negatives >= v_k} = #{y : r(y) > k}``,
      read off a per-row histogram of ``r``.

    When positives outnumber negatives the roles are swapped for the binary search (sort the
    negatives, search the positives), which gives the same numbers.

    All counts are int64 and exact; only the final ratios are float64.
    """
    c, n_pos = pos.shape
    n_neg = neg.shape[1]
    auc = ap = None
    # positives sorted, and for each the number of positives strictly below its value.
    pos_sorted = torch.sort(pos, dim=-1).values
    pos_lt = torch.searchsorted(pos_sorted, pos_sorted, side="left")  # [c, n_pos]
    if n_pos <= n_neg:
        r = torch.searchsorted(pos_sorted, neg, side="right")  # [c, n_neg] in [0, n_pos]
        if want_auroc:
            # l = r - #(positives equal to y): the positive just below position r, if equal
            # to y, heads a tie run that starts at pos_lt of that position.
            prev = (r - 1).clamp_(min=0)
            tied = (r > 0) & (pos_sorted.gather(1, prev) == neg)
            l_ = torch.where(tied, pos_lt.gather(1, prev), r)
            s = l_.sum(dim=-1) + r.sum(dim=-1)
            auc = 1.0 - s.to(torch.float64) / (2.0 * n_pos * n_neg)
            del prev, tied, l_
        if want_ap:
            hist = torch.zeros(c, n_pos + 1, dtype=torch.int64, device=pos.device)
            hist.scatter_add_(1, r, torch.ones_like(r))
            # negatives with r(y) <= k, for k = 0 .. n_pos - 1
            neg_le = hist[:, :n_pos].cumsum(dim=-1)
            fp = n_neg - neg_le
    else:
        neg_sorted = torch.sort(neg, dim=-1).values
        nl = torch.searchsorted(neg_sorted, pos_sorted, side="left")  # negatives < v
        if want_auroc:
            nr = torch.searchsorted(neg_sorted, pos_sorted, side="right")  # negatives <= v
            s = nl.sum(dim=-1) + nr.sum(dim=-1)
            auc = s.to(torch.float64) / (2.0 * n_pos * n_neg)
        fp = n_neg - nl
    if want_ap:
        tp = (n_pos - pos_lt).to(torch.float64)
        precision = tp / (tp + fp.to(torch.float64))
        ap = precision.sum(dim=-1) / n_pos
    return auc, ap


def _chunked_scores(
    scores: Tensor,
    labels: Tensor,
    chunk_size: int | None,
    want_auroc: bool,
    want_ap: bool,
) -> tuple[Tensor, Tensor]:
    if scores.dtype == torch.bool:
        scores = scores.to(torch.uint8)
    use_keys = scores.dtype in _KEY_FLOATS + _KEY_INTS
    host = use_keys and scores.device.type == "cpu"
    labels, n_pos, n_neg = _check_scores_labels(scores, labels, check_nan=not host)
    n_samples, n_features = scores.shape
    chunk = _resolve_chunk(chunk_size, n_samples, n_features, scores.device)
    pos_idx = labels.nonzero().flatten()
    neg_idx = (~labels).nonzero().flatten()
    out_auc = torch.empty(n_features, dtype=torch.float64, device=scores.device)
    out_ap = torch.empty(n_features, dtype=torch.float64, device=scores.device)
    for j0 in range(0, n_features, chunk):
        j1 = min(j0 + chunk, n_features)
        block = scores[:, j0:j1]
        # one sort per feature gives both metrics; computing both costs no more than one
        if host:
            neg, pos = _host_sorted(block, neg_idx, pos_idx)
            if neg.is_floating_point() and bool(
                neg[:, -1].isnan().any() | pos[:, -1].isnan().any()
            ):
                raise _nan_error(scores)  # NaN sorts last
            out_auc[j0:j1], out_ap[j0:j1] = _host_statistics(neg, pos)
            continue
        if use_keys:
            out_auc[j0:j1], out_ap[j0:j1] = _device_statistics(block, labels, n_pos, n_neg)
            continue
        # one feature per row, contiguous along samples (what sort/searchsorted want)
        pos = block.index_select(0, pos_idx).T.contiguous()
        neg = block.index_select(0, neg_idx).T.contiguous()
        auc, ap = _rank_statistics(pos, neg, want_auroc, want_ap)
        del pos, neg
        if auc is not None:
            out_auc[j0:j1] = auc
        if ap is not None:
            out_ap[j0:j1] = ap
    return out_auc, out_ap


def auroc(
    scores: Real[Tensor, "n_samples n_features"] | Bool[Tensor, "n_samples n_features"],
    labels: Bool[Tensor, " n_samples"] | Int[Tensor, " n_samples"],
    chunk_size: int | None = None,
) -> Float[Tensor, " n_features"]:
    """Area under the ROC curve of every feature (column) as a detector of ``labels``.

    The value is the probability that a random positive sample has a higher score than a
    random negative one, ties counting one half (the Mann-Whitney U statistic with average
    ranks, divided by ``n_pos * n_neg``). AUROC 1.0: the feature is higher on every positive
    than on every negative; 0.5: no separation (a constant feature gives exactly 0.5); 0.0:
    higher on every negative. Equal to ``sklearn.metrics.roc_auc_score(labels, scores[:, j])``
    for every ``j`` (to float64 rounding, ties included).

    Args:
        scores: one row per sample, one column per feature (e.g. pooled neuron activations).
            Any real dtype; ties are judged on this dtype.
        labels: True for positives (e.g. sentences of the target language). 0/1 integer
            tensors are accepted too.
        chunk_size: features processed at once; memory is O(n_samples * chunk_size) (about
            12 bytes per element on CPU, 40 on GPU). Default: ~1M elements per block on CPU,
            ~8M on GPU. The result does not depend on it.

    Returns:
        float64 tensor [n_features] on ``scores.device``.

    Raises:
        ValueError: shape mismatch, NaN in ``scores``, or labels with no positives or no
            negatives.
    """
    return _chunked_scores(scores, labels, chunk_size, True, False)[0]


def average_precision(
    scores: Real[Tensor, "n_samples n_features"] | Bool[Tensor, "n_samples n_features"],
    labels: Bool[Tensor, " n_samples"] | Int[Tensor, " n_samples"],
    chunk_size: int | None = None,
) -> Float[Tensor, " n_features"]:
    """Average precision of every feature (column) as a detector of ``labels``.

    ``AP = sum_k (R_k - R_{k-1}) P_k`` over the thresholds "score >= t", one threshold per
    distinct score value (tied samples enter together), exactly as
    ``sklearn.metrics.average_precision_score``. AP 1.0: every positive scores above every
    negative; AP equal to the positive rate: no better than chance (a constant feature gives
    exactly the positive rate). Unlike AUROC, AP rewards features whose *highest* values
    are positives, which suits rare target classes.

    Args and raises as in :func:`auroc`.

    Returns:
        float64 tensor [n_features] on ``scores.device``.
    """
    return _chunked_scores(scores, labels, chunk_size, False, True)[1]


def auroc_and_average_precision(
    scores: Real[Tensor, "n_samples n_features"] | Bool[Tensor, "n_samples n_features"],
    labels: Bool[Tensor, " n_samples"] | Int[Tensor, " n_samples"],
    chunk_size: int | None = None,
) -> tuple[Float[Tensor, " n_features"], Float[Tensor, " n_features"]]:
    """``(auroc(scores, labels), average_precision(scores, labels))`` in one pass.

    Both come from the same sort of each feature's samples, so this costs about as much as
    one of them; identical results. See :func:`auroc`
    and :func:`average_precision` for the meaning of the values and the arguments.
    """
    return _chunked_scores(scores, labels, chunk_size, True, True)


# --------------------------------------------------------------------------------------------
# LAPE
# --------------------------------------------------------------------------------------------


def lape(prob_active: Float[Tensor, "n_langs n_features"]) -> Float[Tensor, " n_features"]:
    """Language activation probability entropy (LAPE; Tang et al. 2024) of every neuron.

    Each neuron's activation probabilities ``p[l]`` (fraction of tokens of language ``l``
    where it fires; see :class:`ActivationProbability`) are normalised to a distribution over
    languages, ``q[l] = p[l] / sum_l p[l]``, and its entropy ``-sum_l q[l] log q[l]`` (natural
    log, ``0 log 0 = 0``) is returned. Low LAPE = language-specific: 0 means the neuron fires
    for one language only; ``log(n_langs)`` means it fires equally often in all languages.

    A neuron that never fires in any language has no distribution: its LAPE is NaN. Tang et
    al. also discard neurons whose activation probability is low in every language; filter
    on ``prob_active.max(0).values`` before ranking, and e.g. use
    ``lape(p).nan_to_num(nan=math.log(n_langs))`` to push dead neurons to the bottom.

    Returns:
        float64 tensor [n_features].

    Raises:
        ValueError: not 2-D, NaN or negative probabilities.
    """
    if prob_active.ndim != 2:
        raise InputError(
            f"prob_active must be 2-D [n_langs, n_features], got shape {tuple(prob_active.shape)}"
        )
    p = prob_active.to(torch.float64)
    if bool(torch.isnan(p).any()) or bool((p < 0).any()):
        raise InputError(
            "prob_active must hold probabilities (non-negative, no NaN); got NaN or negative values"
        )
    total = p.sum(dim=0)
    q = p / total  # NaN columns where total == 0 (dead neurons), kept NaN on purpose
    plogq = torch.where(q > 0, q * torch.log(q), 0.0)
    ent = -plogq.sum(dim=0)
    return torch.where(total > 0, ent, math.nan)


# --------------------------------------------------------------------------------------------
# expert selection helpers
# --------------------------------------------------------------------------------------------


def top_k_per_language(
    scores: Float[Tensor, "n_langs n_features"], k: int, largest: bool = True
) -> Int[Tensor, "n_langs k"]:
    """Indices of the ``k`` best features for each language (row), best first.

    ``largest=True`` for scores where high is expert-like (AUROC, AP); ``largest=False`` for
    LAPE (low entropy = language-specific). Ties are broken arbitrarily.

    Raises:
        ValueError: not 2-D, NaN scores, or ``k`` outside ``[1, n_features]``.
    """
    if scores.ndim != 2:
        raise InputError(
            f"scores must be 2-D [n_langs, n_features], got shape {tuple(scores.shape)}"
        )
    n_features = scores.shape[1]
    if not isinstance(k, int) or k < 1 or k > n_features:
        raise InputError(
            f"k must be an integer in [1, n_features={n_features}], got {k!r}; there are only "
            f"{n_features} features to choose from"
        )
    if scores.is_floating_point() and bool(torch.isnan(scores).any()):
        raise InputError(
            "scores contain NaN (e.g. LAPE of dead neurons); replace them first, e.g. with "
            "scores.nan_to_num(nan=...) using a value that ranks last"
        )
    return torch.topk(scores, k, dim=1, largest=largest, sorted=True).indices


def _select_rows(values: Tensor, rows: Tensor | None, name: str) -> Tensor:
    if values.ndim != 2:
        raise InputError(
            f"values must be 2-D [n_samples, n_features], got shape {tuple(values.shape)}"
        )
    if rows is None:
        sub = values
    else:
        rows = rows.to(values.device)
        if rows.dtype == torch.bool:
            if rows.ndim != 1 or rows.shape[0] != values.shape[0]:
                raise InputError(
                    f"boolean rows must have shape [{values.shape[0]}], got {tuple(rows.shape)}"
                )
        elif rows.ndim != 1:
            raise InputError(f"rows must be 1-D (mask or indices), got {tuple(rows.shape)}")
        sub = values[rows]
    if sub.shape[0] == 0:
        raise InputError(f"{name} over an empty set of rows: select at least one row")
    return sub


def feature_mean(
    values: Float[Tensor, "n_samples n_features"],
    rows: Bool[Tensor, " n_samples"] | Int[Tensor, " n_rows"] | None = None,
) -> Float[Tensor, " n_features"]:
    """Mean of each feature over the selected rows (all rows if ``rows`` is None), e.g. the
    value an expert neuron is clamped to: its mean activation over target-language sentences.
    Accumulated in float64, returned in ``values.dtype`` (float64 for integer input)."""
    sub = _select_rows(values, rows, "feature_mean")
    out = sub.sum(dim=0, dtype=torch.float64) / sub.shape[0]
    return out.to(values.dtype) if values.is_floating_point() else out


def feature_median(
    values: Float[Tensor, "n_samples n_features"],
    rows: Bool[Tensor, " n_samples"] | Int[Tensor, " n_rows"] | None = None,
    chunk_size: int | None = None,
) -> Float[Tensor, " n_features"]:
    """Median of each feature over the selected rows (the clamp value in the reference expert
    code). For an even number of rows it is the average of the two middle values, like
    ``numpy.median`` (``torch.median`` would return the lower one). Chunked over features like
    :func:`auroc`; returned in ``values.dtype`` (float64 for integer input)."""
    sub = _select_rows(values, rows, "feature_median")
    n, n_features = sub.shape
    chunk = _resolve_chunk(chunk_size, n, n_features, values.device)
    out_dtype = values.dtype if values.is_floating_point() else torch.float64
    out = torch.empty(n_features, dtype=out_dtype, device=values.device)
    lo, hi = (n - 1) // 2, n // 2
    for j0 in range(0, n_features, chunk):
        j1 = min(j0 + chunk, n_features)
        srt = sub[:, j0:j1].T.contiguous().sort(dim=-1).values
        mid = (srt[:, lo].to(torch.float64) + srt[:, hi].to(torch.float64)) / 2
        out[j0:j1] = mid.to(out_dtype)
    return out
