"""Benchmark loaders on hand-written fixtures in each format (tests/bench_fixtures.py)."""

from __future__ import annotations

import json

import pytest

from mechlingo.cli import main
from mechlingo.core.errors import DataError, InputError
from mechlingo.data import (
    Fact,
    RecordError,
    benchmark_format,
    detect_format,
    load_benchmark,
    read_parallel,
)
from mechlingo.data.parallel_text import parallel_languages
from tests.bench_fixtures import FLORES_TEXT, write_fixture


def by_key(facts: list[Fact]) -> dict[tuple[str, str], Fact]:
    return {(f.id, f.lang): f for f in facts}


# --------------------------------------------------------------------------------------
# BMLAMA
# --------------------------------------------------------------------------------------


def test_bmlama_facts_relations_ids_suffix_candidates(tmp_path):
    bench = load_benchmark(write_fixture("bmlama", tmp_path / "b"))
    assert bench.format == "bmlama"
    facts = by_key(bench.facts)
    # relations are the English templates, shared by the aligned row in every language
    assert [f.relation for f in bench.facts if f.lang == "en"] == [
        "the_capital_of_x_is_y", "the_capital_of_x_is_y", "x_is_located_in_y_today",
        "x_is_located_in_y_today", "y_is_the_capital_of_x",
    ]  # fmt: skip
    ja = facts[("the_capital_of_x_is_y/0", "ja")]
    assert (ja.prompt, ja.answer, ja.suffix) == ("フランスの首都は", "パリ", "です。")
    assert ja.candidates == ("ベルリン", "パリ", "東京")
    assert ja.filled("東京") == "フランスの首都は東京です。"
    assert (ja.subject, ja.subject_span, ja.subject_en, ja.answer_en) == (
        "フランス",
        (0, 4),
        "France",
        "Paris",
    )
    ko = facts[("x_is_located_in_y_today/2", "ko")]
    assert (ko.prompt, ko.suffix, ko.filled("아시아")) == (
        "독일은",
        "에 있습니다.",
        "독일은 아시아에 있습니다.",
    )
    en = facts[("x_is_located_in_y_today/3", "en")]
    assert (en.prompt, en.suffix) == ("Japan is located in", " today.")
    # the mask at the very start: empty prompt, the subject after the mask
    start = facts[("y_is_the_capital_of_x/4", "fr")]
    assert (start.prompt, start.suffix, start.subject_span) == (
        "",
        " est la capitale de l'Allemagne.",
        (0, 0),
    )
    assert start.candidates == ("Paris", "Berlin")  # a quoted TSV field, read by csv
    assert start.filled("Paris") == "Paris est la capitale de l'Allemagne."
    # every filled gold sentence is the benchmark's prompt with the mask replaced
    zh = facts[("the_capital_of_x_is_y/1", "zh")]
    assert zh.sentence == "日本的首都是东京。"


def test_bmlama_skips_counted_by_reason_and_where(tmp_path):
    bench = load_benchmark(write_fixture("bmlama", tmp_path / "b"))
    assert bench.skipped == {
        "gold_not_in_candidates": 1,
        "subject_not_in_prompt": 1,
        "mask_spacing": 1,
    }
    assert bench.examples["gold_not_in_candidates"] == ["fr.tsv, line 3"]
    assert bench.examples["subject_not_in_prompt"] == ["fr.tsv, line 4"]
    assert bench.examples["mask_spacing"] == ["zh.tsv, line 5"]
    assert bench.unsupported_langs == ()  # every language is read (nl too)
    assert len(bench.facts) == 6 * 5 - 3
    assert {f.lang for f in bench.facts} == {"en", "fr", "ja", "ko", "zh", "nl"}
    # a language selection reads only those files: nothing counted for the others
    sel = load_benchmark(tmp_path / "b", langs=["en", "ja"])
    assert sel.skipped == {} and len(sel.facts) == 10
    assert [f.lang for f in sel.facts[:2]] == ["en", "ja"]


def test_bmlama_selection_and_single_file(tmp_path):
    folder = write_fixture("bmlama", tmp_path / "b")
    bench = load_benchmark(folder, langs=["en", "fr"], relations="the_capital_of_x_is_y")
    assert [(f.id, f.lang) for f in bench.facts] == [
        ("the_capital_of_x_is_y/0", "en"), ("the_capital_of_x_is_y/0", "fr"),
        ("the_capital_of_x_is_y/1", "en"),
    ]  # fmt: skip
    # limit keeps ids present in every requested language (row 1 is skipped in fr)
    lim = load_benchmark(folder, langs=["en", "fr"], limit=2)
    assert sorted({f.id for f in lim.facts}) == [
        "the_capital_of_x_is_y/0", "x_is_located_in_y_today/3", "y_is_the_capital_of_x/4"
    ]  # fmt: skip
    one = load_benchmark(folder / "ko.tsv")
    assert {f.lang for f in one.facts} == {"ko"} and len(one.facts) == 5
    assert one.facts[0].relation == "the_capital_of_x_is_y"  # named from en.tsv beside it
    with pytest.raises(InputError, match="unknown relation"):
        load_benchmark(folder, relations="capital")
    with pytest.raises(InputError, match=r"no facts in language\(s\) \['de'\]"):
        load_benchmark(folder, langs=["en", "de"])


def test_byte_order_marks_are_not_data(tmp_path):
    folder = write_fixture("bmlama", tmp_path / "b")
    en = folder / "en.tsv"
    en.write_bytes(b"\xef\xbb\xbf" + en.read_bytes())
    assert len(load_benchmark(folder, langs=["en"]).facts) == 5
    rows = write_fixture("mlama_rows", tmp_path / "r")
    rows.write_bytes(b"\xef\xbb\xbf" + rows.read_bytes())
    assert len(load_benchmark(rows, langs=["en"]).facts) == 2


def test_bmlama_malformed_files_name_file_and_line(tmp_path):
    folder = write_fixture("bmlama_bad", tmp_path / "b")
    with pytest.raises(RecordError, match=r"de\.tsv, line 3: has 3 fields"):
        load_benchmark(folder)
    (folder / "de.tsv").write_text("Question\tAnswer\nx\ty\n", encoding="utf-8")
    with pytest.raises(RecordError, match=r"de\.tsv, line 1: header"):
        load_benchmark(folder)
    (folder / "de.tsv").write_text(
        "Prompt\tAns\tCandidate Ans\tSubject\nDie Hauptstadt von X ist <mask>.\tA\tA\tX\n",
        encoding="utf-8",
    )
    with pytest.raises(DataError, match="1 rows, en.tsv has 5"):
        load_benchmark(folder)
    (folder / "de.tsv").unlink()
    (folder / "en.tsv").unlink()
    with pytest.raises(DataError, match="needs en.tsv"):
        load_benchmark(folder)


# --------------------------------------------------------------------------------------
# KLAR
# --------------------------------------------------------------------------------------


def test_klar_source_facts_and_skips(tmp_path):
    bench = load_benchmark(write_fixture("klar", tmp_path / "k"))
    assert bench.format == "klar"
    facts = by_key(bench.facts)
    en = facts[("capital_of/2", "en")]
    assert (en.prompt, en.answer, en.suffix) == ("The capital of Germany is", "Berlin", ".")
    ko = facts[("continent/0", "ko")]
    assert (ko.prompt, ko.suffix, ko.answer_en) == ("일본은", " 대륙에 있습니다.", "Asia")
    ja = facts[("capital_of/1", "ja")]
    assert (ja.prompt, ja.suffix, ja.subject_en) == ("日本の首都は", "です。", "Japan")
    fr = facts[("capital_of/0", "fr")]
    assert fr.prompt == "La capitale de la France est" and fr.candidates == ()
    assert bench.skipped == {"empty_subject": 1, "no_mask": 2}
    assert bench.unsupported_langs == () and {f.lang for f in bench.facts} >= {"el"}
    assert {f.relation for f in bench.facts} == {"capital_of", "continent"}
    assert len([f for f in bench.facts if f.lang != "el"]) == (3 + 2) * 3 + 2  # fr: 0 and 2
    assert ("capital_of/1", "fr") not in facts and ("continent/0", "fr") not in facts
    # klar_source itself and one relation file load too
    assert len(load_benchmark(tmp_path / "k" / "klar_source", langs=["en"]).facts) == 5
    one = load_benchmark(tmp_path / "k" / "klar_source" / "ja" / "continent.json")
    assert [(f.id, f.lang) for f in one.facts] == [("continent/0", "ja"), ("continent/1", "ja")]


def test_klar_malformed_json_names_file_and_line(tmp_path):
    folder = write_fixture("klar_bad", tmp_path / "k")
    with pytest.raises(RecordError, match=r"fr[/\\]capital_of\.json, line 3: invalid JSON"):
        load_benchmark(folder)
    bad = folder / "klar_source" / "en" / "capital_of.json"
    bad.write_text(json.dumps({"samples": [{"subject": "x", "index": 0}],
                               "prompt_templates": ["<subject> <mask>"]}))  # fmt: skip
    with pytest.raises(RecordError, match=r"samples\[0\] has no field 'object'"):
        load_benchmark(folder, langs=["en"])


def test_klar_text_variant(tmp_path):
    bench = load_benchmark(write_fixture("klar_flat", tmp_path / "kf"))
    assert bench.format == "klar_flat"
    facts = by_key(bench.facts)
    ja = facts[("klar/1", "ja")]
    assert (ja.prompt, ja.answer, ja.answer_en) == (
        "日本の首都はどこですか？答えは：",
        "東京",
        "Tokyo",
    )
    assert (ja.subject, ja.subject_span) == ("日本の首都はどこですか？", (0, 12))
    ko = facts[("klar/2", "ko")]
    assert (ko.prompt, ko.answer) == ("일본은 어느 대륙에 있습니까? 답은:", "아시아")
    en = facts[("klar/0", "en")]
    assert (en.prompt, en.answer) == ("What is the capital of France? The answer is:", "Paris")
    assert bench.skipped == {"empty_answer": 1}
    assert bench.examples["empty_answer"] == ["fra_Latn.txt, line 3"]
    assert len([f for f in bench.facts if f.lang in ("en", "fr", "ja", "ko")]) == 3 * 4 - 1
    with pytest.raises(RecordError, match=r"fra_Latn\.txt, line 2: no ':'"):
        load_benchmark(write_fixture("klar_flat_bad", tmp_path / "kfb"))


# --------------------------------------------------------------------------------------
# mLAMA, mParaRel, hub rows
# --------------------------------------------------------------------------------------


def test_mlama_templates_candidates_and_skips(tmp_path):
    bench = load_benchmark(write_fixture("mlama", tmp_path / "m"))
    assert bench.format == "mlama"
    facts = by_key(bench.facts)
    en = facts[("P36/1", "en")]
    assert (en.prompt, en.answer, en.suffix) == ("The capital of Japan is", "Tokyo", " .")
    assert en.candidates == ("Paris", "Tokyo", "Berlin")  # every object of P36 in English
    ja = facts[("P30/1", "ja")]
    assert (ja.prompt, ja.suffix, ja.candidates) == (
        "フランスは",
        "にあります。",
        ("アジア", "ヨーロッパ"),
    )
    fr = facts[("P36/2", "fr")]
    assert (fr.candidates, fr.answer_en, fr.subject_en) == (
        ("Paris", "Berlin"),
        "Berlin",
        "Germany",
    )
    assert bench.skipped == {"no_template": 1}
    assert bench.examples["no_template"] == ["fr/P30.jsonl, line 1"]
    assert len([f for f in bench.facts if f.lang in ("en", "ja", "fr")]) == 5 + 5 + 2
    none = load_benchmark(tmp_path / "m", candidates=None, langs=["en"])
    assert all(f.candidates == () for f in none.facts)
    with pytest.raises(RecordError, match=r"en[/\\]P36\.jsonl, line 2: invalid JSON"):
        load_benchmark(write_fixture("mlama_bad", tmp_path / "mb"))


def test_mpararel_patterns_and_tuples(tmp_path):
    folder = write_fixture("mpararel", tmp_path / "p")
    bench = load_benchmark(folder)
    assert bench.format == "mpararel" and bench.skipped == {}
    facts = by_key(bench.facts)
    assert facts[("P36/1", "zh")].prompt == "日本的首都是"  # zh-hans -> zh, first pattern
    assert len(bench.facts) == 6
    every = load_benchmark(folder, template_index=None, langs=["en"])
    assert [(f.id, f.prompt) for f in every.facts] == [
        ("P36/0#0", "The capital of France is"), ("P36/0#1", "France's capital city is"),
        ("P36/1#0", "The capital of Japan is"), ("P36/1#1", "Japan's capital city is"),
    ]  # fmt: skip


def test_mlama_rows_file_aliases(tmp_path):
    bench = load_benchmark(write_fixture("mlama_rows", tmp_path / "r"))
    assert bench.format == "mlama_rows"
    facts = by_key(bench.facts)
    assert facts[("P36/0", "en")].aliases == ("City of Light",)
    assert facts[("P36/0", "fr")].aliases == ()  # a repeat of the answer is dropped
    assert bench.skipped == {}  # the row in another language is read


def test_hub_path_goes_through_datasets(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    path = write_fixture("mlama_rows", tmp_path / "r")
    calls = []
    real = datasets.load_dataset

    def fake(source, name=None, split=None, **kw):  # the hub, served from a local file
        calls.append((source, name, split))
        return real("json", data_files=str(path), split="train")

    monkeypatch.setattr(datasets, "load_dataset", fake)
    assert benchmark_format("someone/mlama-rows") == "mlama_rows"
    bench = load_benchmark("someone/mlama-rows", langs=["en", "fr"], hub_split="train")
    assert calls == [("someone/mlama-rows", None, "train")]
    assert by_key(bench.facts) == by_key(load_benchmark(path, langs=["en", "fr"]).facts)
    # a datasets.Dataset passed directly, and parallel text rows (FLORES+ columns)
    ds = real("json", data_files=str(path), split="train")
    assert len(load_benchmark(ds, langs=["en"]).facts) == 2
    rows = [{"iso_639_3": "fra", "iso_15924": "Latn", "text": "Bonjour."},
            {"iso_639_3": "swh", "iso_15924": "Latn", "text": "Habari."}]  # fmt: skip
    assert load_benchmark(rows, format="flores").texts == {"fr": ["Bonjour."], "sw": ["Habari."]}


def test_hub_failure_is_a_data_error(monkeypatch):
    datasets = pytest.importorskip("datasets")

    def offline(*a, **k):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DataError, match="could not be loaded.*no network"):
        load_benchmark("nobody/nothing")
    assert benchmark_format("data/facts.jsonl") is None  # a missing file, not a hub id
    assert benchmark_format("tests/no-such-folder") is None  # tests/ exists: a local path


# --------------------------------------------------------------------------------------
# Detection and FLORES parallel text
# --------------------------------------------------------------------------------------


def test_detect_format_of_every_fixture(tmp_path):
    want = {
        "bmlama": "bmlama", "klar": "klar", "klar_flat": "klar_flat", "mlama": "mlama",
        "mpararel": "mpararel", "mlama_rows": "mlama_rows", "flores_parquet": "flores",
        "flores_classic": "flores",
    }  # fmt: skip
    for kind, fmt in want.items():
        assert detect_format(write_fixture(kind, tmp_path / kind)) == fmt, kind
    facts = tmp_path / "facts.jsonl"
    facts.write_text('{"id": "a"}\n')
    assert detect_format(facts) == "facts" and benchmark_format(str(facts)) is None
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no benchmark layout"):
        detect_format(tmp_path / "empty")
    (tmp_path / "empty" / "es-k100").mkdir()  # an experts output folder is not KLAR
    (tmp_path / "empty" / "es-k100" / "intervention.json").write_text("{}")
    with pytest.raises(DataError, match="no benchmark layout"):
        detect_format(tmp_path / "empty")


@pytest.mark.parametrize("kind", ["flores_parquet", "flores_classic"])
def test_flores_layouts_read_as_parallel_text(tmp_path, kind):
    folder = write_fixture(kind, tmp_path / kind)
    texts = read_parallel(folder)
    assert list(texts) == ["en", "fr", "es", "zh", "sw"]  # swh_Latn too, keyed sw
    assert texts["zh"] == [f"devtest: {s}" for s in FLORES_TEXT["zho_Hans"]]  # id order
    assert texts["fr"][2] == "devtest: " + FLORES_TEXT["fra_Latn"][2]
    dev = read_parallel(folder, ["en", "es"], split="dev")
    assert dev == {lg: [f"dev: {s}" for s in FLORES_TEXT[c][:3]]
                   for lg, c in (("en", "eng_Latn"), ("es", "spa_Latn"))}  # fmt: skip
    asked = read_parallel(folder, ["en", "swh_Latn"])  # asked for by its own code
    assert asked["sw"][0] == "devtest: Paka analala kwenye sofa."
    langs = parallel_languages(folder)
    assert langs["swh_Latn"] == "sw" and langs["eng_Latn"] == "en"
    assert load_benchmark(folder, langs=["en"]).texts == {"en": texts["en"]}


def test_flores_errors(tmp_path):
    with pytest.raises(DataError, match="not line-aligned"):
        read_parallel(write_fixture("flores_bad", tmp_path / "fb"))
    with pytest.raises(DataError, match="no file for language"):
        read_parallel(write_fixture("flores_classic", tmp_path / "fc"), ["ko"])
    with pytest.raises(InputError, match="split"):
        read_parallel(tmp_path / "fc", split="test")
    only_dev = tmp_path / "od" / "dev"
    only_dev.mkdir(parents=True)
    (only_dev / "eng_Latn.dev").write_text("a\n")
    with pytest.raises(DataError, match="only for 'dev'"):
        read_parallel(tmp_path / "od")
    txt = tmp_path / "txt"
    txt.mkdir()
    (txt / "en.txt").write_text("a\nb\n")
    (txt / "fr.txt").write_text("c\nd\n")
    assert read_parallel(txt) == {"en": ["a", "b"], "fr": ["c", "d"]}  # the <lang>.txt layout


# --------------------------------------------------------------------------------------
# The command line
# --------------------------------------------------------------------------------------


def test_cli_malformed_benchmark_is_one_line_exit_2(tmp_path, tiny_dir, capsys):
    folder = write_fixture("bmlama_bad", tmp_path / "b")
    out = tmp_path / "o"
    args = ["eval", "--model", str(tiny_dir), "--facts", str(folder), "--out", str(out)]
    assert main([*args, "--langs", "en,de"]) == 2
    err = capsys.readouterr().err.strip()
    assert "de.tsv, line 3" in err and len(err.splitlines()) == 1
    assert not out.exists()
    (tmp_path / "empty").mkdir()
    assert main(["eval", "--facts", str(tmp_path / "empty"), "--out", str(out)]) == 2
    assert "no benchmark layout was recognised" in capsys.readouterr().err
    flores = write_fixture("flores_classic", tmp_path / "f")
    assert main(["eval", "--facts", str(flores), "--langs", "en", "--out", str(out)]) == 2
    assert "parallel text" in capsys.readouterr().err


def test_cli_eval_on_bmlama_records_skips(tmp_path, tiny_dir, capsys):
    folder = write_fixture("bmlama", tmp_path / "b")
    out = tmp_path / "o"
    rc = main(["eval", "--model", str(tiny_dir), "--facts", str(folder), "--langs", "en,fr,zh",
               "--relation", "the_capital_of_x_is_y,x_is_located_in_y_today",
               "--max-new-tokens", "2", "--out", str(out), "--quiet"])  # fmt: skip
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["meta"]["data_format"] == "bmlama"
    assert summary["meta"]["skipped"] == {
        "gold_not_in_candidates": 1, "mask_spacing": 1, "subject_not_in_prompt": 1
    }  # fmt: skip
    assert summary["meta"]["n_facts"] == 3  # --limit keeps the ids present in all three: row 0
    assert "skipped 3 records" in capsys.readouterr().err


def test_cli_experts_and_align_on_flores_parquet(tmp_path, tiny_dir):
    data = write_fixture("flores_parquet", tmp_path / "flores")
    edir = tmp_path / "edir"
    rc = main(["experts", "--model", str(tiny_dir), "--target", "es", "--k", "3", "--parallel",
               str(data), "--langs", "en,fr,es", "--lines", "4", "--heldout", "2",
               "--samples", "2", "--sample-tokens", "2", "--ppl-budget", "1000",
               "--out", str(edir), "--quiet"])  # fmt: skip
    assert rc == 0
    summ = json.loads((edir / "summary.json").read_text())
    assert summ["meta"]["langs"] == ["en", "fr", "es"]
    assert summ["meta"]["sentences_per_lang"] == 4
    out = tmp_path / "align"
    rc = main(["align", "--model", str(tiny_dir), "--clamp", str(edir), "--parallel", str(data),
               "--langs", "en,fr,es", "--flores-split", "devtest", "--offset", "2", "--lines", "4",
               "--out", str(out), "--quiet"])  # fmt: skip
    assert rc == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["intervals"]["n_sentences"] == 4 and "es->en" in s["retrieval_top1"]["pre"]
    # the dev split has 3 lines: an --offset past them is refused before the model loads
    rc = main(["align", "--model", str(tiny_dir), "--clamp", str(edir), "--parallel", str(data),
               "--flores-split", "dev", "--offset", "5", "--out", str(tmp_path / "a2"), "--quiet"])  # fmt: skip
    assert rc == 2
