"""Expert neurons: statistics, scores, selection, clamps, the k curve and the CLI."""

from __future__ import annotations

import json
import math

import pytest
import torch

from mechlingo.activations.likelihood import line_nll, perplexity
from mechlingo.activations.runs import run_batch
from mechlingo.analyses.experts import (
    ExpertError,
    KCurveOptions,
    choose_k,
    collect_neuron_stats,
    find_experts,
    k_curve,
    load_clamp,
    make_clamp,
)
from mechlingo.core.tokens import encode
from mechlingo.data.langid import identify_languages
from mechlingo.interventions import NeuronClamp
from mechlingo.kernels.ranking import auroc
from mechlingo.kernels.significance import wilson
from tests.conftest import NTREX, count_hooks

TEXTS = {
    "en": ["the cat sat on the mat", "hello world", "a dog", "it is raining today again"],
    "es": ["el gato", "hola mundo que tal", "un perro grande y feo", "llueve"],
    "fr": ["le chat", "bonjour", "un chien noir", "il pleut beaucoup aujourd'hui"],
}


@pytest.fixture(scope="module")
def experts(tiny):
    return find_experts(tiny, TEXTS, batch_size=3)


def _mlp_acts(model, sentences, hooks=()):
    """mlp_post of every layer for each sentence run alone: list of [layer, pos, d_mlp]."""
    out = []
    n = int(model.cfg.n_layers)
    for s in sentences:
        b = encode(model, [s])
        got: dict[int, torch.Tensor] = {}

        def make(layer, got=got):
            def h(t, hook):
                got[layer] = t[0].detach().clone()

            return h

        run_batch(
            model, b, list(hooks) + [(f"blocks.{i}.mlp.hook_post", make(i)) for i in range(n)]
        )
        out.append(torch.stack([got[i] for i in range(n)]))
    return out


def test_pooled_stats_batched_equal_one_at_a_time(tiny):
    big = collect_neuron_stats(tiny, TEXTS, batch_size=12)
    one = collect_neuron_stats(tiny, TEXTS, batch_size=1)
    torch.testing.assert_close(big.pooled, one.pooled, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(big.prob_active, one.prob_active)
    assert big.pooled.shape == (12, tiny.cfg.n_layers * tiny.cfg.d_mlp)


@pytest.mark.parametrize("pool", ["mean", "max"])
def test_pooled_values_match_hand_computation_without_bos_or_padding(tiny, pool):
    sents = TEXTS["en"]  # different lengths -> padding inside a batch
    stats = collect_neuron_stats(tiny, {"en": sents}, pool=pool, batch_size=4)
    acts = _mlp_acts(tiny, sents)
    for i, a in enumerate(acts):
        real = a[:, 1:]  # drop BOS
        want = real.mean(1) if pool == "mean" else real.amax(1)
        torch.testing.assert_close(stats.pooled[i], want.reshape(-1), atol=1e-5, rtol=1e-5)
    # LAPE input: fraction of real tokens > 0
    fired = torch.cat([a[:, 1:] > 0 for a in acts], dim=1).float().mean(1).reshape(-1)
    torch.testing.assert_close(stats.prob_active[0].float(), fired, atol=1e-6, rtol=0)
    assert count_hooks(tiny) == 0


def test_scores_are_the_kernel_auroc_per_language(experts):
    st = experts.stats
    for li in range(len(st.langs)):
        torch.testing.assert_close(
            experts.neuron_scores.auroc[li], auroc(st.pooled, st.lang_ids == li)
        )
    assert experts.neuron_scores.ap.shape == experts.neuron_scores.auroc.shape
    assert experts.neuron_scores.lape.shape == (st.n_features,)


def test_clamp_sets_exactly_the_expert_neurons(tiny, experts):
    k = 7
    iv = experts.clamp("es", k)
    assert isinstance(iv, NeuronClamp)
    feats = experts.top("es", k)
    layers, neurons = experts.stats.locate(feats)
    vals = experts.clamp_values("es", feats)
    # value = mean pooled activation over es sentences
    es = experts.stats.lang_ids == experts.stats.langs.index("es")
    torch.testing.assert_close(vals, experts.stats.pooled[es][:, feats].mean(0))
    clean = _mlp_acts(tiny, TEXTS["en"][:2])
    clamped = _mlp_acts(tiny, TEXTS["en"][:2], iv.fwd_hooks(tiny))
    first = int(layers.min())
    for c0, c1 in zip(clean, clamped, strict=True):
        for layer, neuron, v in zip(layers.tolist(), neurons.tolist(), vals.tolist(), strict=True):
            assert torch.allclose(c1[layer, :, neuron], torch.full_like(c1[layer, :, neuron], v))
        other = torch.ones(c0.shape[-1], dtype=torch.bool)
        other[neurons[layers == first]] = False
        torch.testing.assert_close(c1[first][:, other], c0[first][:, other])
    assert count_hooks(tiny) == 0


def test_random_control_same_size_same_values_other_neurons(experts):
    k = 10
    ex = experts.clamp("fr", k)
    ctl = experts.random_clamp("fr", k, seed=3)
    flat = lambda iv: {(lay, int(n)) for lay, ids in iv.neurons.items() for n in ids}  # noqa: E731
    assert len(flat(ctl)) == k and not flat(ctl) & flat(ex)
    vals = lambda iv: sorted(torch.cat(list(iv.values.values())).tolist())  # noqa: E731
    assert vals(ctl) == pytest.approx(vals(ex))
    assert ctl.meta["build"]["control"] is True
    assert flat(experts.random_clamp("fr", k, seed=3)) == flat(ctl)


def test_clamp_save_load_compose(tmp_path, tiny, experts):
    iv = experts.clamp("es", 5, value="median")
    iv.save(tmp_path / "es-k5", tiny)
    back = load_clamp(tmp_path / "es-k5", tiny)
    assert back.meta["build"]["lang"] == "es" and back.meta["build"]["value"] == "median"
    for lay in iv.neurons:
        assert torch.equal(back.neurons[lay], iv.neurons[lay])
        torch.testing.assert_close(back.values[lay], iv.values[lay])
    both = iv + experts.clamp("fr", 3)
    assert len(both.fwd_hooks(tiny)) >= 1


def test_overlap_layer_counts_dataframe(experts):
    ov = experts.overlap(20)
    assert torch.allclose(torch.diagonal(ov), torch.ones(3))
    assert bool((ov >= 0).all() and (ov <= 1).all())
    counts = experts.layer_counts(20)
    assert counts.sum(1).tolist() == [20, 20, 20]
    df = experts.to_dataframe(5)
    assert len(df) == 15 and {"lang", "layer", "neuron", "auroc", "ap", "lape"} <= set(df.columns)
    assert df.groupby("lang").auroc.apply(lambda s: s.is_monotonic_decreasing).all()
    experts.fig_layers(20)
    experts.fig_overlap(20)
    s = experts.summary(5)
    assert set(s["per_lang"]) == {"en", "es", "fr"}


def test_lape_selection(experts):
    top = experts.top("es", 3, by="lape")
    assert top.shape == (3,)
    assert torch.isfinite(experts.scores("lape")[1, top]).all()


def test_clear_errors(tiny, experts):
    with pytest.raises(ExpertError, match="no sentences"):
        find_experts(tiny, {"en": ["a b"], "es": []})
    with pytest.raises(ExpertError, match="at least 2 languages"):
        find_experts(tiny, {"en": ["a b"]})
    n = experts.stats.n_features
    with pytest.raises(ExpertError, match=r"k must be an integer in \[1, "):
        experts.clamp("es", n + 1)
    with pytest.raises(ExpertError, match="not in these statistics"):
        experts.clamp("de", 3)
    with pytest.raises(ExpertError, match="same length"):
        make_clamp(torch.tensor([0, 1]), torch.tensor([3, 4]), torch.tensor([1.0, 2.0, 3.0]))
    with pytest.raises(ExpertError, match="1-D"):
        make_clamp(torch.tensor([0]), torch.tensor([3]), torch.ones(1, 1))
    with pytest.raises(ExpertError, match="empty"):
        find_experts(tiny, {"en": ["a", " "], "es": ["b", "c"]})
    with pytest.raises(ExpertError, match="pool"):
        collect_neuron_stats(tiny, TEXTS, pool="median")


def test_perplexity_matches_model_loss(tiny):
    s = "the cat sat on the mat"
    b = encode(tiny, [s])
    logits = tiny(b.tokens).float()
    nll = torch.nn.functional.cross_entropy(logits[0, :-1], b.tokens[0, 1:])
    assert perplexity(tiny, [s]) == pytest.approx(math.exp(float(nll)), rel=1e-4)
    two = perplexity(tiny, [s, "hola"], batch_size=2)
    assert two == pytest.approx(perplexity(tiny, [s, "hola"], batch_size=1), rel=1e-5)


def test_identify_languages():
    got = identify_languages(
        ["Hola, ¿cómo estás? Vivo en Madrid con mi familia.", "123 !!", "Das ist ein Haus."],
        ["en", "de", "fr", "es"],
    )
    assert got == ["es", None, "de"]


def test_line_nll_is_the_per_sentence_loss(tiny):
    sents = ["the cat sat on the mat", "hola", "un perro grande"]
    nll, cnt = line_nll(tiny, sents, batch_size=2)
    for i, s in enumerate(sents):
        b = encode(tiny, [s])
        logits = tiny(b.tokens).float()
        want = torch.nn.functional.cross_entropy(logits[0, :-1], b.tokens[0, 1:], reduction="sum")
        assert float(nll[i]) == pytest.approx(float(want), rel=1e-4)
        assert int(cnt[i]) == b.tokens.shape[1] - 1
    assert perplexity(tiny, sents) == pytest.approx(math.exp(float(nll.sum() / cnt.sum())))


def test_k_curve_runs(tiny, experts):
    opts = KCurveOptions(n_samples=4, max_new_tokens=3, prompts=("1.",))
    kc = k_curve(tiny, experts, "es", [2], TEXTS, opts)
    df = kc.to_dataframe()
    assert list(df.arm) == ["none", "experts", "random"] and list(df.k) == [0, 2, 2]
    assert {"ppl_en", "ppl_es", "ppl_fr", "target_rate_bos"} <= set(df.columns)
    assert df.filter(like="ppl_").notna().all().all()
    for r in kc.rows:  # Wilson interval of the BOS hits; ratios against the no-clamp row
        assert r["n_bos"] == 4 == len(r["bos_hits"]) and r["target_bos"] == sum(r["bos_hits"])
        w = wilson(r["target_bos"], 4)
        assert (r["target_rate_bos_lo"], r["target_rate_bos_hi"]) == (w.lo, w.hi)
        for lg in ("en", "es", "fr"):
            assert r[f"ppl_{lg}_lo"] <= r[f"ppl_{lg}"] <= r[f"ppl_{lg}_hi"]
            want = r[f"ppl_{lg}"] / kc.rows[0][f"ppl_{lg}"]
            assert r[f"ppl_ratio_{lg}"] == pytest.approx(want, rel=1e-9)
    assert kc.rows[0]["ppl_ratio_es"] == 1.0
    t = kc.tests()
    assert [x["k"] for x in t] == [2] and set(t[0]) == {"k", "vs_none", "vs_random"}
    assert t[0]["vs_none"]["n"] == 4
    ch = kc.choose(ppl_budget=1e6)
    assert ch["k"] == 2 and ch["candidates"][0]["within_budget"]
    assert kc.choose(ppl_budget=1e-6)["k"] is None
    kc.fig_k_curve(2)
    assert count_hooks(tiny) == 0


def _row(k, arm, rate, **ppl):
    return {"k": k, "arm": arm, "target_rate_bos": rate, **{f"ppl_{x}": v for x, v in ppl.items()}}


K_ROWS = [
    _row(0, "none", 0.1, es=10, en=10, fr=10),
    _row(50, "experts", 0.3, es=12, en=12, fr=12),  # ratios 1.2
    _row(50, "random", 0.9, es=11, en=11, fr=11),  # controls never chosen
    _row(100, "experts", 0.6, es=15, en=25, fr=30),  # others: geomean 2.74, max 3
    _row(200, "experts", 0.6, es=18, en=18, fr=21),  # others: geomean 1.94, max 2.1
    _row(300, "experts", 0.6, es=19, en=19, fr=19),  # 1.9 everywhere
    _row(500, "experts", 0.9, es=40, en=12, fr=12),  # target 4x
]


@pytest.mark.parametrize(
    "budget,others,want",
    [
        (2.0, "geomean", 200),  # 200 ties 300 at 0.6: the smaller k
        (2.0, "max", 300),  # 200 is out: fr 2.1
        (2.0, "none", 100),  # others ignored: 100, 200, 300 tie at 0.6
        (1.5, "geomean", 50),
        (5.0, "geomean", 500),
        (1.1, "geomean", None),  # nothing within budget
    ],
)
def test_choose_k_on_a_hand_made_curve(budget, others, want):
    ch = choose_k(K_ROWS, "es", ppl_budget=budget, others=others)
    assert ch["k"] == want
    assert [c["k"] for c in ch["candidates"]] == [50, 100, 200, 300, 500]
    assert ch["target_rate_none"] == 0.1 and "never chosen by retrieval" in ch["rule"]
    c100 = ch["candidates"][1]
    assert c100["ppl_ratio_target"] == pytest.approx(1.5)
    want_others = {"geomean": math.sqrt(2.5 * 3.0), "max": 3.0, "none": None}[others]
    assert c100["ppl_ratio_others"] == pytest.approx(want_others)


def test_k_curve_figure_keeps_hindi():  # ppl_hi is Hindi, not an interval bound
    from mechlingo.analyses.experts import KCurve

    rows = [
        dict(r, ppl_hi=5.0, ppl_hi_lo=4.0, ppl_hi_hi=6.0, target_rate_prompt=0.0) for r in K_ROWS
    ]
    names = {t.name for t in KCurve("es", rows).fig_k_curve(200).data}
    assert {"experts hi", "experts es", "chosen k = 200"} <= names
    assert not {"experts hi_lo", "experts hi_hi"} & names


def test_choose_k_default_is_the_papers_rule():
    # the papers' rule weighs the target's rate against the target's perplexity only: on the
    # hand-made curve k = 100 (target ratio 1.5) wins although the others' ratios are ~2.7
    assert choose_k(K_ROWS, "es")["k"] == 100
    assert choose_k(K_ROWS, "es")["others"] == "none"
    assert choose_k(K_ROWS, "es", others="geomean")["k"] == 200


def test_choose_k_errors():
    with pytest.raises(ExpertError, match="'none' row"):
        choose_k(K_ROWS[1:], "es")
    with pytest.raises(ExpertError, match="target"):
        choose_k(K_ROWS, "de")
    with pytest.raises(ExpertError, match="budget"):
        choose_k(K_ROWS, "es", ppl_budget=0)


def _write_data(folder, n=6):
    folder.mkdir()
    for lang, sents in TEXTS.items():
        lines = (sents * 3)[:n]
        (folder / f"{lang}.txt").write_text(
            "\n".join(f"{s} {i}" for i, s in enumerate(lines)) + "\n"
        )
    return folder


def test_cli_experts_then_align(tmp_path, tiny_dir):
    from mechlingo.cli import main

    data = _write_data(tmp_path / "data")
    edir = tmp_path / "edir"
    rc = main(
        ["experts", "--model", str(tiny_dir), "--target", "es", "--k", "3,5", "--parallel", str(data),
         "--lines", "4", "--heldout", "2", "--samples", "3", "--sample-tokens", "3",
         "--ppl-budget", "1000", "--out", str(edir), "--quiet"]
    )  # fmt: skip
    assert rc == 0
    for name in ("summary.json", "experts.csv", "kcurve.csv", "report.html"):
        assert (edir / name).is_file()
    for name in ("es-k3", "es-k5", "es-k5-random"):
        assert (edir / name / "intervention.json").is_file()
    summ = json.loads((edir / "summary.json").read_text())
    assert summ["clamps"] == ["es-k3", "es-k3-random", "es-k5", "es-k5-random"]
    ch = summ["k_choice"]["es"]
    assert ch["ppl_budget"] == 1000 and ch["others"] == "none"  # the papers' rule by default
    stricter = summ["k_choice_stricter"]["es"]  # reported beside it
    assert stricter["others"] == "geomean" and stricter["ppl_budget"] == 1000
    assert [c["k"] for c in ch["candidates"]] == [3, 5]
    assert all(c["within_budget"] for c in ch["candidates"])
    rates = {c["k"]: c["target_rate_bos"] for c in ch["candidates"]}
    best = max(rates.values())
    assert summ["chosen_k"] == {"es": min(k for k, v in rates.items() if v == best)}
    rows = summ["k_curve"]["es"]
    assert [(r["k"], r["arm"]) for r in rows] == [
        (0, "none"), (3, "experts"), (3, "random"), (5, "experts"), (5, "random")
    ]  # fmt: skip
    assert all(r["n_bos"] == 3 and r["target_rate_bos_lo"] is not None for r in rows)
    assert {"ppl_es_lo", "ppl_ratio_en_hi"} <= set(rows[1])
    assert [t["k"] for t in summ["k_tests"]["es"]] == [3, 5]
    assert "Choosing k for es" in (edir / "report.html").read_text()
    out = tmp_path / "align"
    rc = main(
        [
            "align",
            "--model",
            str(tiny_dir),
            "--clamp",
            str(edir),
            "--parallel",
            str(data),
            "--offset",
            "2",
            "--lines",
            "4",
            "--out",
            str(out),
            "--quiet",
        ]
    )  # fmt: skip
    assert rc == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["meta"]["clamp"] == str(edir / f"es-k{summ['chosen_k']['es']}")
    assert set(s["retrieval_top1"]) == {"pre", "post", "control"}
    assert "es->en" in s["retrieval_top1"]["post"]
    assert set(s["distance"]) == {"pre", "post", "control"}
    assert s["distance"]["post"]["target"] == "es" and s["target"] == "es"
    iv = s["intervals"]
    assert iv["n_sentences"] == 4 and iv["unit"] == "sentence"
    want = {"retrieval", "between_languages", "to_medoid", "to_target", "retrieval_to_target"}
    assert set(iv["measures"]) == want
    for m in want:
        assert set(iv["measures"][m]) == {"pre", "post", "control"}
        pre, post = iv["measures"][m]["pre"]["estimate"], iv["measures"][m]["post"]["estimate"]
        g = iv["gains"][m]
        assert set(g) == {"post_vs_pre", "post_vs_control", "control_vs_pre"}
        assert g["post_vs_pre"]["estimate"] == pytest.approx(post - pre, abs=1e-6)
    mean_pre = sum(s["retrieval_top1"]["pre"].values()) / 6
    assert iv["measures"]["retrieval"]["pre"]["estimate"] == pytest.approx(mean_pre, abs=1e-6)
    d = s["distance"]["control"]["between_languages"]
    assert iv["measures"]["between_languages"]["control"]["estimate"] == pytest.approx(d, abs=1e-5)
    assert iv["pairs"]["post"]["es->en"]["n"] == 4
    # side effects of the chosen clamp against its random-neuron control
    rc = main(["align", "--model", str(tiny_dir), "--clamp", str(edir), "--parallel", str(data),
               "--offset", "2", "--lines", "4", "--side-effects", "--side-effects-lines", "2", "--out",
               str(tmp_path / "align-se"), "--quiet"])  # fmt: skip
    se = json.loads((tmp_path / "align-se" / "summary.json").read_text())["side_effects"]
    assert rc == 0 and {r["arm"] for r in se["rows"]} == {"intervention", "control"}
    assert {r["measure"] for r in se["rows"]} >= {"accuracy", "perplexity"}
    # an experts folder whose rule chose no k: align says so and writes nothing
    summ["chosen_k"] = {"es": None}
    (edir / "summary.json").write_text(json.dumps(summ))
    out2 = tmp_path / "align2"
    rc = main(
        ["align", "--model", str(tiny_dir), "--clamp", str(edir), "--parallel", str(data),
         "--offset", "2", "--lines", "4", "--out", str(out2), "--quiet"]
    )  # fmt: skip
    assert rc == 2 and not out2.exists()


def test_cli_errors_leave_nothing(tmp_path, tiny_dir, capsys):
    from mechlingo.cli import main

    data = _write_data(tmp_path / "data")
    out = tmp_path / "out"
    assert (
        main(
            [
                "experts",
                "--model",
                str(tiny_dir),
                "--target",
                "de",
                "--k",
                "10",
                "--parallel",
                str(data),
                "--out",
                str(out),
            ]
        )
        == 2
    )
    assert "no data for target" in capsys.readouterr().err
    assert (
        main(
            [
                "experts",
                "--model",
                str(tiny_dir),
                "--target",
                "es",
                "--k",
                "x",
                "--parallel",
                str(data),
                "--out",
                str(out),
            ]
        )
        == 2
    )
    assert (
        main(
            [
                "align",
                "--model",
                str(tiny_dir),
                "--clamp",
                str(tmp_path / "nope"),
                "--parallel",
                str(data),
                "--out",
                str(out),
            ]
        )
        == 2
    )
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.skipif(not NTREX.is_dir(), reason="NTREX data not present")
def test_gemma_spanish_experts_and_retrieval(gemma):
    from mechlingo.analyses.experts.align import compare_alignment
    from mechlingo.data import read_parallel_dir

    d = read_parallel_dir(NTREX, ["es", "en", "fr"])
    find = {lg: s[:10] for lg, s in d.items()}
    res = find_experts(gemma, find, max_tokens=12, batch_size=32)
    top = res.top("es", 20)
    assert float(res.neuron_scores.auroc[0, top].min()) > 0.9
    iv = res.clamp("es", 100)
    al = {lg: s[200:206] for lg, s in d.items() if lg in ("es", "en")}
    comp = compare_alignment(gemma, al, iv, layers=[9, -1], max_tokens=12)
    assert torch.isfinite(comp.retrieval_pre).all() and torch.isfinite(comp.retrieval_post).all()
    assert comp.retrieval_pre.shape == (2, 2, 2)
    s = comp.summary()
    assert 0 <= s["retrieval_top1"]["post"]["es->en"] <= 1
    assert s["distance"]["post"]["target"] == "es"


def _plain(summary):
    """A summary as the JSON a command writes, without the run's ``meta``."""
    from mechlingo.core.jsonable import jsonable

    out = json.loads(json.dumps(jsonable(summary)))
    out.pop("meta", None)
    out.pop("format_version", None)
    return out


def test_run_experts_and_run_alignment_are_what_the_commands_write(tmp_path, tiny_dir, tiny):
    """The library calls behind ``experts`` and ``align``, without stages, give the numbers
    the commands write (their stages only keep what the calls compute)."""
    from mechlingo.analyses.experts.align_run import load_clamp_pair, run_alignment
    from mechlingo.analyses.experts.run import ExpertSettings, run_experts
    from mechlingo.cli import main
    from mechlingo.data import read_parallel

    data = _write_data(tmp_path / "data")
    edir, adir = tmp_path / "edir", tmp_path / "adir"
    assert main(["experts", "--model", str(tiny_dir), "--target", "es", "--k", "3,5",
                 "--parallel", str(data), "--lines", "4", "--heldout", "2", "--samples", "3",
                 "--sample-tokens", "3", "--ppl-budget", "1000", "--out", str(edir),
                 "--quiet"]) == 0  # fmt: skip
    texts = read_parallel(data)
    settings = ExpertSettings(samples=3, max_new_tokens=3, ppl_budget=1000)
    run = run_experts(tiny, {lg: v[:4] for lg, v in texts.items()}, ["es"], [5, 3, 5],
                      heldout={lg: v[4:6] for lg, v in texts.items()}, settings=settings)  # fmt: skip
    assert run.ks == [3, 5] and sorted(run.clamps) == ["es-k3", "es-k3-random", "es-k5",
                                                       "es-k5-random"]  # fmt: skip
    assert _plain(run.summary()) == _plain(json.loads((edir / "summary.json").read_text()))
    run.write(tmp_path / "lib")
    for name in ("experts.csv", "kcurve.csv"):
        assert (tmp_path / "lib" / name).read_text() == (edir / name).read_text()
    assert (tmp_path / "lib" / "es-k5-random" / "intervention.safetensors").read_bytes() == (
        edir / "es-k5-random" / "intervention.safetensors"
    ).read_bytes()

    assert main(["align", "--model", str(tiny_dir), "--clamp", str(edir / "es-k3"),
                 "--parallel", str(data), "--offset", "2", "--lines", "4", "--out", str(adir),
                 "--quiet"]) == 0  # fmt: skip
    clamp, control = load_clamp_pair(edir / "es-k3", None, tiny)
    assert clamp is not None and control is not None  # es-k3-random, beside the clamp
    align = run_alignment(tiny, {lg: v[2:6] for lg, v in texts.items()}, clamp, control)
    assert _plain(align.summary()) == _plain(json.loads((adir / "summary.json").read_text()))
    assert align.files()["retrieval.csv"] == (adir / "retrieval.csv").read_text()
    assert load_clamp_pair(None, None, tiny) == (None, None)


def test_identify_languages_degrades_for_a_language_py3langid_lacks():
    import py3langid.langid as lid

    from mechlingo.data.langid import UNKNOWN, language_id_notes

    labels = set(lid.LanguageIdentifier.from_model_file(lid.MODEL_FILE).labels)
    assert "dv" not in labels and "mi" not in labels  # Dhivehi (Thaana), Maori (Latin)
    texts = ["ދިވެހި ބަހަކީ ރާއްޖޭގެ ބަހެވެ", "The cat is sitting on the table",
             "Ko te reo Māori tēnei, he reo rangatira nō Aotearoa", "123 !!"]  # fmt: skip
    with pytest.warns(UserWarning, match="dv: py3langid has no model of it"):
        got = identify_languages(texts, ["en", "fr", "dv", "mi"])
    # dv by its own script, English as before, Maori placed in none of the languages
    assert got == ["dv", "en", UNKNOWN, None]
    notes = language_id_notes(["en", "dv", "mi"])
    assert len(notes) == 2 and "Thaana" in notes[0] and "'unknown'" in notes[1]
    assert language_id_notes(["en", "sw", "sv"]) == []
    # without a language py3langid lacks, the restricted identifier is unchanged
    assert identify_languages(texts[1:2], ["en", "fr"]) == ["en"]
