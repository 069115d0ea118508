"""KV-cached decoding: the same tokens as recomputing the prefix, with every kind of
intervention, on mixed-length batches; rows leave the batch; hooks removed after errors."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import mechlingo.activations.decoding as decoding
from mechlingo.activations.decoding import decode, kv_cache_path
from mechlingo.activations.likelihood import sample_from_bos
from mechlingo.core.tokens import current_columns, encode
from mechlingo.data import load_facts
from mechlingo.interventions import Ablation, InterventionError, NeuronClamp, SteeringVector
from mechlingo.scoring.evaluate import DecodeOptions, greedy_generate
from tests.conftest import count_hooks

PROMPTS = [
    "The capital of Italy is",
    "Rome",
    "La capitale de la France est la ville de",
    "東京は",
    "Die Hauptstadt von Deutschland ist",
    "x",
]


def _vec(model, seed):
    return torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(seed))


def _interventions(model):
    d_mlp = int(model.cfg.d_mlp)
    n = int(model.cfg.n_layers)
    last = SteeringVector(_vec(model, 1) * 4, n // 2, 1.0, positions="last")
    gen = SteeringVector(_vec(model, 2) * 4, n - 1, 1.0, positions="generated")
    clamp = NeuronClamp({0: [1, 3, d_mlp - 1]}, 2.5, positions="all")
    return {
        "none": None,
        "steer-last": last,
        "steer-generated": gen,
        "clamp-all": clamp,
        "ablate-ints": Ablation("mlp_out", 0, "zero", positions=[1, -1]),
        "composed": last + clamp + gen,
    }


def _both(model, prompts, max_new_tokens=8, batch_size=16, **kw):
    dec = DecodeOptions(max_new_tokens=max_new_tokens, batch_size=batch_size)
    cached = greedy_generate(model, prompts, **kw, decoding=dec)
    plain = greedy_generate(model, prompts, **kw, decoding=replace(dec, cache=False))
    return cached, plain


def test_tiny_takes_a_cached_path(tiny):
    assert kv_cache_path(tiny) in ("native", "adapter")


@pytest.mark.parametrize(
    "kind", ["none", "steer-last", "steer-generated", "clamp-all", "ablate-ints", "composed"]
)
@pytest.mark.parametrize("stop", [False, True])
def test_cached_equals_uncached_tiny(tiny, kind, stop):
    iv = _interventions(tiny)[kind]
    cached, plain = _both(
        tiny, PROMPTS, max_new_tokens=6, intervention=iv, stop_at_newline=stop, batch_size=4
    )
    assert cached == plain


def test_mixed_batch_equals_one_by_one_cached(tiny):
    iv = _interventions(tiny)["composed"]
    kw = {"intervention": iv, "stop_at_newline": False}
    dec = DecodeOptions(max_new_tokens=5, batch_size=len(PROMPTS))
    batched = greedy_generate(tiny, PROMPTS, **kw, decoding=dec)
    alone = [greedy_generate(tiny, [p], **kw, decoding=DecodeOptions(max_new_tokens=5))[0]
             for p in PROMPTS]  # fmt: skip
    assert batched == alone


def test_position_wise_plain_hook_same_tokens(tiny):
    """A plain hook that treats every position alike gives the same tokens cached."""
    v = _vec(tiny, 5) * 3

    def add(t, hook):
        return t + v

    hooks = [("blocks.1.hook_resid_pre", add)]
    cached, plain = _both(tiny, PROMPTS, max_new_tokens=5, fwd_hooks=hooks, stop_at_newline=False)
    assert cached == plain


def test_columns_visible_to_plain_hooks(tiny):
    """During a cached step a hook can see which positions its columns are."""
    seen = []

    def look(t, hook):
        cols = current_columns()
        seen.append(None if cols is None else cols[:, 0].tolist())

    batch = encode(tiny, ["ab", "abcdef"])
    decode(tiny, batch, max_new_tokens=3, fwd_hooks=[("blocks.0.hook_resid_pre", look)], cache=True)
    n = batch.lengths.tolist()
    assert seen[0] is None  # the prompt pass computes every position
    assert seen[1] == [n[0], n[1]]  # the first generated token, at each row's real position
    assert seen[2] == [n[0] + 1, n[1] + 1]


def test_finished_rows_leave_the_batch(tiny):
    sizes = []

    def size(t, hook):
        sizes.append(int(t.shape[0]))

    batch = encode(tiny, PROMPTS[:4])
    out = decode(
        tiny,
        batch,
        max_new_tokens=5,
        fwd_hooks=[("blocks.0.hook_resid_pre", size)],
        stop=lambda r, ids: len(ids) >= r + 1,  # row r stops after r + 1 tokens
        cache=True,
    )
    assert [len(o) for o in out] == [1, 2, 3, 4]
    assert sizes == [4, 3, 2, 1]  # prompt pass, then one row fewer per step
    ref = decode(tiny, batch, max_new_tokens=5, stop=lambda r, ids: len(ids) >= r + 1, cache=False)
    assert out == ref


def test_hooks_and_adapter_removed_after_error(tiny):
    before = count_hooks(tiny)
    calls = {"n": 0}

    def boom(t, hook):
        calls["n"] += 1
        if calls["n"] == 3:  # in the second decoding step
            raise RuntimeError("boom")

    iv = _interventions(tiny)["composed"]
    with pytest.raises(RuntimeError, match="boom"):
        greedy_generate(
            tiny,
            PROMPTS,
            intervention=iv,
            fwd_hooks=[("blocks.0.hook_resid_pre", boom)],
            decoding=DecodeOptions(max_new_tokens=4),
        )
    assert count_hooks(tiny) == before
    assert all(not m._forward_pre_hooks for m in decoding._attention_modules(tiny))


def test_upstream_fix_takes_the_native_path(tiny, monkeypatch):
    """When the bridge fills the cache itself (TransformerLens fixed), no adapter is used and
    the tokens stay the same."""
    from transformer_lens.model_bridge.generalized_components.attention import AttentionBridge

    original = AttentionBridge._update_kv_cache
    if kv_cache_path(tiny) == "native":
        pytest.skip("this TransformerLens already fills the cache")

    def fixed(self, k, v, **kwargs):
        if kwargs.get("past_key_values") is None and kwargs.get("cache") is not None:
            kwargs = {**kwargs, "past_key_values": kwargs["cache"]}
        return original(self, k, v, **kwargs)

    iv = _interventions(tiny)["composed"]
    ref = greedy_generate(
        tiny, PROMPTS, intervention=iv, decoding=DecodeOptions(max_new_tokens=5, cache=False)
    )
    monkeypatch.setattr(AttentionBridge, "_update_kv_cache", fixed)
    monkeypatch.setattr(decoding, "_PATHS", type(decoding._PATHS)())
    assert kv_cache_path(tiny) == "native"
    assert (
        greedy_generate(tiny, PROMPTS, intervention=iv, decoding=DecodeOptions(max_new_tokens=5))
        == ref
    )
    monkeypatch.setattr(decoding, "_PATHS", type(decoding._PATHS)())


def test_broken_cache_falls_back_to_recomputing(tiny, monkeypatch):
    monkeypatch.setattr(decoding, "_PATHS", type(decoding._PATHS)())
    monkeypatch.setattr(decoding, "_copy_cache_keyword", lambda m, a, k: None)
    assert kv_cache_path(tiny) == "none"
    ref = greedy_generate(tiny, PROMPTS[:3], decoding=DecodeOptions(max_new_tokens=3, cache=False))
    assert greedy_generate(tiny, PROMPTS[:3], decoding=DecodeOptions(max_new_tokens=3)) == ref
    monkeypatch.setattr(decoding, "_PATHS", type(decoding._PATHS)())


def test_sliding_window_too_short_decodes_uncached(tiny, monkeypatch):
    batch = encode(tiny, PROMPTS)
    cfg = tiny.original_model.config
    monkeypatch.setattr(cfg, "sliding_window", batch.tokens.shape[1] + 2, raising=False)
    assert decoding.fits_window(tiny, batch, 2)
    assert not decoding.fits_window(tiny, batch, 3)


def test_sampling_from_bos_same_draws(tiny):
    iv = _interventions(tiny)["clamp-all"]
    hooks = list(iv.fwd_hooks(tiny))
    a = sample_from_bos(tiny, 6, max_new_tokens=5, fwd_hooks=hooks, seed=3, cache=True)
    b = sample_from_bos(tiny, 6, max_new_tokens=5, fwd_hooks=hooks, seed=3, cache=False)
    assert a == b


def test_bad_lengths_refused(tiny):
    with pytest.raises(ValueError, match="max_new_tokens"):
        decode(tiny, encode(tiny, ["ab"]), max_new_tokens=-1)
    with pytest.raises(ValueError, match="batch_size"):
        greedy_generate(tiny, ["ab"], decoding=DecodeOptions(batch_size=0))
    assert decode(tiny, encode(tiny, ["ab"]), max_new_tokens=0) == [[]]
    # the decoding rule's keywords are checked as named arguments are: a misspelt or a
    # missing one is a TypeError, not silently a default
    with pytest.raises(TypeError, match="max_new_tokens"):
        decode(tiny, encode(tiny, ["ab"]), max_new_tokens=2, fwd_hook=[])
    with pytest.raises(TypeError, match="max_new_tokens"):
        decode(tiny, encode(tiny, ["ab"]))


def test_plain_padded_run_needs_the_batch(tiny):
    """A padded multi-row run with a 'last' intervention is refused without lengths, and
    steers each row's real last token when given the batch."""
    import mechlingo

    batch = encode(tiny, PROMPTS[:3])
    v = _vec(tiny, 9)
    sv = SteeringVector(v, 1, 2.0)
    with pytest.raises(InterventionError, match="row lengths"):
        tiny.run_with_hooks(
            batch.tokens, attention_mask=batch.attention_mask(), fwd_hooks=sv.fwd_hooks(tiny)
        )
    assert count_hooks(tiny) == 0
    seen = {}

    def grab(t, hook):
        seen["x"] = t.clone()

    name = "blocks.1.hook_resid_pre"
    tiny.run_with_hooks(
        batch.tokens, attention_mask=batch.attention_mask(), fwd_hooks=[(name, grab)]
    )
    clean = seen["x"]
    tiny.run_with_hooks(
        batch.tokens,
        attention_mask=batch.attention_mask(),
        fwd_hooks=sv.fwd_hooks_for(tiny, batch) + [(name, grab)],
    )
    diff = seen["x"] - clean
    with mechlingo.intervene(tiny, sv, batch=batch):
        tiny.run_with_hooks(
            batch.tokens, attention_mask=batch.attention_mask(), fwd_hooks=[(name, grab)]
        )
    assert torch.equal(seen["x"] - clean, diff)
    for i, n in enumerate(batch.lengths.tolist()):
        torch.testing.assert_close(diff[i, n - 1], 2.0 * v)
        rest = torch.cat([diff[i, : n - 1], diff[i, n:]])
        assert rest.abs().max() == 0
    # 'all' needs no lengths, and one row is taken as unpadded
    NeuronClamp({0: [1]}, 0.0, positions="all").fwd_hooks(tiny)
    tiny.run_with_hooks(batch.tokens, fwd_hooks=NeuronClamp({0: [1]}, 0.0).fwd_hooks(tiny))
    tiny.run_with_hooks(batch.tokens[:1], fwd_hooks=sv.fwd_hooks(tiny))


@pytest.mark.slow
def test_cached_equals_uncached_gemma(gemma):
    """Cached decoding equals recomputing the prefix on the embedded model, for every kind of
    intervention. The equality holds at any batch size, so one fact per language is
    enough: three scripts, mixed lengths, and two batches (2 + 1) with a short last one."""
    assert kv_cache_path(gemma) in ("native", "adapter")
    facts = load_facts(langs=["en", "ja", "ar"], relations=["capital"], limit=1)
    prompts = [f.prompt for f in facts]
    assert len(prompts) == 3 and len({len(p) for p in prompts}) > 1
    for kind, iv in _interventions(gemma).items():
        if kind in ("ablate-ints",):
            continue
        cached, plain = _both(gemma, prompts, max_new_tokens=5, intervention=iv, batch_size=2)
        assert cached == plain, kind
