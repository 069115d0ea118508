"""The command line: outputs, bad input, nothing half-written."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mechlingo.cli import main


def test_help_lists_commands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "lens" in out and "eval" in out


def test_unknown_language_is_clean_error(tmp_path, capsys):
    out = tmp_path / "o"
    code = main(["lens", "--langs", "xx", "--out", str(out)])
    assert code == 2
    assert "xx" in capsys.readouterr().err
    assert not out.exists()


def test_unknown_relation_and_empty_selection(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["eval", "--relation", "weather", "--out", str(out)]) == 2
    assert "weather" in capsys.readouterr().err
    assert main(["eval", "--limit", "0", "--out", str(out)]) == 2
    assert not out.exists()


def test_bad_data_file(tmp_path, capsys):
    bad = tmp_path / "facts.jsonl"
    bad.write_text('{"id": "x", "relation": "capital", "lang": "en"}\n')
    assert (
        main(["eval", "--data", str(bad), "--relation", "all", "--out", str(tmp_path / "o")]) == 2
    )
    err = capsys.readouterr().err
    assert "line 1" in err
    assert not (tmp_path / "o").exists()


def test_offline_hub_model_exits_2(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    out = tmp_path / "o"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mechlingo.cli",
            "lens",
            "--model",
            "some-org/some-model",
            "--langs",
            "en",
            "--limit",
            "2",
            "--out",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "network access" in proc.stderr
    assert not out.exists()


@pytest.mark.slow
def test_lens_and_eval_commands_on_default_model(tmp_path):
    out = tmp_path / "lens"
    assert (
        main(["lens", "--langs", "en,es,fr,de", "--limit", "6", "--quiet", "--out", str(out)]) == 0
    )
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["final_layer_accuracy"]) == {"en", "es", "fr", "de"}
    assert set(summary["english_decodable_before_last"]) == {"en", "es", "fr", "de"}
    html = (out / "report.html").read_text()
    assert "plotly" in html.lower() and "<script" in html
    assert "<script src=" not in html.replace("'", '"')  # offline: nothing loaded from a URL
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    out2 = tmp_path / "eval"
    assert main(["eval", "--langs", "en,es", "--limit", "5", "--quiet", "--out", str(out2)]) == 0
    s2 = json.loads((out2 / "summary.json").read_text())
    assert set(s2["accuracy"]) == {"en", "es"}
    assert all(0.0 <= x <= 1.0 for x in s2["accuracy"].values())


def test_eval_summary_has_wilson_intervals(tmp_path, tiny_dir):
    from mechlingo.kernels.significance import wilson

    out = tmp_path / "eval"
    args = ["eval", "--model", str(tiny_dir), "--langs", "en,fr", "--limit", "4"]
    assert main([*args, "--max-new-tokens", "2", "--quiet", "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    recs = [json.loads(x) for x in (out / "generations.jsonl").read_text().splitlines()]
    for lg in ("en", "fr"):
        k = sum(bool(r["correct"]) for r in recs if r["lang"] == lg)
        n = sum(r["lang"] == lg for r in recs)
        assert n == 4 and s["accuracy_ci"][lg] == wilson(k, n).to_json()
        assert s["accuracy"][lg] == k / n
    assert "Wilson 95% intervals" in (out / "report.html").read_text()


def test_report_page_opens_with_headline_then_provenance_then_collapsed_config():
    """A page: title, the headline block, one provenance line read from meta, the full meta
    as JSON in a closed <details>, then the sections; numbers formatted by fmt_interval."""
    import re

    from mechlingo.report.page import Report, fmt_interval, provenance

    meta = {"model": "m", "weights": "raw", "templates": "natural", "seconds": 2.5,
            "build": {"fact_ids": ["a", "b"], "raw_norms": [1.0, 2.0]}}  # fmt: skip
    report = Report("t", meta)
    report.add_headline("Effect", fmt_interval(0.032, -0.01, 0.075, 48, scale=100, digits=1,
                                                signed=True, unit="points"))  # fmt: skip
    report.add_headline("McNemar p", None)
    report.add_text("a section")
    body = report.render().split("<body>", 1)[1]
    tags = re.findall(r"<(h1|div|p|details)\b", body)[:5]
    assert tags == ["h1", "div", "p", "details", "p"]
    head = body.split("<details", 1)[0]
    assert "<dt>Effect</dt><dd>+3.2 points [-1.0, +7.5] (n=48)</dd>" in head
    assert "<dd>n/a</dd>" in head and "fact_ids" not in head
    assert provenance(meta) == "model m · weights raw · templates natural · 2.5 s"
    config = body.split("<details", 1)[1].split("</details>", 1)[0]
    assert not config.startswith(" open") and "fact_ids" in config
    assert fmt_interval(0.5, 0.2, 0.8) == "0.500 [0.200, 0.800]"
    assert fmt_interval(None, None, None, 3) == "n/a"
