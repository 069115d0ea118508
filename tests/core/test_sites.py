"""Unit tests of the core on the tiny random model: sites, tokens, readout, runs."""

from __future__ import annotations

import pytest
import torch

from mechlingo.activations.runs import collect, next_token_logits, run_batch
from mechlingo.core import answers
from mechlingo.core.answers import answer_tokens, pack_token_sets
from mechlingo.core.sites import SiteError, hook_name, resolve_layers, resolve_site
from mechlingo.core.tokens import TokenizationError, encode, position_mask, sorted_batches
from mechlingo.kernels.readout import final_logits, read_logits
from tests.conftest import count_hooks

PROMPTS = ["The capital of Italy is", "La capitale", "意大利的首都是罗马", "Die Hauptstadt von"]


def test_sites_resolve_and_errors(tiny):
    assert hook_name(tiny, "resid_pre", 0) == "blocks.0.hook_resid_pre"
    assert hook_name(tiny, "neurons", -1) == "blocks.1.mlp.hook_post"
    s = resolve_site(tiny, "mlp_post", 1)
    assert s.width == tiny.cfg.d_mlp and s.layer == 1
    assert resolve_site(tiny, "resid_post", 0).width == tiny.cfg.d_model
    with pytest.raises(SiteError, match="unknown site"):
        resolve_site(tiny, "resid_middle", 0)
    with pytest.raises(SiteError, match="out of range"):
        resolve_site(tiny, "resid_pre", 2)
    with pytest.raises(SiteError, match="out of range"):
        resolve_layers(tiny, [0, 5])
    assert resolve_layers(tiny, None) == [0, 1]
    for site in ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "mlp_post"):
        assert resolve_site(tiny, site, 0).hook_name in tiny.hook_dict


def test_mlp_post_is_down_projection_input(tiny):
    batch = encode(tiny, PROMPTS[:1])
    acts = collect(tiny, batch, ["blocks.0.mlp.hook_post", "blocks.0.mlp.out.hook_in"])
    torch.testing.assert_close(acts["blocks.0.mlp.hook_post"], acts["blocks.0.mlp.out.hook_in"])


def test_encode_right_pads_and_matches_to_tokens(tiny):
    batch = encode(tiny, PROMPTS)
    for i, p in enumerate(PROMPTS):
        ids = tiny.to_tokens(p)[0]
        assert int(batch.lengths[i]) == ids.numel()
        assert torch.equal(batch.tokens[i, : ids.numel()], ids)
        assert bool((batch.tokens[i, ids.numel() :] == batch.pad_id).all())
    assert batch.has_bos and bool((batch.tokens[:, 0] == tiny.tokenizer.bos_token_id).all())
    assert not bool(batch.real_token_mask()[:, 0].any())
    with pytest.raises(TokenizationError):
        encode(tiny, [])


def test_position_mask_rules(tiny):
    batch = encode(tiny, PROMPTS)
    shape = tuple(batch.tokens.shape)
    last = position_mask("last", batch, shape)
    assert torch.equal(last.float().argmax(1), batch.last_index)
    assert torch.equal(last.sum(1), torch.ones(len(PROMPTS), dtype=torch.long))
    allm = position_mask("all", batch, shape)
    assert torch.equal(allm.sum(1), batch.lengths - 1)
    neg = position_mask([-1], batch, shape)
    assert torch.equal(neg, last)
    with pytest.raises(TokenizationError, match="outside"):
        position_mask([-50], batch, shape)
    with pytest.raises(TokenizationError, match="unknown positions rule"):
        position_mask("first", batch, shape)


def test_batched_last_token_logits_equal_one_by_one(tiny):
    batch = encode(tiny, PROMPTS)
    logits = next_token_logits(tiny, batch)
    for i, p in enumerate(PROMPTS):
        ref = tiny(tiny.to_tokens(p))[0, -1]
        torch.testing.assert_close(logits[i], ref, atol=1e-5, rtol=1e-5)


def test_readout_matches_full_softmax(tiny):
    batch = encode(tiny, PROMPTS)
    name = f"blocks.{tiny.cfg.n_layers - 1}.hook_resid_post"
    resid = collect(tiny, batch, [name])[name]
    sets = [[answer_tokens(tiny, "Rome"), answer_tokens(tiny, "Paris")] for _ in PROMPTS]
    ids, primary = pack_token_sets(sets)
    r = read_logits(tiny, resid, ids, primary, top_k=3, chunk_rows=3)
    logp = torch.log_softmax(final_logits(tiny, resid), -1)
    for row in range(len(PROMPTS)):
        for s in range(2):
            members = [i for i in ids[row, s].tolist() if i >= 0]
            mass = torch.logsumexp(logp[row, members], 0)
            torch.testing.assert_close(r.set_logprob[row, s], mass, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(r.primary_logprob[row, s], logp[row, primary[row, s]])
            best = logp[row, members].max()
            assert int(r.set_rank[row, s]) == int((logp[row] > best).sum())
        top = torch.topk(logp[row], 3)
        assert torch.equal(r.top_ids[row], top.indices)


@pytest.mark.parametrize("top_k", [1, 4])
def test_read_logits_fused_pass_across_vocabulary_blocks(tiny, monkeypatch, top_k):
    # the fused pass after the GEMM (normalizer, entropy, set ranks) in blocks of 7 columns,
    # so that every block edge is crossed, against one full float64 log-softmax; top_k=1
    # takes the one max pass, top_k=4 the top-k
    import mechlingo.kernels.readout as readout

    monkeypatch.setattr(readout, "_STATS_BLOCK", 7)
    g = torch.Generator().manual_seed(5)
    resid = torch.randn(9, tiny.cfg.d_model, generator=g) * 2
    sets = [[answer_tokens(tiny, "Rome"), answer_tokens(tiny, "Paris")] for _ in range(9)]
    ids, primary = pack_token_sets(sets)
    r = read_logits(tiny, resid, ids, primary, top_k=top_k, chunk_rows=4)
    logits = final_logits(tiny, resid)
    lse = torch.logsumexp(logits.double(), -1)
    ent = lse - (torch.softmax(logits.double(), -1) * logits.double()).sum(-1)
    torch.testing.assert_close(r.logsumexp.double(), lse, rtol=0, atol=1e-5)
    torch.testing.assert_close(r.entropy.double(), ent, rtol=0, atol=1e-5)
    top = torch.topk(logits, top_k, dim=-1)
    assert torch.equal(r.top_ids, top.indices)
    torch.testing.assert_close(
        r.top_logprobs.double(), top.values.double() - lse[:, None], rtol=0, atol=1e-5
    )
    for row in range(9):
        for s in range(2):
            best = logits[row, [i for i in ids[row, s].tolist() if i >= 0]].max()
            assert int(r.set_rank[row, s]) == int((logits[row] > best).sum())


@pytest.mark.parametrize("soft_cap", [None, 5.0])
def test_read_logits_streamed_normalizer_equals_full_logits(tiny, monkeypatch, soft_cap):
    # top_k=0, ranks=False streams the vocabulary in blocks (here 7 tokens, to cross many
    # block edges) and reads the set tokens' own columns: same numbers as the full logits
    import mechlingo.kernels.readout as readout

    monkeypatch.setattr(readout, "_VOCAB_CHUNK", 7)
    if soft_cap is not None:
        monkeypatch.setattr(
            readout, "output_transform", lambda m, x: soft_cap * torch.tanh(x / soft_cap)
        )
    batch = encode(tiny, PROMPTS)
    resid = collect(tiny, batch, [hook_name(tiny, "resid_post", -1)])
    resid = next(iter(resid.values()))
    sets = [[answer_tokens(tiny, "Rome"), answer_tokens(tiny, "Paris")] for _ in PROMPTS]
    ids, primary = pack_token_sets(sets)
    full = read_logits(tiny, resid, ids, primary, top_k=0)
    fast = read_logits(tiny, resid, ids, primary, top_k=0, ranks=False, chunk_rows=3)
    torch.testing.assert_close(fast.logsumexp, full.logsumexp, atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(fast.set_logprob, full.set_logprob, atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(fast.primary_logprob, full.primary_logprob, atol=1e-5, rtol=1e-6)
    assert bool((fast.set_rank == -1).all())
    if soft_cap is not None:
        logits = final_logits(tiny, resid)  # capped: the patched transform applies here too
        assert float(logits.abs().max()) <= soft_cap
        logp = torch.log_softmax(logits, -1)
        torch.testing.assert_close(
            fast.primary_logprob, logp.gather(1, primary), atol=1e-5, rtol=1e-6
        )


def test_no_autograd_graph(tiny):
    # the parameters require gradients; mechlingo's passes must not build a graph
    assert any(p.requires_grad for p in tiny.parameters())
    batch = encode(tiny, PROMPTS)
    assert not run_batch(tiny, batch).requires_grad
    name = hook_name(tiny, "resid_post", -1)
    resid = collect(tiny, batch, [name])[name]
    assert not resid.requires_grad
    assert not final_logits(tiny, resid).requires_grad
    assert not next_token_logits(tiny, batch).requires_grad


def test_hooks_removed_after_error(tiny):
    batch = encode(tiny, PROMPTS)
    before = count_hooks(tiny)

    def boom(t, hook):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        run_batch(tiny, batch, [("blocks.0.hook_resid_pre", boom)])
    assert count_hooks(tiny) == before
    # collect stops early and cleans up too
    collect(tiny, batch, ["blocks.0.hook_resid_pre"])
    assert count_hooks(tiny) == before


def test_collect_rejects_unknown_hook(tiny):
    with pytest.raises(ValueError, match="not in this model"):
        collect(tiny, encode(tiny, PROMPTS), ["blocks.0.hook_nothing"])


def test_answer_tokens_rules(tiny):
    a = answer_tokens(tiny, "Rome", lang="en")
    assert a.primary == tiny.to_tokens(" Rome", prepend_bos=False)[0, 0]
    assert a.primary in a.ids and a.n_tokens >= 1
    with pytest.raises(TokenizationError, match="empty"):
        answer_tokens(tiny, "  ")
    # the prefix index decodes the vocabulary through the tokenizer's backend: the same texts
    n = int(tiny.cfg.d_vocab)
    assert answers._backend_decodes(tiny.tokenizer)
    assert answers._decode_each(tiny.tokenizer, n) == tiny.tokenizer.batch_decode(
        [[i] for i in range(n)]
    )


def test_sorted_batches_cover_all_rows():
    lengths = [3, 5, 3, 5, 5, 2]
    groups = sorted_batches(lengths, batch_size=2)
    flat = sorted(i for g in groups for i in g)
    assert flat == list(range(6))
    for g in groups:
        assert len(g) <= 2
    order = [i for g in groups for i in g]
    assert [lengths[i] for i in order] == sorted(lengths)


def test_readout_normalizer_and_entropy_match_float64(tiny):
    # the fused readout (one exponential pass for the normalizer and the entropy) against a
    # float64 log-softmax of the same logits, full path (top-k) and streamed path alike
    g = torch.Generator().manual_seed(3)
    resid = torch.randn(7, tiny.cfg.d_model, generator=g) * 3
    logits = final_logits(tiny, resid).double()
    lse = torch.logsumexp(logits, -1)
    ent = lse - (torch.softmax(logits, -1) * logits).sum(-1)
    full = read_logits(tiny, resid, top_k=3, chunk_rows=3)
    torch.testing.assert_close(full.logsumexp.double(), lse, rtol=0, atol=1e-5)
    torch.testing.assert_close(full.entropy.double(), ent, rtol=0, atol=1e-5)
    streamed = read_logits(tiny, resid, top_k=0, ranks=False, chunk_rows=5)
    torch.testing.assert_close(streamed.logsumexp.double(), lse, rtol=0, atol=1e-5)


def test_unembed_adds_a_nonzero_bias_and_skips_a_zero_one():
    from types import SimpleNamespace

    from mechlingo.kernels.readout import unembed

    g = torch.Generator().manual_seed(4)
    W, x = torch.randn(6, 11, generator=g), torch.randn(3, 6, generator=g)
    for b in (torch.zeros(11), torch.randn(11, generator=g)):
        model = SimpleNamespace(W_U=W, b_U=b, cfg=SimpleNamespace())
        torch.testing.assert_close(unembed(model, x), x @ W + b)
