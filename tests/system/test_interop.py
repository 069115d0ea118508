"""Interventions on a plain transformers model (``iv.attach(hf_model)``) against the same
intervention on the TransformerLens bridge, on a tiny random model of every family in the
registry and (one small test) on the embedded model.

The reference is mechlingo's bridge run: ``run_batch`` with ``fwd_hooks_for`` for logits on a
right-padded batch, and ``activations.decoding.decode`` (cached, greedy) for generation. The
plain model gets the very same token ids, right-padded and left-padded (with position ids from
the mask, as ``generate()`` makes them), and ``generate()`` with and without its cache.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from mechlingo.activations.decoding import decode
from mechlingo.activations.runs import run_batch
from mechlingo.core.errors import InterventionError, ModelMismatchError
from mechlingo.core.families import FAMILIES
from mechlingo.core.models import load_model
from mechlingo.core.tokens import TokenBatch, encode
from mechlingo.interventions import (
    Ablation,
    Compose,
    NeuronClamp,
    SteeringVector,
    load_intervention,
)
from mechlingo.interventions.hf import LAYOUTS, left_padded
from mechlingo.testing import build_tiny_folder

PROMPTS = ["The capital of Italy is", "La capitale", "意大利的首都是", "Die Hauptstadt von"]
ATOL = 1e-4


@dataclass
class Pair:
    """One family's tiny model as a bridge (mechlingo) and as plain transformers."""

    name: str
    model: Any
    hf: Any


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def pair(request, tmp_path_factory) -> Pair:
    from transformers import AutoModelForCausalLM

    folder = build_tiny_folder(tmp_path_factory.mktemp(request.param) / "m", request.param)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = load_model(folder, device="cpu")
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return Pair(request.param, model, hf)


def torch_hooks(module: torch.nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in module.modules())


def interventions(model: Any, parallel: bool) -> dict[str, tuple[Any, Any]]:
    """name -> (intervention for the plain model, the same intervention on the bridge)."""
    g = torch.Generator().manual_seed(0)
    d, d_head = int(model.cfg.d_model), int(model.cfg.d_head)
    r = lambda n: torch.randn(n, generator=g)  # noqa: E731
    out = {
        "steer resid_pre last": SteeringVector(r(d), 1, 3.0),
        "steer resid_post all": SteeringVector(r(d), 0, 2.0, site="resid_post", positions="all"),
        "steer mlp_out ints": SteeringVector(r(d), 0, 2.0, site="mlp_out", positions=[0, -2]),
        "steer attn_z": SteeringVector(r(d_head), 1, 2.0, site="attn_z", positions=[1, -1]),
        "clamp set": NeuronClamp({0: [1, 5], 1: [2]}, 3.0, positions="all"),
        "clamp scale last": NeuronClamp(
            {1: [0, 3, 9]}, [2.0, -1.0, 0.5], "scale", positions="last"
        ),
        "ablate attn_out": Ablation("attn_out", 1, positions="last"),
        "ablate mlp_out mean": Ablation("mlp_out", 0, "mean", mean=r(d), positions="all"),
        "ablate mlp_post": Ablation("mlp_post", 1, positions="all_with_bos"),
        "compose": SteeringVector(r(d), 1, 2.0, positions="last")
        + NeuronClamp({0: [4]}, 0.0, "set")
        + Ablation("resid_post", 1, positions=lambda b: b.prompt_last_index - 1),
    }
    if not parallel:
        # the bridge's hook_resid_mid is the pre-MLP norm's input; mechlingo carries a write
        # there on to the residual (core.sites.edit_hooks), as the plain model's hooks do
        out["steer resid_mid + ablate attn_out"] = SteeringVector(
            r(d), 1, 3.0, site="resid_mid", positions="all"
        ) + Ablation("attn_out", 1, positions="last")
        out["ablate resid_mid mean"] = Ablation(
            "resid_mid", 1, "mean", mean=r(d), positions=[0, -1]
        )
        # a clamp goes through the same SiteEdit path: its resid_mid write is carried too
        out["clamp resid_mid scale"] = NeuronClamp(
            {1: [0, 3]}, 2.0, "scale", site="resid_mid", positions="all"
        )
    return {k: (v, v) for k, v in out.items()}


def rows_of(batch: TokenBatch) -> list[torch.Tensor]:
    return [batch.tokens[i, : int(n)] for i, n in enumerate(batch.lengths)]


def hf_logits(hf: Any, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    import inspect

    with torch.no_grad():
        if "position_ids" in inspect.signature(hf.forward).parameters:
            pos = (mask.cumsum(1) - 1).clamp(min=0)
            return hf(ids, attention_mask=mask, position_ids=pos).logits
        return hf(ids, attention_mask=mask).logits  # BLOOM: ALiBi from the mask


def test_logits_equal_the_bridge_padded_left_and_right(pair):
    model, hf = pair.model, pair.hf
    batch = encode(model, PROMPTS)
    assert len(set(batch.lengths.tolist())) > 1
    left, left_mask = left_padded(rows_of(batch), batch.pad_id)
    plain = run_batch(model, batch)
    for name, (iv, ref_iv) in interventions(model, FAMILIES[pair.name].parallel).items():
        ref = run_batch(model, batch, ref_iv.fwd_hooks_for(model, batch))
        assert (ref - plain).abs().max() > 1e-3, name  # the intervention does something
        with iv.attach(hf) as handle:
            assert handle.n_hooks > 0
            right = hf_logits(hf, batch.tokens, batch.attention_mask())
            lefty = hf_logits(hf, left, left_mask)
        assert torch_hooks(hf) == 0
        for i, n in enumerate(batch.lengths.tolist()):
            torch.testing.assert_close(right[i, :n], ref[i, :n], atol=ATOL, rtol=0, msg=name)
            torch.testing.assert_close(lefty[i, -n:], ref[i, :n], atol=ATOL, rtol=0, msg=name)
    # nothing left behind: the plain model's own logits again
    again = hf_logits(hf, batch.tokens, batch.attention_mask())
    for i, n in enumerate(batch.lengths.tolist()):
        torch.testing.assert_close(again[i, :n], plain[i, :n], atol=ATOL, rtol=0)


def _generate(hf: Any, ids, mask, pad_id: int, n: int, cache: bool) -> list[list[int]]:
    out = hf.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=n,
        do_sample=False,
        use_cache=cache,
        pad_token_id=pad_id,
        eos_token_id=None,
        return_dict_in_generate=False,
    )
    return out[:, ids.shape[1] :].tolist()


def test_greedy_generate_equals_the_bridge_cached_and_uncached(pair):
    model, hf = pair.model, pair.hf
    batch = encode(model, PROMPTS)
    left, mask = left_padded(rows_of(batch), batch.pad_id)
    g = torch.Generator().manual_seed(1)
    d = int(model.cfg.d_model)
    cases = {
        "last": SteeringVector(torch.randn(d, generator=g), 1, 3.0),
        "generated": SteeringVector(
            torch.randn(d, generator=g), 0, 3.0, site="resid_post", positions="generated"
        ),
        "clamp last+generated": NeuronClamp({1: [1, 5, 7]}, 10.0, positions="last+generated"),
        "compose all": Ablation("mlp_out", 1, positions="all")
        + SteeringVector(torch.randn(d, generator=g), 1, 1.0, positions=[1]),
    }
    base = decode(model, batch, max_new_tokens=4)
    for name, iv in cases.items():
        ref = decode(model, batch, max_new_tokens=4, fwd_hooks=iv.fwd_hooks(model))
        assert ref != base, name  # the intervention changes some token
        for cache in (True, False):
            with iv.attach(hf):
                got = _generate(hf, left, mask, batch.pad_id, 4, cache)
            assert got == ref, (name, cache)
    assert torch_hooks(hf) == 0
    assert _generate(hf, left, mask, batch.pad_id, 4, True) == base


def test_saved_intervention_fits_the_plain_model(pair, tmp_path):
    model, hf = pair.model, pair.hf
    iv = SteeringVector(torch.ones(int(model.cfg.d_model)), 1, 1.0) + NeuronClamp({0: [1]}, 2.0)
    loaded = load_intervention(iv.save(tmp_path / "iv", model), model)
    with loaded.attach(hf):
        pass
    wrong = SteeringVector(torch.ones(int(model.cfg.d_model) + 1), 1, 1.0)
    with pytest.raises(InterventionError, match="size"):
        wrong.attach(hf)
    with pytest.raises(InterventionError, match="out of range"):
        SteeringVector(torch.ones(int(model.cfg.d_model)), 7, 1.0).attach(hf)
    other = dict(loaded.meta["model"], unembed_fingerprint="0" * 16)
    with pytest.raises(ModelMismatchError):
        Compose(
            [SteeringVector(torch.ones(int(model.cfg.d_model)), 1)], meta={"model": other}
        ).attach(hf)
    if FAMILIES[pair.name].parallel:
        mid = SteeringVector(torch.ones(int(model.cfg.d_model)), 1, 1.0, site="resid_mid")
        with pytest.raises(InterventionError, match="parallel"):
            (NeuronClamp({0: [1]}, 2.0) + mid).attach(hf)
    assert torch_hooks(hf) == 0  # nothing attached by the refusals


def test_layouts_name_the_modules_the_bridge_wraps(pair):
    # the module map is written out per family; the bridge's adapter says where its blocks
    # and down projections are, and the two must agree
    blocks = pair.model.adapter.component_mapping["blocks"]
    mlp = blocks.submodules["mlp"]
    down = mlp.submodules["out"].name
    layout = LAYOUTS[pair.name]
    assert layout.layers == blocks.name
    assert layout.down == (f"{mlp.name}.{down}" if mlp.name else down)


def test_hooks_removed_after_an_error_and_refusals(pair):
    model, hf = pair.model, pair.hf
    batch = encode(model, PROMPTS)

    def bad(b):
        return torch.zeros(3, 3, dtype=torch.bool)  # the wrong shape: raises mid-pass

    iv = SteeringVector(torch.ones(int(model.cfg.d_model)), 0, 1.0) + NeuronClamp(
        {1: [0]}, 1.0, positions=bad
    )
    with pytest.raises(Exception, match="shape"), iv.attach(hf):
        hf(batch.tokens, attention_mask=batch.attention_mask())
    assert torch_hooks(hf) == 0
    with pytest.raises(InterventionError, match="plain transformers"):
        iv.attach(model)
    with pytest.raises(InterventionError, match="no module map"):
        iv.attach(torch.nn.Linear(2, 2))


def test_cached_pass_without_its_prompt_is_refused(pair):
    from transformers import DynamicCache

    model, hf = pair.model, pair.hf
    ids = encode(model, [PROMPTS[0]]).tokens
    cache = DynamicCache(config=hf.config)
    with torch.no_grad():
        hf(ids, past_key_values=cache, use_cache=True)
        with SteeringVector(torch.ones(int(model.cfg.d_model)), 0, 1.0).attach(hf):
            with pytest.raises(InterventionError, match="did not run under this handle"):
                hf(ids[:, -1:], past_key_values=cache, use_cache=True)
    assert torch_hooks(hf) == 0


def plain_twin(bridge: Any) -> Any:
    """The bridge's transformers model as a plain one, sharing its weights (no second copy
    of the embedded model in memory): the same config, the same parameter and buffer
    tensors, the original module classes."""
    from transformers import AutoModelForCausalLM

    orig = bridge.original_model
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(orig.config)
    strip = lambda k: k.replace("._original_component", "")  # noqa: E731
    params = {strip(k): v for k, v in orig.named_parameters(remove_duplicate=False)}
    bufs = {strip(k): v for k, v in orig.named_buffers(remove_duplicate=False)}
    for table, own in ((params, hf.named_parameters), (bufs, hf.named_buffers)):
        for name, _ in list(own(remove_duplicate=False)):
            mod, _, leaf = name.rpartition(".")
            slot = "_parameters" if table is params else "_buffers"
            getattr(hf.get_submodule(mod), slot)[leaf] = table[name]
    return hf.eval()


@pytest.mark.slow
def test_embedded_model_logits_and_generate(gemma):
    hf = plain_twin(gemma)
    batch = encode(gemma, ["The capital of Italy is the city of", "La capitale de la France est"])
    d = int(gemma.cfg.d_model)
    v = torch.randn(d, generator=torch.Generator().manual_seed(0))
    iv = SteeringVector(v / v.norm() * 40.0, 6, 1.0) + NeuronClamp({3: [10, 11]}, 0.0)
    ref = run_batch(gemma, batch, iv.fwd_hooks_for(gemma, batch))
    plain = run_batch(gemma, batch)
    left, mask = left_padded(rows_of(batch), batch.pad_id)
    hf_logits(hf, left[:, -2:], mask[:, -2:])  # transformers installs its own output hooks once
    before = torch_hooks(hf)
    with iv.attach(hf):
        got = hf_logits(hf, left, mask)
        tokens = _generate(hf, left, mask, batch.pad_id, 4, True)
    for i, n in enumerate(batch.lengths.tolist()):
        assert (ref[i, :n] - plain[i, :n]).abs().max() > 0.1
        torch.testing.assert_close(got[i, -n:], ref[i, :n], atol=2e-3, rtol=1e-4)
    assert tokens == decode(gemma, batch, max_new_tokens=4, fwd_hooks=iv.fwd_hooks(gemma))
    assert torch_hooks(hf) == before
