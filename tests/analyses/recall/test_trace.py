"""The recall pipeline tracer, its figures and the ``trace`` command."""

from __future__ import annotations

import json

import pytest

from mechlingo.analyses.recall.trace import (
    CLASSES,
    _classify,
    default_mid_layers,
    trace_recall,
)
from mechlingo.analyses.recall.trace_patching import pipeline_phases
from mechlingo.data import load_facts
from mechlingo.scoring.evaluate import DecodeOptions


def _rec(**kw):
    base = {
        "correct": False,
        "answered_in": None,
        "lang": "fr",
        "en_decodable_mid": False,
        "answer_decodable_mid": False,
    }
    return {**base, **kw}


def test_classification_rule():
    assert _classify(_rec(correct=True, en_decodable_mid=True)) == "correct"
    assert _classify(_rec(answered_in="en", en_decodable_mid=True)) == "wrong_language"
    assert _classify(_rec(en_decodable_mid=True)) == "translation_failure"
    assert _classify(_rec()) == "recall_failure"
    assert _classify(_rec(answer_decodable_mid=True)) == "other"
    # English prompts cannot have a translation failure
    assert _classify(_rec(lang="en", en_decodable_mid=True, answer_decodable_mid=True)) == "other"
    assert default_mid_layers(18) == list(range(6, 17))


@pytest.fixture(scope="module")
def tiny_trace(tiny):
    facts = load_facts(langs=["en", "fr", "ja"], relations=["capital"], limit=3)
    return trace_recall(tiny, facts, max_new_tokens=2)


def test_trace_tiny(tiny_trace):
    tr = tiny_trace
    assert len(tr.records) == 9
    assert all(r["class"] in CLASSES for r in tr.records)
    counts = tr.counts()
    assert set(counts) == {"en", "fr", "ja"}
    assert all(sum(c.values()) == 3 for c in counts.values())
    s = tr.summary()
    json.dumps(s)
    assert s["classification"] == counts
    assert len(tr.to_dataframe()) == 9
    prof = tr.profile()
    assert set(prof["track"]) == {"en", "answer"}
    tr.fig_class_fractions()
    tr.fig_profiles()
    tr.fig_profiles(langs=["en"])


def test_the_usable_facts_come_with_those_candidate_ranking_can_score(tiny):
    from mechlingo.analyses.recall.trace import _usable
    from mechlingo.data import Fact

    facts = [Fact("town/A", "town", "fr", "A", "A:", "Londres", answer_en="London",
                  candidates=("Paris", "Londres")),
             Fact("town/B", "town", "fr", "B", "B:", "Pékin", answer_en="Beijing")]  # fmt: skip
    usable, skipped, ranked = _usable(tiny, facts, None, 10, "generate")
    assert usable == facts and skipped == {}
    assert ranked == [facts[0]]  # only A has candidates


def test_trace_bad_input(tiny):
    facts = load_facts(langs=["en"], relations=["capital"], limit=2)
    with pytest.raises(ValueError, match="no facts"):
        trace_recall(tiny, facts, langs=["de"])
    with pytest.raises(ValueError, match="mid_layers"):
        trace_recall(tiny, facts, mid_layers=[99])
    with pytest.raises(ValueError, match="max_rank"):
        trace_recall(tiny, facts, max_rank=-1)


def test_circuit_and_phases(tiny, tiny_trace):
    from mechlingo.analyses.recall.patching import fact_readouts, patch_activations

    fr = [f for f in load_facts(langs=["fr"], relations=["capital"], limit=3)]
    sw = patch_activations(
        tiny,
        fr[:2],
        fr[1:3],
        ["attn_out", "mlp_out"],
        positions=["subject_first", "subject_last", -1],
        readout=fact_readouts(tiny, fr[:2]),
        alignment="subject",
    )
    phases = pipeline_phases(sw, tiny_trace, "fr")
    assert all(a <= b for a, b in phases.values())
    fig = sw.fig_circuit(phases=phases, top_k=5)
    assert len(fig.data) >= 1


def test_trace_cli(tiny_dir, tmp_path):
    from mechlingo.cli import main

    out = tmp_path / "out"
    rc = main(
        [
            "trace",
            "--model",
            str(tiny_dir),
            "--langs",
            "en,fr",
            "--limit",
            "3",
            "--max-new-tokens",
            "2",
            "--patch-prompts",
            "2",
            "--patch-unanswered",
            "--patch-sites",
            "resid_pre,mlp_out",
            "--quiet",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["classification"]) == {"en", "fr"}
    from mechlingo.kernels.significance import wilson

    for lg, counts in summary["classification"].items():  # Wilson interval per class
        assert sum(counts.values()) == 3
        for c, n in counts.items():
            assert summary["classification_ci"][lg][c] == wilson(n, 3).to_json()
    trace = json.loads((out / "trace.json").read_text())
    assert len(trace) == 6 and {
        "class",
        "generation",
        "first_en_layer",
        "decided_at",
        "continues_prompt",
        "echoes_subject",
    } <= set(trace[0])
    patching = json.loads((out / "patching.json").read_text())
    assert set(patching) == {"en", "fr"} and patching["fr"]["cells"]
    assert (out / "report.html").read_text().count("plotly") > 1
    bad = tmp_path / "bad"
    assert main(["trace", "--model", str(tiny_dir), "--langs", "xx", "--out", str(bad)]) == 2
    assert not bad.exists()


@pytest.mark.slow
def test_gemma_pipeline_classes(gemma):
    ids = {"capital/IT", "capital/FR", "capital/DE", "capital/ES", "capital/JP", "capital/EG"}
    facts = [f for f in load_facts(langs=["en", "es", "fr"], relations=["capital"]) if f.id in ids]
    tr = trace_recall(gemma, facts, batch_size=18)
    counts = tr.counts()
    assert counts["en"]["correct"] >= 4, counts
    failures = sum(counts[lg]["translation_failure"] for lg in ("es", "fr"))
    assert failures >= 1, tr.to_dataframe()[["lang", "id", "generation", "class"]]
    it_es = next(r for r in tr.records if r["id"] == "capital/IT" and r["lang"] == "es")
    assert it_es["en_decodable_mid"], it_es


def _scrub(x, drop=("seconds",)):
    """``x`` without the keys in ``drop`` (timings), at every depth."""
    if isinstance(x, dict):
        return {k: _scrub(v, drop) for k, v in x.items() if k not in drop}
    if isinstance(x, list):
        return [_scrub(v, drop) for v in x]
    return x


def test_trace_cli_writes_what_run_trace_writes(tiny, tiny_dir, tmp_path):
    """`mechlingo trace` and `trace.run_trace(...).write(out)` with the same settings write
    the same summary.json (but its meta), trace.json and patching.json (but timings)."""
    from mechlingo.analyses.recall import trace as trace_mod
    from mechlingo.analyses.recall.trace_options import TraceOptions
    from mechlingo.cli import main

    cli, py = tmp_path / "cli", tmp_path / "py"
    assert main(["trace", "--model", str(tiny_dir), "--langs", "en,fr", "--limit", "4",
                 "--max-new-tokens", "2", "--patch-prompts", "2", "--method", "both",
                 "--verify-heads", "2", "--patch-unanswered", "--quiet",
                 "--out", str(cli)]) == 0  # fmt: skip
    facts = load_facts(langs=["en", "fr"], relations=["capital"], limit=4)
    opts = TraceOptions(max_new_tokens=2, patch_prompts=2, method="both", verify_heads=2,
                        unanswered=True)  # fmt: skip
    run = trace_mod.run_trace(tiny, facts, opts)
    run.write(py)
    a, b = (json.loads((d / "summary.json").read_text()) for d in (cli, py))
    assert "meta" in a and "meta" not in b
    a.pop("meta")
    assert a == b and a["classification_ci"]
    for name in ("trace.json", "patching.json"):
        x, y = (json.loads((d / name).read_text()) for d in (cli, py))
        assert _scrub(x) == _scrub(y) and x
    assert set(json.loads((py / "patching.json").read_text())) == {"en", "fr"}


def test_trace_keeps_the_whole_greedy_line_and_the_decision_point_apart(tiny, tiny_trace):
    """The stored generation is the greedy first line up to the stop rule (what scoring
    without early stop gives), ``decided_at`` the prefix where the verdict was final, and
    the flags are those of the raw continuation; the summary splits the failures."""
    from mechlingo.data.fact_answers import answer_flags
    from mechlingo.scoring.evaluate import evaluate_facts, greedy_generate

    facts = load_facts(langs=["en", "fr", "ja"], relations=["capital"], limit=3)
    full = evaluate_facts(
        tiny, facts, decoding=DecodeOptions(max_new_tokens=2, early_stop=False)
    ).records
    raw = greedy_generate(tiny, [f.prompt for f in facts], decoding=DecodeOptions(max_new_tokens=2))
    for rec, ev, f, g in zip(tiny_trace.records, full, facts, raw, strict=True):
        assert rec["generation"] == ev["generation"] and rec["correct"] == ev["correct"]
        assert rec["generation"].startswith(rec["decided_at"])
        assert {k: rec[k] for k in answer_flags(f, g)} == answer_flags(f, g)
    s = tiny_trace.summary()
    assert set(s["failure_split"]) == {"with_flagged", "without_flagged"}
    assert set(s["flags"]) == {"en", "fr", "ja"}
    pooled = s["failure_split"]["with_flagged"]["non-English"]
    fails = sum(s["classification"][lg][c] for lg in ("fr", "ja")
                for c in ("recall_failure", "translation_failure"))  # fmt: skip
    assert pooled["recall_failure"] + pooled["translation_failure"] == fails


def test_gemma_answers_that_are_no_attempt_are_flagged_and_a_shared_form_is_its_class(gemma):
    """On the embedded model: German "... in der Stadt" is continued as "bibliothek" (glued
    onto the last word), the Japanese capital prompt of Afghanistan is answered by repeating
    the subject, and the French Tirana (written as in English) is a shared form."""
    from mechlingo.data import Fact

    stadt = Fact("capital/CH", "capital", "de", "Bibliothek", "Die Bibliothek steht in der Stadt",
                 "Bern", answer_en="Bern", subject_span=(4, 14))  # fmt: skip
    bundled = [f for f in load_facts(langs=["fr", "ja"], relations=["capital"])
               if (f.lang, f.id) in {("ja", "capital/AF"), ("fr", "capital/AL")}]  # fmt: skip
    tr = trace_recall(gemma, [stadt, *bundled])
    by = {(r["lang"], r["id"]): r for r in tr.records}
    de, ja, fr = by["de", "capital/CH"], by["ja", "capital/AF"], by["fr", "capital/AL"]
    assert de["continues_prompt"] and de["generation"].startswith("bibliothek"), de
    assert ja["echoes_subject"] and ja["generation"].startswith("アフガニスタン"), ja
    assert fr["class"] == "shared_form" and not fr["correct"], fr
    assert de["generation"].startswith(de["decided_at"]) and len(de["decided_at"]) == 2
