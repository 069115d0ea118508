"""The command line: outputs, bad input, nothing half-written."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mechlingo.cli import build_parser, main


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
        main(["eval", "--facts", str(bad), "--relation", "all", "--out", str(tmp_path / "o")]) == 2
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


def _english_facts(path):
    from mechlingo.data import load_facts

    lines = [json.dumps({k: v for k, v in vars(f).items() if not k.startswith("_")})
             for f in load_facts(langs=["en"], relations=["capital"], limit=3)]  # fmt: skip
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_facts_file_without_langs_is_read_in_its_own_languages(tmp_path):
    """`eval --facts FILE` with a file of English facts and no --langs scores English (the
    file's languages), where it used to refuse the file for lacking en,fr,de,es,ja."""
    from mechlingo.cli.common import load_selected_facts
    from mechlingo.core.errors import InputError

    data = _english_facts(tmp_path / "en.jsonl")
    args = build_parser().parse_args(["eval", "--facts", str(data), "--out", str(tmp_path / "o")])
    facts = load_selected_facts(args)
    assert {f.lang for f in facts} == {"en"} and len(facts) == 3
    bundled = build_parser().parse_args(["eval", "--out", str(tmp_path / "o")])
    assert {f.lang for f in load_selected_facts(bundled)} == {"en", "fr", "de", "es", "ja"}
    trace = build_parser().parse_args(["trace", "--limit", "2", "--out", str(tmp_path / "o")])
    assert {f.lang for f in load_selected_facts(trace)} == {"en", "fr", "de", "es", "ja"}
    with_langs = build_parser().parse_args(
        ["eval", "--facts", str(data), "--langs", "en,fr", "--out", str(tmp_path / "o")]
    )
    with pytest.raises(InputError, match="the file has languages \\['en'\\]"):
        load_selected_facts(with_langs)  # asked for French, which the file lacks


def test_steer_build_reads_capitals_by_default_and_every_relation_on_request(tmp_path):
    from mechlingo.cli.common import load_selected_facts
    from mechlingo.data import RELATIONS

    parser = build_parser()
    for cmd in ("build", "eval"):  # the one default of --relation, as every command
        args = parser.parse_args(["steer", cmd, "--limit", "2", "--out", str(tmp_path / "v")])
        assert {f.relation for f in load_selected_facts(args)} == {"capital"}
    args = parser.parse_args(["steer", "build", "--relation", "all", "--limit", "2", "--out",
                              str(tmp_path / "v")])  # fmt: skip
    assert {f.relation for f in load_selected_facts(args)} == set(RELATIONS)
    steer = next(a for a in parser._actions if a.dest == "command").choices["steer"]
    build = next(a for a in steer._actions if a.dest == "steer_command").choices["build"]
    rel = next(a for a in build._actions if "--relation" in a.option_strings)
    assert "default: capital" in rel.help


def test_top_level_help_names_what_each_command_writes(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "except `steer build`" in out and "`replicate` (claims.json" in out


def test_tuned_lens_batch_size_reaches_the_heldout_kl(tmp_path, tiny_dir, monkeypatch):
    from mechlingo.analyses.decoders import run as decoders_run

    seen = []
    real = decoders_run.lens_divergence

    def spy(*args, **kwargs):
        seen.append(kwargs.get("batch_size"))
        return real(*args, **kwargs)

    monkeypatch.setattr(decoders_run, "lens_divergence", spy)
    argv = ["tuned-lens", "--model", str(tiny_dir), "--langs", "en", "--steps", "1",
            "--texts-per-step", "2", "--max-tokens", "8", "--lines", "6", "--heldout", "3",
            "--batch-size", "2", "--quiet", "--out", str(tmp_path / "tl")]  # fmt: skip
    assert main(argv) == 0
    assert seen == [2]
    held = json.loads((tmp_path / "tl" / "summary.json").read_text())["heldout_kl"]
    assert held["n_texts"] == 3


def _without(x, drop=("meta", "format_version", "seconds")):
    """``x`` as JSON without the run's ``meta`` and the fields that measure time."""
    from mechlingo.core.jsonable import jsonable

    x = json.loads(json.dumps(jsonable(x)))
    if isinstance(x, dict):
        return {k: _without(v, drop) for k, v in x.items() if k not in drop}
    if isinstance(x, list):
        return [_without(v, drop) for v in x]
    return x


def test_run_eval_and_run_tuned_lens_are_what_the_commands_write(tmp_path, tiny_dir, tiny):
    """The library calls behind ``eval`` and ``tuned-lens`` give what the commands write."""
    from mechlingo.analyses.decoders.run import run_tuned_lens
    from mechlingo.analyses.decoders.tuned_lens import mix_texts
    from mechlingo.data import load_facts
    from mechlingo.data.prompts import parallel_sentences
    from mechlingo.scoring.accuracy import accuracy_intervals, run_eval
    from mechlingo.scoring.scorers import Scorer

    out = tmp_path / "eval"
    assert main(["eval", "--model", str(tiny_dir), "--langs", "en,fr", "--limit", "4",
                 "--max-new-tokens", "2", "--quiet", "--out", str(out)]) == 0  # fmt: skip
    facts = load_facts(langs=["en", "fr"], relations=["capital"], limit=4, templates="measured")
    run = run_eval(tiny, facts, Scorer("generate", "sentence"), max_new_tokens=2)
    assert _without(run.summary()) == _without(json.loads((out / "summary.json").read_text()))
    assert run.generations() == (out / "generations.jsonl").read_text()
    assert accuracy_intervals([]) == {}

    tl = tmp_path / "tl"
    assert main(["tuned-lens", "--model", str(tiny_dir), "--langs", "en", "--steps", "2",
                 "--texts-per-step", "2", "--max-tokens", "8", "--lines", "6", "--heldout", "3",
                 "--batch-size", "2", "--quiet", "--out", str(tl)]) == 0  # fmt: skip
    en = parallel_sentences(["en"])["en"]
    kw = {"steps": 2, "max_seconds": None, "lr": 1e-3, "texts_per_step": 2, "max_tokens": 8,
          "vocab_sample": "auto", "seed": 0, "progress": False}  # fmt: skip
    lens = run_tuned_lens(tiny, mix_texts({"en": en[:6]}), mix_texts({"en": en[6:9]}),
                          langs=["en"], text="bundled facts", lines="0:6", training=kw,
                          batch_size=2)  # fmt: skip
    assert _without(lens.summary()) == _without(json.loads((tl / "summary.json").read_text()))
    assert lens.loss_csv() == (tl / "loss.csv").read_text()
    assert [label for label, _ in lens.headline()][-1].startswith("Held-out KL")
    assert [heading for heading, _ in lens.figures()] == [
        "Loss curve", "Held-out KL(final || lens) per layer"
    ]  # fmt: skip
    assert lens.lens.meta["lines"] == "0:6" and lens.lens.meta["langs"] == ["en"]


def test_plotlyjs_flag_shares_one_plotly_file_beside_the_report(tmp_path, tiny_dir, monkeypatch):
    from mechlingo.report.page import PLOTLYJS_FILE

    monkeypatch.delenv("MECHLINGO_PLOTLYJS", raising=False)
    args = ["eval", "--model", str(tiny_dir), "--langs", "en", "--limit", "2",
            "--max-new-tokens", "1", "--quiet"]  # fmt: skip
    assert main([*args, "--plotlyjs", "file", "--out", str(tmp_path / "f")]) == 0
    page = (tmp_path / "f" / "report.html").read_text(encoding="utf-8")
    assert f"src='{PLOTLYJS_FILE}'" in page and len(page) < 200_000
    assert (tmp_path / "f" / PLOTLYJS_FILE).stat().st_size > 1_000_000
    assert main([*args, "--out", str(tmp_path / "i")]) == 0  # the default: one inlined file
    assert not (tmp_path / "i" / PLOTLYJS_FILE).exists()
    assert (tmp_path / "i" / "report.html").stat().st_size > 1_000_000
    with pytest.raises(SystemExit) as exc:
        main([*args, "--plotlyjs", "cdn", "--out", str(tmp_path / "c")])
    assert exc.value.code == 2
