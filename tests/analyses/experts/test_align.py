"""Sentence embeddings, cross-lingual distances and retrieval."""

from __future__ import annotations

import itertools

import pytest
import torch

from mechlingo.analyses.experts import make_clamp
from mechlingo.analyses.experts.align import (
    AlignmentError,
    check_parallel,
    compare_alignment,
    distances,
    drop_empty_lines,
    embed_parallel,
    pca_2d,
    per_sentence,
    retrieval,
    retrieval_hits,
)
from mechlingo.core.tokens import encode
from tests.conftest import count_hooks

TEXTS = {
    "en": ["the cat sat on the mat", "hello world", "a dog", "it is raining"],
    "es": ["el gato", "hola mundo que tal", "un perro", "llueve mucho hoy"],
    "fr": ["le chat", "bonjour", "un chien noir", "il pleut"],
}


def test_retrieval_identity_is_one():
    x = torch.randn(6, 16)
    emb = torch.stack([x, x, 2 * x])  # scaling does not change cosine
    r = retrieval(emb)
    assert r.shape == (3, 3)
    assert torch.equal(r, torch.ones(3, 3, dtype=r.dtype))


def test_retrieval_permuted_by_hand():
    torch.manual_seed(1)
    x = torch.nn.functional.normalize(torch.randn(5, 32), dim=-1)
    perm = torch.tensor([0, 2, 1, 3, 4])  # b[j] = a[perm[j]]: fixed points 0, 3, 4
    b = x[perm]
    r = retrieval(torch.stack([x, b]))
    # a -> b: query i finds j with perm[j] == i; correct iff perm[i] == i
    assert float(r[0, 1]) == pytest.approx(3 / 5)
    assert float(r[1, 0]) == pytest.approx(3 / 5)
    cyc = x[torch.tensor([1, 2, 3, 4, 0])]
    assert float(retrieval(torch.stack([x, cyc]))[0, 1]) == 0.0


def test_retrieval_batched_over_layers_and_chunks(monkeypatch):
    import mechlingo.analyses.experts.align as al

    emb = torch.randn(4, 3, 7, 8)
    full = retrieval(emb)
    monkeypatch.setattr(al, "_RETRIEVAL_CHUNK_ELEMENTS", 1)  # one layer per chunk
    assert torch.equal(retrieval(emb), full)
    for i in range(4):
        assert torch.equal(retrieval(emb[i]), full[i])
    c = retrieval(emb, centre=True)
    assert torch.equal(c[2], retrieval(emb[2] - emb[2].mean((0, 1))))


def _cosd(u, v):
    return 1 - float(torch.nn.functional.cosine_similarity(u, v, dim=0))


def test_distances_against_hand_computation():
    torch.manual_seed(0)
    emb = torch.randn(3, 4, 5, dtype=torch.float64)
    langs = ["en", "es", "fr"]
    d = distances(emb, langs, target="es")
    for a, b in itertools.product(range(3), range(3)):
        same = sum(_cosd(emb[a, i], emb[b, i]) for i in range(4)) / 4
        diff = sum(_cosd(emb[a, i], emb[b, j]) for i in range(4) for j in range(4) if i != j) / 12
        assert float(d.between[a, b]) == pytest.approx(same, abs=1e-6)
        assert float(d.different[a, b]) == pytest.approx(diff, abs=1e-6)
    flat = emb.reshape(12, 5)
    totals = [sum(_cosd(flat[i], flat[j]) for j in range(12)) for i in range(12)]
    med = flat[min(range(12), key=totals.__getitem__)]
    for a in range(3):
        want = sum(_cosd(emb[a, i], med) for i in range(4)) / 4
        assert float(d.to_medoid[a]) == pytest.approx(want, abs=1e-6)
    assert torch.equal(d.to_target, d.between[:, 1])
    s = d.summary()
    off = [float(d.between[a, b]) for a in range(3) for b in range(3) if a != b]
    assert s["between_languages"] == pytest.approx(sum(off) / 6, abs=1e-6)
    assert s["to_target"] == pytest.approx((float(d.between[0, 1]) + float(d.between[2, 1])) / 2)
    # centring: same as subtracting the mean embedding by hand
    dc = distances(emb, langs, centre=True)
    dh = distances(emb - emb.mean((0, 1)), langs)
    torch.testing.assert_close(dc.between, dh.between)


@pytest.mark.parametrize("centre", [False, True])
def test_per_sentence_means_are_the_headline_numbers(centre):
    torch.manual_seed(2)
    emb = torch.randn(4, 6, 8, dtype=torch.float64)
    langs = ["en", "es", "fr", "de"]
    v = per_sentence(emb, langs, target="es", centre=centre)
    assert set(v) == {
        "retrieval", "between_languages", "to_medoid", "to_target", "retrieval_to_target"
    }  # fmt: skip
    assert all(x.shape == (6,) for x in v.values())
    r = retrieval(emb, centre=centre)
    off = ~torch.eye(4, dtype=torch.bool)
    assert float(v["retrieval"].mean()) == pytest.approx(float(r[off].mean()), abs=1e-6)
    assert float(v["retrieval_to_target"].mean()) == pytest.approx(
        float(r[[0, 2, 3], 1].mean()), abs=1e-6
    )
    d = distances(emb, langs, target="es", centre=centre).summary()
    for m in ("between_languages", "to_medoid", "to_target"):
        assert float(v[m].mean()) == pytest.approx(d[m], abs=1e-6)
    # by hand, sentence 3: distance between en and fr, and es's hit rate as a query
    x = emb - emb.mean((0, 1)) if centre else emb
    h = retrieval_hits(emb, centre=centre)
    assert h.shape == (4, 4, 6) and bool(h[0, 0].all())
    hand = sum(_cosd(x[a, 3], x[b, 3]) for a in range(4) for b in range(4) if a != b) / 12
    assert float(v["between_languages"][3]) == pytest.approx(hand, abs=1e-6)
    with pytest.raises(AlignmentError, match="two languages"):
        per_sentence(emb[:1], ["en"])


def test_embeddings_match_hand_mean_and_batching(tiny):
    e = embed_parallel(tiny, TEXTS, layers="all", batch_size=5)
    assert e.emb.shape == (tiny.cfg.n_layers, 3, 4, tiny.cfg.d_model)
    one = embed_parallel(tiny, TEXTS, layers="all", batch_size=1)
    torch.testing.assert_close(e.emb, one.emb, atol=1e-5, rtol=1e-5)
    last = embed_parallel(tiny, TEXTS)  # default: final layer only
    assert last.layers == [tiny.cfg.n_layers - 1]
    torch.testing.assert_close(last.emb[0], e.emb[-1], atol=1e-5, rtol=1e-5)
    s = TEXTS["es"][1]
    _, cache = tiny.run_with_cache(encode(tiny, [s]).tokens)
    want = cache[f"blocks.{tiny.cfg.n_layers - 1}.hook_resid_post"][0, 1:].mean(0)
    torch.testing.assert_close(e.emb[-1, 1, 1], want.float(), atol=1e-5, rtol=1e-5)
    assert count_hooks(tiny) == 0


def test_compare_alignment_with_clamp(tiny):
    iv = make_clamp(torch.tensor([0, 1]), torch.tensor([3, 5]), torch.tensor([2.0, -1.0]))
    iv.meta = {"build": {"lang": "es"}}
    c = compare_alignment(tiny, TEXTS, iv)
    assert c.target == "es"
    assert c.retrieval_pre.shape == c.retrieval_post.shape == (tiny.cfg.n_layers, 3, 3)
    assert not torch.equal(c.post.emb, c.pre.emb)
    s = c.summary()
    assert set(s["retrieval_top1"]) == {"pre", "post"} and len(s["retrieval_top1"]["pre"]) == 6
    assert s["distance"]["post"]["target"] == "es"
    assert len(c.to_dataframe()) == tiny.cfg.n_layers * 6
    c.fig_pca()
    c.fig_retrieval()
    c.fig_layers()
    assert pca_2d(c.pre.emb[-1]).shape == (3, 4, 2)
    assert count_hooks(tiny) == 0


def test_compare_alignment_with_control_and_intervals(tiny):
    iv = make_clamp(torch.tensor([0, 1]), torch.tensor([3, 5]), torch.tensor([2.0, -1.0]))
    ctl = make_clamp(torch.tensor([0, 1]), torch.tensor([7, 9]), torch.tensor([2.0, -1.0]))
    c = compare_alignment(tiny, TEXTS, iv, control=ctl, target="es")
    alone = compare_alignment(tiny, TEXTS, ctl, target="es")
    assert c.arms() == ["pre", "post", "control"]
    torch.testing.assert_close(c.control.emb, alone.post.emb)
    torch.testing.assert_close(c.retrieval_control, alone.retrieval_post)
    s = c.summary()
    assert set(s["distance"]) == set(s["retrieval_top1"]) == {"pre", "post", "control"}
    assert s["distance"]["control"] == alone.summary()["distance"]["post"]
    ci = c.intervals()
    assert ci["layer"] == tiny.cfg.n_layers - 1 and ci["n_sentences"] == 4
    for m, per in ci["measures"].items():
        for cell in per.values():
            assert cell["n"] == 4
            assert cell["lo"] <= cell["estimate"] + 1e-9 and cell["estimate"] <= cell["hi"] + 1e-9
        g = ci["gains"][m]["post_vs_control"]
        assert g["estimate"] == pytest.approx(
            per["post"]["estimate"] - per["control"]["estimate"], abs=1e-6
        )
    assert ci["measures"]["between_languages"]["post"]["estimate"] == pytest.approx(
        s["distance"]["post"]["between_languages"], abs=1e-5
    )
    assert set(c.to_dataframe().columns) >= {"top1_pre", "top1_post", "top1_control"}
    assert count_hooks(tiny) == 0


def test_errors():
    with pytest.raises(AlignmentError, match="same number"):
        check_parallel({"en": ["a", "b"], "es": ["a"]})
    with pytest.raises(AlignmentError, match="no sentences"):
        check_parallel({"en": [], "es": []})
    with pytest.raises(AlignmentError, match="empty"):
        check_parallel({"en": ["a", ""], "es": ["a", "b"]})
    with pytest.raises(AlignmentError, match="target"):
        distances(torch.randn(2, 3, 4), ["en", "es"], target="fr")
    with pytest.raises(AlignmentError, match="language names"):
        distances(torch.randn(2, 3, 4), ["en"])
    assert drop_empty_lines({"en": ["a", "", "c"], "es": ["x", "y", " "]}) == {
        "en": ["a"],
        "es": ["x"],
    }


def test_layer_errors(tiny):
    with pytest.raises(ValueError, match="out of range"):
        embed_parallel(tiny, TEXTS, layers=[99])
    with pytest.raises(AlignmentError, match="layers must be"):
        embed_parallel(tiny, TEXTS, layers="some")
