"""The demo report (``mechlingo trace``, what ``make demo`` writes) drawn on the embedded
model, every section's figures checked with the semantic figure rules of
``tests/system/test_figures.py``. The tiny-model version of this check is there; here the
numbers are real, so the rank axes, the bands and the circuit or its note are those a
reader sees. One trace (the demo's five languages, two facts each, one patched prompt) per module.
Then every figure drawn from a model's own run, by the builders of ``test_figures``, on the
embedded model."""

from __future__ import annotations

from typing import Any

import pytest

from mechlingo.analyses.recall.trace import run_trace
from mechlingo.analyses.recall.trace_options import TraceOptions
from mechlingo.data import load_facts
from mechlingo.report.trace import trace_report
from tests.system.test_figures import BUILDERS, builder_context, check_figure


@pytest.fixture(scope="module")
def demo(gemma) -> dict[str, Any]:
    """The demo's trace on a small slice of its facts, as ``cmd_trace`` runs it."""
    facts = load_facts(langs=["en", "fr", "de", "es", "ja"], relations=["capital"], limit=2)
    run = run_trace(gemma, facts, TraceOptions(patch_prompts=1, patch_sites=("resid_pre",)))
    summary = run.summary({"model": "embedded"})
    report = trace_report(run.trace, summary, run.patched, max_rank=10, unpatched=run.unpatched,
                          circuits=run.circuits)  # fmt: skip
    return {"facts": facts, "run": run, "report": report}


def test_every_demo_report_figure_passes_the_figure_rules(demo):
    figures = demo["report"].figures
    # the headline, the classes per language and the latent-language curves at least
    assert len(figures) >= 3
    for k, fig in enumerate(figures):
        check_figure(fig, f"demo report figure {k}")


def test_every_rank_panel_of_the_demo_is_log_and_reversed(demo):
    """Each subplot of the latent-language curves has its own log, reversed rank axis."""
    fig = demo["run"].trace.fig_profiles()
    layout = fig.to_plotly_json()["layout"]
    ranks = [v for k, v in layout.items() if k.startswith("yaxis")]
    assert len(ranks) >= 2  # one panel per class at least for two classes
    for ax in ranks:
        assert ax.get("type") == "log"
        rng = ax.get("range") or []
        assert ax.get("autorange") == "reversed" or (len(rng) == 2 and rng[0] > rng[1])


def test_each_language_is_patched_or_has_a_note(demo):
    """A language is either patched from a correctly answered clean prompt or listed as
    unpatched with its reason, and the report says so; never both, never neither."""
    run, html = demo["run"], demo["report"].render()
    patched, unpatched = {p.lang for p in run.patched}, set(run.unpatched)
    assert patched.isdisjoint(unpatched)
    assert patched | unpatched == {f.lang for f in demo["facts"]}
    for lang, why in run.unpatched.items():
        assert why and lang in html


#: The figures drawn from a model's own run (the other builders of ``test_figures`` draw
#: hand-made rows, the same on any model).
FROM_THE_MODEL = (
    "LensResult.fig_latent_curves", "LensResult.fig_heatmap", "LensResult.fig_tokens",
    "TraceResult.fig_class_fractions", "TraceResult.fig_profiles",
    "PatchingResult.fig_heatmap", "PatchingResult.fig_circuit", "KnockoutResult.fig_knockout",
    "DecoderComparison.fig_curves", "ExpertResult.fig_layers", "ExpertResult.fig_overlap",
    "AlignmentComparison.fig_retrieval", "AlignmentComparison.fig_layers",
    "AlignmentComparison.fig_pca",
)  # fmt: skip


@pytest.fixture(scope="module")
def embedded_ctx(gemma) -> dict[str, Any]:
    """What the figure builders share, on the embedded model (as ``ctx`` on the tiny one)."""
    return builder_context(gemma)


def test_the_model_figures_are_every_model_figure():
    """Every builder not listed here draws hand-made rows only (no model call)."""
    import inspect

    for name, build in BUILDERS.items():
        if name not in FROM_THE_MODEL:
            assert '"model"' not in inspect.getsource(build), name


@pytest.mark.parametrize("name", FROM_THE_MODEL)
def test_every_model_figure_passes_the_figure_rules_on_the_embedded_model(name, embedded_ctx):
    figs = BUILDERS[name](embedded_ctx)
    assert figs
    for k, fig in enumerate(figs):
        check_figure(fig, f"{name}[{k}] (embedded model)")
