"""Any language: standard codes resolved by langcodes, script-based rules, facts files,
parallel text and benchmarks in languages outside the bundled twelve."""

from __future__ import annotations

import json

import pytest

from mechlingo.core.answers import answer_separator, is_correct
from mechlingo.core.errors import InputError
from mechlingo.core.languages import (
    is_lang_code,
    lang_code,
    lang_name,
    lang_script,
    native_name,
    needs_word_boundary,
    order_langs,
    writes_spaces,
)
from mechlingo.data import (
    LANGS,
    RecordError,
    load_benchmark,
    load_facts,
    read_facts,
    read_parallel,
    read_parallel_dir,
    translation_prompt,
)

#: (id key, English subject, Swedish, Swahili, English answer, Swedish answer, Swahili answer)
CAPITALS = [
    ("SE", "Sweden", "Sverige", "Uswidi", "Stockholm", "Stockholm", "Stockholm"),
    ("KE", "Kenya", "Kenya", "Kenya", "Nairobi", "Nairobi", "Nairobi"),
    ("NO", "Norway", "Norge", "Norwei", "Oslo", "Oslo", "Oslo"),
    ("FI", "Finland", "Finland", "Ufini", "Helsinki", "Helsingfors", "Helsinki"),
    ("DE", "Germany", "Tyskland", "Ujerumani", "Berlin", "Berlin", "Berlin"),
    ("TZ", "Tanzania", "Tanzania", "Tanzania", "Dodoma", "Dodoma", "Dodoma"),
    ("FR", "France", "Frankrike", "Ufaransa", "Paris", "Paris", "Paris"),
    ("IT", "Italy", "Italien", "Italia", "Rome", "Rom", "Roma"),
    ("ES", "Spain", "Spanien", "Hispania", "Madrid", "Madrid", "Madrid"),
    ("EG", "Egypt", "Egypten", "Misri", "Cairo", "Kairo", "Kairo"),
    ("JP", "Japan", "Japan", "Japani", "Tokyo", "Tokyo", "Tokyo"),
    ("CN", "China", "Kina", "China", "Beijing", "Peking", "Beijing"),
    ("RU", "Russia", "Ryssland", "Urusi", "Moscow", "Moskva", "Moscow"),
    ("UG", "Uganda", "Uganda", "Uganda", "Kampala", "Kampala", "Kampala"),
    ("DK", "Denmark", "Danmark", "Denmark", "Copenhagen", "Köpenhamn", "Copenhagen"),
    ("PL", "Poland", "Polen", "Poland", "Warsaw", "Warszawa", "Warsaw"),
    ("GR", "Greece", "Grekland", "Ugiriki", "Athens", "Aten", "Athens"),
    ("ET", "Ethiopia", "Etiopien", "Ethiopia", "Addis Ababa", "Addis Abeba", "Addis Ababa"),
    ("RW", "Rwanda", "Rwanda", "Rwanda", "Kigali", "Kigali", "Kigali"),
    ("AT", "Austria", "Österrike", "Austria", "Vienna", "Wien", "Vienna"),
    ("US", "United States", "USA", "Marekani", "Washington", "Washington", "Washington"),
    ("BR", "Brazil", "Brasilien", "Brazil", "Brasília", "Brasília", "Brasilia"),
]
STEMS = {
    "en": "The capital of {s} is",
    "sv": "Huvudstaden i {s} är",
    "swh_Latn": "Mji mkuu wa {s} ni",
}
#: a second relation: the continent of each country but Russia (English, Swedish, Swahili)
CONTINENTS = {
    "Europe": ("Europa", "Ulaya"), "Africa": ("Afrika", "Afrika"), "Asia": ("Asien", "Asia"),
    "North America": ("Nordamerika", "Amerika Kaskazini"),
    "South America": ("Sydamerika", "Amerika Kusini"),
}  # fmt: skip
CONTINENT_OF = {"KE": "Africa", "TZ": "Africa", "EG": "Africa", "UG": "Africa", "ET": "Africa",
                "RW": "Africa", "JP": "Asia", "CN": "Asia", "US": "North America",
                "BR": "South America"}  # fmt: skip
CONTINENT_STEMS = {"en": "{s} is a country in", "sv": "{s} ligger i",
                   "swh_Latn": "{s} iko katika bara la"}  # fmt: skip

#: line-aligned sentences in English, Swedish and Swahili (a FLORES-style file name)
PARALLEL = {
    "en": ["The cat sleeps on the sofa.", "It is raining in the city today.",
           "We read a book every evening.", "The train leaves at eight o'clock.",
           "My sister works at the hospital.", "The children play in the park.",
           "This soup is very hot.", "They bought a new house last year."],
    "sv": ["Katten sover på soffan.", "Det regnar i staden i dag.", "Vi läser en bok varje kväll.",
           "Tåget går klockan åtta.", "Min syster arbetar på sjukhuset.", "Barnen leker i parken.",
           "Den här soppan är mycket varm.", "De köpte ett nytt hus förra året."],
    "swh_Latn": ["Paka analala kwenye sofa.", "Mvua inanyesha mjini leo.",
                 "Tunasoma kitabu kila jioni.", "Treni inaondoka saa mbili.",
                 "Dada yangu anafanya kazi hospitalini.", "Watoto wanacheza bustanini.",
                 "Supu hii ni moto sana.", "Walinunua nyumba mpya mwaka jana."],
}  # fmt: skip


def fact_records(
    english: bool = True, answer_en: bool = True, continents: bool = False
) -> list[dict]:
    """The Swedish and Swahili capitals (and English rows; with ``continents`` the countries'
    continents too) in the documented JSONL format."""
    rows = []
    for key, en, sv, sw, a_en, a_sv, a_sw in CAPITALS:
        facts = [("capital", STEMS, {"en": (en, a_en), "sv": (sv, a_sv), "swh_Latn": (sw, a_sw)})]
        cont = CONTINENT_OF.get(key, "Europe")
        if continents and key != "RU":
            names = {"en": (en, cont), "sv": (sv, CONTINENTS[cont][0]),
                     "swh_Latn": (sw, CONTINENTS[cont][1])}  # fmt: skip
            facts.append(("continent", CONTINENT_STEMS, names))
        for relation, stems, cells in facts:
            for lang, (subject, answer) in cells.items():
                if lang == "en" and not english:
                    continue
                row = {"id": f"{relation}/{key}", "relation": relation, "lang": lang,
                       "subject": subject, "prompt": stems[lang].format(s=subject),
                       "answer": answer}  # fmt: skip
                if answer_en:
                    row["answer_en"] = cells["en"][1]
                rows.append(row)
    return rows


def write_facts(path, rows) -> str:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    return str(path)


def write_parallel(folder) -> str:
    folder.mkdir()
    for code, lines in PARALLEL.items():
        (folder / f"{code}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(folder)


@pytest.mark.parametrize(
    ("code", "canonical"),
    [("sv", "sv"), ("swe", "sv"), ("swh_Latn", "sw"), ("swh", "sw"), ("zh-Hans", "zh"),
     ("zho_Hans", "zh"), ("zho_Hant", "zh-Hant"), ("sr-Latn", "sr-Latn"), ("sr", "sr"),
     ("en-US", "en"), ("pt-PT", "pt-PT"), ("iw", "he"), ("fin_Latn", "fi"), ("ZH-hans", "zh")],
)  # fmt: skip
def test_codes_resolve_to_one_canonical_form(code, canonical):
    assert lang_code(code) == canonical


@pytest.mark.parametrize("code", ["xx", "", "und", "123", "english"])
def test_a_code_that_names_no_language_is_refused(code):
    assert not is_lang_code(code)
    with pytest.raises(InputError, match="not a language code"):
        lang_code(code)


def test_script_names_and_word_spacing():
    # script: the code's own, else CLDR's likely one
    assert [lang_script(c) for c in ("sv", "sr-Latn", "sr", "ja", "th", "ko", "zh-Hant")] == [
        "Latn", "Latn", "Cyrl", "Jpan", "Thai", "Kore", "Hant"]  # fmt: skip
    assert [writes_spaces(c) for c in ("sv", "sw", "zh", "ja", "th", "km", "my", "ko")] == [
        True, True, False, False, False, False, False, True]  # fmt: skip
    # Korean writes spaces but its particles attach: no word boundary needed after an answer
    assert [needs_word_boundary(c) for c in ("sv", "ko", "th", "ja")] == [True, False, False, False]
    assert writes_spaces(None) and needs_word_boundary("not a code")
    assert lang_name("sv") == "Swedish" and lang_name("zh") == "Chinese"
    assert native_name("sv") == "Svenska" and native_name("sw") == "Kiswahili"
    assert order_langs({"sw", "en", "fi", "ja"}) == ["en", "ja", "fi", "sw"]
    # the bundled rules are what they were
    assert answer_separator("zh") == "" and answer_separator("ko") == " "
    assert answer_separator("th") == "" and answer_separator("sv") == " "


def test_eval_rule_in_a_new_language():
    assert is_correct(" Stockholm är", ["Stockholm"], "sv")
    assert not is_correct(" Stockholmsregionen", ["Stockholm"], "sv")  # a longer word
    assert is_correct("กรุงเทพมหานครเป็น", ["กรุงเทพมหานคร"], "th")  # Thai: no boundary


def test_facts_file_in_swedish_and_swahili(tmp_path):
    facts = read_facts(write_facts(tmp_path / "f.jsonl", fact_records()))
    assert [f.lang for f in facts[:3]] == ["en", "sv", "sw"]  # swh_Latn stored as sw
    assert len(facts) == 3 * len(CAPITALS)
    sv = load_facts(langs=["sv", "swh_Latn"], path=tmp_path / "f.jsonl")
    assert {f.lang for f in sv} == {"sv", "sw"} and len(sv) == 2 * len(CAPITALS)
    assert sv[0].sentence == "Huvudstaden i Österrike är Wien"
    # translation prompts label a language by its own name (CLDR), English by default
    assert translation_prompt(sv[0]) == "English: Vienna\nSvenska:"
    assert translation_prompt(sv[0], labels="en") == "English: Vienna\nSwedish:"


def test_english_rows_of_the_file_give_english_answers_when_langs_leave_en_out(tmp_path):
    path = write_facts(tmp_path / "f.jsonl", fact_records(answer_en=False))
    sw = load_facts(langs=["sw"], path=path)
    assert [(f.id, f.answer_en, f.subject_en) for f in sw][:2] == [
        ("capital/AT", "Vienna", "Austria"), ("capital/BR", "Brasília", "Brazil")]  # fmt: skip


def test_every_problem_of_a_file_in_one_error(tmp_path):
    good = fact_records()[:2]
    rows = [
        {**good[0], "answers": ["x"]},  # unknown field: nearest is 'answer'
        {**good[1], "alias": "y"},  # nearest is 'aliases'
        {**good[1], "lang": "xx", "id": "capital/ZZ"},  # not a language
        {**good[0], "prompt": good[0]["prompt"] + " "},  # trailing space
    ]
    path = tmp_path / "bad.jsonl"
    write_facts(path, rows)
    with path.open("a") as handle:
        handle.write("not json\n")
        handle.write(json.dumps(good[0]) + "\n")  # repeats line 1's (id, lang)
    with pytest.raises(RecordError) as err:
        read_facts(path)
    text = str(err.value)
    assert text.startswith(f"{path}: 6 problems")
    for needle in ("line 1: field 'answers'", "did you mean 'answer'?", "line 2: field 'alias'",
                   "did you mean 'aliases'?", "line 3: field 'lang' has unknown language 'xx'",
                   "line 4: field 'prompt' ends with whitespace", "line 5: invalid JSON",
                   "line 6: field 'id' repeats"):  # fmt: skip
        assert needle in text, needle


def test_problems_are_capped(tmp_path):
    rows = [{**fact_records()[0], "id": f"capital/{i}", "lang": "xx"} for i in range(30)]
    with pytest.raises(RecordError) as err:
        read_facts(write_facts(tmp_path / "bad.jsonl", rows))
    lines = str(err.value).split("\n")
    assert lines[0].endswith("30 problems (the first 20 listed)") and len(lines) == 21


def test_parallel_text_in_any_language(tmp_path):
    folder = write_parallel(tmp_path / "par")
    (tmp_path / "par" / "README.txt").write_text("not a language\n")
    texts = read_parallel(folder)
    assert list(texts) == ["en", "sv", "sw"] and texts["sw"] == PARALLEL["swh_Latn"]
    assert list(read_parallel_dir(folder, ["sw", "sv"])) == ["sw", "sv"]  # sw finds swh_Latn
    assert list(read_parallel(folder, ["swh_Latn"])) == ["sw"]


def test_benchmark_loader_keeps_every_language(tmp_path):
    """An mLAMA-layout folder with Swedish and Swahili besides English: all three read."""
    root = tmp_path / "mlama"
    for lang, template in (("en", "The capital of [X] is [Y] ."), ("sv", "Huvudstaden i [X] är [Y] ."),
                           ("sw", "Mji mkuu wa [X] ni [Y] ."), ("qq", "[X] [Y]")):  # fmt: skip
        (root / lang).mkdir(parents=True)
        (root / lang / "templates.jsonl").write_text(
            json.dumps({"relation": "P36", "template": template}) + "\n", encoding="utf-8"
        )
        rows = [{"sub_label": s, "obj_label": o, "uuid": f"u{i}"}
                for i, (s, o) in enumerate([("Kenya", "Nairobi"), ("Norge", "Oslo")])]  # fmt: skip
        (root / lang / "P36.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    bench = load_benchmark(root)
    assert sorted({f.lang for f in bench.facts}) == ["en", "sv", "sw"]
    assert bench.unsupported_langs == ("qq",)  # qq is no language code
    assert "sv" not in LANGS


def test_answer_tokens_follow_the_script(tiny):
    """Thai continues without a space (like zh/ja), Swedish and Swahili with one: the
    continuation form's token count tells them apart (the tiny tokenizer writes a space as a
    token of its own)."""
    from mechlingo.core.answers import answer_tokens

    def count(text: str) -> int:
        return len(tiny.to_tokens(text, prepend_bos=False)[0])

    assert count(" กรุงเทพ") == count("กรุงเทพ") + 1
    assert answer_tokens(tiny, "กรุงเทพ", lang="th").n_tokens == count("กรุงเทพ")
    for lang in ("sv", "swh_Latn"):
        assert answer_tokens(tiny, "Stockholm", lang=lang).n_tokens == count(" Stockholm")
