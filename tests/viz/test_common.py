"""Every result's ``fig_*`` method draws the result's own numbers: the traces of each figure
are checked by hand against the arrays of a tiny-model result (or of a small result built
here), so moving a figure's inputs from the result object to plain arrays cannot change what
is drawn. The viz functions take plain data only; their arguments are spelled out here."""

from __future__ import annotations

import math

import pytest
import torch

from mechlingo.analyses.decoders.compare import compare_decoders
from mechlingo.analyses.decoders.lens import lens_facts
from mechlingo.analyses.decoders.tuned_lens import TunedLensTraining
from mechlingo.analyses.recall.dev_grid import DevSearch
from mechlingo.analyses.recall.patching import attention_knockout, fact_readouts, patch_activations
from mechlingo.analyses.recall.steer_eval import fig_accuracy_ci, fig_headroom
from mechlingo.analyses.recall.steering import ConditionResults, SteeringConfig
from mechlingo.analyses.recall.trace import CLASSES, trace_recall
from mechlingo.analyses.recall.transfer import TransferMatrix
from mechlingo.core.errors import InputError
from mechlingo.data import load_facts
from mechlingo.scoring.evaluate import EvalResult
from mechlingo.viz.lens import lens_kl_figure
from mechlingo.viz.palette import CLASS


def close(a, b, tol=1e-6):
    a, b = list(a), list(b)
    return len(a) == len(b) and all(
        (math.isnan(x) and math.isnan(y)) or abs(x - y) <= tol for x, y in zip(a, b, strict=True)
    )


@pytest.fixture(scope="module")
def facts():
    return load_facts(langs=["en", "fr", "ja"], relations=["capital"], limit=3)


@pytest.fixture(scope="module")
def lens(tiny, facts):
    return lens_facts(tiny, facts, track_langs=["en"])


def test_lens_heatmap_draws_rank_and_probability(lens):
    t = lens.track_index("en")
    fig = lens.fig_heatmap("en", "rank")
    (hm,) = fig.data
    ref = torch.log10(lens.rank[:, :, t].float() + 1).T
    assert torch.allclose(torch.tensor(hm.z), ref)
    assert list(hm.x) == lens.layers
    assert list(hm.y) == [f"{i}:{lg} {lens.answers['en'][i]}" for i, lg in enumerate(lens.langs)]
    assert f"rank {int(lens.rank[-1, 0, t])}" in hm.hovertext[0][-1]
    n = len(lens.prompts)
    assert (
        fig.layout.title.text
        == f"Logit lens: rank of the English answer per layer and prompt (n = {n})"
    )
    (hm,) = lens.fig_heatmap("answer", "prob").data
    a = lens.track_index("answer")
    assert torch.allclose(torch.tensor(hm.z), lens.logprob[:, :, a].exp().T)
    with pytest.raises(InputError, match="rank"):
        lens.fig_heatmap("en", "logit")
    with pytest.raises(KeyError, match="unknown track"):
        lens.fig_heatmap("xx")


def _median(v: torch.Tensor) -> list[float]:
    """The median over the last axis as numpy/pandas take it (mean of the middle two)."""
    return torch.quantile(v.double(), 0.5, dim=-1).tolist()


def test_latent_curves_draw_the_median_probability(lens):
    fig = lens.fig_latent_curves()
    lines = [tr for tr in fig.data if tr.mode == "lines+markers"]
    assert len(lines) == len(set(lens.langs)) * len(lens.tracks)
    # panel order: sorted languages; per panel, the tracks in order
    for k, tr in enumerate(lines):
        lg = sorted(set(lens.langs))[k // len(lens.tracks)]
        track = lens.tracks[k % len(lens.tracks)]
        idx = [i for i, x in enumerate(lens.langs) if x == lg]
        ref = _median(lens.logprob[:, idx, lens.track_index(track)].exp())
        assert close(tr.y, ref, 1e-6) and list(tr.x) == lens.layers


def test_decoder_curves_draw_each_decoder(tiny):
    facts = load_facts(langs=["en", "fr"], limit=2)
    cmp = compare_decoders(tiny, facts, ["logit", "patchscope"])
    fig = cmp.fig_curves()
    lines = [tr for tr in fig.data if tr.mode == "lines+markers"]
    # per decoder: probability and rank of two tracks, entropy, energy
    assert len(lines) == 2 * 6 and len(fig.data) == 2 * 12
    for c, (name, res) in enumerate(cmp.results.items()):
        idx = [i for i, lg in enumerate(res.langs) if lg == "fr"]
        mine = lines[6 * c : 6 * (c + 1)]
        a, e = res.track_index("answer"), res.track_index("en")
        assert close(mine[0].y, _median(res.logprob[:, idx, a].exp()))
        assert close(mine[1].y, _median(res.logprob[:, idx, e].exp()))
        assert close(mine[3].y, _median(res.rank[:, idx, e].float() + 1))
        assert close(mine[4].y, _median(res.entropy[:, idx]), 1e-5)
        assert fig.layout.annotations[c].text == name
    assert f"prompts in fr; n = {len(idx)};" in fig.layout.title.text


@pytest.fixture(scope="module")
def trace(tiny, facts):
    return trace_recall(tiny, facts, max_new_tokens=2)


def test_trace_figures_draw_counts_and_median_ranks(trace):
    assert list(CLASS) == list(CLASSES)
    counts = trace.counts()
    fig = trace.fig_class_fractions()
    assert [tr.name for tr in fig.data] == [c.replace("_", " ") for c in CLASSES]
    for tr, c in zip(fig.data, CLASSES, strict=True):
        assert list(tr.y) == [counts[lg][c] / sum(counts[lg].values()) for lg in counts]
        assert list(tr.customdata) == [counts[lg][c] for lg in counts]
    fig = trace.fig_profiles(langs=["fr", "ja"])
    cls, lang = trace.classes(), trace.lens.langs
    pooled = [(i, k) for i, (k, lg) in enumerate(zip(cls, lang, strict=True)) if lg != "en"]
    present = [c for c in CLASSES if any(k == c for _, k in pooled)]
    lines = [tr for tr in fig.data if tr.mode == "lines+markers"]
    assert len(lines) == 2 * len(present)
    first = [i for i, k in pooled if k == present[0]]
    for tr, track in zip(lines[:2], ("en", "answer"), strict=True):
        s = (trace.lens.rank[:, first, trace.lens.track_index(track)].float() + 1).sort(1).values
        n = s.shape[1]
        assert close(tr.y, ((s[:, (n - 1) // 2] + s[:, n // 2]) / 2).tolist())
    assert fig.layout.title.text.startswith("Latent-language curves per class (fr, ja; n = 6 ")
    assert trace.fig_profiles(langs=["de"]).layout.title.text.startswith("no queries")


@pytest.fixture(scope="module")
def patched(tiny):
    fr = load_facts(langs=["fr"], relations=["capital"], limit=3)
    return patch_activations(
        tiny,
        fr[:2],
        fr[1:3],
        ["attn_out", "mlp_out", "head"],
        positions=["subject_first", "subject_last", -1],
        readout=fact_readouts(tiny, fr[:2]),
        alignment="subject",
    )


def test_patching_heatmaps_draw_the_grids(patched):
    for value in ("normalized", "effect"):
        fig = patched.fig_heatmap(value=value)
        assert len(fig.data) == len(patched.sites) == 3
        for tr, site in zip(fig.data, patched.sites, strict=True):
            g = patched.grid(site, 0, value)
            if site == "head":
                g = torch.nanmean(g, dim=1)
                assert list(tr.x) == [f"h{h}" for h in patched.heads]
            else:
                assert list(tr.x) == patched.position_labels
            assert torch.allclose(torch.tensor(tr.z, dtype=torch.float), g, equal_nan=True)
            assert list(tr.y) == patched.layers
        what = {"normalized": "normalised effect", "effect": "effect (patched - corrupted)"}
        assert f"{what[value]} on the log-probability of the prompt-language answer" in (
            fig.layout.title.text
        )
        assert "n = 2 clean prompts" in fig.layout.title.text


def test_circuit_nodes_are_the_largest_effects(patched):
    vals = patched.normalized()
    fig = patched.fig_circuit(top_k=4, heads=True, title="t")
    drawn = sorted(v for tr in fig.data for v, *_ in tr.customdata)
    order = sorted((float(v) for v in vals if not math.isnan(float(v))), key=lambda v: -abs(v))[:4]
    assert close(drawn, sorted(order))
    for tr in fig.data:  # each node sits at its cell's position (offset by site) and layer
        for x, y, (v, *_) in zip(tr.x, tr.y, tr.customdata, strict=True):
            i = next(i for i, c in enumerate(patched.cells) if float(vals[i]) == v)
            cell = patched.cells[i]
            off = {"attn_out": -0.15, "mlp_out": 0.15, "head": -0.3}[cell.site]
            assert (x, y) == (cell.position + off, float(cell.layer)) and tr.name == cell.site
    assert fig.layout.title.text == "t (n = 2 clean prompts)"
    default = patched.fig_circuit(top_k=3)
    assert "head" not in {tr.name for tr in default.data}
    assert default.layout.title.text.startswith("Circuit: top 3 components")


def test_the_patching_circuit_draws_no_edge_it_did_not_measure(patched):
    """A patching sweep measures components, not paths: the diagram draws its nodes and no
    line between them (no arrow, no line shape, no trace in lines mode), and says why."""
    from mechlingo.viz.patching import EDGES_NOTE

    fig = patched.fig_circuit(top_k=6, heads=True, phases={"a": (0, 1)}).to_plotly_json()
    layout = fig["layout"]
    assert not [a for a in layout.get("annotations", []) if a.get("showarrow", True)]
    assert not [s for s in layout.get("shapes", []) if s.get("type") == "line"]
    assert all("lines" not in tr.get("mode", "markers") for tr in fig["data"])
    assert EDGES_NOTE in [a["text"] for a in layout["annotations"]]


def test_knockout_draws_relative_change_and_interval(tiny, facts):
    res = attention_knockout(tiny, facts[:4], [(0, -1), (0, 1), (1, 1)])
    (tr,) = res.fig_knockout().data
    rel = res.relative_change()
    lo, hi = res.bootstrap_ci()
    assert close(tr.y, rel.tolist()) and list(tr.x) == ["0--1", "0-1", "1-1"]
    assert close(tr.error_y.array, (hi - rel).tolist())
    assert close(tr.error_y.arrayminus, (rel - lo).tolist())


def test_loss_and_kl_figures():
    loss = torch.tensor([[3.0, 2.0], [1.5, 1.0], [0.5, 0.25]])
    training = TunedLensTraining(None, loss, [10, 12, 9], 7.2, 2)
    fig = training.fig_loss()
    assert [list(tr.y) for tr in fig.data] == [[3.0, 1.5, 0.5], [2.0, 1.0, 0.25],
                                               [2.5, 1.25, 0.375]]  # fmt: skip
    assert "(n = 31 tokens, 7 s, 2 process(es))" in fig.layout.title.text
    div = {"entries": [0, 1], "n_texts": 4, "n_tokens": 30,
           "decoders": {"logit": {"kl": [2.0, 1.0], "lo": [1.5, None], "hi": [2.5, None]}}}  # fmt: skip
    band, line = lens_kl_figure(div).data
    assert list(line.y) == [2.0, 1.0] and list(band.y) == [2.5, 1.0, 1.0, 1.5]


def test_repair_figures_draw_rows_and_cells():
    rows = [
        {"stage": "screen", "vector": "task", "layer": 2, "alpha": 1.0, "score": 0.5},
        {"stage": "screen", "vector": "task", "layer": 1, "alpha": 2.0, "score": 0.25},
        {"stage": "screen", "vector": "diff", "layer": 1, "alpha": 1.0, "score": 0.9},
        {"stage": "dev", "vector": "task", "layer": 1, "alpha": 1.0, "score": 0.1},
    ]
    search = DevSearch(rows, {}, None, None, unit="resid")
    (hm,) = search.fig_heatmap("task").data
    assert list(hm.x) == ["1", "2"] and list(hm.y) == ["1", "2"]
    assert [list(r) for r in hm.z] == [[None, 0.5], [0.25, None]]
    cells = [
        {"row": "all", "col": "capital", "n": 12,
         "gain": {"estimate": 0.1, "lo": -0.05, "hi": 0.25}, "control_gain": None},
        {"row": "only_city", "col": "city", "n": 8,
         "gain": {"estimate": -0.2, "lo": None, "hi": 0.0}, "control_gain": None},
    ]  # fmt: skip
    m = TransferMatrix("relation", cells, ["all", "only_city"], ["capital", "city"])
    (hm,) = m.fig_transfer().data
    assert [list(r) for r in hm.z] == [[pytest.approx(10.0), None], [None, pytest.approx(-20.0)]]
    assert hm.text[0][0] == "+10.0<br>[-5.0, +25.0]<br>n=12" and hm.text[0][1] == ""
    assert hm.zmax == pytest.approx(20.0)
    with pytest.raises(ValueError, match="control_gain"):
        m.fig_transfer("p")


def test_accuracy_figures_draw_the_proportions():
    ev = EvalResult([{"lang": "fr", "correct": True}, {"lang": "fr", "correct": False},
                     {"lang": "en", "correct": True}])  # fmt: skip
    (bar,) = ev.fig_accuracy().data
    assert list(bar.x) == ["en", "fr"] and list(bar.y) == [1.0, 0.5]
    acc = {"orig": {"en": 0.5, "fr": 0.25}, "both": {"en": 0.75, "fr": 0.5}}
    cond = ConditionResults(acc, {}, "fr", {}, {}, SteeringConfig(1, 1.0, 1, 1.0))
    assert [list(b.y) for b in cond.fig_accuracy().data] == [[0.5, 0.25], [0.75, 0.5]]
    iv = {
        "orig": {
            "fr": {"estimate": 0.25, "lo": 0.1, "hi": 0.5},
            "en": {"estimate": 0.5, "lo": None, "hi": 0.8},
        }
    }
    (bar,) = fig_accuracy_ci(iv).data
    assert list(bar.x) == ["en", "fr"] and list(bar.y) == [0.5, 0.25]
    assert close(bar.error_y.array, [0.3, 0.25]) and bar.error_y.arrayminus[0] is None
    hr = {"k": 3, "zero_shot": iv["orig"], "k_shot": iv["orig"]}
    assert [b.name for b in fig_headroom(hr).data] == ["zero-shot", "3-shot"]
