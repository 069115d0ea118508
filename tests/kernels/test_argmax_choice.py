"""The bfloat16 screen of greedy decoding is chosen by a one-off measurement: the screened
and the plain float32 arg-max give the same token, the timing runs once per device, dtype and
unembedding shape, and ``screening`` forces either path."""

from __future__ import annotations

import pytest
import torch

from mechlingo.kernels import argmax as am
from mechlingo.kernels import readout
from mechlingo.kernels.argmax import build_screen, plain_argmax, screen_is_faster, screened_argmax


@pytest.fixture
def fresh_choice(monkeypatch):
    """No measured choice yet, and the screen applicable whatever this CPU is."""
    monkeypatch.setattr(readout, "_SCREEN_PAYS", {})
    monkeypatch.setattr(readout, "bf16_supported", lambda device: True)


def _rows(model, n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, int(model.cfg.d_model), generator=g) * 3


def test_both_paths_give_the_same_arg_max(tiny, fresh_choice):
    resid = _rows(tiny, 40, 1)
    want = readout.final_logits(tiny, resid).argmax(-1)
    with readout.screening(True):
        screened = readout.greedy_next(tiny, resid)
    with readout.screening(False):
        plain = readout.greedy_next(tiny, resid)
    assert torch.equal(screened, want) and torch.equal(plain, want)
    assert readout.screen_choice(tiny) is None  # forced paths measure nothing


def test_kernels_agree_with_torch_argmax():
    g = torch.Generator().manual_seed(4)
    W, x, b = torch.randn(48, 3000, generator=g), torch.randn(7, 48, generator=g), torch.randn(3000)
    want = (x @ W + b).argmax(-1)
    assert torch.equal(plain_argmax(x, W, b), want)
    assert torch.equal(screened_argmax(x, W, build_screen(W), b), want)
    assert isinstance(screen_is_faster(x, W, build_screen(W), b, repeats=1), bool)


@pytest.mark.parametrize("faster", [False, True])
def test_the_choice_is_measured_once_and_followed(tiny, fresh_choice, monkeypatch, faster):
    calls, screened = [], []
    real = am.screened_argmax

    def timing(x, W, screen, b=None, repeats=2):
        calls.append(x.shape[0])
        return faster

    def spy(*args, **kw):
        screened.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(readout, "screen_is_faster", timing)
    monkeypatch.setattr(readout, "screened_argmax", spy)
    resid = _rows(tiny, 5, 2)
    want = readout.final_logits(tiny, resid).argmax(-1)
    assert readout.screen_choice(tiny) is None
    for _ in range(3):
        assert torch.equal(readout.greedy_next(tiny, resid), want)
    assert calls == [readout._PROBE_ROWS]  # once, on a decoding batch's worth of rows
    assert readout.screen_choice(tiny) is faster
    assert bool(screened) is faster  # the measured choice is the path taken
