"""Tests for mechlingo.kernels.streaming: pooling over real positions, streaming means
(merge, state round trip) and the per-language firing-rate accumulator, against direct
torch computations."""

from __future__ import annotations

import math

import pytest
import torch

from mechlingo.kernels.streaming import (
    ActivationProbability,
    StreamingMean,
    masked_pool,
    mean_difference,
)

# ------------------------------------------------------------------ pooling


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_masked_pool_matches_loop(dtype):
    g = torch.Generator().manual_seed(0)
    acts = torch.randn(4, 7, 5, generator=g).to(dtype)
    mask = torch.tensor(
        [
            [1, 1, 1, 0, 0, 0, 0],
            [1, 1, 1, 1, 1, 1, 1],
            [0, 0, 1, 1, 0, 1, 0],
            [1, 0, 0, 0, 0, 0, 0],
        ],
        dtype=torch.bool,
    )
    acts[~mask] = math.nan  # padding may hold anything
    mean = masked_pool(acts, mask, "mean")
    mx = masked_pool(acts, mask, "max")
    assert mean.dtype == dtype and mx.dtype == dtype
    for b in range(4):
        real = acts[b][mask[b]].float()
        torch.testing.assert_close(mean[b].float(), real.mean(0).to(dtype).float())
        torch.testing.assert_close(mx[b], real.max(0).values.to(dtype))


def test_masked_pool_errors():
    acts = torch.randn(2, 3, 4)
    with pytest.raises(ValueError, match=r"rows \[1\]"):
        masked_pool(acts, torch.tensor([[True, False, False], [False, False, False]]))
    with pytest.raises(ValueError, match=r"\(2, 3, 4\).*\(2, 4\)"):
        masked_pool(acts, torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="how"):
        masked_pool(acts, torch.ones(2, 3, dtype=torch.bool), "median")  # type: ignore[arg-type]


# ------------------------------------------------------------------ streaming


def test_streaming_mean_equals_torch_mean():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(103, 6, 5, generator=g)
    m = StreamingMean()
    for chunk in x.split(17):
        m.update(chunk)
    torch.testing.assert_close(m.mean, x.double().mean(0), rtol=0, atol=1e-12)
    assert m.count.item() == 103
    assert m.mean.dtype == torch.float64


def test_streaming_mean_masked_and_weighted():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 6, 4, generator=g)
    mask = torch.rand(8, 6, generator=g) > 0.3
    x_pad = x.clone()
    x_pad[~mask] = math.nan
    m = StreamingMean()
    m.update(x_pad[:5], mask[:5])
    m.update(x_pad[5:], mask[5:])
    torch.testing.assert_close(m.mean, x[mask].double().mean(0), rtol=0, atol=1e-12)
    assert m.count.item() == mask.sum().item()
    w = torch.rand(8, generator=g)
    mw = StreamingMean()
    mw.update(x, w)
    ref = (x.double() * w.double()[:, None, None]).sum(0) / w.double().sum()
    torch.testing.assert_close(mw.mean, ref, rtol=0, atol=1e-12)


def test_streaming_mean_merge_and_state():
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(30, 4, generator=g), torch.randn(11, 4, generator=g)
    both = StreamingMean()
    both.update(a)
    both.update(b)
    ma, mb = StreamingMean(), StreamingMean()
    ma.update(a)
    mb.update(b)
    merged = ma.merge(mb)
    torch.testing.assert_close(merged.mean, both.mean, rtol=0, atol=1e-14)
    assert merged.count.item() == 41
    restored = StreamingMean.from_state(merged.state_dict())
    torch.testing.assert_close(restored.mean, both.mean, rtol=0, atol=1e-14)
    # merge is in place: ``ma`` now covers both streams
    torch.testing.assert_close(ma.mean, both.mean, rtol=0, atol=1e-14)
    # pre-allocated (e.g. a process that saw no data) merges as a no-op
    only_b = StreamingMean(shape=(4,)).merge(mb)
    torch.testing.assert_close(only_b.mean, b.double().mean(0), rtol=0, atol=1e-14)
    # mean difference
    only_a = StreamingMean()
    only_a.update(a)
    torch.testing.assert_close(
        mean_difference(only_a, mb), a.double().mean(0) - b.double().mean(0), rtol=0, atol=1e-12
    )


def test_streaming_mean_errors():
    m = StreamingMean()
    with pytest.raises(ValueError, match="empty"):
        _ = m.mean
    m.update(torch.randn(3, 4))
    with pytest.raises(ValueError, match=r"\(5,\).*\(4,\)"):
        m.update(torch.randn(3, 5))
    with pytest.raises(ValueError, match="prefix"):
        m.update(torch.randn(3, 4), torch.ones(4, dtype=torch.bool))


def test_activation_probability_accumulator():
    acts = torch.tensor(
        [
            [[1.0, -1.0], [2.0, 0.0], [9.0, 9.0]],  # sentence 0, lang 0, last token is padding
            [[-1.0, 3.0], [0.5, 0.5], [0.0, 1.0]],  # sentence 1, lang 1
        ]
    )
    mask = torch.tensor([[True, True, False], [True, True, True]])
    acc = ActivationProbability(n_langs=2)
    acc.update(acts, lang=torch.tensor([0, 1]), mask=mask)
    expected = torch.tensor([[2 / 2, 0 / 2], [1 / 3, 3 / 3]], dtype=torch.float64)
    torch.testing.assert_close(acc.prob_active, expected)
    # same counts from per-sentence updates with an int language, then merged
    a0, a1 = ActivationProbability(2), ActivationProbability(2)
    a0.update(acts[0], lang=0, mask=mask[0])
    a1.update(acts[1], lang=1, mask=mask[1])
    merged = ActivationProbability.from_state(a0.merge(a1).state_dict())
    torch.testing.assert_close(merged.prob_active, expected)
    with pytest.raises(ValueError, match=r"languages \[1\]"):
        a = ActivationProbability(2)
        a.update(acts[0], lang=0)
        _ = a.prob_active
