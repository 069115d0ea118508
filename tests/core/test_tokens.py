"""Chat-model prompts (the chat part of :mod:`mechlingo.core.tokens`): the modes, the token ids against the
tokenizer's own rendering of the template, few-shot demonstrations as turns, and the
positions interventions and subject spans use, on a tiny model whose tokenizer has a chat
template."""

from __future__ import annotations

import json

import pytest
import torch

import mechlingo
from mechlingo.core.errors import InputError
from mechlingo.core.models import load_model
from mechlingo.core.tokens import (
    ChatPrompt,
    chat_enabled,
    chat_messages,
    chat_prefix_length,
    encode,
    looks_chat_model,
    use_chat,
)
from mechlingo.data import load_facts
from mechlingo.data.prompts import few_shot_prompt, translation_prompt
from mechlingo.interventions import SteeringVector
from mechlingo.testing import TINY_CHAT_TEMPLATE, build_tiny_folder

PROMPTS = ["The capital of France is", "La capitale de l'Italie est"]


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    return build_tiny_folder(
        tmp_path_factory.mktemp("templated") / "model", chat_template=TINY_CHAT_TEMPLATE
    )


@pytest.fixture()
def chat_model(chat_dir):
    model = load_model(chat_dir, device="cpu")
    model.cfg.model_name = "tiny-gemma3-it"
    return model


def test_modes(chat_model, tiny):
    assert not chat_enabled(chat_model)  # off until asked
    assert use_chat(chat_model, "auto") is True  # template + an "-it" name
    assert use_chat(chat_model, "off") is False and not chat_enabled(chat_model)
    chat_model.cfg.model_name = "tiny-gemma3"  # a base model's name: auto stays off
    assert use_chat(chat_model, "auto") is False
    assert use_chat(chat_model, "on") is True
    assert use_chat(tiny, "auto") is False  # no template
    with pytest.raises(InputError, match="chat template"):
        use_chat(tiny, "on")
    with pytest.raises(InputError, match="unknown chat mode"):
        use_chat(chat_model, "yes")
    assert not chat_enabled(tiny)
    for name, tuned in [("google/gemma-3-1b-it", True), ("Qwen/Qwen2.5-0.5B-Instruct", True),
                        ("meta-llama/Llama-2-7b-chat-hf", True), ("google/gemma-3-270m", False),
                        ("bigscience/bloom-560m", False), ("gpt2", False)]:  # fmt: skip
        assert looks_chat_model(name) is tuned, name


def test_tokens_are_the_template_then_the_plain_stem(chat_model):
    plain = encode(chat_model, PROMPTS)
    use_chat(chat_model, "on")
    chat = encode(chat_model, PROMPTS)
    tok = chat_model.tokenizer
    for i, p in enumerate(PROMPTS):
        ids = chat.tokens[i, : chat.lengths[i]].tolist()
        plain_ids = plain.tokens[i, : plain.lengths[i]].tolist()
        # the stem's own tokens end the row: the last real token is the stem's last token
        assert ids[-(len(plain_ids) - 1) :] == plain_ids[1:]
        assert ids[0] == tok.bos_token_id == plain_ids[0]
        assert chat_prefix_length(chat_model, p) == len(ids) - len(plain_ids)
        # the ids spell exactly what the tokenizer's template renders
        messages = [{"role": "user", "content": p}, {"role": "assistant", "content": p}]
        rendered = tok.apply_chat_template(messages, tokenize=False, continue_final_message=True)
        assert tok.decode(ids) == rendered
        assert rendered.endswith("<start_of_turn>model\n" + p)
    assert chat.has_bos


def test_few_shot_and_translation_demonstrations_become_turns(chat_model):
    facts = load_facts(langs=["fr"], relations=["capital"], limit=6)
    prompt = few_shot_prompt(facts[0], facts, k=3)
    assert isinstance(prompt, ChatPrompt) and isinstance(prompt, str)
    assert prompt.query == facts[0].prompt and len(prompt.demos) == 3
    assert str(prompt).endswith(facts[0].prompt)  # the plain text is unchanged
    messages = chat_messages(prompt)
    assert [m["role"] for m in messages] == ["user", "assistant"] * 4
    for (stem, solved), user, assistant in zip(
        prompt.demos, messages[0:6:2], messages[1:6:2], strict=True
    ):
        assert user["content"] == stem and assistant["content"] == solved
        assert solved.startswith(stem) and solved != stem
    use_chat(chat_model, "on")
    ids = encode(chat_model, [prompt]).tokens[0].tolist()
    text = chat_model.tokenizer.decode(ids)
    assert text.count("<start_of_turn>model") == 4 and text.count("<end_of_turn>") == 7
    trans = translation_prompt(facts[1], k=2, pool=load_facts(langs=["fr"], limit=40))
    assert len(trans.demos) == 2 and str(trans).endswith("\n" + trans.query)
    assert trans.query.startswith("English: ") and trans.query.endswith(":")
    # a ChatPrompt survives pickling and JSON as its text
    import pickle

    again = pickle.loads(pickle.dumps(prompt))
    assert again == prompt and json.loads(json.dumps(prompt)) == str(prompt)


def test_steering_at_last_lands_on_the_stems_last_token(chat_model):
    plain = encode(chat_model, PROMPTS)
    use_chat(chat_model, "on")
    batch = encode(chat_model, PROMPTS)
    mask = batch.attention_mask()
    vec = torch.randn(chat_model.cfg.d_model) * 10
    base = chat_model(batch.tokens, attention_mask=mask)
    with mechlingo.intervene(chat_model, SteeringVector(vec, layer=1, alpha=1.0), batch=batch):
        steered = chat_model(batch.tokens, attention_mask=mask)
    for i in range(len(PROMPTS)):
        last = int(batch.lengths[i]) - 1
        assert torch.equal(base[i, :last], steered[i, :last])  # nothing before it moved
        assert not torch.allclose(base[i, last], steered[i, last])
        plain_last = plain.tokens[i, int(plain.lengths[i]) - 1]
        assert int(batch.tokens[i, last]) == int(plain_last)


def test_subject_span_shifts_by_the_template(chat_model):
    from mechlingo.analyses.recall.patching.positions import subject_token_span

    fact = load_facts(langs=["en"], relations=["capital"], limit=1)[0]
    plain = subject_token_span(chat_model, fact.prompt, fact.subject_span)
    use_chat(chat_model, "on")
    shifted = subject_token_span(chat_model, fact.prompt, fact.subject_span)
    offset = chat_prefix_length(chat_model, fact.prompt)
    assert offset > 0 and shifted == (plain[0] + offset, plain[1] + offset)
    ids = encode(chat_model, [fact.prompt]).tokens[0]
    subject = chat_model.tokenizer.decode(ids[shifted[0] : shifted[1] + 1].tolist())
    start, end = fact.subject_span
    assert fact.prompt[start:end].strip() in subject


def test_cli_chat_flag(chat_dir, tmp_path):
    from mechlingo.cli.main import main

    def run(mode: str) -> dict:
        out = tmp_path / mode
        argv = ["eval", "--model", str(chat_dir), "--langs", "en", "--limit", "2",
                "--chat", mode, "--quiet", "--device", "cpu", "--out", str(out)]  # fmt: skip
        assert main(argv) == 0
        return json.loads((out / "summary.json").read_text())

    assert run("on")["meta"]["chat"] is True
    assert run("off")["meta"]["chat"] is False
    assert run("auto")["meta"]["chat"] is False  # the folder's name does not say "-it"


def test_steering_vector_build_reads_the_chat_prompts(chat_model):
    """The repair vectors' build means are taken at the last token of the chat-wrapped
    prompts: equal to a hand computation on the wrapped token ids."""
    from mechlingo.activations.runs import last_token_means
    from mechlingo.analyses.recall.steering import steering_prompts

    facts = load_facts(langs=["en", "fr"], relations=["capital"], limit=5)
    prompts = steering_prompts(facts, k_shot=2)
    assert all(isinstance(p, ChatPrompt) and p.demos for p in prompts["few_shot"])
    plain = last_token_means(chat_model, prompts["few_shot"], layers=[1]).mean
    use_chat(chat_model, "on")
    wrapped = last_token_means(chat_model, prompts["few_shot"], layers=[1]).mean
    rows = []
    for p in prompts["few_shot"]:
        ids = encode(chat_model, [p]).tokens
        _, cache = chat_model.run_with_cache(ids, names_filter="blocks.1.hook_resid_pre")
        rows.append(cache["blocks.1.hook_resid_pre"][0, -1].double())
    torch.testing.assert_close(wrapped[-1], torch.stack(rows).mean(0), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(wrapped, plain)


def test_gc_pause_restores_the_collector_also_after_an_error():
    """The vocabulary index is built with the cyclic collector paused; it is on again after
    the block (also when the block raised), and stays off where the caller had turned it off."""
    import gc

    from mechlingo.core.answers import _gc_paused

    assert gc.isenabled()
    with pytest.raises(RuntimeError), _gc_paused():
        assert not gc.isenabled()
        raise RuntimeError("boom")
    assert gc.isenabled()
    gc.disable()
    try:
        with _gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
