"""The readout kernels against the plain computation on a tiny model."""

from __future__ import annotations

import torch

from mechlingo.kernels.readout import apply_final_norm, token_logprobs


def _plain(model, resid, targets):
    logits = apply_final_norm(model, resid) @ model.W_U.float()
    if getattr(model, "b_U", None) is not None:
        logits = logits + model.b_U.float()
    return torch.log_softmax(logits, dim=-1).gather(1, targets[:, None])[:, 0]


def test_token_logprobs_equal_the_log_softmax_with_shared_rows(tiny):
    """Rows repeated with other targets (a prompt's candidates read at its last token) share
    one normalizer: every row still gets its own target's log-probability, as the full
    log-softmax gives it, whatever the chunking."""
    g = torch.Generator().manual_seed(0)
    d, vocab = int(tiny.cfg.d_model), int(tiny.W_U.shape[1])
    base = torch.randn(3, d, generator=g)
    resid = base[[0, 1, 0, 2, 0, 1]]  # row 0 three times, row 1 twice
    targets = torch.tensor([5, 7, 9, 1, 5, vocab - 1])
    want = _plain(tiny, resid, targets)
    for chunk in (1, 2, 512):
        got = token_logprobs(tiny, resid, targets, chunk_rows=chunk)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert got[0] == got[4]  # the same row and target: the same number
    assert torch.equal(token_logprobs(tiny, resid[:0], targets[:0]), torch.empty(0))
