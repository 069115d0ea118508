"""Every figure mechlingo draws, checked from its own JSON (``fig.to_plotly_json()``).

The test finds every ``fig_*`` method of every result class and every module-level ``fig_*``
function in the package, so a new figure cannot be left out silently: :data:`BUILDERS` must
name each one (``test_every_figure_method_has_a_builder``). Each builder draws its figure on
the tiny model (or from hand-made numbers where the run that produces them is long), and
each report section's figures are checked the same way. The rules, per figure:

* the title gives its n (``n = 12`` or ``n=12``);
* every axis that holds a trace has a title; a heatmap's colour bar too;
* an axis that shows ranks (its title says "rank") is a log axis, reversed (rank 1 on top);
* no trace on a probability axis (its title says "probability") leaves [0, 1];
* a series named for a concept (a class, a site, an answer track, a condition, a decoder,
  the knockout line) is drawn in that concept's palette colour.
"""

from __future__ import annotations

import importlib
import inspect
import math
import pkgutil
import re
from collections.abc import Callable, Iterator
from typing import Any

import pandas as pd
import pytest
import torch

import mechlingo
from mechlingo.viz import palette
from mechlingo.viz.common import track_label

# ----------------------------------------------------------------------------- the checks

_N = re.compile(r"\bn ?= ?\d")
_AXIS = re.compile(r"^[xy]axis\d*$")


def _text(title: Any) -> str:
    if isinstance(title, dict):
        return str(title.get("text") or "")
    return str(title or "")


def _axes_used(doc: dict[str, Any]) -> set[str]:
    """The layout names (``xaxis``, ``yaxis3``) of the axes that hold a trace."""
    used = set()
    for tr in doc["data"]:
        if tr.get("type") in ("pie", "table", "sankey"):
            continue
        for key in ("xaxis", "yaxis"):
            ref = tr.get(key, key[0])
            used.add(key + ref[1:] if ref.startswith(key[0]) else ref)
    return used


def _reversed(ax: dict[str, Any]) -> bool:
    rng = ax.get("range")
    return ax.get("autorange") == "reversed" or (rng is not None and rng[0] > rng[1])


def _numbers(values: Any) -> list[float]:
    if values is None:
        return []
    out: list[float] = []
    for v in values:
        if isinstance(v, (list, tuple)):
            out.extend(_numbers(v))
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v):
            out.append(float(v))
    return out


def _concept_colours() -> dict[str, str]:
    """Legend name -> the colour its concept has in the palette."""
    out: dict[str, str] = {}
    for c in palette.CLASS:
        out[c.replace("_", " ")] = palette.class_color(c)
    for s in palette.SITE:
        out[s] = palette.site_color(s)
    for t in ("answer", "en", *palette.LANGUAGE):
        out[track_label(t)] = palette.track_color(t)
    for c in palette.CONDITION:
        out[c] = palette.condition_color(c)
    for d in palette.DECODER:
        out[d] = palette.decoder_color(d)
    for v in palette.VERDICT:
        out[v.replace("_", " ")] = palette.verdict_color(v)
    out["control"] = palette.condition_color("control")
    return out


CONCEPTS = _concept_colours()


def _colour(tr: dict[str, Any]) -> str | None:
    marker, line = tr.get("marker") or {}, tr.get("line") or {}
    c = marker.get("color") if isinstance(marker.get("color"), str) else None
    return c or line.get("color")


def check_figure(fig: Any, where: str) -> None:
    """Assert the rules of the module docstring on one figure."""
    doc = fig.to_plotly_json()
    layout = doc["layout"]
    title = _text(layout.get("title"))
    assert _N.search(title), f"{where}: no n in the title {title!r}"
    axes = {k: v for k, v in layout.items() if _AXIS.match(k)}
    for name in _axes_used(doc):
        ax = axes.get(name, {})
        ax_title = _text(ax.get("title"))
        assert ax_title, f"{where}: {name} has no title"
        if "rank" in ax_title.lower():
            assert ax.get("type") == "log" and _reversed(ax), f"{where}: {name} {ax}"
        if "probability" in ax_title.lower():
            for tr in doc["data"]:
                on = tr.get("yaxis", "y")
                if ("yaxis" + on[1:]) == name and tr.get("type", "scatter") == "scatter":
                    ys = _numbers(tr.get("y"))
                    assert all(-1e-9 <= y <= 1 + 1e-9 for y in ys), f"{where}: {name} {ys}"
    for tr in doc["data"]:
        if tr.get("type") == "heatmap" and "coloraxis" not in tr:
            assert _text((tr.get("colorbar") or {}).get("title")), f"{where}: colour bar"
        if tr.get("type") == "heatmap" and "probability" in _text(
            (tr.get("colorbar") or {}).get("title")
        ):
            assert all(0 <= z <= 1 for z in _numbers(tr.get("z"))), where
        name = tr.get("name")
        if name in CONCEPTS and _colour(tr) is not None:
            assert _colour(tr) == CONCEPTS[name], f"{where}: {name!r} drawn {_colour(tr)}"
        if name and name.startswith("blocked last"):
            assert _colour(tr) == palette.effect_color("knockout"), where
    for key, cax in layout.items():
        if key.startswith("coloraxis"):
            assert _text((cax.get("colorbar") or {}).get("title")), f"{where}: {key} title"


# ----------------------------------------------------------------------------- discovery


def _modules() -> Iterator[Any]:
    for info in pkgutil.walk_packages(mechlingo.__path__, "mechlingo."):
        if ".cli" in info.name or info.name.endswith("__main__"):
            continue
        yield importlib.import_module(info.name)


def discovered() -> set[str]:
    """``"Class.fig_x"`` for each figure method and ``"module.fig_x"`` for each function."""
    out = set()
    for mod in _modules():
        for name, obj in vars(mod).items():
            if getattr(obj, "__module__", None) != mod.__name__:
                continue
            if inspect.isclass(obj):
                out |= {f"{name}.{m}" for m in vars(obj) if m.startswith("fig_")}
            elif inspect.isfunction(obj) and name.startswith("fig_"):
                out.add(f"{mod.__name__.rsplit('.', 1)[-1]}.{name}")
    return out


# ----------------------------------------------------------------------------- builders

TEXTS = {
    "en": ["the cat sat on the mat", "hello world", "a dog", "it is raining today"],
    "es": ["el gato", "hola mundo que tal", "un perro grande", "llueve"],
    "fr": ["le chat", "bonjour", "un chien noir", "il pleut beaucoup"],
}
CELL = {"estimate": 0.5, "lo": 0.4, "hi": 0.6}


def builder_context(model: Any) -> dict[str, Any]:
    """What the builders share on ``model``: facts, a lens, a trace and a token grid."""
    from mechlingo.analyses.decoders.lens import lens_facts, logit_lens
    from mechlingo.analyses.recall.trace import trace_recall
    from mechlingo.data import load_facts

    facts = load_facts(langs=["en", "fr", "ja"], relations=["capital"], limit=3)
    return {
        "model": model,
        "facts": facts,
        "lens": lens_facts(model, facts, track_langs=["en"]),
        "trace": trace_recall(model, facts, max_new_tokens=2),
        "tokens": logit_lens(model, ["The capital of France is", "東京は日本の首都"]),
    }


@pytest.fixture(scope="module")
def ctx(tiny):
    """What the builders share, on the tiny model."""
    return builder_context(tiny)


def _patched(c: dict[str, Any]) -> Any:
    from mechlingo.analyses.recall.patching import fact_readouts, patch_activations
    from mechlingo.data import load_facts

    if "patched" not in c:
        fr = load_facts(langs=["fr"], relations=["capital"], limit=3)
        c["patched"] = patch_activations(
            c["model"], fr[:2], fr[1:3], ["attn_out", "mlp_out", "head"],
            positions=["subject_first", "subject_last", -1],
            readout=fact_readouts(c["model"], fr[:2]), alignment="subject",
        )  # fmt: skip
    return c["patched"]


def _knockout(c: dict[str, Any]) -> list[Any]:
    from mechlingo.analyses.recall.patching import attention_knockout

    return [attention_knockout(c["model"], c["facts"][:4], [(0, 0), (1, 1)]).fig_knockout()]


def _decoders(c: dict[str, Any]) -> list[Any]:
    from mechlingo.analyses.decoders.compare import compare_decoders

    return [compare_decoders(c["model"], c["facts"][:4], ["logit", "patchscope"]).fig_curves()]


def _loss(c: dict[str, Any]) -> list[Any]:
    from mechlingo.analyses.decoders.tuned_lens import TunedLensTraining

    loss = torch.tensor([[3.0, 2.0], [1.5, 1.0], [0.5, 0.25]])
    return [TunedLensTraining(None, loss, [10, 12, 9], 7.2, 2).fig_loss()]


def _dev(c: dict[str, Any]) -> list[Any]:
    from mechlingo.analyses.recall.dev_grid import DevSearch

    rows = [
        {"stage": "screen", "vector": "task", "layer": 2, "alpha": 1.0, "score": 0.5, "n": 8},
        {"stage": "screen", "vector": "task", "layer": 1, "alpha": 2.0, "score": 0.25, "n": 8},
    ]
    return [DevSearch(rows, {}, None, None, unit="resid").fig_heatmap("task")]


def _transfer(c: dict[str, Any]) -> list[Any]:
    from mechlingo.analyses.recall.transfer import TransferMatrix

    cells = [{"row": "all", "col": "capital", "n": 12, "control_gain": None,
              "gain": {"estimate": 0.1, "lo": -0.05, "hi": 0.25}}]  # fmt: skip
    return [TransferMatrix("relation", cells, ["all"], ["capital"]).fig_transfer()]


def _eval(c: dict[str, Any]) -> list[Any]:
    from mechlingo.scoring.evaluate import EvalResult

    rows = [{"lang": "fr", "correct": True}, {"lang": "fr", "correct": False},
            {"lang": "en", "correct": True}]  # fmt: skip
    return [EvalResult(rows).fig_accuracy()]


def _conditions(c: dict[str, Any]) -> list[Any]:
    from mechlingo.analyses.recall.steering import ConditionResults, SteeringConfig
    from mechlingo.scoring.evaluate import EvalResult

    acc = {"orig": {"en": 0.5, "fr": 0.25}, "both": {"en": 0.75, "fr": 0.5}}
    raw = EvalResult([{"lang": lg, "correct": True} for lg in ("en", "fr") for _ in range(4)])
    res = ConditionResults(acc, {}, "fr", {}, {"orig": raw}, SteeringConfig(1, 1.0, 1, 1.0))
    return [res.fig_accuracy()]


def _accuracy_ci(c: dict[str, Any]) -> list[Any]:
    from mechlingo.analyses.recall.steer_eval import fig_accuracy_ci

    cell = {**CELL, "n": 20}
    return [fig_accuracy_ci({k: {"en": cell, "fr": cell} for k in ("orig", "task", "random")})]


def _headroom(c: dict[str, Any]) -> list[Any]:
    from mechlingo.analyses.recall.steer_eval import fig_headroom

    cell = {**CELL, "n": 20}
    return [fig_headroom({"k": 3, "zero_shot": {"fr": cell}, "k_shot": {"fr": cell}})]


def _experts(c: dict[str, Any]) -> Any:
    from mechlingo.analyses.experts import find_experts

    if "experts" not in c:
        c["experts"] = find_experts(c["model"], TEXTS, batch_size=3)
    return c["experts"]


def _align(c: dict[str, Any]) -> Any:
    from mechlingo.analyses.experts import make_clamp
    from mechlingo.analyses.experts.align import compare_alignment

    if "align" not in c:
        iv = make_clamp(torch.tensor([0, 1]), torch.tensor([3, 5]), torch.tensor([2.0, -1.0]))
        iv.meta = {"build": {"lang": "es"}}
        c["align"] = compare_alignment(c["model"], TEXTS, iv)
    return c["align"]


def _k_curve(c: dict[str, Any]) -> list[Any]:
    from mechlingo.analyses.experts import KCurve

    rows = [
        {"k": k, "arm": arm, "target_rate_bos": 0.2, "target_rate_prompt": 0.3, "n_bos": 10,
         "ppl_en": 10.0, "ppl_fr": 12.0, "ppl_ratio_fr": 1.2}
        for k in (1, 10) for arm in ("experts", "random")
    ] + [{"k": 0, "arm": "none", "target_rate_bos": 0.1, "target_rate_prompt": 0.1,
          "n_bos": 10, "ppl_en": 10.0, "ppl_fr": 12.0, "ppl_ratio_fr": 1.0}]  # fmt: skip
    return [KCurve("fr", rows).fig_k_curve(10)]


def _side_effects(c: dict[str, Any]) -> list[Any]:
    from mechlingo.scoring.side_effects import MEASURES, SideEffects

    rows = [
        {"arm": arm, "lang": lg, "measure": m, "base": 0.5, "value": 0.6, "delta": 0.1,
         "ci_low": 0.0, "ci_high": 0.2, "value_ci_low": 0.5, "value_ci_high": 0.7, "n": 10}
        for arm in ("intervention", "control") for lg in ("en", "fr") for m in MEASURES
    ]  # fmt: skip
    return [SideEffects(rows, ["en", "fr"]).fig_heatmap()]


Builder = Callable[[dict[str, Any]], list[Any]]

#: Every figure mechlingo draws, by the name :func:`discovered` gives it.
BUILDERS: dict[str, Builder] = {
    "LensResult.fig_latent_curves": lambda c: [c["lens"].fig_latent_curves()],
    "LensResult.fig_heatmap": lambda c: [
        c["lens"].fig_heatmap("en", "rank"),
        c["lens"].fig_heatmap("answer", "prob"),
    ],
    "LensResult.fig_tokens": lambda c: [
        c["tokens"].fig_tokens(p, color) for p in (0, 1) for color in ("prob", "lang")
    ],
    "TraceResult.fig_class_fractions": lambda c: [c["trace"].fig_class_fractions()],
    "TraceResult.fig_profiles": lambda c: [
        c["trace"].fig_profiles(),
        c["trace"].fig_profiles(langs=["en", "fr", "ja"]),
    ],
    "PatchingResult.fig_heatmap": lambda c: [
        _patched(c).fig_heatmap(value=v) for v in ("normalized", "effect", "mean")
    ],
    "PatchingResult.fig_circuit": lambda c: [
        _patched(c).fig_circuit(top_k=4, heads=True, phases={"a": (0, 1), "b": (1, 1)}),
        _patched(c).fig_circuit(title="fr"),
    ],
    "KnockoutResult.fig_knockout": _knockout,
    "DecoderComparison.fig_curves": _decoders,
    "TunedLensTraining.fig_loss": _loss,
    "DevSearch.fig_heatmap": _dev,
    "TransferMatrix.fig_transfer": _transfer,
    "EvalResult.fig_accuracy": _eval,
    "ConditionResults.fig_accuracy": _conditions,
    "steer_eval.fig_accuracy_ci": _accuracy_ci,
    "steer_eval.fig_headroom": _headroom,
    "ExpertResult.fig_layers": lambda c: [_experts(c).fig_layers(5)],
    "ExpertResult.fig_overlap": lambda c: [_experts(c).fig_overlap(5)],
    "AlignmentComparison.fig_retrieval": lambda c: [_align(c).fig_retrieval()],
    "AlignmentComparison.fig_layers": lambda c: [_align(c).fig_layers()],
    "AlignmentComparison.fig_pca": lambda c: [_align(c).fig_pca()],
    "KCurve.fig_k_curve": _k_curve,
    "SideEffects.fig_heatmap": _side_effects,
}


def test_every_figure_method_has_a_builder():
    assert sorted(discovered() - set(BUILDERS)) == [], "figures this test does not draw"
    assert sorted(set(BUILDERS) - discovered()) == [], "builders of figures that are gone"


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_figure_is_correct_by_construction(name, ctx):
    figs = BUILDERS[name](ctx)
    assert figs
    for k, fig in enumerate(figs):
        check_figure(fig, f"{name}[{k}]")


# ----------------------------------------------------------------------------- reports


def test_trace_and_lens_report_figures(ctx):
    from mechlingo.analyses.recall.trace import run_trace
    from mechlingo.analyses.recall.trace_options import TraceOptions
    from mechlingo.report.lens import lens_report, token_lens_report
    from mechlingo.report.trace import trace_report

    facts = [f for f in ctx["facts"] if f.lang in ("en", "fr")]
    run = run_trace(
        ctx["model"], facts, TraceOptions(max_new_tokens=2, patch_prompts=2, unanswered=True)
    )
    summary = run.summary({"model": "tiny"})
    report = trace_report(run.trace, summary, run.patched, max_rank=10, circuits=run.circuits)
    assert run.circuits and "measured circuit" in report.render()
    lens = ctx["lens"]
    reports = {
        "trace": report,
        "lens": lens_report(lens, {**lens.summary(), "meta": {}}, max_rank=10),
        "token lens": token_lens_report(ctx["tokens"], {}),
    }
    for name, rep in reports.items():
        assert rep.figures, name
        for k, fig in enumerate(rep.figures):
            check_figure(fig, f"{name} report figure {k}")


def test_a_language_without_a_correct_answer_gets_a_note_not_a_circuit(ctx):
    """The tiny model answers nothing: by default no language is patched, each gets a note
    in the report and a record in patching.json; with ``unanswered`` the report says how
    many clean prompts are wrong."""
    from mechlingo.analyses.recall.trace import run_trace
    from mechlingo.analyses.recall.trace_options import TraceOptions
    from mechlingo.analyses.recall.trace_patching import corrupted_pairs
    from mechlingo.report.trace import trace_report

    trace, facts = ctx["trace"], ctx["facts"]
    assert not any(r["correct"] for r in trace.records)
    assert corrupted_pairs(trace, facts, "fr", 2) is None
    clean, corrupt = corrupted_pairs(trace, facts, "fr", 2, unanswered=True)
    assert len(clean) == 2 and all(
        a.answer != b.answer for a, b in zip(clean, corrupt, strict=True)
    )
    # one correct record: it alone is the clean prompt, even with n = 2
    first = next(r for r in trace.records if r["lang"] == "fr")
    first["correct"] = True
    try:
        clean, _ = corrupted_pairs(trace, facts, "fr", 2)
        assert [f.id for f in clean] == [first["id"]]
    finally:
        first["correct"] = False
    fr = [f for f in facts if f.lang == "fr"]
    run = run_trace(ctx["model"], fr, TraceOptions(max_new_tokens=2, patch_prompts=2))
    assert run.patched == [] and "answered correctly" in run.unpatched["fr"]
    assert run.patching() == {"fr": {"unpatched": run.unpatched["fr"]}}
    html = trace_report(run.trace, run.summary({}), run.patched, max_rank=10,
                        unpatched=run.unpatched).render()  # fmt: skip
    assert "No circuit for fr" in html
    run = run_trace(
        ctx["model"], fr, TraceOptions(max_new_tokens=2, patch_prompts=2, unanswered=True)
    )
    assert run.patched[0].n_unanswered == 2
    html = trace_report(run.trace, run.summary({}), run.patched, max_rank=10).render()
    assert "2 of the clean fr prompts below are answered wrongly" in html


def test_stage_labels_do_not_overlap():
    from mechlingo.viz.patching import _label_heights

    heights = _label_heights({"English recall": (3, 5), "conversion to fr": (4, 5), "x": (9, 9)},
                             gap=1.0)  # fmt: skip
    assert heights == [4.0, 5.0, 9.0]


def test_concept_colours_are_disjoint():
    """Sites, the knockout line and verdicts share no colour with classes, languages,
    answer tracks or conditions."""
    others = {*palette.CLASS.values(), *palette.LANGUAGE.values(), *palette.TRACK.values(),
              *palette.CONDITION.values()}  # fmt: skip
    for group in (palette.SITE, palette.EFFECT, palette.VERDICT):
        assert not set(group.values()) & others, group


def test_latent_curve_bands_are_quantiles(ctx):
    curves = ctx["lens"].latent_curves()
    assert ((curves["q25"] <= curves["median"]) & (curves["median"] <= curves["q75"])).all()
    assert curves[["q25", "q75"]].stack().between(0, 1).all()
    old = pd.DataFrame([{"lang": "fr", "track": "en", "layer": 0, "mean": 0.9, "std": 0.5}])
    from mechlingo.viz.lens import latent_curves_figure

    band = latent_curves_figure(old).data[0]
    assert max(band.y) <= 1 and min(band.y) >= 0


# ----------------------------------------------------------------------------- displays


def test_results_show_themselves_without_tensors(ctx):
    """Every result a notebook displays has a short ``__repr__`` and an ``_repr_html_``
    table with its n, and neither prints a tensor."""
    from mechlingo.analyses.decoders.compare import compare_decoders
    from mechlingo.analyses.decoders.tuned_lens import TunedLensTraining
    from mechlingo.analyses.experts import KCurve
    from mechlingo.analyses.recall.patching import attention_knockout
    from mechlingo.analyses.recall.steering import build_steering_vectors
    from mechlingo.data import load_facts

    m = ctx["model"]
    loss = torch.tensor([[3.0, 2.0], [1.5, 1.0]])
    k_rows = [{"k": 1, "arm": "experts", "target_rate_bos": 0.5, "target_rate_bos_lo": 0.2,
               "target_rate_bos_hi": 0.8, "n_bos": 10}]  # fmt: skip
    results = {
        "PatchingResult": _patched(ctx),
        "KnockoutResult": attention_knockout(m, ctx["facts"][:4], [(0, 0), (1, 1)]),
        "SteeringPair": build_steering_vectors(
            m, load_facts(langs=["en", "fr"], relations=["capital"], limit=6)
        ),
        "ExpertResult": _experts(ctx),
        "KCurve": KCurve("fr", k_rows),
        "AlignmentComparison": _align(ctx),
        "DecoderComparison": compare_decoders(m, ctx["facts"][:4], ["logit", "patchscope"]),
        "TunedLensTraining": TunedLensTraining(None, loss, [10, 12], 7.2, 1),
        "LensResult": ctx["tokens"],
    }
    for name, res in results.items():
        text, page = repr(res), res._repr_html_()
        assert text.startswith(name) and len(text) < 300, text
        for shown in (text, page):
            assert "tensor(" not in shown, (name, shown[:200])
        assert "<b>" in page, name
        if name not in ("LensResult", "TunedLensTraining", "SteeringPair", "ExpertResult"):
            assert "<th>n</th>" in page or "sentences per language" in page, (name, page)
    assert "[" in results["PatchingResult"]._repr_html_().split("top cells")[1]  # intervals
    assert "0.2, 0.8" in results["KCurve"]._repr_html_()


def test_patching_shows_progress_and_gives_the_same_numbers(ctx, capsys):
    from mechlingo.analyses.recall.patching import fact_readouts, patch_activations
    from mechlingo.data import load_facts

    fr = load_facts(langs=["fr"], relations=["capital"], limit=3)
    kw = {
        "positions": [-1],
        "readout": fact_readouts(ctx["model"], fr[:2]),
        "cells_per_batch": 2,
        "alignment": "last",
    }
    quiet = patch_activations(ctx["model"], fr[:2], fr[1:3], ["mlp_out"], **kw)
    capsys.readouterr()
    shown = patch_activations(ctx["model"], fr[:2], fr[1:3], ["mlp_out"], progress=True, **kw)
    assert "patching" in capsys.readouterr().err
    assert torch.equal(quiet.values, shown.values)


# ----------------------------------------------------------------------------- claims report


def _claim(cid: str, verdict: str, est: float, family: str | None, **kw: Any) -> dict:
    value = {"estimate": {"estimate": est, "lo": est - 0.1, "hi": est + 0.1, "n": 40}}
    row = {"id": cid, "paper": "Lu et al. 2025", "claim": f"claim {cid}", "paper_number": "x",
           "verdict": verdict, "reason": "r", "error": None, "figure": "fig-forest",
           "value": value, "rule": {"threshold": 0.0}, "family": family, **kw}  # fmt: skip
    return {k: v for k, v in row.items() if v is not None or k == "error"}


def test_claims_report_opens_with_decisions_then_the_forest_plot():
    from mechlingo.card.rules import ClaimsCard
    from mechlingo.report.replicate import replicate_report
    from mechlingo.viz.claims import forest_figure, forest_rows

    rows = [
        _claim("b", "does not hold", -0.2, "secondary"),
        _claim("a", "holds", 0.4, "primary", control={"estimate": {"estimate": 0.05}}),
        _claim("c", "inconclusive", 0.1, None),
        {**_claim("d", "not testable here", 0.0, "primary"), "value": None},
    ]
    drawn = forest_rows(rows)
    assert [r["label"] for r in drawn] == ["a", "b", "c"]  # primary first; d has no value
    fig = forest_figure(rows)
    check_figure(fig, "forest")
    by_name = {tr.name: tr for tr in fig.data}
    assert by_name["holds"].marker.color == palette.verdict_color("holds")
    assert list(by_name["holds"].x) == [0.4] and list(by_name["control"].x) == [0.05]
    assert list(by_name["threshold"].y) == ["a (primary)", "b (secondary)", "c"]
    assert close(by_name["does not hold"].error_x.array, [0.1])
    meta = {"model": "tiny", "metric_decision": "generate: the answers are single words",
            "plan": {"budget": "quick", "stages": ["trace"]}}  # fmt: skip
    report = replicate_report(ClaimsCard(rows, {}, meta))
    page = report.render()
    order = [page.index(f"<h2 id='{a}'>") for a in ("metric-decision", "families", "plan",
                                                    "fig-forest")]  # fmt: skip
    order.append(page.index("<table class='claims'>"))
    assert order == sorted(order)
    assert "generate: the answers are single words" in page and "quick" in page
    assert report.figures and report.figures[0] is not None
    bare = replicate_report(ClaimsCard([_claim("a", "holds", 0.4, None)], {}, {})).render()
    assert "id='metric-decision'" not in bare and "id='plan'" not in bare
    assert "id='families'" not in bare and "id='fig-forest'" in bare


def close(a: Any, b: Any, tol: float = 1e-9) -> bool:
    return all(abs(x - y) <= tol for x, y in zip(list(a), list(b), strict=True))
