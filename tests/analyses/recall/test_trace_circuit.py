"""The trace's measured circuit on the tiny model: every line of its figure is an edge scored
by EAP-IG (read back from the figure's JSON, with its score), and the n in the title is the
number of prompts the edges were scored on."""

from __future__ import annotations

import json
import re

import pytest

from mechlingo.analyses.circuits.faithfulness import edge_intervals
from mechlingo.analyses.recall import trace as trace_mod
from mechlingo.analyses.recall.trace_circuit import TraceCircuit, circuit_facts
from mechlingo.analyses.recall.trace_options import TraceOptions
from mechlingo.core.errors import InputError
from mechlingo.data import load_facts
from tests.viz.test_circuit_figure import drawn_edges


@pytest.fixture(scope="module")
def run(tiny):
    facts = load_facts(langs=["en", "fr"], relations=["capital"], limit=8)
    # the tiny random model answers nothing: its prompts are scored as unanswered ones
    opts = TraceOptions(max_new_tokens=2, patch_prompts=1, unanswered=True, circuit_prompts=4)
    return facts, trace_mod.run_trace(tiny, facts, opts)


def test_every_drawn_edge_is_a_measured_edge_with_its_score(run):
    _, r = run
    assert set(r.circuits) == {"en", "fr"}
    for c in r.circuits.values():
        assert isinstance(c, TraceCircuit)
        res = c.result
        fig = json.loads(c.figure().to_json())
        mean = edge_intervals(res.scores, res.facts)[0]
        scored = {res.edge_name(e): float(mean[e]) for e in res.ranked}
        drawn = drawn_edges(fig)
        assert drawn and drawn <= set(scored), sorted(drawn - set(scored))
        assert drawn == {res.edge_name(e) for e in res.circuit}
        for tr in fig["data"]:
            if tr.get("mode") == "lines":  # the hover's score is the edge's measured mean
                shown = float(re.search(r"estimated effect ([-\d.e]+)", tr["hovertext"])[1])
                assert shown == pytest.approx(scored[tr["meta"]["edge"]], rel=0.01, abs=1e-3)


def test_the_title_gives_the_prompts_the_edges_were_scored_on(run):
    facts, r = run
    for lang, c in r.circuits.items():
        assert isinstance(c, TraceCircuit)
        title = json.loads(c.figure().to_json())["layout"]["title"]["text"]
        n = int(re.search(r"n = (\d+) facts", title)[1])
        used = len(dict.fromkeys(f.id for f in c.result.pairs.clean))
        assert n == used == c.n == len(set(c.result.facts)) and f"{n} prompts" in title
        clean, _, available = circuit_facts(r.trace, facts, lang, 4, unanswered=True)
        assert n <= len(clean) == min(4, available)
        assert (c.shortfall() is None) == (n == 4)
        if n < 4:  # said plainly in the title and the report's note
            assert "fewer than the 4 asked for" in title and f"only {n} of the 4" in c.shortfall()


def test_the_report_and_files_carry_the_measured_circuits(run):
    from mechlingo.report.trace import trace_report

    _, r = run
    files = r.files()
    data = json.loads(json.dumps(files["circuits.json"]))
    assert set(data) == {"en", "fr"} and all(d["n"] == r.circuits[k].n for k, d in data.items())
    html = trace_report(r.trace, r.summary({}), r.patched, max_rank=10, circuits=r.circuits)
    text = html.render()
    assert "Circuit (en)" in text and "measured circuit" in text


def test_no_circuit_without_a_correct_answer_and_bad_counts(tiny, run):
    facts, r = run
    from mechlingo.analyses.recall.trace_circuit import trace_circuit

    why = trace_circuit(tiny, r.trace, facts, "en", 4)  # nothing answered correctly
    assert isinstance(why, str) and "answered correctly" in why
    with pytest.raises(InputError, match="circuit_prompts"):
        TraceOptions(circuit_prompts=-1)
