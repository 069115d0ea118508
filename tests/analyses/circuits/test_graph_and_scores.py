"""The computational graph of every kind of block, EAP/EAP-IG edge scores and exact edge
patching, on tiny random models (their numbers mean nothing; the equalities must hold)."""

from __future__ import annotations

import pytest
import torch
from torch.nn.functional import log_softmax

from mechlingo.analyses.circuits.graph import build_graph
from mechlingo.analyses.circuits.patching import EdgePatcher
from mechlingo.analyses.circuits.scores import edge_scores
from mechlingo.core.errors import InputError
from mechlingo.core.models import load_model
from mechlingo.kernels.readout import apply_final_norm, unembed
from mechlingo.testing import build_tiny_folder
from tests.conftest import corrupted_pair


@pytest.fixture(scope="module")
def family_models(tmp_path_factory):
    """Tiny models of three more block kinds: GPT-2 (sequential, per-head senders), Falcon
    (parallel, one norm for attention and MLP), GPT-NeoX (parallel, two norms)."""
    out = {}
    for name in ("gpt2", "falcon", "gpt_neox"):
        folder = build_tiny_folder(tmp_path_factory.mktemp(f"circ-{name}") / "model", name)
        out[name] = load_model(folder, device="cpu")
    return out


def _expected(n_layers: int, n_heads: int, kind: str) -> tuple[int, int, int]:
    """(senders, receivers, edges) counted by hand from the block's wiring."""
    per_attn = n_heads if kind != "layer" else 1
    senders = 1 + n_layers * (per_attn + 1)
    edges = 0
    for layer in range(n_layers):
        upstream = 1 + layer * (per_attn + 1)  # embeddings and every earlier block
        if kind == "parallel1":
            edges += upstream  # one block input
        elif kind == "parallel2":
            edges += 2 * upstream  # attention and MLP read the same residual
        else:
            edges += upstream + (upstream + per_attn)  # the MLP reads its own layer's heads
    receivers = n_layers + 1 if kind == "parallel1" else 2 * n_layers + 1
    return senders, receivers, edges + senders  # the logits read every sender


def test_graph_counts_on_four_block_kinds(tiny, family_models):
    cases = [
        (tiny, "layer"),  # Gemma 3: post-attention norm, so attention senders are layers
        (family_models["gpt2"], "heads"),
        (family_models["falcon"], "parallel1"),
        (family_models["gpt_neox"], "parallel2"),
    ]
    for model, kind in cases:
        g = build_graph(model)
        L, H = int(model.cfg.n_layers), int(model.cfg.n_heads)
        assert (len(g.senders), len(g.receivers), g.n_edges) == _expected(L, H, kind), kind
        assert g.n_edges_at(7) == 7 * g.n_edges
        assert g.heads == (kind != "layer")
        for r in g.receivers:
            assert r.hook in model.hook_dict
        # every edge goes forward: no sender feeds the receiver of its own component
        for s, r in g.edges():
            assert r not in g.receiver_of(s)
    with pytest.raises(InputError, match="heads=False"):
        build_graph(tiny, heads=True)
    assert len(build_graph(family_models["gpt2"], heads=False).senders) == 5


def _setup(model, roles_k=1):
    clean, corr = corrupted_pair(model)
    T = clean.tokens.shape[1]
    roles = torch.zeros(clean.batch_size, T, roles_k)
    if roles_k == 1:
        roles[..., 0] = 1
    else:  # the corrupted position alone, and every other position
        roles[:, :, 1] = 1
        roles[:, 2, 1], roles[:, 2, 0] = 0, 1
    return clean, corr, roles


def _logprob_readout(model, token: int):
    def readout(final, rows):
        return log_softmax(unembed(model, apply_final_norm(model, final)).float(), -1)[:, token]

    return readout


def test_no_edge_removed_is_clean_and_every_edge_removed_is_corrupted(tiny, family_models):
    """The routing: the receivers' hooks are the only inputs of their components, so with
    every edge carrying its corrupted value every receiver reads the corrupted residual."""
    for model in (tiny, *family_models.values()):
        g = build_graph(model)
        clean, corr, roles = _setup(model, 2)
        ro = _logprob_readout(model, 5)
        p = EdgePatcher(model, g, clean, corr, ro, roles)
        S, R = g.mask.shape
        base = p.read(torch.zeros(S, R, 2, dtype=torch.bool))
        full = p.read(torch.ones(S, R, 2, dtype=torch.bool))
        logits_c = model(clean.tokens)[:, -1].float()
        logits_x = model(corr.tokens)[:, -1].float()
        assert torch.allclose(base, log_softmax(logits_c, -1)[:, 5], atol=1e-4)
        assert torch.allclose(full, log_softmax(logits_x, -1)[:, 5], atol=1e-4)


def test_eap_equals_exact_edge_patching_where_first_order_is_exact(tiny):
    """A linear toy: the readout is ``v . x`` of the final residual ``x`` (a fixed random
    direction ``v``, no norm, no softmax), and the edges are those into the logits receiver,
    whose input *is* that residual. Patching edge ``s -> logits`` moves ``x`` by exactly
    ``delta_s`` (nothing downstream of the receiver but the readout), so the exact change is
    ``v . delta_s`` = the EAP score ``delta_s . grad``, term for term: the first-order
    approximation has no remainder. (Edges into attention/MLP receivers go through norms and
    softmaxes, where EAP is only an approximation: the next tests.)"""
    g = build_graph(tiny)
    clean, corr, roles = _setup(tiny, 2)
    v = torch.randn(int(tiny.cfg.d_model), generator=torch.Generator().manual_seed(3))

    def readout(final, rows):
        return final.float() @ v

    scores, base, _ = edge_scores(tiny, g, clean, corr, readout, roles)
    p = EdgePatcher(tiny, g, clean, corr, readout, roles)
    logits = len(g.receivers) - 1
    edges = [(s, logits, k) for s in range(len(g.senders)) for k in range(2)]
    exact = p.edge_effects(edges, base)
    est = torch.stack([scores[:, s, r, k] for s, r, k in edges])
    assert exact.abs().max() > 1e-2  # the edges do something
    torch.testing.assert_close(est, exact, atol=1e-4, rtol=1e-4)


def test_eap_ig_approaches_exact_patching_as_steps_grow(tiny):
    """The edges out of the embeddings, all patched exactly, are the corrupted run (nothing
    else differs between the prompts), and their EAP-IG scores sum to the integral of the
    gradient along the embedding path (integrated gradients' completeness): the error
    shrinks as the steps grow, from plain EAP (one step) on."""
    g = build_graph(tiny)
    clean, corr, roles = _setup(tiny)
    ro = _logprob_readout(tiny, 7)
    p = EdgePatcher(tiny, g, clean, corr, ro, roles)
    S, R = g.mask.shape
    removed = torch.zeros(S, R, 1, dtype=torch.bool)
    removed[0] = True  # every edge out of the embeddings
    base = p.read(torch.zeros_like(removed))
    exact = p.read(removed) - base
    errors = []
    for steps in (1, 2, 4, 16):
        scores, _, corrupted = edge_scores(tiny, g, clean, corr, ro, roles, steps=steps)
        torch.testing.assert_close(exact, corrupted - base, atol=1e-4, rtol=1e-4)
        errors.append(float((scores[:, 0].sum((1, 2)) - exact).abs().max()))
    assert errors == sorted(errors, reverse=True), errors
    assert errors[-1] < 0.15 * errors[0], errors


def test_exact_edge_patching_equals_a_hand_built_path_patch(family_models):
    """Three edges of the tiny GPT-2, patched by hand with plain TransformerLens hooks: the
    sender's corrupted-minus-clean output (a head's ``z @ W_O``, or the embeddings) added at
    the receiver's input hook only (for the logits, at the last block's output, which only
    the final norm reads), the readout read from the model's own logits."""
    model = family_models["gpt2"]
    g = build_graph(model)
    clean, corr, roles = _setup(model)
    ro = _logprob_readout(model, 9)
    _, c_cache = model.run_with_cache(clean.tokens)
    _, x_cache = model.run_with_cache(corr.tokens)

    def head_delta(layer, head):
        z = f"blocks.{layer}.attn.hook_z"
        w = model.blocks[layer].attn.W_O[head]
        return (x_cache[z][:, :, head] - c_cache[z][:, :, head]) @ w

    cases = [  # (sender, receiver, the hook a hand-built patch edits, the delta)
        ("a0.h2", "mlp1", "blocks.1.ln2.hook_in", head_delta(0, 2)),
        ("embed", "attn1", "blocks.1.ln1.hook_in", None),
        ("a1.h3", "logits", "blocks.1.hook_resid_post", head_delta(1, 3)),
    ]
    s_idx = {s.name: i for i, s in enumerate(g.senders)}
    r_idx = {r.name: i for i, r in enumerate(g.receivers)}
    p = EdgePatcher(model, g, clean, corr, ro, roles)
    base = p.read(torch.zeros(*g.mask.shape, 1, dtype=torch.bool))
    for snd, rec, hook, delta in cases:
        if delta is None:
            pre = "blocks.0.hook_resid_pre"
            delta = x_cache[pre] - c_cache[pre]
        logits = model.run_with_hooks(
            clean.tokens, fwd_hooks=[(hook, lambda t, hook, d=delta: t + d)]
        )
        hand = log_softmax(logits[:, -1].float(), -1)[:, 9]
        (mine,) = p.edge_effects([(s_idx[snd], r_idx[rec], 0)], base)
        assert float((hand - base).abs().max()) > 1e-4, snd  # the edge does something
        torch.testing.assert_close(mine + base, hand, atol=1e-4, rtol=1e-4)
