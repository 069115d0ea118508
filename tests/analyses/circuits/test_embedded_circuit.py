"""find_circuit on the embedded model (a few facts): the faithfulness curve runs from the
corrupted run (no edge clean) to the clean run (every edge clean), and the top edges are
verified by exact patching."""

from __future__ import annotations

import math

import pytest

from mechlingo.analyses.circuits import find_circuit
from mechlingo.data import load_facts


def test_find_circuit_on_the_embedded_model(gemma):
    facts = load_facts(langs="en", relations="capital", limit=8)
    res = find_circuit(gemma, facts, method="eap", sizes=(0, 20), verify=3, positions="all")
    assert res.n >= 3
    assert len(res.graph.senders) == 1 + 2 * int(gemma.cfg.n_layers)  # Gemma 3: layer senders
    curve = {p["n_edges"]: p["faithfulness"] for p in res.curve}
    assert curve[0] == pytest.approx(0.0, abs=1e-3)
    assert curve[res.graph.n_edges] == pytest.approx(1.0, abs=1e-3)
    assert len(res.verified) == 3 and math.isfinite(res.verified[0]["exact"])
    # the clean answers are the model's own: clearly more likely than under a wrong subject
    assert float(res.clean.mean()) > float(res.corrupted.mean())
