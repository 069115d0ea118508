"""Per-language logit lens: exactness against the model and TransformerLens, batching
invariants, and what it shows on the embedded model."""

from __future__ import annotations

import pytest
import torch
from transformer_lens.tools.analysis import logit_lens as tl_logit_lens

from mechlingo.analyses.decoders.lens import lens_facts, logit_lens

PROMPTS = ["The capital of Italy is the city of", "La capitale", "意大利的首都是", "Die Stadt"]
LANGS = ["en", "fr", "zh", "de"]
ANSWERS = {"answer": ["Rome", "Paris", "罗马", "Rom"], "en": ["Rome", "Paris", "Rome", "Rome"]}


def test_last_entry_is_model_output(tiny):
    r = logit_lens(tiny, PROMPTS, ANSWERS, langs=LANGS, top_k=3)
    assert r.layers == list(range(tiny.cfg.n_layers + 1))
    for i, p in enumerate(PROMPTS):
        logp = torch.log_softmax(tiny(tiny.to_tokens(p))[0, -1], -1)
        top = torch.topk(logp, 3)
        assert torch.equal(r.top_ids[-1, i], top.indices)
        torch.testing.assert_close(r.top_logprobs[-1, i], top.values, atol=1e-5, rtol=1e-5)


def test_mixed_length_batch_equals_one_by_one(tiny):
    batched = logit_lens(tiny, PROMPTS, ANSWERS, langs=LANGS, batch_size=4)
    for i, p in enumerate(PROMPTS):
        alone = logit_lens(
            tiny, [p], {k: [v[i]] for k, v in ANSWERS.items()}, langs=[LANGS[i]], batch_size=1
        )
        torch.testing.assert_close(batched.logprob[:, i], alone.logprob[:, 0], atol=1e-5, rtol=0)
        assert torch.equal(batched.rank[:, i], alone.rank[:, 0])
        assert torch.equal(batched.top_ids[:, i], alone.top_ids[:, 0])


def _tl_reference(model, prompt, word):
    target = " " + word
    res = tl_logit_lens(model, model.to_tokens(prompt), targets=target, return_type="log_probs")
    return res.values.reshape(-1), res.rank_trajectory(target).reshape(-1)


def test_equals_transformer_lens_logit_lens(tiny):
    for prompt, word in [("The capital of Italy is", "Rome"), ("La capitale", "Paris")]:
        ours = logit_lens(tiny, [prompt], {"a": [word]}, langs=["en"])
        ref_lp, ref_rank = _tl_reference(tiny, prompt, word)
        torch.testing.assert_close(ours.primary_logprob[:, 0, 0], ref_lp, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_equals_transformer_lens_on_gemma(gemma):
    prompt = "La capital de Italia es la ciudad de"
    ours = logit_lens(gemma, [prompt], {"a": ["Roma"]}, langs=["es"])
    ref_lp, ref_rank = _tl_reference(gemma, prompt, "Roma")
    torch.testing.assert_close(ours.primary_logprob[:, 0, 0], ref_lp, atol=1e-4, rtol=1e-5)
    # the set rank is the best rank over the answer's token set: never worse than TL's
    assert bool((ours.rank[:, 0, 0] <= ref_rank).all())
    assert int(ours.rank[-1, 0, 0]) == int(ref_rank[-1]) or int(ours.rank[-1, 0, 0]) < 5


def test_errors(tiny):
    with pytest.raises(ValueError, match="no prompts"):
        logit_lens(tiny, [], {"a": []})
    with pytest.raises(ValueError, match="answers for"):
        logit_lens(tiny, PROMPTS, {"a": ["x"]})
    with pytest.raises(ValueError, match="out of range"):
        logit_lens(tiny, PROMPTS, ANSWERS, langs=LANGS, layers=[7])


@pytest.mark.slow
def test_english_pivot_visible_on_gemma(gemma):
    from mechlingo.data import load_facts

    facts = [
        f
        for f in load_facts(langs=["en", "es", "fr"], relations=["capital"])
        if f.id == "capital/IT"
    ]
    r = lens_facts(gemma, facts, track_langs=["en"])
    en_rank = r.rank[:, :, r.track_index("en")]
    i_es = r.langs.index("es")
    # DESIGN.md: on the Spanish prompt " Rome" (English) is the top token around layer 15-16
    assert int(en_rank[14:18, i_es].min()) == 0
    # the English prompt answers Rome at the output
    assert bool(r.final_top1("answer")[r.langs.index("en")])
    s = r.summary()
    assert s["english_decodable_before_last"]["es"] == 1.0
    df = r.to_dataframe()
    assert set(df["track"]) == {"answer", "en"} and len(df) == 19 * 3 * 2
    r.fig_latent_curves()
    r.fig_heatmap("en")
