"""Pure-torch rank metrics for neuron-level analyses: separation scores of every feature
(column) at once, language specificity, and the selection of the best features.

Everything here works on tensors only (no model, no scikit-learn) and runs on whatever device
the inputs live on: CPU or CUDA, unchanged. Hot paths never call ``.item()`` or ``.cpu()``;
the only host synchronisations are the one-off input checks (NaN scan, label counts, empty
masks), which are needed to raise a clear error.

Contents
--------
* :func:`auroc` -- area under the ROC curve, rank-based (Mann-Whitney U, average ranks for
  ties); matches ``sklearn.metrics.roc_auc_score`` to ~1e-15.
* :func:`average_precision` -- matches ``sklearn.metrics.average_precision_score`` (tied
  scores form one threshold).
* :func:`auroc_and_average_precision` -- both from one sort (the cost of one call).
* :func:`lape` -- language activation probability entropy (Tang et al. 2024): entropy of each
  neuron's activation probability across languages (the probabilities come from
  :class:`mechlingo.kernels.streaming.ActivationProbability`).
* :func:`top_k_per_language`, :func:`feature_mean`, :func:`feature_median` -- the best ``k``
  features of each language and the per-feature mean or median over a subset of rows (the
  value an expert neuron is clamped to).

Numerical choices
-----------------
AUROC is computed with exact integer arithmetic (int64 pair counts) and one final float64
division, so it is exact up to float64 rounding whatever the input dtype. Average precision
accumulates float64 precisions. Ties are detected on the input dtype itself (sorting does not
need an up-cast), so a float32 input is ranked exactly as scikit-learn ranks the same float32
array.
"""

from __future__ import annotations

import math
import threading
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
# not given. Peak extra memory is roughly 40 bytes per element (a copy of the block, int64
# sort keys or search results and a few working arrays): ~10 MB on CPU, where blocks that stay
# in cache run fastest (measured: 2,000 samples x 128 features is ~1.5x faster than x 512),
# ~320 MB on accelerators, where larger blocks amortise kernel launches.
_DEFAULT_CHUNK_ELEMENTS = {"cpu": 1 << 18, "other": 1 << 23}

# dtypes whose values map exactly and order-preservingly into an int64 sort key with one spare
# low bit for the label (floats up to 32 bits via their IEEE bit pattern, integers up to 32
# bits directly). float64 and int64 inputs use the binary-search kernel instead.
_KEY_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_KEY_INTS = (torch.uint8, torch.int8, torch.int16, torch.int32)


# --------------------------------------------------------------------------------------------
# input checks
# --------------------------------------------------------------------------------------------


def _check_scores_labels(scores: Tensor, labels: Tensor) -> tuple[Tensor, int, int]:
    """Validate inputs of the separation scores; return labels on the scores' device."""
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
    if scores.is_floating_point() and bool(torch.isnan(scores).any()):
        n_bad_cols = int(torch.isnan(scores).any(dim=0).sum())
        raise InputError(
            f"scores contain NaN in {n_bad_cols} of {scores.shape[1]} features; the ranking is "
            "undefined. Check the activations (e.g. pooling over an all-padding row) or drop "
            "those columns"
        )
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


def _sort_and_locate(
    block: Tensor, labels: Tensor, n_pos: int, host: bool
) -> tuple[Tensor, Tensor]:
    """Sorted keys ``[c, n_samples]`` (see :func:`_sort_keys`) and the sorted positions of the
    positives in each row ``[c, n_pos]`` (ascending).

    On accelerators: ``torch.sort``, ``cumsum`` and ``scatter`` (no host round trip). On CPU
    the same computation runs in numpy, with the rows split over ``torch.get_num_threads()``
    threads (numpy releases the GIL): numpy >= 2 sorts integers with SIMD sorting networks,
    ~10x faster than ``torch.sort`` on the same rows. A sort of integers is unique, so both
    paths give identical results.
    """
    c, n = block.shape[1], block.shape[0]
    if not host:
        srt = torch.sort(_sort_keys(block, labels), dim=-1).values
        is_pos = srt & 1
        # exactly n_pos positives per row: the j-th goes to column j, negatives to a spare
        # column that is dropped (no data-dependent shape, so no host round trip)
        col = torch.where(is_pos.bool(), is_pos.cumsum(dim=-1) - 1, n_pos)
        where = torch.arange(n, device=srt.device).expand(c, n)
        pos_at = torch.zeros(c, n_pos + 1, dtype=torch.int64, device=srt.device)
        pos_at.scatter_(1, col, where)
        return srt, pos_at[:, :n_pos]
    is_float = block.dtype in _KEY_FLOATS
    # A column slice of a wide matrix: copying it row-contiguous first and transposing the
    # small copy is ~8x faster than transposing the strided slice directly (TLB misses).
    x = block.contiguous().T.to(torch.float32 if is_float else torch.int64).contiguous().numpy()
    lab = labels.numpy().astype(np.int64)
    srt = np.empty((c, n), dtype=np.int64)
    is_pos = np.empty((c, n), dtype=np.bool_)

    def work(i0: int, i1: int) -> None:
        s = srt[i0:i1]
        if is_float:
            bits = (x[i0:i1] + np.float32(0.0)).view(np.int32)  # -0.0 + 0.0 = +0.0
            s[...] = bits ^ ((bits >> 31) & 0x7FFFFFFF)
        else:
            s[...] = x[i0:i1]
        s <<= 1
        s |= lab
        s.sort(axis=-1)
        np.bitwise_and(s, 1, out=is_pos[i0:i1], casting="unsafe")

    n_threads = min(torch.get_num_threads(), c)
    if n_threads <= 1 or c * n < 1 << 15:
        work(0, c)
    else:
        bounds = np.linspace(0, c, n_threads + 1).astype(int)
        pool = _sort_pool(n_threads)
        futures = [pool.submit(work, int(bounds[i]), int(bounds[i + 1])) for i in range(n_threads)]
        for f in futures:
            f.result()
    # exactly n_pos positives per row; row-major order = ascending positions in a row
    pos = torch.nonzero(torch.from_numpy(is_pos))[:, 1].view(c, n_pos)
    return torch.from_numpy(srt), pos


def _sorted_statistics(
    block: Tensor, labels: Tensor, n_pos: int, n_neg: int, host: bool | None = None
) -> tuple[Tensor, Tensor]:
    """AUROC and AP for one block ``[n_samples, c]`` by one sort of each feature's samples.

    Each feature's samples are sorted by ``2 * key(value) + label`` (see :func:`_sort_keys`):
    by value, negatives before positives among equal values. For the k-th positive
    (0-based, ascending) at sorted position ``i_k`` with value ``v_k``:

    * ``#{negatives <= v_k} = i_k - k`` (everything before it that is not a positive);
    * ``s_k`` = the first position holding ``v_k`` (= ``i_k`` unless ``v_k`` is tied), so
      ``#{samples < v_k} = s_k``, ``#{positives < v_k} = p_k`` (the first positive with that
      value) and ``#{negatives < v_k} = s_k - p_k``.

    AUROC (ties count one half) ``= sum_k (#neg < v_k + #neg <= v_k) / (2 n_pos n_neg)``; AP
    (one threshold ``score >= v`` per distinct value, as scikit-learn) ``= mean_k of
    (n_pos - p_k) / (n - s_k)``, the precision at each positive's own threshold. All counts
    are exact int64; only the final ratios are float64.
    """
    n = n_pos + n_neg
    if host is None:  # CPU tensors: numpy sort and host-side shortcuts; else all torch
        host = block.device.type == "cpu"
    srt, pos_at = _sort_and_locate(block, labels, n_pos, host)
    c = srt.shape[0]
    k = torch.arange(n_pos, device=srt.device)
    neg_le = pos_at - k
    vals = srt.gather(1, pos_at) >> 1
    if host:
        # A positive is tied with something iff the sample just before it has its value. Only
        # the rows with such a tie need the binary searches (continuous activations: a few %).
        prev = srt.gather(1, (pos_at - 1).clamp_(min=0)) >> 1
        tied_rows = ((pos_at > 0) & (prev == vals)).any(dim=-1).nonzero().flatten()
        first, pos_first = pos_at, k.expand(c, n_pos).clone()
        if tied_rows.numel():
            tv = vals[tied_rows]
            first = first.index_copy(
                0, tied_rows, torch.searchsorted(srt[tied_rows], tv << 1, side="left")
            )
            pos_first[tied_rows] = torch.searchsorted(tv, tv, side="left")
    else:
        # no host round trip on accelerators: the general path for every row
        first = torch.searchsorted(srt, vals << 1, side="left")  # s_k
        pos_first = torch.searchsorted(vals, vals, side="left")  # p_k
    neg_lt = first - pos_first
    auc = (neg_lt.sum(dim=-1) + neg_le.sum(dim=-1)).to(torch.float64) / (2.0 * n_pos * n_neg)
    precision = (n_pos - pos_first).to(torch.float64) / (n - first).to(torch.float64)
    ap = precision.sum(dim=-1) / n_pos
    return auc, ap


def _rank_statistics(
    pos: Tensor, neg: Tensor, want_auroc: bool, want_ap: bool
) -> tuple[Tensor | None, Tensor | None]:
    """AUROC and/or AP for one block of features, given as ``pos`` [c, n_pos] (scores of the
    positive samples, one feature per row) and ``neg`` [c, n_neg]. Used for float64 and int64
    scores, which do not fit the sort keys of :func:`_sorted_statistics`.

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
    labels, n_pos, n_neg = _check_scores_labels(scores, labels)
    if scores.dtype == torch.bool:
        scores = scores.to(torch.uint8)
    n_samples, n_features = scores.shape
    chunk = _resolve_chunk(chunk_size, n_samples, n_features, scores.device)
    pos_idx = labels.nonzero().flatten()
    neg_idx = (~labels).nonzero().flatten()
    out_auc = torch.empty(n_features, dtype=torch.float64, device=scores.device)
    out_ap = torch.empty(n_features, dtype=torch.float64, device=scores.device)
    use_keys = scores.dtype in _KEY_FLOATS + _KEY_INTS
    for j0 in range(0, n_features, chunk):
        j1 = min(j0 + chunk, n_features)
        block = scores[:, j0:j1]
        if use_keys:
            # one sort per feature gives both metrics; computing both costs no more than one
            out_auc[j0:j1], out_ap[j0:j1] = _sorted_statistics(block, labels, n_pos, n_neg)
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
            40 bytes per element). Default: ~1M elements per block on CPU, ~8M on GPU. The
            result does not depend on it.

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
