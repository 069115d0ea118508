"""The bfloat16-screened arg-max: its error bound holds, it returns the float32 arg-max
(near-ties, outlier dimensions, a bias, the fallback), and greedy decoding uses it only
where it applies."""

from __future__ import annotations

import pytest
import torch

from mechlingo.kernels import argmax as am
from mechlingo.kernels import readout
from mechlingo.kernels.argmax import build_screen, error_bound, kept_columns, screened_argmax


def _heavy(shape, seed, scale=1.0):
    """Gaussian entries with a few outlier dimensions, as in real residual streams."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * scale
    x[..., :3] *= 40.0
    return x


def test_error_bound_holds_elementwise():
    W = _heavy((256, 5000), 0, 0.05)
    x = _heavy((64, 256), 1)
    approx = torch.nn.functional.linear(x.bfloat16(), W.T.contiguous().bfloat16()).float()
    exact = x.double() @ W.double()
    err = (approx.double() - exact).abs()
    bound = error_bound(256) * x.double().norm(dim=1, keepdim=True) * W.double().norm(dim=0)
    assert bool((err <= bound).all())
    assert float((err / bound).max()) < 0.5  # the Cauchy-Schwarz bound is not tight


@pytest.mark.parametrize("bias", [False, True])
def test_screened_equals_float32_argmax(bias):
    W = _heavy((128, 20000), 2, 0.05)
    x = _heavy((48, 128), 3)
    b = torch.randn(20000, generator=torch.Generator().manual_seed(4)) if bias else None
    got = screened_argmax(x, W, build_screen(W), b)
    logits = x @ W + (b if b is not None else 0)
    assert torch.equal(got, logits.argmax(-1))


def test_near_ties_keep_the_float32_winner():
    """Columns whose logits differ by far less than bfloat16 resolves: the float32 winner
    must still come out, and ties go to the lowest index as in torch.argmax."""
    g = torch.Generator().manual_seed(5)
    W = torch.randn(64, 3000, generator=g) * 0.05
    x = torch.randn(16, 64, generator=g)
    best = (x @ W).argmax(-1)
    # Column 7 becomes a near-copy of row 0's winner, 1e-5 relative below it.
    W[:, 7] = W[:, best[0]] * (1 - 1e-5)
    # Column 11 becomes an exact copy of row 1's winner: a tie that index order breaks.
    W[:, 11] = W[:, best[1]]
    got = screened_argmax(x, W, build_screen(W))
    ref = (x @ W).argmax(-1)
    assert torch.equal(got, ref)
    assert float((x[1] @ W)[11]) == float((x[1] @ W)[best[1]])  # the tie is real


def test_kept_columns_hold_every_winner_and_few_others():
    g = torch.Generator().manual_seed(6)
    W = torch.randn(128, 20000, generator=g) * 0.05
    x = torch.randn(32, 128, generator=g) * 4
    kept = kept_columns(x, build_screen(W))
    assert set((x @ W).argmax(-1).tolist()) <= set(kept.tolist())
    assert kept.numel() < 20000 // 4  # the screen does prune


def test_too_many_kept_falls_back_to_float32(monkeypatch):
    W = torch.ones(32, 500)  # every column ties: all kept
    W[:, 123] += 1e-3
    x = torch.ones(4, 32)
    monkeypatch.setattr(am, "MAX_KEPT", 10)
    assert screened_argmax(x, W, build_screen(W)).tolist() == [123] * 4


def test_greedy_next_equals_final_logits_argmax(tiny, monkeypatch):
    monkeypatch.setattr(readout, "bf16_supported", lambda device: True)
    resid = torch.randn(9, tiny.cfg.d_model, generator=torch.Generator().manual_seed(8)) * 3
    ref = readout.final_logits(tiny, resid).argmax(-1)
    assert torch.equal(readout.greedy_next(tiny, resid), ref)
    assert readout._SCREENS.get(tiny) is not None


def test_greedy_next_with_a_zero_and_a_real_bias(tiny, monkeypatch):
    """An all-zero ``b_U`` is skipped (no float32 pass), a non-zero one is added: both give
    the plain float32 arg-max."""
    monkeypatch.setattr(readout, "bf16_supported", lambda device: True)
    resid = torch.randn(11, tiny.cfg.d_model, generator=torch.Generator().manual_seed(3)) * 3
    b = getattr(tiny, "b_U", None)
    if b is None:
        pytest.skip("this model has no b_U")
    saved = b.detach().clone()
    try:
        for fill in (torch.zeros_like(saved), torch.randn(saved.shape) * 2):
            with torch.no_grad():
                b.copy_(fill)
            ref = readout.final_logits(tiny, resid).argmax(-1)
            assert torch.equal(readout.greedy_next(tiny, resid), ref)
    finally:
        with torch.no_grad():
            b.copy_(saved)


def test_screen_follows_edited_weights(tiny, monkeypatch):
    """Editing W_U in place (a new tensor version) rebuilds the screen."""
    monkeypatch.setattr(readout, "bf16_supported", lambda device: True)
    resid = torch.randn(5, tiny.cfg.d_model, generator=torch.Generator().manual_seed(9))
    readout.greedy_next(tiny, resid)
    W = tiny.W_U
    col = 17
    saved = W[:, col].clone()
    try:
        with torch.no_grad():
            W[:, col] = readout.apply_final_norm(tiny, resid[0:1])[0] * 100.0
        assert int(readout.greedy_next(tiny, resid[0:1])[0]) == col
    finally:
        with torch.no_grad():
            W[:, col] = saved
    assert torch.equal(
        readout.greedy_next(tiny, resid), readout.final_logits(tiny, resid).argmax(-1)
    )


def test_screen_off_where_it_does_not_apply(tiny, monkeypatch):
    resid = torch.randn(3, tiny.cfg.d_model)
    monkeypatch.setattr(readout, "bf16_supported", lambda device: False)
    assert readout._screen(tiny, tiny.W_U) is None
    monkeypatch.setattr(readout, "bf16_supported", lambda device: True)
    with readout.screening(False):
        assert readout._screen(tiny, tiny.W_U) is None
    monkeypatch.setattr(
        readout, "output_transform", lambda model, logits: 30 * torch.tanh(logits / 30)
    )
    assert readout._screen(tiny, tiny.W_U) is None  # a soft-cap: plain arg-max
    assert readout.greedy_next(tiny, resid).shape == (3,)
