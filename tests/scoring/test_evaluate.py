"""The eval rule and greedy generation."""

from __future__ import annotations

import pytest
import torch

from mechlingo.core.answers import is_correct, normalize
from mechlingo.scoring.evaluate import DecodeOptions, evaluate_facts, greedy_generate


def test_normalize_and_rule():
    assert normalize('  "Rome," he said') == 'rome," he said'
    assert is_correct(" Rome. It is the largest", ["Rome"], "en")
    assert is_correct("«Paris»", ["Paris"], "fr")
    assert not is_correct(" Romania is", ["Rom"], "de")  # word boundary
    assert is_correct(" Rom ist", ["Rom"], "de")
    assert is_correct("로마입니다", ["로마"], "ko")  # particles attach in Korean
    assert is_correct("罗马。", ["罗马"], "zh")
    assert not is_correct("\nRome", ["Rome"], "en") or is_correct("\nRome", ["Rome"], "en")
    assert is_correct(" ROME", ["rome"], "en")
    assert not is_correct(" Florence", ["Rome", "Roma"], "it")
    assert is_correct(" Roma", ["Rome", "Roma"], "it")


def test_greedy_generate_matches_step_by_step(tiny):
    prompts = ["The capital of Italy is", "La capitale", "The capital of Italy is"]
    gens = greedy_generate(
        tiny, prompts, stop_at_newline=False, decoding=DecodeOptions(max_new_tokens=4)
    )
    assert gens[0] == gens[2]
    for p, g in zip(prompts, gens, strict=True):
        toks = tiny.to_tokens(p)
        out = []
        for _ in range(4):
            nxt = int(tiny(toks)[0, -1].argmax())
            if nxt == tiny.tokenizer.eos_token_id:
                break
            out.append(nxt)
            toks = torch.cat([toks, torch.tensor([[nxt]])], 1)
        assert g == tiny.tokenizer.decode(out)


@pytest.mark.slow
def test_english_capitals_mostly_correct(gemma):
    from mechlingo.data import load_facts

    facts = load_facts(langs=["en"], relations=["capital"], limit=20)
    res = evaluate_facts(gemma, facts, decoding=DecodeOptions(max_new_tokens=6))
    acc = res.accuracy()["en"]
    assert acc >= 0.6, res.records
    df = res.to_dataframe()
    assert {"generation", "correct", "in_english"} <= set(df.columns)
