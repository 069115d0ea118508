"""Tests for mechlingo.kernels.ranking: agreement with scikit-learn, chunking invariance,
LAPE, the selection helpers and the input errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

sklearn_metrics = pytest.importorskip("sklearn.metrics")

from mechlingo.kernels.ranking import (  # noqa: E402
    auroc,
    auroc_and_average_precision,
    average_precision,
    feature_mean,
    feature_median,
    lape,
    top_k_per_language,
)


def _sklearn_scores(scores: torch.Tensor, labels: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    x = scores.cpu().numpy()
    y = labels.cpu().numpy()
    auc = [sklearn_metrics.roc_auc_score(y, x[:, j]) for j in range(x.shape[1])]
    ap = [sklearn_metrics.average_precision_score(y, x[:, j]) for j in range(x.shape[1])]
    return np.array(auc), np.array(ap)


def _data(n: int, f: int, pos_rate: float, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    labels = torch.zeros(n, dtype=torch.bool)
    n_pos = min(n - 1, max(1, round(n * pos_rate)))
    labels[torch.randperm(n, generator=g)[:n_pos]] = True
    ties = torch.randint(0, 4, (n, f), generator=g).to(dtype)  # heavy ties
    shifted = ties + labels[:, None].to(dtype) * torch.randint(0, 2, (1, f), generator=g).to(dtype)
    cont = torch.randn(n, 4, generator=g).to(dtype)
    const = torch.full((n, 2), 3.0, dtype=dtype)
    return torch.cat([ties, shifted, cont, const], dim=1), labels


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "n,pos_rate", [(2, 0.5), (9, 0.2), (60, 1 / 12), (61, 0.5), (57, 0.9), (300, 0.03)]
)
def test_matches_sklearn_with_ties(dtype, n, pos_rate):
    scores, labels = _data(n, 12, pos_rate, dtype, seed=n)
    ref_auc, ref_ap = _sklearn_scores(scores, labels)
    auc, ap = auroc_and_average_precision(scores, labels, chunk_size=5)
    assert auc.dtype == torch.float64 and ap.dtype == torch.float64
    np.testing.assert_allclose(auc.numpy(), ref_auc, atol=1e-12, rtol=0)
    np.testing.assert_allclose(ap.numpy(), ref_ap, atol=1e-12, rtol=0)
    # the single-metric entry points give the same numbers
    assert torch.equal(auroc(scores, labels), auc)
    assert torch.equal(average_precision(scores, labels), ap)


def test_constant_feature():
    scores, labels = _data(40, 3, 0.25, torch.float32, seed=1)
    const = torch.full((40, 3), -2.5)
    auc, ap = auroc_and_average_precision(const, labels)
    assert torch.all(auc == 0.5)
    torch.testing.assert_close(
        ap, torch.full((3,), labels.double().mean().item(), dtype=torch.float64)
    )


def test_perfect_and_reversed_separation():
    labels = torch.tensor([True, True, False, False, False])
    x = torch.tensor([5.0, 4.0, 1.0, 2.0, 3.0])
    scores = torch.stack([x, -x], dim=1)
    auc, ap = auroc_and_average_precision(scores, labels)
    assert auc.tolist() == [1.0, 0.0]
    assert ap[0].item() == 1.0


def test_float32_ties_judged_in_input_dtype():
    # values equal in float32 but not in float64 must tie, as in sklearn on the float32 array
    base = torch.tensor([1.0, 1.0 + 1e-9, 2.0, 0.5, 1.0], dtype=torch.float64)
    labels = torch.tensor([True, False, True, False, False])
    scores32 = base.to(torch.float32)[:, None]
    ref_auc, ref_ap = _sklearn_scores(scores32, labels)
    auc, ap = auroc_and_average_precision(scores32, labels)
    np.testing.assert_allclose(auc.numpy(), ref_auc, atol=1e-12)
    np.testing.assert_allclose(ap.numpy(), ref_ap, atol=1e-12)


def test_integer_and_bool_inputs():
    scores, labels = _data(50, 6, 0.3, torch.int64, seed=3)
    scores = scores[:, :12]
    ref_auc, ref_ap = _sklearn_scores(scores, labels)
    auc, ap = auroc_and_average_precision(scores, labels.to(torch.int64))  # 0/1 labels too
    np.testing.assert_allclose(auc.numpy(), ref_auc, atol=1e-12)
    np.testing.assert_allclose(ap.numpy(), ref_ap, atol=1e-12)
    b = scores[:, :3] > 1
    ref_auc, ref_ap = _sklearn_scores(b.to(torch.int64), labels)
    auc, ap = auroc_and_average_precision(b, labels)
    np.testing.assert_allclose(auc.numpy(), ref_auc, atol=1e-12)
    np.testing.assert_allclose(ap.numpy(), ref_ap, atol=1e-12)


@pytest.mark.parametrize("pos_rate", [0.1, 0.8])  # both internal branches
def test_chunking_is_exact(pos_rate):
    scores, labels = _data(80, 30, pos_rate, torch.float32, seed=7)
    full = auroc_and_average_precision(scores, labels, chunk_size=10_000)
    for cs in (1, 3, 17, None):
        part = auroc_and_average_precision(scores, labels, chunk_size=cs)
        assert torch.equal(part[0], full[0]) and torch.equal(part[1], full[1])


@pytest.mark.parametrize(
    "dtype", [torch.float16, torch.bfloat16, torch.uint8, torch.int8, torch.int16, torch.int32]
)
def test_sort_key_dtypes_match_sklearn(dtype):
    # every dtype that takes the sort-key path, with negative values and heavy ties
    g = torch.Generator().manual_seed(11)
    labels = torch.rand(70, generator=g) < 0.2
    raw = torch.randint(-3 if dtype != torch.uint8 else 0, 4, (70, 9), generator=g)
    scores = (raw + labels[:, None].to(torch.int64) * (torch.arange(9) % 2)).to(dtype)
    if dtype.is_floating_point:
        scores = scores / 4  # fractions, still exact in 16 bits
    ref_auc, ref_ap = _sklearn_scores(scores.float(), labels)
    auc, ap = auroc_and_average_precision(scores, labels)
    np.testing.assert_allclose(auc.numpy(), ref_auc, atol=1e-12, rtol=0)
    np.testing.assert_allclose(ap.numpy(), ref_ap, atol=1e-12, rtol=0)


def test_negative_zero_ties_with_zero():
    labels = torch.tensor([True, False, False, True, False])
    x = torch.tensor([0.0, -0.0, 1.0, -0.0, 0.0])[:, None]
    auc, ap = auroc_and_average_precision(x, labels)
    ref = np.array([0, 0, 1, 0, 0])  # -0.0 == 0.0
    assert auc.item() == pytest.approx(sklearn_metrics.roc_auc_score(labels.numpy(), ref))
    assert ap.item() == pytest.approx(sklearn_metrics.average_precision_score(labels.numpy(), ref))


@pytest.mark.parametrize("continuous", [True, False])  # no-tie shortcut and the tie path
def test_sort_kernel_equals_search_kernel_on_large_blocks(continuous):
    # big enough for the multi-threaded row sort; float32 takes the sort-key kernel, the same
    # values in float64 the binary-search kernel: both count pairs exactly
    g = torch.Generator().manual_seed(5)
    labels = torch.rand(500, generator=g) < 1 / 12
    x = torch.randn(500, 300, generator=g) + labels[:, None] * torch.rand(300, generator=g)
    if not continuous:
        x = (x * 4).round() / 4
    auc32, ap32 = auroc_and_average_precision(x, labels)
    auc64, ap64 = auroc_and_average_precision(x.double(), labels)
    torch.testing.assert_close(auc32, auc64, atol=1e-15, rtol=0)
    torch.testing.assert_close(ap32, ap64, atol=1e-15, rtol=0)
    ref_auc, ref_ap = _sklearn_scores(x[:, :40], labels)
    np.testing.assert_allclose(auc32[:40].numpy(), ref_auc, atol=1e-12, rtol=0)
    np.testing.assert_allclose(ap32[:40].numpy(), ref_ap, atol=1e-12, rtol=0)


@pytest.mark.parametrize("pos_rate", [1 / 12, 0.7])
def test_accelerator_path_equals_host_path(pos_rate):
    # the all-torch path (what runs on CUDA: torch.sort of label-packed keys, scatter,
    # searchsorted on every row) run on CPU must give the numbers of the numpy path (sorted
    # negatives and positives apart, one binary search per positive)
    from mechlingo.kernels.ranking import _device_statistics, _host_sorted, _host_statistics

    scores, labels = _data(90, 40, pos_rate, torch.float32, seed=13)
    scores = torch.cat([scores, torch.randn(90, 30)], dim=1)
    n_pos = int(labels.sum())
    split = _host_sorted(scores, (~labels).nonzero().flatten(), labels.nonzero().flatten())
    host = _host_statistics(*split)
    torch_only = _device_statistics(scores, labels, n_pos, 90 - n_pos)
    assert torch.equal(host[0], torch_only[0]) and torch.equal(host[1], torch_only[1])
    ref_auc, ref_ap = _sklearn_scores(scores, labels)
    np.testing.assert_allclose(torch_only[0].numpy(), ref_auc, atol=1e-12, rtol=0)
    np.testing.assert_allclose(torch_only[1].numpy(), ref_ap, atol=1e-12, rtol=0)


def test_inf_scores_are_ranked():
    labels = torch.tensor([True, False, True, False, False, True])
    x = torch.tensor([math.inf, 1.0, -math.inf, math.inf, 0.0, 2.0])[:, None]
    auc, ap = auroc_and_average_precision(x, labels)
    ref_auc = sklearn_metrics.roc_auc_score(labels.numpy(), np.array([3, 1, -1, 3, 0, 2]))
    ref_ap = sklearn_metrics.average_precision_score(labels.numpy(), np.array([3, 1, -1, 3, 0, 2]))
    assert auc.item() == pytest.approx(ref_auc, abs=1e-12)
    assert ap.item() == pytest.approx(ref_ap, abs=1e-12)


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize("fn", [auroc, average_precision, auroc_and_average_precision])
def test_score_errors(fn):
    scores = torch.randn(6, 3)
    with pytest.raises(ValueError, match="no positives"):
        fn(scores, torch.zeros(6, dtype=torch.bool))
    with pytest.raises(ValueError, match="no negatives"):
        fn(scores, torch.ones(6, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"\(6, 3\).*\(5,\)"):
        fn(scores, torch.tensor([True, False, True, False, True]))
    with pytest.raises(ValueError, match="2-D"):
        fn(torch.randn(6), torch.tensor([True, False] * 3))
    bad = scores.clone()
    bad[2, 1] = math.nan
    with pytest.raises(ValueError, match="NaN"):
        fn(bad, torch.tensor([True, False] * 3))
    with pytest.raises(ValueError, match="0 and 1"):
        fn(scores, torch.tensor([0, 1, 2, 0, 1, 0]))
    with pytest.raises(ValueError, match="chunk_size"):
        fn(scores, torch.tensor([True, False] * 3), chunk_size=0)


# ------------------------------------------------------------------ LAPE


def test_lape_hand_example():
    p = torch.tensor(
        [
            [0.5, 0.2, 0.0, 0.3],  # lang 0
            [0.0, 0.2, 0.0, 0.1],  # lang 1
            [0.0, 0.2, 0.0, 0.0],  # lang 2
        ]
    )
    out = lape(p)
    assert out[0].item() == 0.0  # fires for one language only: maximally specific
    assert out[1].item() == pytest.approx(math.log(3))  # uniform: not specific
    assert math.isnan(out[2].item())  # never fires: undefined
    assert out[3].item() == pytest.approx(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))
    with pytest.raises(ValueError):
        lape(-p)


# ------------------------------------------------------------------ selection helpers


def test_top_k_per_language():
    scores = torch.tensor([[0.1, 0.9, 0.5, 0.7], [0.8, 0.2, 0.3, 0.1]])
    assert top_k_per_language(scores, 2).tolist() == [[1, 3], [0, 2]]
    assert top_k_per_language(scores, 1, largest=False).tolist() == [[0], [3]]
    with pytest.raises(ValueError, match="n_features=4"):
        top_k_per_language(scores, 5)
    with pytest.raises(ValueError, match="NaN"):
        top_k_per_language(torch.tensor([[math.nan, 1.0]]), 1)


def test_feature_mean_and_median():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(11, 7, generator=g)
    rows = torch.tensor([True, False] * 5 + [True])
    torch.testing.assert_close(feature_mean(x, rows), x[rows].mean(0))
    torch.testing.assert_close(feature_mean(x), x.mean(0))
    for sel in (rows, torch.tensor([0, 3, 4, 9]), None):
        sub = x if sel is None else x[sel]
        ref = torch.from_numpy(np.median(sub.numpy(), axis=0))
        torch.testing.assert_close(feature_median(x, sel, chunk_size=3), ref)
    with pytest.raises(ValueError, match="empty"):
        feature_median(x, torch.zeros(11, dtype=torch.bool))
