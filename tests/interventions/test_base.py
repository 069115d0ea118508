"""Interventions on the tiny model, checked against hand computations."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mechlingo
from mechlingo.activations.runs import run_batch
from mechlingo.core.tokens import encode
from mechlingo.interventions import (
    Ablation,
    Compose,
    Gated,
    InterventionError,
    ModelMismatchError,
    NeuronClamp,
    SteeringVector,
    intervention_hooks,
    load_intervention,
    model_info,
)
from mechlingo.scoring.evaluate import DecodeOptions, greedy_generate
from tests.conftest import count_hooks

PROMPTS = ["The capital of Italy is", "Rome", "La capitale de la France est"]


def _read(model, hook_name, fwd_hooks=(), tokens=None, batch=None):
    """Activation at ``hook_name`` after the given hooks (a plain run or a padded batch)."""
    out = {}

    def grab(t, hook):
        out["x"] = t.detach().clone()

    hooks = list(fwd_hooks) + [(hook_name, grab)]
    if batch is not None:
        run_batch(model, batch, hooks)
    else:
        model.run_with_hooks(tokens, fwd_hooks=hooks)
    return out["x"]


@pytest.fixture(scope="module")
def toks(tiny):
    return tiny.to_tokens(PROMPTS[0])


def test_steering_adds_alpha_v_only_at_last_in_padded_batch(tiny):
    batch = encode(tiny, PROMPTS)
    assert len(set(batch.lengths.tolist())) > 1  # really padded
    v = torch.randn(tiny.cfg.d_model, generator=torch.Generator().manual_seed(1))
    sv = SteeringVector(v, 1, 2.5)
    name = "blocks.1.hook_resid_pre"
    clean = _read(tiny, name, batch=batch)
    steered = _read(tiny, name, sv.fwd_hooks(tiny), batch=batch)
    diff = steered - clean
    for i, n in enumerate(batch.lengths.tolist()):
        torch.testing.assert_close(diff[i, n - 1], 2.5 * v, rtol=1e-5, atol=1e-5)
        mask = torch.ones(diff.shape[1], dtype=torch.bool)
        mask[n - 1] = False
        assert torch.equal(diff[i, mask], torch.zeros_like(diff[i, mask]))


def test_steering_explicit_positions_and_all(tiny, toks):
    v = torch.ones(tiny.cfg.d_model)
    name = "blocks.0.hook_resid_pre"
    clean = _read(tiny, name, tokens=toks)
    d = _read(tiny, name, SteeringVector(v, 0, 1.0, positions=[1, 3]).fwd_hooks(tiny), toks) - clean
    touched = (d.abs().sum(-1)[0] > 0).nonzero().flatten().tolist()
    assert touched == [1, 3]
    d = _read(tiny, name, SteeringVector(v, 0, 1.0, positions="all").fwd_hooks(tiny), toks) - clean
    touched = (d.abs().sum(-1)[0] > 0).nonzero().flatten().tolist()
    assert touched == list(range(1, toks.shape[1]))  # every token but BOS

    def first_two(batch):
        return torch.tensor([1] * batch.batch_size)

    d = _read(tiny, name, SteeringVector(v, 0, 1.0, positions=first_two).fwd_hooks(tiny), toks)
    assert ((d - clean).abs().sum(-1)[0] > 0).nonzero().flatten().tolist() == [1]


def test_alpha_zero_changes_nothing(tiny, toks):
    v = torch.randn(tiny.cfg.d_model)
    clean = tiny(toks)
    out = tiny.run_with_hooks(toks, fwd_hooks=SteeringVector(v, 1, 0.0).fwd_hooks(tiny))
    assert torch.equal(clean, out)


def test_clamp_sets_exactly_the_chosen_neurons(tiny, toks):
    name = "blocks.1.mlp.hook_post"
    clean = _read(tiny, name, tokens=toks)
    clamp = NeuronClamp({1: [3, 7]}, {1: [5.0, -2.0]}, positions="all")
    got = _read(tiny, name, clamp.fwd_hooks(tiny), toks)
    expect = clean.clone()
    expect[0, 1:, 3] = 5.0
    expect[0, 1:, 7] = -2.0
    assert torch.equal(got, expect)


@pytest.mark.parametrize(
    ("mode", "fn"),
    [("scale", lambda x: x * 3.0), ("add", lambda x: x + 3.0), ("set", lambda x: x * 0 + 3.0)],
)
def test_clamp_modes_and_several_layers(tiny, toks, mode, fn):
    clamp = NeuronClamp({0: [1], 1: [2, 4]}, 3.0, mode, positions="last")
    for layer, ids in ((0, [1]), (1, [2, 4])):
        name = f"blocks.{layer}.mlp.hook_post"
        # the layer-1 input depends on the layer-0 clamp: compare against a run with only the
        # other layer's clamp applied
        other = {0: [1], 1: [2, 4]}
        other.pop(layer)
        base_hooks = NeuronClamp(other, 3.0, mode, positions="last").fwd_hooks(tiny)
        clean = _read(tiny, name, base_hooks, toks)
        got = _read(tiny, name, clamp.fwd_hooks(tiny), toks)
        expect = clean.clone()
        expect[0, -1, ids] = fn(clean[0, -1, ids])
        torch.testing.assert_close(got, expect, rtol=0, atol=0)


def test_ablation_zero_and_mean(tiny, toks):
    name = "blocks.1.hook_attn_out"
    clean = _read(tiny, name, tokens=toks)
    got = _read(tiny, name, Ablation("attn_out", 1, positions="last").fwd_hooks(tiny), toks)
    assert torch.equal(got[0, -1], torch.zeros_like(got[0, -1]))
    assert torch.equal(got[0, :-1], clean[0, :-1])
    mean = torch.arange(tiny.cfg.d_model, dtype=torch.float32)
    got = _read(tiny, name, Ablation("attn_out", 1, "mean", mean=mean).fwd_hooks(tiny), toks)
    assert torch.equal(got[0, 1:], mean.expand_as(got[0, 1:]))
    assert torch.equal(got[0, 0], clean[0, 0])
    with pytest.raises(InterventionError, match="mean="):
        Ablation("attn_out", 1, "mean")


def test_composition_order(tiny, toks):
    name = "blocks.1.hook_resid_pre"
    v = torch.ones(tiny.cfg.d_model)
    steer = SteeringVector(v, 1, 2.0, positions="last")
    zero = Ablation("resid_pre", 1, positions="last")
    # steer then zero -> zero; zero then steer -> exactly 2 * v
    a = _read(tiny, name, (steer + zero).fwd_hooks(tiny), toks)
    b = _read(tiny, name, (zero + steer).fwd_hooks(tiny), toks)
    assert torch.equal(a[0, -1], torch.zeros_like(v))
    assert torch.equal(b[0, -1], 2.0 * v)
    c = Compose([zero, Compose([steer, steer])])
    assert [p.kind for p in c.parts] == ["Ablation", "SteeringVector", "SteeringVector"]
    assert torch.equal(_read(tiny, name, c.fwd_hooks(tiny), toks)[0, -1], 4.0 * v)


def test_three_ways_agree(tiny, toks):
    v = torch.randn(tiny.cfg.d_model, generator=torch.Generator().manual_seed(2))
    iv = SteeringVector(v, 1, 3.0) + NeuronClamp({0: [0, 5]}, 1.5)
    with mechlingo.intervene(tiny, iv):
        a = tiny(toks)
    b = tiny.run_with_hooks(toks, fwd_hooks=iv.fwd_hooks(tiny))
    with tiny.hooks(fwd_hooks=iv.fwd_hooks(tiny)):
        c = tiny(toks)
    clean = tiny(toks)
    assert torch.equal(a, b) and torch.equal(b, c)
    assert not torch.allclose(a, clean)
    assert count_hooks(tiny) == 0


def test_hooks_removed_after_exception(tiny, toks):
    before = count_hooks(tiny)
    iv = SteeringVector(torch.ones(tiny.cfg.d_model), 1, 1.0) + NeuronClamp({1: [0]}, 0.0)

    def boom(t, hook):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"), mechlingo.intervene(tiny, iv):
        assert count_hooks(tiny) == before + 2
        tiny.run_with_hooks(toks, fwd_hooks=[("blocks.1.hook_resid_post", boom)])
    assert count_hooks(tiny) == before
    with pytest.raises(RuntimeError, match="boom"):
        tiny.run_with_hooks(
            toks, fwd_hooks=iv.fwd_hooks(tiny) + [("blocks.1.hook_resid_post", boom)]
        )
    assert count_hooks(tiny) == before
    with pytest.raises(RuntimeError, match="boom"):
        greedy_generate(
            tiny,
            PROMPTS[:1],
            intervention=iv,
            fwd_hooks=[("blocks.1.hook_resid_post", boom)],
            decoding=DecodeOptions(max_new_tokens=2),
        )
    assert count_hooks(tiny) == before


def test_generation_equals_manual_decoding(tiny):
    """No KV cache: greedy_generate with an intervention equals a full forward per step."""
    v = torch.randn(tiny.cfg.d_model, generator=torch.Generator().manual_seed(3))
    for positions in ("last", "last+generated"):
        iv = SteeringVector(v, 1, 4.0, positions=positions)
        prompt = PROMPTS[0]
        got = greedy_generate(
            tiny,
            [prompt],
            intervention=iv,
            stop_at_newline=False,
            decoding=DecodeOptions(max_new_tokens=5),
        )[0]
        tokens = tiny.to_tokens(prompt)
        plen = tokens.shape[1]
        new = []
        for _ in range(5):

            def steer(t, hook, plen=plen, positions=positions):
                t = t.clone()
                if positions == "last":
                    t[:, plen - 1] += 4.0 * v
                else:
                    t[:, plen - 1 :] += 4.0 * v
                return t

            logits = tiny.run_with_hooks(tokens, fwd_hooks=[("blocks.1.hook_resid_pre", steer)])
            nxt = int(logits[0, -1].argmax())
            if nxt == tiny.tokenizer.eos_token_id:
                break
            new.append(nxt)
            tokens = torch.cat([tokens, torch.tensor([[nxt]])], dim=1)
        assert got == tiny.tokenizer.decode(new), positions


def test_save_load_roundtrip(tiny, tmp_path):
    v = torch.randn(tiny.cfg.n_layers, tiny.cfg.d_model)
    iv = (
        SteeringVector(v, 1, 2.0, meta={"build": {"n_prompts": 3, "langs": ["fr"]}})
        + NeuronClamp({0: [1, 2], 1: [3]}, {0: [1.0, 2.0], 1: [0.5]}, "scale")
        + Ablation("attn_out", 0, "mean", mean=torch.ones(tiny.cfg.d_model), positions=[1])
    )
    iv.save(tmp_path / "iv", model=tiny)
    back = load_intervention(tmp_path / "iv", tiny)
    assert isinstance(back, Compose) and len(back.parts) == 3
    assert back.meta["model"] == model_info(tiny)
    assert back.parts[0].meta["build"]["langs"] == ["fr"]
    toks = tiny.to_tokens(PROMPTS[0])
    a = tiny.run_with_hooks(toks, fwd_hooks=iv.fwd_hooks(tiny))
    b = tiny.run_with_hooks(toks, fwd_hooks=back.fwd_hooks(tiny))
    assert torch.equal(a, b)
    import json

    doc = json.loads((tmp_path / "iv" / "intervention.json").read_text())
    assert doc["meta"]["model"]["weights"] == "raw"
    assert doc["config"]["parts"][0]["config"]["positions"] == "last"
    assert "mechlingo" in doc


def test_load_on_wrong_model_says_what_differs(tiny, tmp_path):
    sv = SteeringVector(torch.ones(tiny.cfg.d_model), 0, 1.0)
    sv.save(tmp_path / "sv", model=tiny)
    import json

    path = tmp_path / "sv" / "intervention.json"
    doc = json.loads(path.read_text())
    doc["meta"]["model"]["d_model"] = 640
    doc["meta"]["model"]["unembed_fingerprint"] = "0123456789abcdef"
    doc["meta"]["model"]["weights"] = "compat"
    path.write_text(json.dumps(doc))
    with pytest.raises(ModelMismatchError, match="d_model: saved 640, this model 64") as err:
        load_intervention(tmp_path / "sv", tiny)
    assert "unembed_fingerprint" in str(err.value) and "weights" in str(err.value)
    load_intervention(tmp_path / "sv")  # without a model: no check


def test_callable_positions_cannot_be_saved(tiny, tmp_path):
    sv = SteeringVector(torch.ones(tiny.cfg.d_model), 0, positions=lambda b: b.last_index)
    with pytest.raises(InterventionError, match="callable positions"):
        sv.save(tmp_path / "x", model=tiny)
    assert not (tmp_path / "x").exists()


def test_clear_errors(tiny):
    with pytest.raises(InterventionError, match="size 10 .* width 64"):
        SteeringVector(torch.ones(10), 0).fwd_hooks(tiny)
    with pytest.raises(ValueError, match="unknown site 'resid_middle'"):
        SteeringVector(torch.ones(64), 0, site="resid_middle")
    with pytest.raises(InterventionError, match="layer 5 is out of range"):
        SteeringVector(torch.ones(64), 5).fwd_hooks(tiny)
    with pytest.raises(InterventionError, match="out of range"):
        NeuronClamp({0: [10_000]}, 1.0).fwd_hooks(tiny)
    with pytest.raises(InterventionError, match="layer 3 is out of range"):
        NeuronClamp({3: [1]}, 1.0).fwd_hooks(tiny)
    with pytest.raises(InterventionError, match="no layer"):
        SteeringVector(torch.ones(2, 64)).fwd_hooks(tiny)
    with pytest.raises(InterventionError, match="stack has 3 layers"):
        SteeringVector(torch.ones(3, 64), 0).fwd_hooks(tiny)
    with pytest.raises(InterventionError, match="unknown clamp mode"):
        NeuronClamp({0: [1]}, 1.0, "double")
    with pytest.raises(ValueError, match="unknown positions rule"):
        SteeringVector(torch.ones(64), 0, positions="first")


def test_repr_and_html():
    iv = SteeringVector(torch.ones(4), 2, 0.5, meta={"name": "task"}) + NeuronClamp({1: [0]}, 1.0)
    text = repr(iv)
    assert "SteeringVector(name=task, site=resid_pre, layer=2, alpha=0.5" in text
    assert "NeuronClamp(mode=set" in text
    page = iv._repr_html_()
    assert "<ol>" in page and "SteeringVector" in page and "NeuronClamp" in page


def test_clamp_values_as_flat_sequence(tiny):
    from mechlingo.interventions import InterventionError, NeuronClamp

    c = NeuronClamp({0: [1, 2], 1: [3]}, torch.tensor([0.5, 1.5, 2.5]))
    assert c.values[0].tolist() == [0.5, 1.5] and c.values[1].tolist() == [2.5]
    assert NeuronClamp({0: [1, 2]}, torch.tensor(2.0)).values[0].tolist() == [2.0, 2.0]
    with pytest.raises(InterventionError, match="one value per neuron"):
        NeuronClamp({0: [1, 2]}, torch.zeros(3))


def test_zeroing_has_one_owner(tiny, toks):
    """Zeroing is an Ablation: a clamp has no zero mode (the error says what to use), and a
    clamp set to 0 and a zero ablation of the whole site give the same activation."""
    with pytest.raises(InterventionError, match="zeroing is an Ablation"):
        NeuronClamp({0: [1]}, mode="zero")
    with pytest.raises(TypeError):
        Ablation("attn_out", 1, kind="zero")  # the old keyword is gone
    assert not hasattr(Ablation("attn_out", 1), "ablation")
    name = "blocks.0.mlp.hook_post"
    every = list(range(int(tiny.cfg.d_mlp)))
    a = _read(tiny, name, NeuronClamp({0: every}, 0.0, positions="last").fwd_hooks(tiny), toks)
    b = _read(tiny, name, Ablation("mlp_post", 0, positions="last").fwd_hooks(tiny), toks)
    assert torch.equal(a, b) and torch.equal(b[0, -1], torch.zeros_like(b[0, -1]))


FIXTURE = Path(__file__).parents[1] / "fixtures" / "intervention_v1"


def test_an_intervention_saved_before_the_base_loads_and_acts_the_same(tiny):
    """A Compose of every kind saved by the code before the SiteEdit base (commit c86a4d0,
    see tests/fixtures/intervention_v1/README.md) loads, checks against the model, and gives
    the logits that code gave; its old ``mode="zero"`` clamp loads as a set to 0."""
    from safetensors.torch import load_file

    from mechlingo.core.tokens import encode

    iv = load_intervention(FIXTURE / "intervention", tiny)
    kinds = [p.kind for p in iv.parts]
    assert kinds == ["SteeringVector", "NeuronClamp", "NeuronClamp", "Ablation", "Ablation",
                     "Gated"]  # fmt: skip
    zero = iv.parts[1]
    assert zero.mode == "set" and all(not v.any() for v in zero.values.values())
    assert iv.parts[0].meta["name"] == "task" and iv.parts[0].layer == 1
    batch = encode(tiny, ["The capital of Italy is", "La capitale de la France est"])
    with mechlingo.intervene(tiny, iv, batch=batch):
        logits = tiny(batch.tokens, attention_mask=batch.attention_mask())
    last = logits[torch.arange(2), batch.lengths - 1]
    want = load_file(str(FIXTURE / "logits.safetensors"))["last_logits"]
    torch.testing.assert_close(last, want, rtol=1e-5, atol=1e-5)
    clean = tiny(batch.tokens, attention_mask=batch.attention_mask())[
        torch.arange(2), batch.lengths - 1
    ]
    assert not torch.allclose(last, clean)  # the fixture really intervenes


def test_plus_and_only_for_build_the_classes_without_the_registry(monkeypatch, tmp_path):
    """``+`` and ``only_for`` name Compose and Gated directly: with the saved-kind registry
    emptied they still build them, while restoring a saved kind (the registry's one use)
    then fails."""
    from mechlingo.interventions import base

    a = SteeringVector(torch.ones(8), 0, 1.0)
    b = SteeringVector(torch.zeros(8), 1, 2.0)
    saved = (a + b).save(tmp_path / "ab")
    monkeypatch.setattr(base, "_REGISTRY", {})
    both = a + b
    assert type(both) is Compose and both.parts == [a, b]
    gated = both.only_for({"fr"}, exclude=True)
    assert type(gated) is Gated and gated.inner is both and gated.exclude
    assert gated.langs == frozenset({"fr"})
    with pytest.raises(InterventionError, match="unknown intervention"):
        load_intervention(saved)


def test_intervention_hooks_order_and_effect(tiny, toks):
    """The intervention's hooks come first, then the extra hooks, which therefore read the
    steered activation; without an intervention the extra hooks alone, in a new list."""
    v = torch.randn(tiny.cfg.d_model, generator=torch.Generator().manual_seed(3))
    sv = SteeringVector(v, 1, 2.0, positions="all")
    name = "blocks.1.hook_resid_pre"
    seen = {}

    def grab(t, hook):
        seen["x"] = t.detach().clone()

    extra = [(name, grab)]
    hooks = intervention_hooks(tiny, sv, extra)
    assert [n for n, _ in hooks] == [n for n, _ in sv.fwd_hooks(tiny)] + [name]
    assert hooks[-1][1] is grab
    tiny.run_with_hooks(toks, fwd_hooks=hooks)
    clean = _read(tiny, name, tokens=toks)
    diff = (seen["x"] - clean)[:, 1:]  # "all" leaves the BOS token alone
    torch.testing.assert_close(diff, (2.0 * v).expand_as(diff), rtol=1e-5, atol=1e-5)
    alone = intervention_hooks(tiny, None, extra)
    assert alone == extra and alone is not extra
    assert intervention_hooks(tiny, None) == []
