"""Language-gated interventions and the prompt language identifier."""

from __future__ import annotations

import pytest
import torch

from mechlingo.activations.runs import run_batch
from mechlingo.core.tokens import encode
from mechlingo.data import LANGS, few_shot_prompt, load_facts
from mechlingo.data.langid import identify_language
from mechlingo.interventions import (
    Ablation,
    Gated,
    InterventionError,
    SteeringVector,
    load_intervention,
)
from mechlingo.scoring.evaluate import DecodeOptions, greedy_generate
from tests.conftest import count_hooks

# en, fr, de of different lengths: a padded batch
MIXED = [
    "The capital of France is",
    "La capitale de la France est",
    "Die Hauptstadt von Italien ist",
]
LANG_OF = ["en", "fr", "de"]


def _logits(model, prompts, iv=None):
    """Logits of a padded batch ``[batch, pos, vocab]`` and the batch (for row lengths)."""
    batch = encode(model, prompts)
    hooks = [] if iv is None else iv.fwd_hooks(model)
    return run_batch(model, batch, hooks).detach(), batch


def _steer(model, alpha=40.0, positions="last"):
    v = torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(3))
    return SteeringVector(v, 1, alpha, positions=positions)


def _rows_equal(a, b, batch, rows, exact=True):
    for i in rows:
        n = int(batch.lengths[i])
        if exact:
            assert torch.equal(a[i, :n], b[i, :n]), f"row {i} differs"
        else:
            torch.testing.assert_close(a[i, :n], b[i, :n], rtol=1e-4, atol=1e-4)


def test_identifier_names_every_natural_prompt():
    facts = load_facts(templates="natural", limit=6)
    pools: dict = {}
    for f in facts:
        pools.setdefault((f.relation, f.lang), []).append(f)
    assert {f.lang for f in facts} == set(LANGS)
    for f in facts:
        assert identify_language(f.prompt) == f.lang, f.prompt
        assert identify_language(few_shot_prompt(f, pools[(f.relation, f.lang)], k=3)) == f.lang
    assert identify_language("12345 !?") is None
    assert (
        identify_language("東京は日本の首都です") == "ja"
        and identify_language("北京是中国的首都") == "zh"
    )


def test_gate_to_non_english_leaves_english_logits_identical(tiny):
    gated = Gated(_steer(tiny), {"en"}, exclude=True)
    clean, batch = _logits(tiny, MIXED)
    steered, _ = _logits(tiny, MIXED, _steer(tiny))
    got, _ = _logits(tiny, MIXED, gated)
    _rows_equal(got, clean, batch, [0])  # English: bit-identical to no intervention
    _rows_equal(got, steered, batch, [1, 2])  # French, German: the ungated intervention
    for i in range(3):  # the steering does change every row, so each equality can fail
        assert not torch.allclose(steered[i], clean[i])
    alone, b1 = _logits(tiny, MIXED[:1], gated)
    _rows_equal(alone, clean[:1], b1, [0], exact=False)
    assert count_hooks(tiny) == 0


def test_gate_declared_languages_and_unknown_rows(tiny):
    iv = _steer(tiny)
    clean, batch = _logits(tiny, MIXED)
    steered, _ = _logits(tiny, MIXED, iv)
    # declared (the identifier would say "fr"): the prompt is treated as German
    gate = Gated(iv, {"de"}, declared={MIXED[1]: "de"}, identify=False)
    got, _ = _logits(tiny, MIXED, gate)
    _rows_equal(got, steered, batch, [1])
    _rows_equal(got, clean, batch, [0, 2])  # row 2 is undeclared -> unknown -> skipped
    got, _ = _logits(tiny, MIXED, Gated(iv, {"de"}, identify=False, unknown="apply"))
    _rows_equal(got, steered, batch, [0, 1, 2])
    facts = [f for f in load_facts(langs=["en", "fr"], limit=2, templates="natural")]
    gate = Gated.for_facts(iv, {"fr"}, facts)
    assert gate.declared == {f.prompt: f.lang for f in facts}
    with pytest.raises(InterventionError, match="language code"):
        Gated(iv, [])
    with pytest.raises(InterventionError, match="unknown"):
        Gated(iv, {"fr"}, unknown="maybe")


def test_gate_composes_saves_and_needs_a_batch(tiny, tmp_path):
    iv = _steer(tiny)
    abl = Ablation("mlp_post", 0, "zero")
    combo = iv.only_for({"fr"}) + abl  # gate + plain intervention
    clean, batch = _logits(tiny, MIXED, abl)
    both, _ = _logits(tiny, MIXED, iv + abl)
    got, _ = _logits(tiny, MIXED, combo)
    _rows_equal(got, both, batch, [1])
    _rows_equal(got, clean, batch, [0, 2])
    nested = Gated(iv + abl, {"en"}, exclude=True)  # a gate around a composition
    got, _ = _logits(tiny, MIXED, nested)
    _rows_equal(got, both, batch, [1, 2])
    _rows_equal(got, _logits(tiny, MIXED)[0], batch, [0])
    nested.save(tmp_path / "g", tiny)
    back = load_intervention(tmp_path / "g", tiny)
    assert isinstance(back, Gated) and back.exclude and back.langs == {"en"}
    again, _ = _logits(tiny, MIXED, back)
    _rows_equal(again, _logits(tiny, MIXED, nested)[0], batch, [0, 1, 2])
    with pytest.raises(InterventionError, match="needs each row's tokens"):
        tiny.run_with_hooks(tiny.to_tokens(MIXED[1]), fwd_hooks=nested.fwd_hooks(tiny))
    assert count_hooks(tiny) == 0


@pytest.mark.parametrize("positions", ["last", "last+generated"])
def test_gate_in_cached_decoding_mixed_batch(tiny, positions):
    iv = _steer(tiny, alpha=60.0, positions=positions)
    gate = Gated(iv, {"en"}, exclude=True)
    for cache in (True, False):
        got = greedy_generate(
            tiny,
            MIXED,
            intervention=gate,
            stop_at_newline=False,
            decoding=DecodeOptions(max_new_tokens=5, cache=cache),
        )
        plain = greedy_generate(
            tiny,
            MIXED[:1],
            stop_at_newline=False,
            decoding=DecodeOptions(max_new_tokens=5, cache=cache),
        )
        ungated = greedy_generate(
            tiny,
            MIXED[1:],
            intervention=iv,
            stop_at_newline=False,
            decoding=DecodeOptions(max_new_tokens=5, cache=cache),
        )
        assert got == plain + ungated
    assert greedy_generate(
        tiny, MIXED, intervention=iv, decoding=DecodeOptions(max_new_tokens=5)
    ) != greedy_generate(
        tiny, MIXED, decoding=DecodeOptions(max_new_tokens=5)
    )  # the steering changes generations, so the equalities above can fail


@pytest.mark.slow
def test_gate_on_gemma_mixed_batch_cached(gemma):
    prompts = [
        "The capital of Kenya is",
        "La capitale du Kenya est",
        "Die Hauptstadt von Kenia ist",
    ]
    v = torch.randn(gemma.cfg.d_model, generator=torch.Generator().manual_seed(0))
    iv = SteeringVector(v / v.norm() * 3000.0, 8, 1.0)
    gate = iv.only_for({"en"}, exclude=True)
    got = greedy_generate(
        gemma, prompts, intervention=gate, decoding=DecodeOptions(max_new_tokens=4)
    )
    assert (
        got[0] == greedy_generate(gemma, prompts[:1], decoding=DecodeOptions(max_new_tokens=4))[0]
    )
    assert got[1:] == greedy_generate(
        gemma, prompts[1:], intervention=iv, decoding=DecodeOptions(max_new_tokens=4)
    )
