"""Every supported model family, on a tiny random model built offline (mechlingo.testing).

Each check compares mechlingo against an independent reference: the original transformers
model run with torch hooks on its own modules (block inputs/outputs, the down projection's
input, its own final norm, soft-cap and logit scale), TransformerLens's logit lens and
patching, hand computations, and the same prompts run one by one. docs/models.md has the
table of families and what each check covers.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import transformer_lens.patching as tlp
from transformer_lens.tools.analysis import logit_lens as tl_logit_lens

import mechlingo
from mechlingo.activations.runs import next_token_logits, run_batch
from mechlingo.analyses.decoders.lens import logit_lens
from mechlingo.analyses.experts import collect_neuron_stats
from mechlingo.analyses.experts.align import embed_parallel
from mechlingo.analyses.recall.patching import answer_logprob, patch_activations
from mechlingo.core.answers import answer_tokens
from mechlingo.core.errors import InterventionError
from mechlingo.core.families import FAMILIES, REFUSED, Family
from mechlingo.core.models import ModelLoadError, load_model, weight_mode
from mechlingo.core.sites import SITE_HOOKS, SiteError, resolve_site, site_map
from mechlingo.core.tokens import TokenBatch, encode
from mechlingo.interventions import Ablation, NeuronClamp, SteeringVector
from mechlingo.testing import TINY, build_tiny_folder, build_tokenizer
from tests.conftest import count_hooks

PROMPTS = ["The capital of Italy is", "La capitale", "意大利的首都是", "Die Hauptstadt von"]
LANGS = ["en", "fr", "zh", "de"]
ANSWERS = {"answer": ["Rome", "Paris", "罗马", "Rom"], "en": ["Rome", "Paris", "Rome", "Rome"]}
TEXTS = {
    "en": ["the cat sat on the mat", "hello world", "a dog", "it is raining today again"],
    "es": ["el gato", "hola mundo que tal", "un perro grande y feo", "llueve"],
}
ATOL = 2e-5


@dataclass
class Fam:
    """One family's tiny model, loaded twice: through mechlingo and as plain transformers."""

    spec: Family
    folder: Any
    model: Any  # the TransformerBridge from mechlingo.load_model
    hf: Any  # the same folder loaded by transformers.AutoModelForCausalLM (the reference)
    hooks0: int  # hooks the bridge keeps attached itself (XGLM's MLP is built from hooks)

    def module_paths(self) -> tuple[str, str]:
        """(blocks path, down projection path inside a block) in the transformers model, read
        from the bridge's adapter so the reference hooks the very modules the bridge wraps."""
        blocks = self.model.adapter.component_mapping["blocks"]
        mlp = blocks.submodules["mlp"]
        down = mlp.submodules["out"].name
        # XGLM's MLP is not a module of its own: fc1/fc2 sit on the decoder layer
        return blocks.name, f"{mlp.name}.{down}" if mlp.name else down


@pytest.fixture(scope="session", params=sorted(FAMILIES))
def fam(request, tmp_path_factory) -> Fam:
    from transformers import AutoModelForCausalLM

    name = request.param
    folder = build_tiny_folder(tmp_path_factory.mktemp(f"family-{name}") / "model", name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = load_model(folder, device="cpu")
    assert not [w for w in caught if "not among the families" in str(w.message)]
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return Fam(FAMILIES[name], folder, model, hf, count_hooks(model))


# --------------------------------------------------------------------------------------
# the reference: torch hooks on the original transformers modules
# --------------------------------------------------------------------------------------


def _hidden(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, tuple) else out


def hf_run(
    fam: Fam, tokens: torch.Tensor, *, last_block_output: torch.Tensor | None = None
) -> dict[str, Any]:
    """Run the transformers model on ``tokens`` [1, pos] and record, with torch hooks on its
    own modules: the input of block 0, every block's output, every down projection's input
    and the logits. With ``last_block_output`` the last block's output is replaced by it, so
    the logits are the model's own head (final norm, soft-cap, logit scale) applied to it."""
    blocks_path, down_path = fam.module_paths()
    n = int(fam.model.cfg.n_layers)
    rec: dict[str, Any] = {"post": {}, "down_in": {}}
    handles = []

    def pre0(mod, args, kwargs):
        rec["pre0"] = (args[0] if args else kwargs["hidden_states"]).detach().clone()

    def out_hook(layer):
        def fn(mod, args, out):
            rec["post"][layer] = _hidden(out).detach().clone()
            if layer == n - 1 and last_block_output is not None:
                if isinstance(out, tuple):
                    return (last_block_output, *out[1:])
                return last_block_output
            return None

        return fn

    def down_hook(layer):
        def fn(mod, args):
            rec["down_in"][layer] = args[0].detach().clone()

        return fn

    try:
        block0 = fam.hf.get_submodule(f"{blocks_path}.0")
        handles.append(block0.register_forward_pre_hook(pre0, with_kwargs=True))
        for layer in range(n):
            block = fam.hf.get_submodule(f"{blocks_path}.{layer}")
            handles.append(block.register_forward_hook(out_hook(layer)))
            down = block.get_submodule(down_path)
            handles.append(down.register_forward_pre_hook(down_hook(layer)))
        with torch.no_grad():
            rec["logits"] = fam.hf(tokens).logits.float()
    finally:
        for h in handles:
            h.remove()
    return rec


def _one(fam: Fam, prompt: str) -> torch.Tensor:
    return encode(fam.model, [prompt]).tokens


def _first_real(fam: Fam) -> int:
    return 1 if encode(fam.model, ["a"]).has_bos else 0


# --------------------------------------------------------------------------------------
# 1. loading and sites
# --------------------------------------------------------------------------------------


def test_load_model_and_every_site(fam):
    model, spec = fam.model, fam.spec
    assert type(model).__name__ == "TransformerBridge"
    sm = site_map(model)
    for site in SITE_HOOKS:
        if site == "resid_mid" and spec.parallel:
            # parallel blocks have no residual between attention and MLP: refused by name
            assert not sm.available[site]
            with pytest.raises(SiteError, match="resid_mid"):
                resolve_site(model, site, 0)
            continue
        for layer in range(sm.n_layers):
            s = resolve_site(model, site, layer)
            assert s.hook_name in model.hook_dict

    tokens = _one(fam, PROMPTS[0])
    # one BOS at most, whoever adds it (TransformerLens, or the tokenizer itself as Llama's
    # and XGLM's do), and none where the family has none
    bos = model.tokenizer.bos_token_id
    if encode(model, ["a"]).has_bos:
        assert int(tokens[0, 0]) == bos and int(tokens[0, 1]) != bos
    else:
        assert int(tokens[0, 0]) != bos
    _, cache = model.run_with_cache(tokens)
    ref = hf_run(fam, tokens)
    # the neuron count is the down projection's real input width (TransformerLens guesses
    # 4 * d_model for XGLM; load_model corrects cfg.d_mlp)
    width = ref["down_in"][0].shape[-1]
    assert resolve_site(model, "mlp_post", 0).width == int(model.cfg.d_mlp) == width
    # the bridge computes what transformers computes
    torch.testing.assert_close(model(tokens).float(), ref["logits"], atol=ATOL, rtol=1e-5)
    # resid_pre 0 is the input of the first block (after BLOOM's embedding LayerNorm, after
    # Gemma's sqrt(d_model) scaling); resid_post l is block l's output
    torch.testing.assert_close(cache["blocks.0.hook_resid_pre"], ref["pre0"], atol=ATOL, rtol=0)
    for layer in range(sm.n_layers):
        c = lambda k, layer=layer: cache[f"blocks.{layer}.{k}"]  # noqa: E731
        torch.testing.assert_close(c("hook_resid_post"), ref["post"][layer], atol=ATOL, rtol=0)
        # mlp_post is the input of the down projection (for gated MLPs act(gate) * up)
        torch.testing.assert_close(c("mlp.hook_post"), ref["down_in"][layer], atol=ATOL, rtol=0)
        # the residual decomposes into the sublayer outputs the sites name
        if spec.parallel:
            total = c("hook_resid_pre") + c("hook_attn_out") + c("hook_mlp_out")
            torch.testing.assert_close(c("hook_resid_post"), total, atol=ATOL, rtol=0)
        else:
            mid = c("hook_resid_pre") + c("hook_attn_out")
            torch.testing.assert_close(c("hook_resid_mid"), mid, atol=ATOL, rtol=0)
            total = mid + c("hook_mlp_out")
            torch.testing.assert_close(c("hook_resid_post"), total, atol=ATOL, rtol=0)


def test_answer_tokens_carry_the_word(fam):
    # whatever the space convention (Ġ, ▁, none, the space as a token of its own), the
    # primary token is the start of the word and no member of the set is only whitespace
    model = fam.model
    for word, lang in [("Rome", "en"), ("Paris", "fr"), ("罗马", "zh"), ("Roma", "es")]:
        a = answer_tokens(model, word, lang=lang)
        text = model.tokenizer.decode([a.primary]).strip()
        # "\ufffd": a byte-level token holding part of a character's UTF-8 bytes
        assert text and (word.startswith(text) or text == "\ufffd"), (word, text)
        assert all(model.tokenizer.decode([i]).strip() for i in a.ids)
        spaced = " " + word if lang != "zh" else word
        ids = model.to_tokens(spaced, prepend_bos=False)[0].tolist()
        assert a.n_tokens == len(ids) and a.primary in ids


# --------------------------------------------------------------------------------------
# 2. logit lens
# --------------------------------------------------------------------------------------


def test_lens_equals_model_head_and_transformer_lens(fam):
    model = fam.model
    n = int(model.cfg.n_layers)
    for prompt, lang, word in [(PROMPTS[0], "en", "Rome"), (PROMPTS[2], "zh", "罗马")]:
        ours = logit_lens(model, [prompt], {"a": [word]}, langs=[lang], top_k=3)
        assert ours.layers == list(range(n + 1))
        tokens = _one(fam, prompt)
        primary = answer_tokens(model, word, lang=lang).primary
        # TransformerLens's own logit lens, same entries, same target token
        ref = tl_logit_lens(
            model, tokens, targets=torch.tensor([primary]), return_type="log_probs"
        ).values.reshape(-1)
        torch.testing.assert_close(ours.primary_logprob[:, 0, 0], ref, atol=1e-4, rtol=1e-4)
        # an independent reference: the transformers model's own head (final norm, soft-cap,
        # logit scale) applied to its own residual stream after each block
        base = hf_run(fam, tokens)
        stream = [base["pre0"]] + [base["post"][i] for i in range(n)]
        for entry in range(n + 1):
            head = hf_run(fam, tokens, last_block_output=stream[entry])["logits"][0, -1]
            want = head.log_softmax(-1)
            got = ours.primary_logprob[entry, 0, 0]
            torch.testing.assert_close(got, want[primary], atol=1e-4, rtol=1e-4)
            top = torch.topk(want, 3)
            torch.testing.assert_close(ours.top_logprobs[entry, 0], top.values, atol=1e-4, rtol=0)
        # the last entry is the model's output
        out = model(tokens)[0, -1].float().log_softmax(-1)
        assert torch.equal(ours.top_ids[-1, 0], torch.topk(out, 3).indices)
        torch.testing.assert_close(ours.top_logprobs[-1, 0], torch.topk(out, 3).values)


# --------------------------------------------------------------------------------------
# 3. padded batches
# --------------------------------------------------------------------------------------


def test_mixed_length_batch_equals_one_by_one(fam):
    model = fam.model
    batch = encode(model, PROMPTS)
    assert len(set(batch.lengths.tolist())) > 1  # really padded
    logits = next_token_logits(model, batch)
    lens = logit_lens(model, PROMPTS, ANSWERS, langs=LANGS, batch_size=4)
    for i, p in enumerate(PROMPTS):
        alone = hf_run(fam, _one(fam, p))["logits"][0, -1]
        torch.testing.assert_close(logits[i], alone, atol=1e-4, rtol=1e-5)
        one = logit_lens(model, [p], {k: [v[i]] for k, v in ANSWERS.items()}, langs=[LANGS[i]])
        torch.testing.assert_close(lens.logprob[:, i], one.logprob[:, 0], atol=1e-4, rtol=0)
        assert torch.equal(lens.top_ids[:, i], one.top_ids[:, 0])


def test_compat_mode_lens_equals_raw_lens(fam):
    # folded norms and centred weights (compat=True) change the weights, not what the lens
    # reads: every entry, every prompt, the same log-probabilities as the raw model
    compat = load_model(fam.folder, device="cpu", compat=True)
    assert weight_mode(compat) == "compat" and weight_mode(fam.model) == "raw"
    raw = logit_lens(fam.model, PROMPTS, ANSWERS, langs=LANGS)
    folded = logit_lens(compat, PROMPTS, ANSWERS, langs=LANGS)
    torch.testing.assert_close(folded.logprob, raw.logprob, atol=1e-4, rtol=0)
    torch.testing.assert_close(folded.primary_logprob, raw.primary_logprob, atol=1e-4, rtol=0)


# --------------------------------------------------------------------------------------
# 4. patching
# --------------------------------------------------------------------------------------


def _pair(model: Any) -> tuple[TokenBatch, TokenBatch]:
    """Same-shape source/target batches without padding: the target corrupts one token."""
    clean = encode(model, ["The cat sat on the mat", "A dog ran to the park"])
    width = int(clean.lengths.min())
    tokens = clean.tokens[:, :width].clone()
    lengths = torch.full((tokens.shape[0],), width)
    bad = tokens.clone()
    bad[:, 2] = (bad[:, 2] + 11) % 200 + 5
    return (
        TokenBatch(tokens, lengths, clean.pad_id, clean.has_bos),
        TokenBatch(bad, lengths.clone(), clean.pad_id, clean.has_bos),
    )


def _tl_metric(metric):
    ids = [list(s[0].ids) for s in metric.sets]

    def fn(logits):
        lp = logits[:, -1].float().log_softmax(-1)
        return torch.stack([torch.logsumexp(lp[i, ids[i]], -1) for i in range(len(ids))])

    return fn


def test_patching_grow_equals_stack_equals_transformer_lens(fam):
    model = fam.model
    src, tgt = _pair(model)
    metric = answer_logprob(model, ["mat", "park"], name="lp")
    sites = ["resid_pre", "resid_post", "attn_out", "mlp_out", "head"]
    if not fam.spec.parallel:
        sites.insert(1, "resid_mid")
    stack = patch_activations(model, src, tgt, sites, readout=metric, batching="stack")
    grow = patch_activations(
        model, src, tgt, sites, readout=metric, batching="grow", cells_per_batch=7
    )
    assert stack.cells == grow.cells
    assert (stack.values - grow.values).abs().max() < 1e-4
    assert not torch.allclose(stack.clean, stack.corrupted)
    _, cache = model.run_with_cache(src.tokens)
    for site, fn in [
        ("resid_pre", tlp.get_act_patch_resid_pre),
        ("attn_out", tlp.get_act_patch_attn_out),
        ("mlp_out", tlp.get_act_patch_mlp_out),
        ("head", tlp.get_act_patch_attn_head_out_by_pos),
    ]:
        ref = fn(model, tgt.tokens, cache, _tl_metric(metric), reduce="none").values
        ref = ref.reshape(-1, ref.shape[-1])
        ours = torch.stack([grow.values[0, i] for i, c in enumerate(grow.cells) if c.site == site])
        assert ours.shape == ref.shape
        assert (ours - ref).abs().max() < 1e-4, site
    # patching the last block's output at the last position reproduces the source
    n = int(model.cfg.n_layers)
    last = patch_activations(
        model, src, tgt, "resid_post", layers=[n - 1], positions=[-1], readout=metric
    )
    torch.testing.assert_close(last.values[:, 0], last.clean, atol=1e-4, rtol=0)
    assert count_hooks(model) == fam.hooks0


# --------------------------------------------------------------------------------------
# 5. interventions
# --------------------------------------------------------------------------------------


def _read(model, name, hooks, batch):
    out = {}

    def grab(t, hook):
        out["x"] = t.detach().clone()

    run_batch(model, batch, list(hooks) + [(name, grab)])
    return out["x"]


def test_each_intervention_changes_exactly_what_it_should(fam):
    model = fam.model
    batch = encode(model, PROMPTS)
    first = _first_real(fam)
    d = int(model.cfg.d_model)
    # steering: + alpha * v at each row's last real token of resid_pre 1, nothing else
    v = torch.randn(d, generator=torch.Generator().manual_seed(1))
    name = "blocks.1.hook_resid_pre"
    clean = _read(model, name, (), batch)
    diff = _read(model, name, SteeringVector(v, 1, 2.5).fwd_hooks(model), batch) - clean
    for i, n in enumerate(batch.lengths.tolist()):
        torch.testing.assert_close(diff[i, n - 1], 2.5 * v, atol=1e-5, rtol=1e-5)
        diff[i, n - 1] = 0
    assert torch.equal(diff, torch.zeros_like(diff))
    # "all": every real token, position 0 included exactly when it is not a BOS
    steer_all = SteeringVector(torch.ones(d), 0, 1.0, positions="all")
    diff = _read(model, "blocks.0.hook_resid_pre", steer_all.fwd_hooks(model), batch)
    diff = diff - _read(model, "blocks.0.hook_resid_pre", (), batch)
    touched = diff.abs().sum(-1) > 0
    want = batch.real_token_mask()
    assert torch.equal(touched, want) and bool(want[:, 0].any()) == (first == 0)
    # neuron clamp: exactly the chosen neurons of mlp_post, at every real token
    name = "blocks.1.mlp.hook_post"
    clean = _read(model, name, (), batch)
    clamp = NeuronClamp({1: [3, 7]}, {1: [5.0, -2.0]}, positions="all")
    got = _read(model, name, clamp.fwd_hooks(model), batch)
    expect = clean.clone()
    mask = batch.real_token_mask()
    expect[..., 3][mask] = 5.0
    expect[..., 7][mask] = -2.0
    assert torch.equal(got, expect)
    # the clamp reaches the residual only through the down projection: at the last layer,
    # the change of resid_post is exactly the change of mlp_out
    n = int(model.cfg.n_layers)
    hooks = NeuronClamp({n - 1: [3]}, 4.0, positions="last").fwd_hooks(model)
    post = f"blocks.{n - 1}.hook_resid_post"
    mlp = f"blocks.{n - 1}.hook_mlp_out"
    d_post = _read(model, post, hooks, batch) - _read(model, post, (), batch)
    d_mlp = _read(model, mlp, hooks, batch) - _read(model, mlp, (), batch)
    torch.testing.assert_close(d_post, d_mlp, atol=1e-5, rtol=0)
    assert float(d_mlp.abs().sum()) > 0
    # ablation: attn_out 1 zeroed at the last token only; earlier positions of the block's
    # output do not change (causal attention)
    name = "blocks.1.hook_attn_out"
    abl = Ablation("attn_out", 1, positions="last").fwd_hooks(model)
    clean = _read(model, name, (), batch)
    got = _read(model, name, abl, batch)
    clean_post = _read(model, "blocks.1.hook_resid_post", (), batch)
    got_post = _read(model, "blocks.1.hook_resid_post", abl, batch)
    for i, n_i in enumerate(batch.lengths.tolist()):
        assert torch.equal(got[i, n_i - 1], torch.zeros(d))
        assert torch.equal(got[i, : n_i - 1], clean[i, : n_i - 1])
        assert torch.equal(got_post[i, : n_i - 1], clean_post[i, : n_i - 1])
        assert not torch.allclose(got_post[i, n_i - 1], clean_post[i, n_i - 1])


def _reads(model, names, hooks, batch):
    """One run with ``hooks`` first, then readers of ``names`` (so they see the edits)."""
    out = {}

    def grab(name):
        def fn(t, hook):
            out[name] = t.detach().clone()

        return fn

    logits = run_batch(model, batch, list(hooks) + [(n, grab(n)) for n in names])
    return out, logits


def _mid_writes(model):
    d = int(model.cfg.d_model)
    v = torch.randn(d, generator=torch.Generator().manual_seed(3))
    return [
        SteeringVector(v, 0, 3.0, site="resid_mid", positions="all"),
        SteeringVector(v, 1, 2.0, site="resid_mid", positions="last"),
        Ablation("resid_mid", 0, positions="last"),
        Ablation("resid_mid", 1, "mean", mean=v, positions="all"),
    ]


def test_resid_mid_writes_edit_the_residual(fam):
    """The bridge's hook_resid_mid is the pre-MLP norm's input; a write there must reach the
    residual stream too: resid_post == resid_mid' + mlp_out, and the same logits as the same
    intervention on the plain transformers model (whose hooks edit the residual itself)."""
    model = fam.model
    batch = encode(model, PROMPTS)
    if fam.spec.parallel:
        for iv in _mid_writes(model):
            with pytest.raises(InterventionError, match="parallel"):
                iv.fwd_hooks(model)
        return
    plain = run_batch(model, batch)
    for iv in _mid_writes(model):
        names = [f"blocks.{iv.layer}.hook_{k}" for k in ("resid_mid", "mlp_out", "resid_post")]
        clean, _ = _reads(model, names, (), batch)
        got, logits = _reads(model, names, iv.fwd_hooks(model), batch)
        mid, mlp, post = (got[n] for n in names)
        assert (mid - clean[names[0]]).abs().max() > 1e-3, iv
        torch.testing.assert_close(post, mid + mlp, atol=ATOL, rtol=0, msg=repr(iv))
        assert (logits - plain).abs().max() > 1e-4, iv
        if isinstance(iv, Ablation) and iv.mode == "zero":
            for i, n in enumerate(batch.lengths.tolist()):
                assert torch.equal(mid[i, n - 1], torch.zeros_like(mid[i, n - 1]))
            # no comparison with the plain model: a zero residual is 0/0 for the norms after
            # it, and hf.py writes resid_mid' - resid_mid through attn_out, which leaves ~1e-7
            # there instead of 0 (the norms blow it up: 1e-4 on the logits, 0.5 with Gemma's
            # post-MLP norm)
            continue
        with iv.attach(fam.hf):
            ref = fam.hf(batch.tokens, attention_mask=batch.attention_mask()).logits
        for i, n in enumerate(batch.lengths.tolist()):
            torch.testing.assert_close(logits[i, :n], ref[i, :n], atol=ATOL, rtol=0)
    # composed after an ablation of the same block's output, the carried edit must not undo it
    d = int(model.cfg.d_model)
    steer = SteeringVector(torch.ones(d), 0, 2.0, site="resid_mid", positions="all")
    for iv in (Ablation("resid_post", 0) + steer, steer + Ablation("resid_post", 0)):
        got, _ = _reads(model, ["blocks.0.hook_resid_post"], iv.fwd_hooks(model), batch)
        post = got["blocks.0.hook_resid_post"]
        mask = batch.real_token_mask()
        assert torch.equal(post[mask], torch.zeros_like(post[mask])), iv
        assert float(post[~mask].abs().sum()) > 0  # the ablation did not touch BOS/padding
    assert count_hooks(model) == fam.hooks0


def test_patching_resid_mid_equals_a_hand_patched_residual(fam):
    """patch_activations at resid_mid equals a run that sets the residual between attention and MLP
    by hand: attn_out + (source resid_mid - target resid_mid) at the patched position."""
    if fam.spec.parallel:
        pytest.skip("no resid_mid in a parallel block")
    model = fam.model
    src, tgt = _pair(model)
    metric = answer_logprob(model, ["mat", "park"], name="lp")
    layer, pos = 0, 2  # layer 1's attention carries position 2's residual to the last token
    for batching in ("stack", "grow"):
        res = patch_activations(
            model,
            src,
            tgt,
            "resid_mid",
            layers=[layer],
            positions=[pos],
            readout=metric,
            batching=batching,
        )
        mid = f"blocks.{layer}.hook_resid_mid"
        a, _ = _reads(model, [mid], (), src)
        b, _ = _reads(model, [mid], (), tgt)
        delta = a[mid][:, pos] - b[mid][:, pos]

        def carry(t, hook, delta=delta):
            t = t.clone()
            t[:, pos] += delta
            return t

        hand, logits = _reads(model, [mid], [(f"blocks.{layer}.hook_attn_out", carry)], tgt)
        torch.testing.assert_close(hand[mid][:, pos], a[mid][:, pos], atol=ATOL, rtol=0)
        ids = [list(s[0].ids) for s in metric.sets]
        lp = logits[:, -1].float().log_softmax(-1)
        want = torch.stack([torch.logsumexp(lp[i, ids[i]], -1) for i in range(len(ids))])
        torch.testing.assert_close(res.values[0, 0], want, atol=1e-4, rtol=0)
        assert (res.values[0, 0] - res.corrupted[0]).abs().max() > 1e-3  # the patch matters
    assert count_hooks(model) == fam.hooks0


# --------------------------------------------------------------------------------------
# 6. hooks after an error
# --------------------------------------------------------------------------------------


def test_hooks_removed_after_error(fam, monkeypatch):
    import mechlingo.analyses.recall.patching as patching

    model = fam.model
    batch = encode(model, PROMPTS)
    before = next_token_logits(model, batch)
    iv = SteeringVector(torch.ones(model.cfg.d_model), 1, 1.0) + NeuronClamp({1: [0]}, 0.0)

    def boom(t, hook):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        run_batch(model, batch, [("blocks.0.hook_resid_pre", boom)])
    assert count_hooks(model) == fam.hooks0
    with pytest.raises(RuntimeError, match="boom"), mechlingo.intervene(model, iv):
        model.run_with_hooks(_one(fam, PROMPTS[0]), fwd_hooks=[("blocks.1.hook_resid_post", boom)])
    assert count_hooks(model) == fam.hooks0

    class Boom(Exception):
        pass

    def exploding_writer(*args, **kwargs):
        def hook(t, hook):
            if hook.name.startswith("blocks.1."):
                raise Boom  # mid-pass, after layer 0's hooks have fired
            return t

        return hook

    src, tgt = _pair(model)
    metric = answer_logprob(model, ["mat", "park"])
    monkeypatch.setattr(patching, "_writer", exploding_writer)
    for batching in ("grow", "stack"):
        with pytest.raises(Boom):
            patch_activations(
                model, src, tgt, ["resid_pre", "head"], readout=metric, batching=batching
            )
        assert count_hooks(model) == fam.hooks0
    # nothing left behind: the same numbers as before the errors
    assert torch.equal(next_token_logits(model, batch), before)


# --------------------------------------------------------------------------------------
# 7. expert statistics and 8. alignment embeddings
# --------------------------------------------------------------------------------------


def test_expert_stats_read_the_down_projection_input(fam):
    model = fam.model
    first = _first_real(fam)
    sents = TEXTS["en"]
    stats = collect_neuron_stats(model, {"en": sents}, pool="mean", batch_size=4)
    mx = collect_neuron_stats(model, {"en": sents}, pool="max", batch_size=2)
    n = int(model.cfg.n_layers)
    fired = []
    for i, s in enumerate(sents):
        ref = hf_run(fam, _one(fam, s))["down_in"]
        acts = torch.stack([ref[layer][0, first:] for layer in range(n)])  # [layer, pos, d_mlp]
        want = acts.mean(1).reshape(-1)
        torch.testing.assert_close(stats.pooled[i], want, atol=ATOL, rtol=1e-5)
        torch.testing.assert_close(mx.pooled[i], acts.amax(1).reshape(-1), atol=ATOL, rtol=1e-5)
        fired.append(acts > 0)
    rate = torch.cat(fired, dim=1).float().mean(1).reshape(-1)
    torch.testing.assert_close(stats.prob_active[0].float(), rate, atol=1e-6, rtol=0)
    assert count_hooks(model) == fam.hooks0


def test_alignment_embedding_reads_block_outputs(fam):
    model = fam.model
    first = _first_real(fam)
    emb = embed_parallel(model, TEXTS, layers="all", batch_size=3)
    n = int(model.cfg.n_layers)
    for li, lang in enumerate(TEXTS):
        for j, s in enumerate(TEXTS[lang]):
            ref = hf_run(fam, _one(fam, s))["post"]
            for layer in range(n):
                want = ref[layer][0, first:].mean(0)
                torch.testing.assert_close(emb.emb[layer, li, j], want, atol=ATOL, rtol=1e-5)
    assert count_hooks(model) == fam.hooks0


# --------------------------------------------------------------------------------------
# load_model: refusals, unchecked architectures, hub ids
# --------------------------------------------------------------------------------------


def _config_only(folder, architecture: str):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"architectures": [architecture]}))
    return folder


@pytest.mark.parametrize(
    ("architecture", "why"),
    [
        ("MT5ForConditionalGeneration", "encoder-decoder"),
        ("M2M100ForConditionalGeneration", "encoder-decoder"),
        ("XLMRobertaForMaskedLM", "encoder"),
        ("MambaForCausalLM", "state-space"),
        ("JambaForCausalLM", "mixes attention"),
    ],
)
def test_refused_families_are_named(tmp_path, architecture, why):
    assert architecture in REFUSED
    folder = _config_only(tmp_path / "m", architecture)
    with pytest.raises(ModelLoadError, match=why) as err:
        load_model(folder, device="cpu")
    assert architecture in str(err.value) and "docs/models.md" in str(err.value)


def test_unknown_architecture_is_refused_with_what_exists(tmp_path):
    folder = _config_only(tmp_path / "m", "MyOwnModelForCausalLM")
    with pytest.raises(ModelLoadError, match="MyOwnModelForCausalLM") as err:
        load_model(folder, device="cpu")
    assert "LlamaForCausalLM" in str(err.value)


def test_unchecked_family_loads_with_a_warning(tmp_path):
    from transformers import AutoModelForCausalLM, OPTConfig

    tok = build_tokenizer("bytelevel")
    cfg = OPTConfig(
        vocab_size=len(tok),
        hidden_size=32,
        ffn_dim=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        word_embed_proj_dim=32,
        architectures=["OPTForCausalLM"],
    )
    assert "OPTForCausalLM" not in REFUSED
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path / "opt")
    tok.save_pretrained(tmp_path / "opt")
    with pytest.warns(UserWarning, match="OPTForCausalLM.*not among the families"):
        model = load_model(tmp_path / "opt", device="cpu")
    assert model.cfg.n_layers == 2


def test_mixture_of_experts_has_no_neuron_site(tmp_path):
    # an MoE block's mlp.hook_post is the mixed d_model-wide output, not a neuron layer:
    # the site is refused by name instead of indexed into
    from transformers import AutoModelForCausalLM, MixtralConfig

    from mechlingo.analyses.experts import ExpertError

    tok = build_tokenizer("bytelevel")
    cfg = MixtralConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=128,
        architectures=["MixtralForCausalLM"],
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path / "moe")
    tok.save_pretrained(tmp_path / "moe")
    with pytest.warns(UserWarning, match="MixtralForCausalLM"):
        model = load_model(tmp_path / "moe", device="cpu")
    with pytest.raises(SiteError, match="mixture-of-experts"):
        resolve_site(model, "mlp_post", 0)
    with pytest.raises(ExpertError, match="mixture-of-experts"):
        collect_neuron_stats(model, {"en": ["hello world"]})
    with pytest.raises(Exception, match="mixture-of-experts"):
        NeuronClamp({0: [1]}, 1.0).fwd_hooks(model)
    # the lens still reproduces the output
    r = logit_lens(model, [PROMPTS[0]], {"a": ["Rome"]}, top_k=3)
    out = model(model.to_tokens(PROMPTS[0]))[0, -1].float().log_softmax(-1)
    torch.testing.assert_close(r.top_logprobs[-1, 0], torch.topk(out, 3).values)


def test_hub_id_goes_through_the_folder_path(tmp_path, monkeypatch):
    import mechlingo.core.models as models

    folder = build_tiny_folder(tmp_path / "snapshot", "qwen2")
    asked = []

    def fake_download(name: str) -> Any:
        asked.append(name)
        return folder

    monkeypatch.setattr(models, "_download_hub", fake_download)
    model = load_model("Qwen/Qwen2.5-tiny", device="cpu")
    assert asked == ["Qwen/Qwen2.5-tiny"]
    assert model.cfg.model_name == "Qwen/Qwen2.5-tiny"
    local = load_model(folder, device="cpu")
    tokens = local.to_tokens(PROMPTS[0])
    assert torch.equal(model(tokens), local(tokens))
    # a refused family is refused by name on the hub path too
    refused = _config_only(tmp_path / "mt5", "MT5ForConditionalGeneration")
    monkeypatch.setattr(models, "_download_hub", lambda name: refused)
    with pytest.raises(ModelLoadError, match="MT5ForConditionalGeneration"):
        load_model("google/mt5-small", device="cpu")


def test_docs_table_lists_every_family():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "models.md").read_text()
    for spec in FAMILIES.values():
        assert f"`{spec.architecture}`" in text, spec.architecture
    for arch in ("MT5ForConditionalGeneration", "MambaForCausalLM"):
        assert arch in text


def test_no_family_is_both_supported_and_refused():
    assert not {f.architecture for f in FAMILIES.values()} & set(REFUSED)
    assert len(FAMILIES) >= 8


def test_every_family_has_a_tiny_model_and_entries_are_keywords():
    """The registry and the builder cover the same families; each tiny model's config names
    its family's architecture; ``Family`` takes keyword arguments only."""
    assert set(TINY) - {None} == set(FAMILIES)
    assert all(TINY[name].architecture == spec.architecture for name, spec in FAMILIES.items())
    with pytest.raises(TypeError):
        Family("x", "XForCausalLM", "", False, True, "", "")  # type: ignore[misc]
