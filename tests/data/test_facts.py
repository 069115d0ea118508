"""Tests of the bundled facts, the loaders and the prompt builders (fast, no model)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from mechlingo.core.answers import answer_key
from mechlingo.data import (
    LANG_NAMES,
    LANGS,
    RELATIONS,
    Fact,
    RecordError,
    bundled_path,
    fact_from_mapping,
    few_shot_prompt,
    from_dataset,
    load_facts,
    parallel_sentences,
    read_jsonl,
    read_parallel_dir,
    read_tsv,
    template_info,
    to_dataset,
    translation_prompt,
    write_jsonl,
    write_tsv,
    zero_shot_prompt,
)
from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
NTREX = Path("/work/shared/data/ntrex/dev")


@pytest.fixture(scope="module")
def facts() -> list[Fact]:
    return load_facts()


def _record(**changes: object) -> dict[str, object]:
    record: dict[str, object] = {
        "id": "capital/IT",
        "relation": "capital",
        "lang": "en",
        "subject": "Italy",
        "prompt": "The capital of Italy is the city of",
        "answer": "Rome",
    }
    record.update(changes)
    return {k: v for k, v in record.items() if v is not None}


def _write_lines(path: Path, records: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), "utf-8")
    return path


# --- the bundled file -------------------------------------------------------------------


def test_bundled_file_is_small() -> None:
    assert bundled_path().stat().st_size < 4_000_000


def test_languages_and_relations(facts: list[Fact]) -> None:
    assert len(LANGS) == 12 and set(LANG_NAMES) == set(LANGS)
    assert len(RELATIONS) >= 6
    assert {f.relation for f in facts} == set(RELATIONS)
    assert {f.lang for f in facts} == set(LANGS)


def test_every_id_in_all_languages(facts: list[Fact]) -> None:
    langs_of: dict[str, list[str]] = defaultdict(list)
    for fact in facts:
        langs_of[fact.id].append(fact.lang)
    for fid, langs in langs_of.items():
        assert sorted(langs) == sorted(LANGS), fid


def test_record_invariants(facts: list[Fact]) -> None:
    for fact in facts:
        start, end = fact.subject_span
        assert fact.prompt[start:end] == fact.subject, fact
        assert fact.prompt == fact.prompt.rstrip(), fact
        assert fact.prompt == fact.prompt.lstrip(), fact
        assert fact.answer.strip() and fact.answer == fact.answer.strip(), fact
        assert fact.answer_en and fact.subject_en, fact
        assert fact.id.startswith(fact.relation + "/"), fact
        assert all(a and a != fact.answer for a in fact.aliases), fact
        assert zero_shot_prompt(fact) == fact.prompt


def test_counts_per_relation(facts: list[Fact]) -> None:
    ids = Counter(f.relation for f in facts if f.lang == "en")
    assert ids["capital"] >= 100
    for relation in ("language", "currency", "continent", "city_country", "script"):
        assert ids[relation] >= 100, (relation, ids[relation])


def test_same_template_within_language_and_relation(facts: list[Fact]) -> None:
    info = template_info()["templates"]
    for fact in facts:
        template = info[fact.relation][fact.lang]["template"]
        start = template.index("{s}")
        assert fact.prompt == template[:start] + fact.subject + template[start + 3 :]


def test_known_facts(facts: list[Fact]) -> None:
    by_key = {(f.id, f.lang): f for f in facts}
    assert by_key[("capital/IT", "en")].answer == "Rome"
    assert by_key[("capital/IT", "de")].answer == "Rom"
    assert by_key[("capital/FR", "ja")].answer == "パリ"
    assert by_key[("continent/BR", "en")].answer == "South America"
    assert by_key[("script/ru", "en")].answer == "Cyrillic"
    assert by_key[("currency/JP", "en")].answer_en == "Japanese Yen"


# --- load_facts -------------------------------------------------------------------------


def test_load_filters_and_order() -> None:
    facts = load_facts(langs=["fr", "en"], relations="capital")
    assert {f.lang for f in facts} == {"fr", "en"}
    assert {f.relation for f in facts} == {"capital"}
    assert [f.lang for f in facts[:2]] == ["fr", "en"]
    assert facts == sorted(facts, key=lambda f: (f.id, f.lang != "fr"))


def test_limit_keeps_languages_aligned() -> None:
    facts = load_facts(langs=["en", "zh", "ar"], limit=5)
    per_lang: dict[str, list[str]] = defaultdict(list)
    for fact in facts:
        per_lang[fact.lang].append(fact.id)
    assert per_lang["en"] == per_lang["zh"] == per_lang["ar"]
    counts = Counter(fid.split("/")[0] for fid in per_lang["en"])
    assert set(counts.values()) == {5} and set(counts) == set(RELATIONS)
    first = sorted({f.id for f in load_facts(langs=["en"], relations="capital")})[:5]
    assert [i for i in per_lang["en"] if i.startswith("capital/")] == first


def test_unknown_language_and_relation() -> None:
    with pytest.raises(ValueError, match="xx") as err:
        load_facts(langs=["en", "xx"])
    assert "fr" in str(err.value)  # lists the valid languages
    with pytest.raises(ValueError, match="nonsense") as err:
        load_facts(relations=["nonsense"])
    assert "capital" in str(err.value)


def test_empty_selection_says_what_was_asked(tmp_path: Path) -> None:
    path = _write_lines(tmp_path / "one.jsonl", [_record()])
    with pytest.raises(ValueError, match="no facts.*'de'"):
        load_facts(langs=["de"], path=path)
    with pytest.raises(ValueError, match="limit"):
        load_facts(limit=0)


def test_load_user_file(tmp_path: Path) -> None:
    path = _write_lines(tmp_path / "mine.jsonl", [_record(), _record(lang="fr", prompt="X Italy")])
    facts = load_facts(path=path)
    assert [f.lang for f in facts] == ["en", "fr"]
    assert facts[1].subject_span == (2, 7)  # derived from the prompt


# --- file formats -----------------------------------------------------------------------


def test_round_trips(tmp_path: Path) -> None:
    facts = load_facts(limit=4)
    write_jsonl(facts, tmp_path / "f.jsonl")
    assert read_jsonl(tmp_path / "f.jsonl") == facts
    write_tsv(facts, tmp_path / "f.tsv")
    assert read_tsv(tmp_path / "f.tsv") == facts
    assert load_facts(path=tmp_path / "f.tsv") == facts
    assert from_dataset(to_dataset(facts)) == facts


def test_tsv_escapes_newlines_and_tabs(tmp_path: Path) -> None:
    fact = Fact(
        "r/1",
        "capital",
        "en",
        "It\taly",
        "Country: It\taly\nCapital:",
        "Ro\\me",
        subject_span=(9, 15),
    )
    write_tsv([fact], tmp_path / "x.tsv")
    assert len((tmp_path / "x.tsv").read_text("utf-8").splitlines()) == 2
    assert read_tsv(tmp_path / "x.tsv") == [fact]


def test_optional_fields_default(tmp_path: Path) -> None:
    [fact] = read_jsonl(_write_lines(tmp_path / "a.jsonl", [_record()]))
    assert fact.aliases == () and fact.answer_en == "" and fact.subject_span == (15, 20)


@pytest.mark.parametrize(
    ("record", "field"),
    [
        (_record(answer=None), "answer"),
        (_record(lang="xx"), "lang"),
        (_record(prompt="The capital of Italy is "), "prompt"),
        (_record(subject="Spain"), "subject_span"),
        (_record(subject_span=[0, 3]), "subject_span"),
        (_record(aliases=[1, 2]), "aliases"),
        (_record(answer=""), "answer"),
    ],
)
def test_bad_jsonl_names_file_line_field(tmp_path: Path, record: dict, field: str) -> None:
    path = _write_lines(tmp_path / "bad.jsonl", [_record(id="ok/1"), record])
    with pytest.raises(ValueError) as err:
        read_jsonl(path)
    message = str(err.value)
    assert "bad.jsonl" in message and "line 2" in message and f"'{field}'" in message


def test_bad_json_and_duplicates(tmp_path: Path) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text('{"id": 1\n', "utf-8")
    with pytest.raises(ValueError, match="broken.jsonl, line 1: invalid JSON"):
        read_jsonl(path)
    path = _write_lines(tmp_path / "dup.jsonl", [_record(), _record()])
    with pytest.raises(ValueError, match="line 2.*'id'.*first on line 1"):
        read_jsonl(path)


def test_bad_tsv_names_file_line_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.tsv"
    header = "id\trelation\tlang\tsubject\tprompt\tanswer\n"
    path.write_text(
        header + "a/1\tcapital\ten\tItaly\tItaly is\tRome\n" + "a/2\tcapital\tq\tX\tX\tY\n"
    )
    with pytest.raises(ValueError, match=r"bad\.tsv, line 3: field 'lang'"):
        read_tsv(path)
    path.write_text("id\trelation\tlang\tsubject\tprompt\n" + "a/1\tcapital\ten\tItaly\tItaly is\n")
    with pytest.raises(ValueError, match=r"bad\.tsv, line 2: field 'answer' is missing"):
        read_tsv(path)
    path.write_text(header + "a/1\tcapital\ten\n")
    with pytest.raises(ValueError, match="line 2: has 3 columns"):
        read_tsv(path)


def test_unknown_extension(tmp_path: Path) -> None:
    (tmp_path / "x.csv").write_text("")
    with pytest.raises(ValueError, match="extension"):
        load_facts(path=tmp_path / "x.csv")


# --- prompts ----------------------------------------------------------------------------


def test_few_shot_excludes_query_and_matches_relation_lang() -> None:
    pool = load_facts(relations=["capital", "currency"], limit=20)
    query = next(f for f in pool if f.lang == "de" and f.relation == "capital")
    prompt = few_shot_prompt(query, pool, k=4, seed=1, sep=" ### ")
    parts = prompt.split(" ### ")
    assert len(parts) == 5 and parts[-1] == query.prompt
    demos = {f.sentence: f for f in pool}
    used = [demos[p] for p in parts[:-1]]
    assert all(d.relation == "capital" and d.lang == "de" and d.id != query.id for d in used)
    assert len({d.id for d in used}) == 4
    assert prompt == few_shot_prompt(query, pool, k=4, seed=1, sep=" ### ")  # deterministic
    assert prompt != few_shot_prompt(query, pool, k=4, seed=2, sep=" ### ")
    assert query.sentence not in prompt


def test_few_shot_multiline_templates_and_errors() -> None:
    pool = load_facts(langs=["en"], relations="capital", limit=3)
    query = pool[0]
    prompt = few_shot_prompt(query, pool, k=2, sep="\n\n")
    assert prompt.endswith(query.prompt) and prompt.count("\n\n") == 2
    with pytest.raises(ValueError, match="pool has 2 facts"):
        few_shot_prompt(query, pool, k=3)
    assert few_shot_prompt(query, pool, k=0) == query.prompt


def test_zh_ja_answers_follow_without_space() -> None:
    [zh] = load_facts(langs="zh", relations="capital", limit=1)
    [fr] = load_facts(langs="fr", relations="capital", limit=1)
    assert zh.sentence == zh.prompt + zh.answer
    assert fr.sentence == fr.prompt + " " + fr.answer


def test_translation_prompt() -> None:
    facts = load_facts(langs=["en", "fr", "de"], relations="capital", limit=10)
    query = next(f for f in facts if f.lang == "fr")
    assert translation_prompt(query) == f"English: {query.answer_en}\nFrançais:"
    assert translation_prompt(query, labels="en") == f"English: {query.answer_en}\nFrench:"
    de_answer = next(f.answer for f in facts if f.id == query.id and f.lang == "de")
    assert translation_prompt(query, src="de", pool=facts, labels="en").startswith(
        f"German: {de_answer}\n"
    )
    assert translation_prompt(query, src="de").startswith(f"Deutsch: {de_answer}\n")
    shots = translation_prompt(query, k=3, pool=facts, labels="en")
    lines = shots.split("\n")
    assert len(lines) == 8 and lines[-1] == "French:" and lines[-2] == f"English: {query.answer_en}"
    assert all(line.startswith(("English: ", "French: ")) for line in lines[:-1])
    demos = [(lines[i][9:], lines[i + 1][8:]) for i in range(0, 6, 2)]
    assert all(src != tgt for src, tgt in demos)  # words that change in translation first
    with pytest.raises(ValueError, match="pool"):
        translation_prompt(query, k=2)


def test_parallel_sentences_aligned() -> None:
    texts = parallel_sentences(["en", "ja", "hi"], relations=["capital"], limit=7)
    assert [len(v) for v in texts.values()] == [7, 7, 7]
    facts = load_facts(langs=["en", "ja"], relations="capital", limit=7)
    en = [f for f in facts if f.lang == "en"]
    assert texts["en"][3] == en[3].sentence.replace("\n", " ")
    assert all("\n" not in line for lines in texts.values() for line in lines)


def test_aliases() -> None:
    by_id = {f.id: f for f in load_facts(langs="en", relations=["currency", "city_country"])}
    assert {"Yen", "JPY"} <= set(by_id["currency/JP"].aliases)
    assert "Bosnia and Herzegovina" in by_id["city_country/Europe/Sarajevo"].aliases
    assert "dollar" not in {a.casefold() for a in by_id["currency/US"].aliases}  # shared
    assert answer_key("  N’Djamena!") == "ndjamena"


# --- parallel text ----------------------------------------------------------------------


def test_read_parallel_dir(tmp_path: Path) -> None:
    (tmp_path / "en.txt").write_text("a\nb\n", "utf-8")
    (tmp_path / "fr.txt").write_text("x\ny\n", "utf-8")
    assert read_parallel_dir(tmp_path) == {"en": ["a", "b"], "fr": ["x", "y"]}
    with pytest.raises(ValueError, match="de"):
        read_parallel_dir(tmp_path, langs=["en", "de"])
    (tmp_path / "de.txt").write_text("only one\n", "utf-8")
    with pytest.raises(ValueError, match="line counts"):
        read_parallel_dir(tmp_path)


@pytest.mark.skipif(not NTREX.is_dir(), reason="NTREX dev set not present")
def test_read_parallel_dir_ntrex() -> None:
    texts = read_parallel_dir(NTREX)
    assert list(texts) == list(LANGS)
    assert len({len(v) for v in texts.values()}) == 1 and len(texts["en"]) > 100


# --- the generator ----------------------------------------------------------------------


def test_generator_is_deterministic_and_matches_bundle(tmp_path: Path) -> None:
    import babel

    gen = load_script("generate_data")
    gen.generate(tmp_path / "a")
    gen.generate(tmp_path / "b")
    for name in ("facts.jsonl", "templates.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    recorded = template_info()["source"]["babel"]
    if recorded != babel.__version__:
        pytest.skip(f"bundle made with Babel {recorded}, installed {babel.__version__}")
    bundled = bundled_path().read_bytes()
    assert (tmp_path / "a" / "facts.jsonl").read_bytes() == bundled, "rerun generate_data.py"


def test_generator_templates_have_one_subject_slot() -> None:
    gen = load_script("generate_data")
    for relation, per_lang in gen.CANDIDATES.items():
        assert set(per_lang) == set(LANGS), relation
        for lang, templates in per_lang.items():
            for template in templates:
                assert template.count("{s}") == 1 and template == template.rstrip(), (
                    relation,
                    lang,
                )


def test_fact_from_cloze() -> None:
    from mechlingo.data import fact_from_cloze

    fact = fact_from_cloze(
        id="P36/1",
        relation="capital",
        lang="en",
        template="The capital of [X] is [Y] .",
        subject="Italy",
        answer="Rome",
    )
    assert fact.prompt == "The capital of Italy is" and fact.subject_span == (15, 20)
    with pytest.raises(ValueError, match="after"):
        fact_from_cloze(
            id="P1/1",
            relation="r",
            lang="en",
            template="[Y] is the capital of [X].",
            subject="Italy",
            answer="Rome",
        )


def test_cloze_fields_round_trip_and_fill(tmp_path: Path) -> None:
    rec = {
        "id": "capital/FR",
        "relation": "capital",
        "lang": "ja",
        "subject": "フランス",
        "prompt": "フランスの首都は",
        "answer": "パリ",
        "suffix": "です。",
        "candidates": ["ロンドン", "パリ"],
    }
    fact = fact_from_mapping(rec)
    assert fact.suffix == "です。" and fact.candidates == ("ロンドン", "パリ")
    assert fact.filled("ロンドン") == "フランスの首都はロンドンです。"
    assert fact.sentence == "フランスの首都はパリです。"
    head = fact_from_mapping(
        {
            **rec,
            "lang": "en",
            "prompt": "",
            "subject": "France",
            "answer": "Paris",
            "suffix": " is the capital of France.",
            "candidates": "Paris|London",
        }
    )
    assert head.filled("London") == "London is the capital of France."
    assert head.subject_span == (0, 0)
    for path in (tmp_path / "f.jsonl", tmp_path / "f.tsv"):
        (write_jsonl if path.suffix == ".jsonl" else write_tsv)([fact], path)
    assert read_jsonl(tmp_path / "f.jsonl") == [fact]
    assert read_tsv(tmp_path / "f.tsv") == [fact]
    plain = load_facts(langs=["en"], relations=["capital"], limit=1)[0]
    assert "suffix" not in plain.to_json() and "candidates" not in plain.to_json()
    with pytest.raises(RecordError, match="candidates"):
        fact_from_mapping({**rec, "candidates": ["ロンドン"]})
    with pytest.raises(RecordError, match="prompt"):
        fact_from_mapping({**rec, "prompt": "", "suffix": ""})


def test_answer_key_drops_arabic_vowel_marks_and_tatweel():
    from mechlingo.core.answers import answer_key

    assert answer_key("\u0645\u064f\u062d\u064e\u0645\u0651\u064e\u062f") == answer_key(
        "\u0645\u062d\u0645\u062f"
    )
    assert answer_key("\u0645\u0640\u062d\u0645\u062f") == answer_key("\u0645\u062d\u0645\u062f")
