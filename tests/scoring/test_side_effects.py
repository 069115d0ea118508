"""The side-effects matrix: values against hand computations on the tiny model, the
norm-matched controls, saved interventions, JSON and the figure. NTREX lines are read from
the shared data folder, never copied into the package."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from mechlingo.activations.likelihood import line_nll, perplexity
from mechlingo.data import load_facts
from mechlingo.data.langid import identify_languages
from mechlingo.interventions import (
    Ablation,
    Compose,
    NeuronClamp,
    SteeringVector,
    intervene,
    load_intervention,
)
from mechlingo.scoring.evaluate import DecodeOptions, evaluate_facts, greedy_generate
from mechlingo.scoring.side_effects import (
    SideEffectOptions,
    SideEffectsError,
    line_prefix,
    random_control,
    side_effects,
)
from tests.conftest import NTREX, count_hooks

LANGS = ["en", "fr", "de"]


@pytest.fixture(scope="module")
def lines():
    if not NTREX.is_dir():
        pytest.skip(f"NTREX lines not found in {NTREX}")
    out = {}
    for lg in LANGS:
        text = (NTREX / f"{lg}.txt").read_text(encoding="utf-8").splitlines()
        out[lg] = [s for s in text if s.strip()][:6]
    return out


@pytest.fixture(scope="module")
def facts():
    return load_facts(langs=["en", "fr"], relations=["capital"], limit=4)


@pytest.fixture(scope="module")
def vector(tiny):
    v = torch.randn(tiny.cfg.d_model, generator=torch.Generator().manual_seed(1))
    return SteeringVector(v, 1, 4.0, positions="all")


@pytest.fixture(scope="module")
def result(tiny, vector, facts, lines):
    return side_effects(
        tiny,
        vector,
        facts,
        lines,
        options=SideEffectOptions(max_tokens=12, continuation_tokens=5, n_boot=200),
    )


def _hand_nll(model, text, max_tokens, iv=None):
    """Summed NLL and count of one line from a plain full forward (no mechlingo runs)."""
    tokens = model.to_tokens(text)[:, : max_tokens + 1]
    with intervene(model, iv):
        logits = model(tokens)
    lp = logits[0, :-1].double().log_softmax(-1)
    nll = -lp.gather(1, tokens[0, 1:, None])[:, 0]
    return float(nll.sum()), int(nll.numel())


def test_line_nll_against_hand_computation(tiny, vector, lines):
    texts = lines["fr"]
    for iv in (None, vector):
        hooks = list(iv.fwd_hooks(tiny)) if iv is not None else []
        s, c = line_nll(tiny, texts, fwd_hooks=hooks, max_tokens=12, batch_size=4)
        for i, t in enumerate(texts):
            hs, hc = _hand_nll(tiny, t, 12, iv)
            assert int(c[i]) == hc
            assert float(s[i]) == pytest.approx(hs, rel=1e-4)
        ref = perplexity(tiny, texts, fwd_hooks=hooks, max_tokens=12)
        assert math.exp(float(s.sum() / c.sum())) == pytest.approx(ref, rel=1e-5)
    assert count_hooks(tiny) == 0


def test_matrix_against_hand_computation(tiny, vector, facts, lines, result):
    ctrl = random_control(vector, tiny, seed=0)
    df = result.to_dataframe()
    assert set(df["arm"]) == {"intervention", "control"}
    assert result.langs == ["en", "fr", "de"]
    # accuracy: the eval rule with and without the intervention
    base = evaluate_facts(tiny, facts)
    for arm, iv in (("intervention", vector), ("control", ctrl)):
        ev = evaluate_facts(tiny, facts, intervention=iv)
        for lg in ("en", "fr"):
            b = [r["correct"] for r in base.records if r["lang"] == lg]
            v = [r["correct"] for r in ev.records if r["lang"] == lg]
            row = result.get(lg, "accuracy", arm)
            assert row["base"] == pytest.approx(np.mean(b))
            assert row["value"] == pytest.approx(np.mean(v))
            assert row["n"] == len(b)
        with pytest.raises(KeyError):
            result.get("de", "accuracy", arm)  # no German facts
        # perplexity: relative change of exp(mean NLL) over the lines
        for lg in LANGS:
            hb = [_hand_nll(tiny, t, 12) for t in lines[lg]]
            hv = [_hand_nll(tiny, t, 12, iv) for t in lines[lg]]
            n = sum(c for _, c in hb)
            pb = math.exp(sum(s for s, _ in hb) / n)
            pv = math.exp(sum(s for s, _ in hv) / n)
            row = result.get(lg, "perplexity", arm)
            assert row["base"] == pytest.approx(pb, rel=1e-4)
            assert row["value"] == pytest.approx(pv, rel=1e-4)
            assert row["delta"] == pytest.approx(pv / pb - 1, rel=1e-3, abs=1e-6)
            assert row["ci_low"] <= row["delta"] <= row["ci_high"]
        # output language: py3langid on greedy continuations of each line's first words
        for lg in LANGS:
            prompts = [line_prefix(t, lg) for t in lines[lg]]
            gb = greedy_generate(
                tiny, prompts, stop_at_newline=False, decoding=DecodeOptions(max_new_tokens=5)
            )
            gv = greedy_generate(
                tiny,
                prompts,
                stop_at_newline=False,
                intervention=iv,
                decoding=DecodeOptions(max_new_tokens=5),
            )
            sb = np.mean([x == lg for x in identify_languages(gb, LANGS)])
            sv = np.mean([x == lg for x in identify_languages(gv, LANGS)])
            row = result.get(lg, "output_lang", arm)
            assert (row["base"], row["value"]) == pytest.approx((sb, sv))
            assert row["value_ci_low"] <= row["value"] <= row["value_ci_high"]
    assert count_hooks(tiny) == 0


def test_intervals(result):
    from scipy.stats import binomtest

    for r in result.rows:
        if r["measure"] == "perplexity":
            continue
        k = round(r["value"] * r["n"])
        ci = binomtest(k, r["n"]).proportion_ci(method="wilson")
        assert (r["value_ci_low"], r["value_ci_high"]) == pytest.approx((ci.low, ci.high))
        if r["delta"] == 0 and r["ci_low"] == r["ci_high"]:
            continue  # no item changed: a degenerate (point) interval
        assert r["ci_low"] <= r["delta"] <= r["ci_high"]
        assert -1 <= r["ci_low"] and r["ci_high"] <= 1


def test_controls_are_norm_matched(tiny):
    v = torch.randn(tiny.cfg.d_model)
    sv = SteeringVector(v, 0, 2.0)
    c = random_control(sv, tiny, seed=3)
    assert torch.linalg.norm(c.direction()) == pytest.approx(float(torch.linalg.norm(v)), rel=1e-5)
    assert c.layer == 0 and c.alpha == 2.0 and c.site == sv.site
    assert not torch.allclose(c.direction(), v)
    cl = NeuronClamp({0: [1, 2, 3], 1: [5]}, {0: [1.0, 2.0, 3.0], 1: [4.0]})
    cc = random_control(cl, tiny, seed=1)
    assert {k: v.numel() for k, v in cc.neurons.items()} == {0: 3, 1: 1}
    assert not set(cc.neurons[0].tolist()) & {1, 2, 3}
    assert torch.equal(cc.values[0], cl.values[0]) and cc.mode == cl.mode
    ab = Ablation("mlp_out", 1, "mean", mean=torch.ones(tiny.cfg.d_model))
    ac = random_control(ab, tiny)
    assert float(ac.mean.norm()) == pytest.approx(float(ab.mean.norm()), rel=1e-5)
    assert random_control(Ablation("attn_out", 1), tiny).layer == 0
    comp = random_control(Compose([sv, cl]), tiny)
    assert [type(p) for p in comp.parts] == [SteeringVector, NeuronClamp]


def test_saved_intervention_json_and_figure(tiny, vector, facts, lines, result, tmp_path):
    vector.save(tmp_path / "v", tiny)
    loaded = load_intervention(tmp_path / "v", tiny)
    again = side_effects(
        tiny,
        loaded,
        facts,
        lines,
        options=SideEffectOptions(max_tokens=12, continuation_tokens=5, n_boot=200),
    )
    assert again.to_dataframe().equals(result.to_dataframe())
    doc = json.loads(json.dumps(result.to_json(), allow_nan=False))
    assert doc["measures"] == ["accuracy", "perplexity", "output_lang"]
    assert len(doc["rows"]) == len(result.rows) == 2 * (2 + 3 + 3)
    fig = result.fig_heatmap()
    assert len(fig.data) == 2 and len(fig.data[0].z) == 3
    assert result.matrix().shape == (3, 3)


def test_bad_input(tiny, vector, facts, lines):
    with pytest.raises(SideEffectsError, match="no facts and no lines"):
        side_effects(tiny, vector, facts, lines, langs=["xx"])
    with pytest.raises(SideEffectsError, match="control"):
        side_effects(tiny, vector, facts, lines, control="nope")
    with pytest.raises(SideEffectsError, match="no non-empty lines"):
        side_effects(tiny, vector, [], {"en": ["  "]})


def test_clamp_composition_and_no_control(tiny, facts, lines):
    clamp = NeuronClamp({0: [1, 2, 3], 1: [4]}, 2.0)
    both = Compose([clamp, SteeringVector(torch.ones(tiny.cfg.d_model), 0, 0.5)])
    small = {lg: v[:3] for lg, v in lines.items()}
    res = side_effects(
        tiny,
        both,
        facts[:2],
        small,
        control=None,
        options=SideEffectOptions(max_tokens=8, n_boot=50),
    )
    assert {r["arm"] for r in res.rows} == {"intervention"}
    assert res.meta["control"] is None and "NeuronClamp" in res.meta["intervention"]
    res = side_effects(
        tiny,
        clamp,
        [],
        small,
        langs=["fr"],
        options=SideEffectOptions(max_tokens=8, continuation_tokens=3, n_boot=50),
    )
    assert {(r["arm"], r["measure"]) for r in res.rows} == {
        (a, m) for a in ("intervention", "control") for m in ("perplexity", "output_lang")
    }
    assert count_hooks(tiny) == 0


def test_heatmap_from_plain_rows():
    """The figure is drawn from the rows alone: each cell's colour is its change, its text the
    change and interval; a missing cell and an undefined change are blank (None)."""
    from mechlingo.viz.side_effects import cell_text, side_effects_heatmap

    nan = float("nan")
    row = {"arm": "intervention", "ci_low": -0.1, "ci_high": 0.3}
    rows = [
        dict(row, lang="es", measure="accuracy", delta=0.1),
        dict(row, lang="es", measure="perplexity", delta=nan),
        dict(row, lang="fr", measure="accuracy", delta=-0.25, ci_low=nan),
        dict(row, lang="es", measure="accuracy", delta=0.9),  # a duplicate: the first wins
        dict(row, arm="control", lang="fr", measure="perplexity", delta=0.05),
    ]
    fig = side_effects_heatmap(rows, ["es", "fr"], ("accuracy", "perplexity", "output_lang"))
    assert [t.hovertemplate.split("<extra>")[1] for t in fig.data] == [
        "intervention</extra>",
        "control</extra>",
    ]
    iv = fig.data[0]
    assert list(iv.x) == ["Δ accuracy", "Δ perplexity (rel.)"]
    assert [list(r) for r in iv.z] == [[0.1, None], [-0.25, None]]
    assert [list(r) for r in iv.text] == [["+0.10<br>[-0.10, +0.30]", "n/a"], ["-0.25", ""]]
    assert cell_text(rows[0]) == "+0.10<br>[-0.10, +0.30]"
    assert fig.layout.title.text == "Side effects of the intervention (95% intervals)"
    one = side_effects_heatmap(rows, ["es", "fr"], ("accuracy",), arms=["control"])
    assert len(one.data) == 1 and [list(r) for r in one.data[0].z] == [[None], [None]]
