"""``mechlingo circuit`` on the tiny model: its outputs (summary.json last), its report's
figures checked from their JSON, ``--dry-run`` without a model, bad input refused before the
model loads."""

from __future__ import annotations

import contextlib
import json

import numpy as np
import pandas as pd
import pytest

from mechlingo.analyses.circuits import languages
from mechlingo.cli import circuit as circuit_cli
from mechlingo.cli import common, main
from tests.system.test_figures import check_figure
from tests.viz.test_circuit_figure import drawn_edges


def _no_model(*a, **k):
    raise AssertionError("the model was loaded")


def test_dry_run_prints_the_plan_and_loads_no_model(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(common, "load_cli_model", _no_model)
    out = tmp_path / "o"
    argv = ["circuit", "--langs", "en,fr", "--relation", "capital", "--limit", "10",
            "--ig-steps", "3", "--verify-edges", "7", "--out", str(out), "--dry-run"]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "plan of mechlingo circuit" in text and "estimated CPU time" in text
    # 703 edges x 5 groups on the embedded model; per pair 1 + 3*3 for the scores, 3 plain
    # passes (two corrupted, one other language), 2 x (7 + 12 + 1) patched ones
    assert "3,515" in text and ": 52 forward passes" in text
    assert not out.exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--ig-steps", "0"], "--ig-steps must be at least 1"),
        (["--faithfulness", "1.5"], "--faithfulness must be above 0 and at most 1"),
        (["--verify-edges", "-1"], "--verify-edges must be 0 or more"),
        (["--circuit-prompts", "2"], "at least 3"),
        (["--relation", "capital,language"], "one relation"),
        (["--attribution", "acdc"], "invalid choice"),
        (["--langs", "xx"], "xx"),
    ],
)
def test_bad_input_is_refused_before_the_model_loads(tmp_path, capsys, monkeypatch, flags, message):
    monkeypatch.setattr(common, "load_cli_model", _no_model)
    out = tmp_path / "o"
    with pytest.raises(SystemExit) if "--attribution" in flags else contextlib.nullcontext():
        rc = main(["circuit", "--langs", "en", "--limit", "5", *flags, "--out", str(out)])
        assert rc == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_circuit_command_on_the_tiny_model(tmp_path, tiny_dir, monkeypatch):
    # the tiny random model answers nothing: every fact counts as answered correctly
    monkeypatch.setattr(languages, "correct_facts", lambda model, facts, **kw: list(facts))
    written, reports = [], []
    real_write, real_report = circuit_cli.write_outputs, circuit_cli.circuit_report
    monkeypatch.setattr(circuit_cli, "write_outputs",
                        lambda out, files: written.append(list(files)) or real_write(out, files))  # fmt: skip
    monkeypatch.setattr(circuit_cli, "circuit_report",
                        lambda lc, meta: reports.append(real_report(lc, meta)) or reports[-1])  # fmt: skip
    out = tmp_path / "c"
    argv = ["circuit", "--model", str(tiny_dir), "--langs", "en,fr", "--limit", "10",
            "--attribution", "eap-ig", "--ig-steps", "2", "--verify-edges", "3",
            "--positions", "all", "--circuit-prompts", "8", "--faithfulness", "0.5",
            "--quiet", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert written[0][-1] == "summary.json"  # published last
    s = json.loads((out / "summary.json").read_text())
    langs = set(s["languages"])
    assert langs == {"en", "fr"}
    assert s["meta"]["attribution"] == "eap-ig" and s["meta"]["ig_steps"] == 2
    for lg in langs:
        c = json.loads((out / "circuits" / f"{lg}.json").read_text())
        row = s["languages"][lg]
        assert c["n"] == row["n"] >= 3 and len(c["edges"]) == row["edges"]
        assert c["faithfulness"]["faithfulness"] >= 0.5 or row["edges"] == row["of_edges"]
        x = [p["n_edges"] / row["of_edges"] for p in c["curve"]]
        f = [p["faithfulness"] for p in c["curve"]]
        x, f = [0.0, *x] if x[0] > 0 else x, [0.0, *f] if x[0] > 0 else f
        assert row["cpr"]["value"] == pytest.approx(np.trapezoid(f, x), abs=1e-4)
        assert row["cpr"]["lo"] <= row["cpr"]["value"] <= row["cpr"]["hi"]
        assert s["cross_faithfulness"][lg][lg]["faithfulness"] == pytest.approx(
            c["faithfulness"]["faithfulness"]
        )
    csv = pd.read_csv(out / "curves.csv")
    curves = json.loads((out / "curves.json").read_text())
    assert len(csv) == sum(len(v["curve"]) for v in curves.values())
    o = s["overlap"]["en"]["fr"]
    assert 0 < o["p"] <= 1 and 0 <= o["jaccard"] <= 1
    assert o["jaccard"] == s["overlap"]["fr"]["en"]["jaccard"]
    figs = reports[0].figures
    assert len(figs) == 1 + 2 + len(langs)  # curves, overlap, cross, one circuit each
    for i, fig in enumerate(figs):
        check_figure(fig, f"circuit report figure {i}")
    for lg, fig in zip(list(s["languages"]), figs[-len(langs) :], strict=True):
        c = json.loads((out / "circuits" / f"{lg}.json").read_text())
        assert drawn_edges(fig.to_plotly_json()) == {e["edge"] for e in c["edges"]}
    assert "Faithfulness curves" in (out / "report.html").read_text()
