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


def _energy_by_definition(x, W):
    """``||Wc^T x||^2 / ||x||^2 / (||Wc||_F^2 / d)`` in float64, ``x`` already normalised."""
    x, W = x.double(), W.double()
    Wc = W - W.mean(dim=1, keepdim=True)
    return ((x @ Wc) ** 2).sum(-1) / (x**2).sum(-1) / ((Wc**2).sum() / W.shape[0])


class _Head:
    """An unembedding with a bias and a logit soft-cap, no final norm."""

    def __init__(self, W, b):
        self.W_U, self.b_U = W, b
        self.cfg = type("Cfg", (), {"output_logits_soft_cap": 30.0})()


def test_read_logits_energy_equals_the_definition(tiny, monkeypatch):
    """The token energy beside the other readouts: from the logits the readout already holds
    where they are plain (the tiny Gemma: no Gram matrix is built), else from the Gram matrix
    (the streamed readout; a bias and a soft-cap). Each equals the float64 definition and
    :func:`token_energy`; asking for it changes no other readout."""
    from mechlingo.kernels import readout

    g = torch.Generator().manual_seed(5)
    resid = torch.randn(7, tiny.cfg.d_model, generator=g) * 3
    want = _energy_by_definition(apply_final_norm(tiny, resid).float(), tiny.W_U.float())
    real_gram = readout._energy_gram

    def no_gram(*a, **k):
        raise AssertionError("the Gram matrix was built")

    monkeypatch.setattr(readout, "_energy_gram", no_gram)
    full = readout.read_logits(tiny, resid, top_k=3, chunk_rows=3, energy=True)
    torch.testing.assert_close(full.energy.double(), want, rtol=1e-6, atol=0)
    plain = readout.read_logits(tiny, resid, top_k=3, chunk_rows=3)
    assert plain.energy is None
    for name in ("logsumexp", "top_ids", "top_logprobs", "entropy"):
        assert torch.equal(getattr(plain, name), getattr(full, name)), name
    monkeypatch.setattr(readout, "_energy_gram", real_gram)
    streamed = readout.read_logits(tiny, resid, top_k=0, ranks=False, chunk_rows=5, energy=True)
    torch.testing.assert_close(streamed.energy.double(), want, rtol=1e-5, atol=0)
    torch.testing.assert_close(readout.token_energy(tiny, resid).double(), want, rtol=1e-5, atol=0)

    W = torch.randn(16, 50, generator=g)
    head = _Head(W, torch.randn(50, generator=g))
    x = torch.randn(4, 16, generator=g)
    capped = readout.read_logits(head, x, top_k=2, energy=True)
    torch.testing.assert_close(
        capped.energy.double(), _energy_by_definition(x, W), rtol=1e-5, atol=0
    )
