"""A circuit as an intervention on the tiny model: the whole graph kept is the clean run,
nothing kept (corrupted reference) the corrupted run; composed with a steering vector it
equals the receivers' inputs built by hand; saved and loaded it gives identical logits; a
hostile saved file is refused."""

from __future__ import annotations

import json

import pytest
import torch

from mechlingo.analyses.circuits import build_graph, find_circuit
from mechlingo.analyses.circuits.faithfulness import ratio_interval
from mechlingo.analyses.circuits.runs import readout_fn
from mechlingo.core.errors import MechlingoError
from mechlingo.data import load_facts
from mechlingo.interventions import CircuitAblation, SteeringVector, intervene, load_intervention


@pytest.fixture(scope="module")
def setup(tiny):
    g = build_graph(tiny)
    gen = torch.Generator().manual_seed(0)
    vocab = int(tiny.cfg.d_vocab)
    clean = torch.randint(1, vocab, (2, 6), generator=gen)
    corrupted = torch.randint(1, vocab, (2, 6), generator=gen)
    ref = CircuitAblation.reference_of(tiny, g.senders, corrupted)
    return g, clean, corrupted, ref


def _ablation(g, ref, keep):
    return CircuitAblation(
        g.senders, g.receivers, g.mask, keep, ref, meta={"reference": "corrupted"}
    )


def _logits(model, iv, tokens):
    with intervene(model, iv):
        return model(tokens)


def test_whole_circuit_is_the_clean_run_and_none_the_corrupted_run(tiny, setup):
    g, clean, corrupted, ref = setup
    full = _logits(tiny, _ablation(g, ref, g.mask), clean)
    assert torch.allclose(full, tiny(clean), atol=1e-5)
    empty = _logits(tiny, _ablation(g, ref, torch.zeros_like(g.mask)), clean)
    assert torch.allclose(empty, tiny(corrupted), atol=1e-4)
    assert not torch.allclose(empty, full, atol=1e-2)
    # a mean reference: with nothing kept, every position of every prompt reads the same
    # residual stream, so every row's logits are the same
    mean = CircuitAblation.reference_of(tiny, g.senders, corrupted, mean=True)
    assert mean.shape == (len(g.senders), 1, 1, int(tiny.cfg.d_model))
    flat = _logits(tiny, _ablation(g, mean, torch.zeros_like(g.mask)), clean)
    assert torch.allclose(flat, flat[:1, :1].expand_as(flat), atol=1e-4)


def test_composed_with_a_steering_vector_equals_both_by_hand(tiny, setup):
    g, clean, corrupted, ref = setup
    v = torch.randn(int(tiny.cfg.d_model), generator=torch.Generator().manual_seed(5))
    steer = SteeringVector(v, 1, 2.0, positions="all")
    both = _logits(tiny, _ablation(g, ref, torch.zeros_like(g.mask)) + steer, clean)
    # by hand: every receiver reads the corrupted run's input, plus 2v from layer 1 on (the
    # steering vector is no sender's output, so it reaches every later receiver directly),
    # at every position but BOS (the rule "all")
    _, cache = tiny.run_with_cache(
        corrupted, names_filter=lambda n: n in {r.hook for r in g.receivers}
    )
    hooks = []
    for r in g.receivers:
        add = torch.zeros(clean.shape[1], v.shape[0])
        if r.layer >= 1:
            add[1:] = 2.0 * v
        hooks.append((r.hook, lambda t, hook, c=cache[r.hook], a=add: c + a))
    by_hand = tiny.run_with_hooks(clean, fwd_hooks=hooks)
    assert torch.allclose(both, by_hand, atol=1e-4)
    # the whole circuit kept: the steering vector alone
    alone = _logits(tiny, _ablation(g, ref, g.mask) + steer, clean)
    assert torch.allclose(alone, _logits(tiny, steer, clean), atol=1e-5)


def test_save_and_load_give_identical_logits(tiny, setup, tmp_path):
    g, clean, _, ref = setup
    keep = torch.zeros(*g.mask.shape, dtype=torch.bool)
    keep[:, -1] = True  # every edge into the logits
    iv = _ablation(g, ref, keep)
    steer = SteeringVector(torch.ones(int(tiny.cfg.d_model)), 0, 0.5, positions="all")
    for obj, name in ((iv, "circuit"), (iv + steer, "composed")):
        obj.save(tmp_path / name, tiny)
        back = load_intervention(tmp_path / name, tiny)
        assert torch.equal(_logits(tiny, back, clean), _logits(tiny, obj, clean))
    assert "kept" in repr(load_intervention(tmp_path / "circuit"))


def test_a_hostile_saved_circuit_is_refused(tiny, setup, tmp_path):
    g, _, _, ref = setup
    _ablation(g, ref, g.mask).save(tmp_path / "iv", tiny)
    doc = json.loads((tmp_path / "iv" / "intervention.json").read_text(encoding="utf-8"))
    doc["config"]["senders"][0]["hook"] = "__import__('os').system('x')"
    (tmp_path / "iv" / "intervention.json").write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(MechlingoError, match="malformed sender"):
        load_intervention(tmp_path / "iv", tiny)
    doc["config"]["senders"][0]["hook"] = "blocks.99.hook_nothing"
    (tmp_path / "iv" / "intervention.json").write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(MechlingoError, match="no hook"):
        load_intervention(tmp_path / "iv", tiny)


def test_a_found_circuit_as_an_intervention_gives_its_faithfulness(tiny):
    facts = load_facts(langs="en", relations="capital", limit=10)
    res = find_circuit(tiny, facts, steps=1, method="eap", sizes=(5,), verify=0, target=2.0)
    point = next(p for p in res.curve if p["n_edges"] == 5)
    res.circuit = res.ranked[:5]
    iv = res.intervention(tiny)
    b = res.pairs.clean_batch
    # the metric of the intervened run gives the curve's faithfulness at 5 edges
    readout = readout_fn(tiny, res.pairs.readout)
    patched = _readout_from_hooks(tiny, iv, b, readout)
    f = ratio_interval(patched - res.corrupted, res.clean - res.corrupted, res.facts)[0]
    assert f == pytest.approx(point["faithfulness"], abs=1e-4)


def _readout_from_hooks(model, iv, b, readout):
    """The readout of the intervened run (the final residual at each row's last token)."""
    got = {}

    def grab(t, hook):
        got["final"] = t[torch.arange(t.shape[0]), b.last_index]

    with intervene(model, iv, batch=b):
        model.run_with_hooks(
            b.tokens, attention_mask=b.attention_mask(), fwd_hooks=[("ln_final.hook_in", grab)]
        )
    return readout(got["final"], torch.arange(b.batch_size)).float()
