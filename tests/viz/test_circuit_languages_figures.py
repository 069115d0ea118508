"""The cross-language circuit figures, checked from their JSON: n in the title, every axis
titled, the interval band around each curve, the heatmap cells where the numbers are."""

from __future__ import annotations

from mechlingo.viz.circuit import faithfulness_curves_figure, language_matrix_figure
from tests.system.test_figures import check_figure


def _curve(scale: float) -> list[dict]:
    return [
        {"n_edges": n, "faithfulness": f * scale, "lo": f * scale - 0.1, "hi": f * scale + 0.1}
        for n, f in ((0, 0.0), (10, 0.4), (100, 0.8), (703, 1.0))
    ]


def test_faithfulness_curves_figure():
    areas = {"cpr": {"value": 0.9}, "cmd": {"value": 0.1}}
    fig = faithfulness_curves_figure(
        {
            "en": {"curve": _curve(1.0), "n": 39, "areas": areas},
            "fr": {"curve": _curve(0.9), "n": 38},
        }
    )
    check_figure(fig, "faithfulness curves")
    doc = fig.to_plotly_json()
    title = doc["layout"]["title"]["text"]
    assert "en n = 39" in title and "fr n = 38" in title
    lines = [t for t in doc["data"] if t.get("mode") == "lines+markers"]
    bands = [t for t in doc["data"] if t.get("fill") == "toself"]
    assert [t["name"] for t in lines] == ["en (CPR 0.90, CMD 0.10)", "fr"]
    assert list(lines[0]["x"]) == [10, 100, 703]  # the 0-edge point is off the log axis
    assert len(bands) == 2 and max(bands[0]["y"]) == 1.1  # the interval, not the curve
    assert doc["layout"]["xaxis"]["type"] == "log"


def test_language_matrix_figure():
    vals = {"en": {"fr": 0.2}, "fr": {"en": 0.2}}
    text = {"en": {"fr": "0.20 (p = 0.0005)"}, "fr": {"en": "0.20 (p = 0.0005)"}}
    fig = language_matrix_figure(
        vals, {"en": 39, "fr": 38}, title="Edge Jaccard", colorbar="edge Jaccard", text=text
    )
    check_figure(fig, "overlap heatmap")
    hm = fig.to_plotly_json()["data"][0]
    assert [list(r) for r in hm["z"]] == [[None, 0.2], [0.2, None]]
    assert hm["text"][0][1] == "0.20 (p = 0.0005)" and hm["text"][0][0] == ""
