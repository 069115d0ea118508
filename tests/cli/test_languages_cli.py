"""Languages outside the bundled twelve through the commands (tiny model, in process), and no
dead ends: a wrong facts file is reported whole, by every command, before any model loads."""

from __future__ import annotations

import json

import pytest

from mechlingo.cli import common, main
from mechlingo.core import models
from tests.data.test_languages import CAPITALS, fact_records, write_facts, write_parallel


@pytest.fixture
def facts_file(tmp_path):
    return write_facts(tmp_path / "sv_sw.jsonl", fact_records())


def _summary(out):
    return json.loads((out / "summary.json").read_text())


def test_eval_in_swedish_and_swahili(tiny_dir, facts_file, tmp_path):
    out = tmp_path / "eval"
    args = ["eval", "--model", str(tiny_dir), "--facts", facts_file, "--langs", "sv,swh_Latn",
            "--limit", "4"]  # fmt: skip
    assert main([*args, "--max-new-tokens", "2", "--quiet", "--out", str(out)]) == 0
    s = _summary(out)
    assert set(s["accuracy"]) == {"sv", "sw"}  # swh_Latn is read as sw
    rows = [json.loads(x) for x in (out / "generations.jsonl").read_text().splitlines()]
    assert sorted({r["lang"] for r in rows}) == ["sv", "sw"] and len(rows) == 2 * 4


def test_trace_in_swedish_and_swahili_without_english_in_langs(tiny_dir, tmp_path):
    """The issue's dead end: --langs leaves out the English rows the trace needs; the file's
    English rows still give the English answers (no answer_en in the records)."""
    facts = write_facts(tmp_path / "f.jsonl", fact_records(answer_en=False))
    out = tmp_path / "trace"
    args = ["trace", "--model", str(tiny_dir), "--facts", facts, "--langs", "sv,sw"]
    assert main([*args, "--max-new-tokens", "2", "--patch-prompts", "0", "--quiet",
                 "--out", str(out)]) == 0  # fmt: skip
    assert set(_summary(out)["classification"]) == {"sv", "sw"}


def test_trace_without_any_english_answer_stops_before_the_model(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(common, "load_model", _no_model)
    facts = write_facts(tmp_path / "f.jsonl", fact_records(english=False, answer_en=False))
    for extra in (["--dry-run"], []):
        code = main(["trace", "--facts", facts, "--out", str(tmp_path / "o"), *extra])
        err = capsys.readouterr().err
        assert (
            code == 2
            and f"{len(CAPITALS)} fact(s) have no English answer" in err
            and "answer_en" in err
        )
        assert "pool" not in err and "track_langs" not in err  # no Python-API advice


def test_lens_prompt_in_swedish_tracks_new_languages(tiny_dir, tmp_path):
    out = tmp_path / "lens"
    args = ["lens", "--model", str(tiny_dir), "--prompt", "Huvudstaden i Sverige är",
            "--track", "sv,swh_Latn", "--quiet", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    tokens = json.loads((out / "tokens.json").read_text())
    assert tokens  # the grid of the prompt was written


@pytest.mark.slow
def test_experts_and_align_on_a_swahili_target(tiny_dir, tmp_path):
    par = write_parallel(tmp_path / "par")
    exp = tmp_path / "experts"
    common_args = ["--model", str(tiny_dir), "--parallel", par, "--lines", "4", "--quiet"]
    args = ["experts", *common_args, "--target", "swh_Latn", "--k", "3,5", "--samples", "2",
            "--sample-tokens", "2", "--heldout", "2", "--out", str(exp)]  # fmt: skip
    assert main(args) == 0
    s = _summary(exp)
    assert (exp / "sw-k3").is_dir() and (exp / "sw-k5-random").is_dir()
    assert "sw" in json.dumps(s["chosen_k"] if "chosen_k" in s else s)
    out = tmp_path / "align"
    assert main(["align", *common_args, "--clamp", str(exp), "--out", str(out)]) == 0
    assert (out / "retrieval.csv").is_file()


@pytest.mark.slow
def test_replicate_lu2025_on_swedish_and_swahili_facts(tiny_dir, tmp_path):
    from tests.card.test_replicate import TINY

    facts = write_facts(tmp_path / "f.jsonl", fact_records(continents=True))
    out = tmp_path / "card"
    settings = {**TINY, "lu_langs": ["en", "sv", "sw"],
                "transfer": {**TINY["transfer"], "relations": ["capital", "continent"],
                             "langs": ["en", "sv", "sw"]}}  # fmt: skip
    args = ["replicate", "--model", str(tiny_dir), "--paper", "lu2025", "--facts", facts,
            "--settings", json.dumps(settings), "--quiet", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    card = json.loads((out / "claims.json").read_text())
    assert card["claims"] and not [r for r in card["claims"] if r.get("error")]
    assert card["meta"]["facts_scope"]["lu_langs"] == ["en", "sv", "sw"]


def _no_model(*args, **kwargs):
    raise AssertionError("a model was loaded")


#: every command that reads --facts, with the flags it needs besides
FACT_COMMANDS = [
    ["eval"],
    ["trace"],
    ["lens"],
    ["steer", "build"],
    ["replicate", "--paper", "lu2025"],
]


@pytest.mark.parametrize("dry_run", [False, True])
@pytest.mark.parametrize("command", FACT_COMMANDS, ids=lambda c: c[0] + "-" + c[-1])
def test_every_problem_of_a_facts_file_before_any_model(command, dry_run, tmp_path,
                                                          monkeypatch, capsys):  # fmt: skip
    if dry_run and command[0] == "replicate":
        pytest.skip("replicate has --plan, not --dry-run")
    monkeypatch.setattr(common, "load_model", _no_model)
    monkeypatch.setattr(models, "load_model", _no_model)
    good = fact_records()
    rows = [{**good[0], "answers": ["x"]}, {**good[1], "alias": "y"},
            {**good[2], "lang": "xx"}, {**good[3], "prompt": good[3]["prompt"] + " "}]  # fmt: skip
    path = write_facts(tmp_path / "bad.jsonl", rows)
    out = tmp_path / "o"
    code = main([*command, "--facts", path, "--out", str(out), *(["--dry-run"] * dry_run)])
    err = capsys.readouterr().err
    assert code == 2 and not out.exists()
    assert "4 problems" in err
    for needle in ("'answers'", "did you mean 'answer'?", "'alias'", "did you mean 'aliases'?",
                   "has unknown language 'xx'", "ends with whitespace"):  # fmt: skip
        assert needle in err, needle


def test_lens_tracks_languages_from_rows_langs_leaves_out(tiny_dir, tmp_path, monkeypatch, capsys):
    """--langs sv --track sw,en: the file's Swahili and English rows give the tracked answers;
    a tracked language the file lacks is refused before the model loads, in flags."""
    facts = write_facts(tmp_path / "f.jsonl", fact_records(answer_en=False))
    out = tmp_path / "lens"
    args = ["lens", "--model", str(tiny_dir), "--facts", facts, "--langs", "sv", "--limit", "3"]
    assert main([*args, "--track", "sw,en", "--quiet", "--out", str(out)]) == 0
    rows = (out / "lens.csv").read_text().splitlines()
    assert len(rows) > 1
    monkeypatch.setattr(common, "load_model", _no_model)
    assert main([*args, "--track", "fr", "--out", str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err
    assert "--track fr: no fr answer for fact" in err and "add fr rows" in err
    assert "pool" not in err and "track_langs" not in err


@pytest.mark.parametrize(
    ("argv", "flag"),
    [(["eval", "--langs", "en,sv"], "--facts FILE"), (["lens", "--langs", "swh_Latn"], "--facts FILE"),
     (["experts", "--langs", "en,sv", "--target", "en"], "--parallel DIR")],
)  # fmt: skip
def test_a_new_language_without_own_data_says_what_to_pass(argv, flag, tmp_path, monkeypatch,
                                                           capsys):  # fmt: skip
    monkeypatch.setattr(common, "load_model", _no_model)
    assert main([*argv, "--out", str(tmp_path / "o"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "the bundled" in err and f"pass your own with {flag}" in err
