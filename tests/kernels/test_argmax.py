"""The bfloat16-screened arg-max: its error bound holds, it returns the float32 arg-max
(near-ties, outlier dimensions, a bias, the fallback), and greedy decoding uses it only
where it applies."""

from __future__ import annotations

import pytest
import torch

from mechlingo.kernels import argmax as am
from mechlingo.kernels import readout
from mechlingo.kernels.argmax import build_screen, error_bound, kept_columns, screened_argmax


@pytest.fixture(autouse=True)
def _screen_always():
    """These tests check the screen itself: greedy decoding takes it wherever it applies, not
    only where it measured faster (tests/kernels/test_argmax_choice.py checks the choice)."""
    with readout.screening(True):
        yield


def _heavy(shape, seed, scale=1.0):
    """Gaussian entries with a few outlier dimensions, as in real residual streams."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * scale
    x[..., :3] *= 40.0
    return x


@pytest.mark.parametrize("bias", [False, True])
def test_error_bound_holds_elementwise(bias):
    W = _heavy((256, 5000), 0, 0.05)
    x = _heavy((64, 256), 1)
    b = torch.randn(5000, generator=torch.Generator().manual_seed(2)) * 3 if bias else None
    scr = build_screen(W)
    approx = torch.nn.functional.linear(x.bfloat16(), scr.W_bf16)
    if b is not None:
        approx = approx.float() + b
    exact = x @ W + (0 if b is None else b)  # the float32 logits the screen stands for
    err = (approx.double() - exact.double()).abs()
    bound = error_bound(x, scr, approx, b).double()
    assert bool((err <= bound).all())
    assert float((err / bound).max()) < 0.6  # Cauchy-Schwarz: not tight
    # the measured rounding norms make it far tighter than 2.5 u ||x|| ||W_j||
    old = 2.5 * 2.0**-8 * x.norm(dim=1, keepdim=True) * W.norm(dim=0)
    assert float((bound / old).median()) < 0.5


def test_kept_columns_threshold_keeps_every_column_the_exact_bound_keeps():
    """The first pass (one compare against the row's widest slack) drops no column that
    the elementwise bound would keep, with and without a bias."""
    W = _heavy((96, 4000), 7, 0.05)
    x = _heavy((40, 96), 8)
    scr = build_screen(W)
    for b in (None, torch.randn(4000, generator=torch.Generator().manual_seed(9)) * 5):
        approx = torch.nn.functional.linear(x.bfloat16(), scr.W_bf16)
        if b is not None:
            approx = approx.float() + b
        bound = error_bound(x, scr, approx, b)
        top = approx.float().argmax(-1, keepdim=True)
        tau = approx.float().gather(1, top) - bound.gather(1, top)
        want = ((approx.float() + bound) >= tau).any(dim=0).nonzero().squeeze(1)
        assert kept_columns(x, scr, b).tolist() == want.tolist()


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


@pytest.mark.slow
def test_bound_and_arg_max_on_the_embedded_models_decoding_rows(gemma):
    """Real final-layer rows of the embedded model (262,144 tokens), unsteered and pushed
    by a large random steering vector at layer 6: the bound holds on every logit, the
    screen keeps few columns, and the greedy token is the float32 arg-max."""
    from mechlingo.activations.runs import collect, final_resid_name
    from mechlingo.core.tokens import encode
    from mechlingo.interventions.steering import SteeringVector

    prompts = ["The capital of France is", "La capitale du Japon est", "日本の首都は",
               "Die Hauptstadt von Spanien ist", "A moeda do Brasil é o"]  # fmt: skip
    batch = encode(gemma, prompts)
    name = final_resid_name(gemma)
    g = torch.Generator().manual_seed(0)
    v = torch.randn(int(gemma.cfg.d_model), generator=g)
    rows = [collect(gemma, batch, [name])[name]]
    for scale in (20.0, 80.0):
        hooks = SteeringVector(v / v.norm() * scale, 6).fwd_hooks(gemma)
        rows.append(collect(gemma, batch, [name], fwd_hooks=hooks)[name])
    with torch.no_grad():
        x = readout.apply_final_norm(gemma, torch.cat(rows))
        W = gemma.W_U.detach()
        scr = build_screen(W)
        approx = torch.nn.functional.linear(x.bfloat16(), scr.W_bf16)
        err = (approx.double() - (x @ W.float()).double()).abs()
        assert bool((err <= error_bound(x, scr, approx).double()).all())
        assert kept_columns(x, scr).numel() < 2000  # of 262,144
        want = readout.final_logits(gemma, torch.cat(rows)).argmax(-1)
        assert torch.equal(screened_argmax(x, W, scr), want)
