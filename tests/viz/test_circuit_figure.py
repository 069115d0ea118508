"""The measured-circuit figure, checked from its JSON: every line drawn is a measured edge."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from mechlingo.viz.circuit import measured_circuit_figure, node_xy


def drawn_edges(fig_json: dict[str, Any]) -> set[str]:
    """The edges a figure draws: every line trace must name its edge (``meta.edge``); a
    line without one fails."""
    out = set()
    for trace in fig_json["data"]:
        if "lines" not in str(trace.get("mode", "")):
            continue
        meta = trace.get("meta") or {}
        assert "edge" in meta, f"a line that is no measured edge: {trace.get('name')}"
        out.add(meta["edge"])
    return out


def check_only_measured(fig_json: dict[str, Any], data: dict[str, Any]) -> None:
    measured = {e["edge"] for e in data["edges"]}
    extra = drawn_edges(fig_json) - measured
    assert not extra, f"unmeasured edges drawn: {sorted(extra)}"


def _data() -> dict[str, Any]:
    def edge(s, r, pos, score, **kw):
        return {"edge": f"{s}->{r}@{pos}", "sender": s, "receiver": r, "position": pos,
                "score": score, "lo": score - 0.1, "hi": score + 0.1, "n": 20, **kw}  # fmt: skip

    return {
        "n": 20,
        "n_layers": 2,
        "positions": ["subject_last", "last"],
        "faithfulness": {"faithfulness": 0.82, "lo": 0.7, "hi": 0.9},
        "edges": [
            edge("embed", "mlp0", "subject_last", -0.8, exact=-0.75),
            edge("m0", "attn1", "subject_last", -0.4),
            edge("a1.h3", "logits", "last", 0.2),
        ],
    }


def test_figure_draws_exactly_the_measured_edges():
    data = _data()
    fig = measured_circuit_figure(data, title="en")
    js = fig.to_plotly_json()
    assert drawn_edges(js) == {e["edge"] for e in data["edges"]}
    lines = {t["meta"]["edge"]: t for t in js["data"] if t.get("meta")}
    widths = [lines[e["edge"]]["line"]["width"] for e in data["edges"]]
    assert widths[0] > widths[1] > widths[2] and widths[0] == pytest.approx(8.0)
    hover = lines["embed->mlp0@subject_last"]["hovertext"]
    assert (
        "-0.8 [-0.9, -0.7]" in hover and "n = 20" in hover and "exact edge patching: -0.75" in hover
    )
    assert "exact" not in lines["m0->attn1@subject_last"]["hovertext"]
    assert lines["m0->attn1@subject_last"]["x"][0] == node_xy("m0", 0, 2)[0]
    title = js["layout"]["title"]["text"]
    assert "n = 20" in title and "0.82 [0.7, 0.9]" in title and "3 edges" in title
    assert js["layout"]["xaxis"]["title"]["text"] and js["layout"]["yaxis"]["title"]["text"]
    check_only_measured(js, data)


def test_the_check_fails_on_an_unmeasured_edge():
    data = _data()
    js = measured_circuit_figure(data).to_plotly_json()
    forged = copy.deepcopy(js)
    forged["data"].append({**forged["data"][0], "meta": {"edge": "embed->logits@last"}})
    with pytest.raises(AssertionError, match="unmeasured"):
        check_only_measured(forged, data)
    ruled = copy.deepcopy(js)  # a line drawn by a rule, naming no edge
    ruled["data"].append({"type": "scatter", "mode": "lines", "x": [0, 1], "y": [0, 1]})
    with pytest.raises(AssertionError, match="no measured edge"):
        check_only_measured(ruled, data)
    fewer = {**data, "edges": data["edges"][1:]}  # the figure of more edges than measured
    with pytest.raises(AssertionError, match="embed->mlp0"):
        check_only_measured(js, fewer)
