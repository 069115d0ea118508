"""Per-language logit lens: exactness against the model and TransformerLens, batching
invariants, and what it shows on the embedded model."""

from __future__ import annotations

import pytest
import torch
from transformer_lens.tools.analysis import logit_lens as tl_logit_lens

from mechlingo.analyses.decoders.lens import lens_facts, lens_with_mismatch, logit_lens
from mechlingo.data import Fact
from mechlingo.data.fact_answers import mismatch_tracks

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


# ----------------------------------------------------------------------------- token lens


def test_token_lens_top1_is_the_hand_readout_at_every_position(tiny):
    """Without answers the lens reads every position: each cell's top token is the argmax
    of the final norm and unembedding applied to the cached residual stream there."""
    from mechlingo.analyses.decoders.entries import lens_hook_names
    from mechlingo.core.tokens import encode

    prompts = ["The capital of France is", "意大利的首都是"]
    r = logit_lens(tiny, prompts, top_k=5, batch_size=2)
    g = r.tokens
    assert r.tracks == [] and g is not None and g.layers == r.layers
    names = lens_hook_names(tiny, r.layers)
    for p, prompt in enumerate(prompts):
        ids = encode(tiny, [prompt]).tokens
        _, cache = tiny.run_with_cache(ids)
        assert g.tokens[p] == [tiny.tokenizer.decode([i]) for i in ids[0].tolist()]
        for e, name in enumerate(names):
            x = tiny.ln_final(cache[name][0].float())
            logp = torch.log_softmax(x @ tiny.W_U.float() + tiny.b_U.float(), -1)
            top = torch.topk(logp, 5)
            assert torch.equal(g.top_ids[p][e], top.indices), (p, name)
            torch.testing.assert_close(g.top_logprobs[p][e], top.values, atol=1e-5, rtol=1e-5)
            want = tiny.tokenizer.batch_decode([[i] for i in top.indices[:, 0].tolist()])
            assert g.top1(p)[e] == want
        # the last entry at the last position is the model's own next-token prediction
        assert int(g.top_ids[p][-1, -1, 0]) == int(tiny(ids)[0, -1].argmax())
        assert torch.equal(r.top_ids[:, p], g.top_ids[p][:, -1])


def test_token_lens_equals_the_last_token_lens_for_every_decoder(tiny):
    """With answers and ``tokens=True`` the grid's last position holds what the
    last-token readout holds, for the logit lens, a tuned lens and a patchscope."""
    from mechlingo.analyses.decoders.options import TrainingOptions
    from mechlingo.analyses.decoders.patchscope import Patchscope
    from mechlingo.analyses.decoders.tuned_lens import mix_texts, train_tuned_lens
    from mechlingo.data.prompts import parallel_sentences

    lens = train_tuned_lens(tiny, mix_texts(parallel_sentences(["en", "fr"]), 4),
                            TrainingOptions(steps=2, texts_per_step=4, lr=1e-2, seed=1)).lens  # fmt: skip
    for decoder in (None, lens, Patchscope()):
        r = logit_lens(tiny, PROMPTS[:2], {k: v[:2] for k, v in ANSWERS.items()},
                       langs=LANGS[:2], decoder=decoder, tokens=True, top_k=3)  # fmt: skip
        for p in range(2):
            assert torch.equal(r.tokens.top_ids[p][:, -1], r.top_ids[:, p]), decoder
            torch.testing.assert_close(r.tokens.top_logprobs[p][:, -1], r.top_logprobs[:, p],
                                       atol=1e-4, rtol=1e-4)  # fmt: skip


def test_token_lens_figure_and_result_display(tiny):
    r = logit_lens(tiny, ["The capital of France is"], top_k=5)
    fig = r.fig_tokens()
    (hm,) = fig.data
    g = r.tokens
    assert torch.allclose(torch.tensor(hm.z), g.top_logprobs[0][:, :, 0].exp(), atol=1e-6)
    assert fig.layout.title.text.startswith("Logit lens (en prompt)")
    assert list(hm.y) == r.layers and len(hm.x) == len(g.tokens[0])
    hover = hm.customdata[-1][-1]
    assert hover.count("<br>") == 4 and repr(g.top_tokens[0][-1][-1][0]) in hover
    by_lang = r.fig_tokens(color="lang")
    assert by_lang.data[0].coloraxis == "coloraxis"
    assert {"none", "shared"} <= set(by_lang.layout.coloraxis.colorbar.ticktext)
    assert "tensor" not in repr(r) and "fig_tokens" in r._repr_html_()
    assert r.summary()["n_prompts"] == {"en": 1}
    doc = g.to_json()[0]
    assert doc["tokens"] == g.tokens[0] and len(doc["top"][0][0]) == 5
    with pytest.raises(Exception, match="fig_tokens"):
        r.fig_latent_curves()
    with_answers = logit_lens(tiny, PROMPTS[:1], {"answer": ["Rome"]})
    assert with_answers.tokens is None
    with pytest.raises(Exception, match="last token only"):
        with_answers.fig_tokens()


def test_token_language():
    from mechlingo.analyses.decoders.tokens import token_language

    assert token_language("ローマ") == "ja" and token_language(" 罗马") == "zh"
    assert token_language("Москва") == "ru" and token_language("  ") == "shared"
    assert token_language(" capitale", ["fr", "en"]) == "fr" and token_language(" bibli") is None


def test_lens_cli_reads_a_prompt_at_every_position(tiny_dir, tmp_path):
    import json

    from mechlingo.cli import main

    out = tmp_path / "tok"
    rc = main(["lens", "--model", str(tiny_dir), "--prompt", "The capital of France is",
               "--quiet", "--out", str(out)])  # fmt: skip
    assert rc == 0
    doc = json.loads((out / "tokens.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    assert doc[0]["tokens"][-1] == " is" and len(doc[0]["top"]) == len(summary["layers"])
    assert summary["top1"][0][-1][-1] == doc[0]["top"][-1][-1][0]["token"]
    html = (out / "report.html").read_text()
    assert html.count('class="figure"') == 2 and "top next token" in html
    bad = ["lens", "--model", str(tiny_dir), "--prompt", "x", "--decoder", "logit,patchscope",
           "--out", str(tmp_path / "bad")]  # fmt: skip
    assert main(bad) == 2


def test_lens_cli_token_grid_on_the_embedded_model(tmp_path):
    """`mechlingo lens --prompt "The capital of France is"` on the embedded Gemma 3 270M: the
    grid covers every position and layer; after "is", " Paris" is the top token of late
    layers (entries 13, 16 and 17 when measured) and in the output's top 5 (the output's
    top-1 is " the": "... is the city of Paris")."""
    import json

    from mechlingo.cli import main

    out = tmp_path / "paris"
    assert main(["lens", "--prompt", "The capital of France is", "--quiet",
                 "--out", str(out)]) == 0  # fmt: skip
    doc = json.loads((out / "tokens.json").read_text())[0]
    assert doc["tokens"] == ["<bos>", "The", " capital", " of", " France", " is"]
    assert len(doc["top"]) == 19 and all(len(row) == 6 for row in doc["top"])
    last = doc["top"][-1][-1]
    assert " Paris" in [c["token"] for c in last] and 0 < last[0]["prob"] <= 1
    assert sum(row[-1][0]["token"] == " Paris" for row in doc["top"][12:18]) >= 2
    assert all(a["prob"] >= b["prob"] for a, b in zip(last, last[1:], strict=False))


def test_a_prompt_without_a_declared_language_is_titled_with_its_own(tiny):
    """A French few-shot prompt read without langs= is identified as French (the grid said
    "(en prompt)"); a declared language is kept."""
    fr = "Pays : Italie\nCapitale : Rome\nPays : Allemagne\nCapitale :"
    r = logit_lens(tiny, [fr, "Die Hauptstadt von Frankreich ist"], layers=[0, 1])
    assert r.langs == ["fr", "de"]
    assert r.fig_tokens(0).layout.title.text.startswith("Logit lens (fr prompt)")
    assert logit_lens(tiny, [fr], langs=["it"], layers=[0]).langs == ["it"]


def test_lens_with_mismatch_tracks_the_prepared_words(tiny):
    facts = [Fact("town/A", "town", "fr", "A", "A:", "Londres", answer_en="London"),
             Fact("town/B", "town", "fr", "B", "B:", "Pékin", answer_en="Beijing")]  # fmt: skip
    lens, mismatch = lens_with_mismatch(tiny, facts, None, 2, False)
    tracks, expected = mismatch_tracks(facts, None)
    assert mismatch == expected == ["Beijing", "London"]
    assert lens.tracks == list(tracks) and lens.answers == tracks
