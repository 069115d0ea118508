"""mechlingo's core on a classic TransformerLens ``HookedTransformer`` (TransformerLens 3.x).

Runs in the separate TransformerLens 3.9 environment made by
``scripts/check_hooked_transformer.sh``; under TransformerLens 4 (no HookedTransformer) every
test here is skipped. The model is a tiny ``HookedTransformerConfig`` with random weights and
the tiny byte-level tokenizer of :func:`mechlingo.testing.build_tiny_folder`.
"""

from __future__ import annotations

import importlib.metadata

import pytest
import torch

_TL_VERSION = importlib.metadata.version("transformer-lens")
if int(_TL_VERSION.split(".")[0]) >= 4:
    pytest.skip(
        f"transformer-lens {_TL_VERSION}: the HookedTransformer checks run under TransformerLens "
        "3.x (bash scripts/check_hooked_transformer.sh)",
        allow_module_level=True,
    )
HookedTransformer = pytest.importorskip("transformer_lens").HookedTransformer
HookedTransformerConfig = pytest.importorskip("transformer_lens").HookedTransformerConfig

from mechlingo.activations.runs import collect, next_token_logits, run_batch  # noqa: E402
from mechlingo.analyses.decoders.lens import logit_lens  # noqa: E402
from mechlingo.core.models import load_model, weight_mode  # noqa: E402
from mechlingo.core.sites import hook_name, site_map  # noqa: E402
from mechlingo.core.tokens import encode  # noqa: E402
from mechlingo.scoring.evaluate import DecodeOptions  # noqa: E402
from mechlingo.testing import build_tiny_folder  # noqa: E402

PROMPTS = [
    "The capital of Italy is",
    "La capital de Italia es la ciudad de",
    "Die Hauptstadt von Italien ist",
    "イタリアの首都は",
]
LANGS = ["en", "es", "de", "ja"]
ANSWERS = {"answer": ["Rome", "Roma", "Rom", "ローマ"], "en": ["Rome"] * 4}


@pytest.fixture(scope="module")
def ht(tmp_path_factory):
    from transformers import AutoTokenizer

    folder = build_tiny_folder(tmp_path_factory.mktemp("tiny-ht") / "model")
    tok = AutoTokenizer.from_pretrained(str(folder))
    cfg = HookedTransformerConfig(
        n_layers=2,
        d_model=64,
        d_head=16,
        n_heads=4,
        d_mlp=128,
        d_vocab=len(tok),
        n_ctx=128,
        act_fn="gelu",
        normalization_type="LN",
        device="cpu",
        seed=0,
    )
    model = HookedTransformer(cfg, tokenizer=tok)
    with torch.no_grad():  # larger weights so that predictions are not flat
        for p in model.parameters():
            if p.ndim >= 2:
                p.normal_(0.0, 0.2)
    model.eval()
    return load_model(model)


def _alone_logprobs(model, prompt: str) -> torch.Tensor:
    tokens = model.to_tokens(prompt, prepend_bos=True, truncate=False)
    return model(tokens)[0, -1].float().log_softmax(-1)


def test_load_model_and_sites(ht):
    assert weight_mode(ht) in ("raw", "compat")
    sm = site_map(ht)
    assert sm.n_layers == 2 and sm.d_mlp == 128
    for site in ("resid_pre", "resid_post", "mlp_post", "attn_out", "mlp_out"):
        assert hook_name(ht, site, 1) in ht.hook_dict


def test_next_token_logits_match_model(ht):
    batch = encode(ht, PROMPTS)
    logits = next_token_logits(ht, batch)
    for i, p in enumerate(PROMPTS):
        torch.testing.assert_close(
            logits[i].log_softmax(-1), _alone_logprobs(ht, p), rtol=1e-4, atol=1e-4
        )


def test_lens_last_entry_is_model_output_and_batched_equals_single(ht):
    res = logit_lens(ht, PROMPTS, ANSWERS, langs=LANGS, batch_size=4, top_k=3)
    assert res.logprob.shape == (3, len(PROMPTS), 2)
    for i, p in enumerate(PROMPTS):
        lp = _alone_logprobs(ht, p)
        top = lp.topk(3)
        assert res.top_ids[-1, i].tolist() == top.indices.tolist()
        torch.testing.assert_close(res.top_logprobs[-1, i], top.values, rtol=1e-4, atol=1e-4)
    single = logit_lens(ht, PROMPTS, ANSWERS, langs=LANGS, batch_size=1, top_k=3)
    torch.testing.assert_close(res.logprob, single.logprob, rtol=1e-4, atol=1e-4)
    assert torch.equal(res.rank, single.rank)


def test_add_vector_hook_via_run_batch(ht):
    """A plain add-vector intervention at each prompt's last token, through run_batch."""
    batch = encode(ht, PROMPTS)
    name = hook_name(ht, "resid_pre", 1)
    v = torch.randn(ht.cfg.d_model, generator=torch.Generator().manual_seed(1))
    last = batch.last_index

    def add(t, hook):
        t = t.clone()
        rows = torch.arange(t.shape[0], device=t.device)
        t[rows, last.to(t.device)] += v.to(t.device, t.dtype)
        return t

    steered = run_batch(ht, batch, [(name, add)])
    for i, p in enumerate(PROMPTS):
        tokens = ht.to_tokens(p, prepend_bos=True, truncate=False)
        n = tokens.shape[1]

        def add_one(t, hook, n=n):
            t = t.clone()
            t[0, n - 1] += v
            return t

        ref = ht.run_with_hooks(tokens, fwd_hooks=[(name, add_one)])[0, -1]
        torch.testing.assert_close(steered[i, n - 1], ref, rtol=1e-4, atol=1e-4)
    assert sum(len(hp._forward_hooks) for hp in ht.hook_dict.values()) == 0


def test_steering_vector_intervention(ht):
    iv_mod = pytest.importorskip("mechlingo.interventions")
    v = torch.randn(ht.cfg.d_model, generator=torch.Generator().manual_seed(2))
    sv = iv_mod.SteeringVector(v, layer=1, alpha=2.0)
    batch = encode(ht, PROMPTS)
    name = hook_name(ht, "resid_pre", 1)
    plain = collect(ht, batch, [name])[name]
    steered = collect(ht, batch, [name], fwd_hooks=sv.fwd_hooks(ht))[name]
    torch.testing.assert_close(steered - plain, (2.0 * v).expand_as(plain), rtol=1e-4, atol=1e-4)


def test_patch_activations_identity(ht):
    patching = pytest.importorskip("mechlingo.analyses.recall.patching")
    src = ["The capital of Italy is", "The capital of Spain is"]
    readout = patching.answer_logprob(ht, ["Rome", "Madrid"], name="lp")
    sw = patching.patch_activations(ht, src, src, ["resid_pre", "mlp_out"], readout=readout)
    # patching a run into itself changes nothing
    torch.testing.assert_close(sw.effect(), torch.zeros_like(sw.effect()), rtol=0, atol=1e-4)
    # a HookedTransformer passes a batch that grows mid-pass through (its masks and rotary
    # tables broadcast): the default "grow" sweep equals "stack" on a real patch
    tgt = ["The capital of Spain is", "The capital of Italy is"]
    sites = ["resid_pre", "attn_out", "head"]
    kw = dict(readout=readout, alignment="last", positions=[-1, -2, -3])
    grown = patching.patch_activations(ht, src, tgt, sites, batching="grow", **kw)
    stacked = patching.patch_activations(ht, src, tgt, sites, batching="stack", **kw)
    assert not torch.allclose(grown.clean, grown.corrupted)
    torch.testing.assert_close(grown.values, stacked.values, rtol=0, atol=1e-4)
    # a HookedTransformer has no transformers cache to reuse: the default does without it,
    # and asking for it is refused with what to do
    with pytest.raises(patching.PatchingError, match="reuse_prefix=None"):
        patching.patch_activations(ht, src, tgt, sites, reuse_prefix=True, **kw)


def test_resid_mid_is_the_residual_on_a_hooked_transformer(ht):
    """A HookedTransformer's hook_resid_mid is the residual itself: a write there is one hook
    (no carry to resid_post, as on a TransformerBridge: mechlingo.core.sites.edit_hooks), and
    after it resid_post == resid_mid' + mlp_out; a resid_mid patch equals a hand-made one that
    writes the difference through attn_out."""
    iv_mod = pytest.importorskip("mechlingo.interventions")
    patching = pytest.importorskip("mechlingo.analyses.recall.patching")
    v = torch.randn(ht.cfg.d_model, generator=torch.Generator().manual_seed(4))
    batch = encode(ht, PROMPTS)
    names = [hook_name(ht, s, 1) for s in ("resid_mid", "mlp_out", "resid_post")]
    clean = collect(ht, batch, names)
    for iv in [
        iv_mod.SteeringVector(v, 1, 3.0, site="resid_mid", positions="all"),
        iv_mod.Ablation("resid_mid", 1, "mean", mean=v, positions="last"),
    ]:
        hooks = iv.fwd_hooks(ht)
        assert [n for n, _ in hooks] == [names[0]]
        got = collect(ht, batch, names, fwd_hooks=hooks)
        assert (got[names[0]] - clean[names[0]]).abs().max() > 1e-3
        torch.testing.assert_close(got[names[2]], got[names[0]] + got[names[1]], atol=1e-5, rtol=0)
    src, tgt = PROMPTS[:2], PROMPTS[1::-1]
    readout = patching.answer_logprob(ht, ["Rome", "Roma"], name="lp")
    sw = patching.patch_activations(
        ht, src, tgt, "resid_mid", layers=[1], positions=[-1], alignment="last", readout=readout
    )
    s_b, t_b = encode(ht, src), encode(ht, tgt)
    delta = collect(ht, s_b, names[:1])[names[0]] - collect(ht, t_b, names[:1])[names[0]]
    last = t_b.last_index

    def carry(t, hook):
        t = t.clone()
        t[torch.arange(t.shape[0]), last] += delta.to(t.dtype)
        return t

    logits = run_batch(ht, t_b, [(hook_name(ht, "attn_out", 1), carry)])
    lp = logits[torch.arange(2), last].float().log_softmax(-1)
    ids = [list(s[0].ids) for s in readout.sets]
    want = torch.stack([torch.logsumexp(lp[i, ids[i]], -1) for i in range(2)])
    torch.testing.assert_close(sw.values[0, 0], want, atol=1e-4, rtol=0)


def test_distributed_building_blocks_single_process(ht):
    from mechlingo.activations.pooled import pooled_neuron_acts
    from mechlingo.activations.runs import last_token_means

    means = last_token_means(ht, PROMPTS, layers=[0, 1])
    batch = encode(ht, PROMPTS)
    names = [hook_name(ht, "resid_pre", layer) for layer in (0, 1)]
    acts = collect(ht, batch, names)
    ref = torch.stack([acts[n] for n in names], dim=1).double().mean(0)
    torch.testing.assert_close(means.mean, ref, rtol=1e-5, atol=1e-5)
    pooled = pooled_neuron_acts(ht, {"en": PROMPTS[:2], "de": PROMPTS[2:]})
    assert pooled.pooled.shape == (4, 2 * 128)
    assert torch.isfinite(pooled.prob_active).all()


def test_generation_recomputes_the_prefix_on_a_hooked_transformer(ht):
    """A HookedTransformer has no transformers cache to drive: decoding takes the uncached
    path, and a mixed-length batch still equals one prompt at a time."""
    from mechlingo.activations.decoding import kv_cache_path
    from mechlingo.scoring.evaluate import greedy_generate

    assert kv_cache_path(ht) == "none"
    batched = greedy_generate(
        ht, PROMPTS, stop_at_newline=False, decoding=DecodeOptions(max_new_tokens=3)
    )
    alone = [
        greedy_generate(ht, [p], stop_at_newline=False, decoding=DecodeOptions(max_new_tokens=3))[0]
        for p in PROMPTS
    ]
    assert batched == alone
