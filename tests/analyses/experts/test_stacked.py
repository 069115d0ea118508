"""Random-clamp populations in one stacked pass: equal to one run per clamp."""

from __future__ import annotations

import pytest
import torch

from mechlingo.activations.likelihood import line_nll, sample_from_bos
from mechlingo.analyses.experts import KCurveOptions, find_experts, k_curve
from mechlingo.analyses.experts.stacked import stacked_bos_samples, stacked_line_nll
from mechlingo.core.errors import InputError
from mechlingo.interventions import intervention_hooks
from tests.conftest import count_hooks

TEXTS = {
    "en": ["the cat sat on the mat", "hello world", "a dog", "it is raining today again"],
    "es": ["el gato", "hola mundo que tal", "un perro grande y feo", "llueve"],
    "fr": ["le chat", "bonjour", "un chien noir", "il pleut beaucoup aujourd'hui"],
}


@pytest.fixture(scope="module")
def experts(tiny):
    return find_experts(tiny, TEXTS, batch_size=3)


def _clamps(experts):
    """No clamp, the experts' clamp and three layer-matched random clamps."""
    rnd = [experts.random_clamp("es", 3, seed=s, layer_matched=True) for s in range(3)]
    return [None, experts.clamp("es", 3), *rnd]


def test_stacked_line_nll_equals_one_by_one(tiny, experts):
    ivs = _clamps(experts)
    hooks = [intervention_hooks(tiny, iv) for iv in ivs]
    sents = TEXTS["es"] + TEXTS["fr"]
    got = stacked_line_nll(tiny, sents, hooks, batch_size=3, max_tokens=6)
    assert len(got) == len(ivs)
    for h, (nll, cnt) in zip(hooks, got, strict=True):
        want, want_cnt = line_nll(tiny, sents, fwd_hooks=h, batch_size=3, max_tokens=6)
        assert torch.equal(cnt, want_cnt)
        assert torch.allclose(nll, want, atol=1e-5, rtol=0)
    # the clamps do change the NLL: the conditions did not all run unhooked
    assert not torch.allclose(got[0][0], got[1][0], atol=1e-3)
    assert count_hooks(tiny) == 0


def test_stacked_bos_samples_equal_one_by_one(tiny, experts):
    ivs = _clamps(experts)
    hooks = [intervention_hooks(tiny, iv) for iv in ivs]
    for cache in (True, False):
        got = stacked_bos_samples(tiny, hooks, 5, max_new_tokens=4, seed=7, cache=cache)
        want = [sample_from_bos(tiny, 5, max_new_tokens=4, fwd_hooks=h, seed=7, cache=cache)
                for h in hooks]  # fmt: skip
        assert got == want
    assert stacked_bos_samples(tiny, [], 5) == []
    with pytest.raises(InputError, match="at least one sample"):
        stacked_bos_samples(tiny, hooks, 0)


def test_k_curve_stacked_equals_one_by_one(tiny, experts):
    kw = {"n_samples": 4, "max_new_tokens": 3, "prompts": ("1.", "*"), "max_tokens": 8,
          "control_seeds": (0, 1, 2), "layer_matched": True}  # fmt: skip
    one = k_curve(tiny, experts, "es", [2, 3], TEXTS, KCurveOptions(stack=False, **kw)).rows
    stacked = k_curve(tiny, experts, "es", [2, 3], TEXTS, KCurveOptions(**kw)).rows
    assert [(r["k"], r["arm"], r.get("control_seed")) for r in stacked] == [
        (0, "none", None), (2, "experts", None), (2, "random", 0), (2, "random", 1),
        (2, "random", 2), (3, "experts", None), (3, "random", 0), (3, "random", 1),
        (3, "random", 2)]  # fmt: skip
    assert len(one) == len(stacked)
    for a, b in zip(one, stacked, strict=True):
        assert a.keys() == b.keys()
        assert a["bos_hits"] == b["bos_hits"] and a["examples"] == b["examples"]
        for key, v in a.items():
            if isinstance(v, float):
                assert b[key] == pytest.approx(v, abs=1e-5, rel=1e-5), key
    # the random draws are different neuron sets: their perplexities differ
    ppl = {r["control_seed"]: r["ppl_es"] for r in stacked if r["arm"] == "random" and r["k"] == 3}
    assert len(set(ppl.values())) == 3


def test_k_curve_stacked_resumes_from_stored_arms(tiny, experts):
    kw = {"n_samples": 3, "max_new_tokens": 2, "prompts": ("1.",), "max_tokens": 6,
          "control_seeds": (0, 1)}  # fmt: skip
    store: dict = {}
    calls: list[str] = []

    def cache(name, fn):
        calls.append(name)
        if name not in store:
            store[name] = fn()
        return store[name]

    first = k_curve(tiny, experts, "es", [2], TEXTS, KCurveOptions(**kw), checkpoint=cache).rows
    assert list(store) == ["none", "k2-experts", "k2-random_s0", "k2-random_s1"]
    del store["k2-random_s1"]
    again = k_curve(tiny, experts, "es", [2], TEXTS, KCurveOptions(**kw), checkpoint=cache).rows
    assert again[:3] == first[:3]  # stored arms are loaded, not recomputed
    assert again[3]["ppl_es"] == pytest.approx(first[3]["ppl_es"], abs=1e-5)
    assert again[3]["ppl_ratio_es"] == pytest.approx(first[3]["ppl_ratio_es"], abs=1e-5)


def test_shard_turn_moves_the_odd_arm_to_another_rank(monkeypatch):
    """Under torchrun each rank runs a contiguous share of the arms; ``shard_turn`` rotates
    which share each rank takes, so two curves of 5 and 7 arms with turns 0 and 1 give the
    two ranks 6 arms each (5/7 with no turn), and every arm runs on exactly one rank."""
    from types import SimpleNamespace

    from mechlingo.analyses.experts import kcurve

    ran: dict[int, list[str]] = {}

    def fake_one(model, iv, heldout, **kw):
        ran.setdefault(rank[0], []).append(iv)
        return {"arm": iv}

    rank = [0]
    monkeypatch.setattr(kcurve, "scoring_sharded", lambda: True)
    monkeypatch.setattr(kcurve, "dist_info", lambda: SimpleNamespace(rank=rank[0], world_size=2))
    monkeypatch.setattr(kcurve, "_outputs_one", fake_one)
    monkeypatch.setattr(kcurve, "gather_lists", lambda pairs: pairs)  # this rank's own only
    for turn, n in ((0, 5), (1, 7)):
        arms = [kcurve._Arm(0, "none", f"t{turn}a{i}", f"a{i}") for i in range(n)]  # type: ignore[arg-type]
        seen = []
        for r in (0, 1):
            rank[0] = r
            try:
                kcurve._arm_outputs(None, arms, {}, False, {}, turn)  # type: ignore[arg-type]
            except KeyError:  # the other rank's arms are missing from the fake gather
                pass
        for r in (0, 1):
            seen += [x for x in ran.get(r, []) if x.startswith(f"t{turn}")]
        assert sorted(seen) == sorted(a.iv for a in arms)  # each arm once
    assert [len(ran[r]) for r in (0, 1)] == [6, 6]
    assert ran[0][:2] == ["t0a0", "t0a1"] and ran[1][:3] == ["t0a2", "t0a3", "t0a4"]
