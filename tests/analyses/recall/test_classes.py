"""What a traced answer did, on hand-made cases: the shared-form class, the flags of a
continuation of the prompt's last word and of an echo of the subject, the decision point, and
the recall share the trace headline and the card's ``recall_failures`` row both read."""

from __future__ import annotations

import pytest

from mechlingo.analyses.recall.classes import (
    CLASSES,
    classify,
    failure_records,
    failure_split,
    flag_counts,
)
from mechlingo.core.answers import (
    continues_prompt,
    decision_prefix,
    echoes_subject,
    first_line,
    generation_flags,
    is_correct,
    shared_form,
)
from mechlingo.data import Fact
from mechlingo.data.fact_answers import answer_flags


def _fact(lang, subject, prompt, answer, en, aliases=()):
    return Fact(f"capital/{subject}", "capital", lang, subject, prompt, answer, answer_en=en,
                aliases=tuple(aliases), subject_span=(prompt.find(subject),
                                                      prompt.find(subject) + len(subject)))  # fmt: skip


TIRANA = _fact("fr", "Albanie", "La capitale de l'Albanie est", "Tirana", "Tirana")
LONDRES = _fact("fr", "Royaume-Uni", "La capitale du Royaume-Uni est", "Londres", "London")
STADT = _fact("de", "Bern", "Die Bibliothek steht in der Stadt", "Bern", "Bern")
TOKYO = _fact("ja", "日本", "日本の首都は", "東京", "Tokyo")
MEXICO = _fact("en", "Mexico", "The capital of Mexico is", "Mexico City", "Mexico City")


def _shared(f):
    return shared_form(f.lang, f.answers, f.answer_en)


def _echoes(generation, f):
    return echoes_subject(generation, f.subject, f.answers, f.lang)


def _cut(generation, f):
    return decision_prefix(generation, f.answers, f.lang, f.answer_en)


def test_shared_form_is_an_answer_written_as_the_english_one():
    assert _shared(TIRANA)  # fr Tirana = en Tirana: nothing to translate
    assert not _shared(LONDRES)
    assert not _shared(MEXICO)  # English is the reference, never shared with itself
    # an alias written as the English answer counts; case and spacing do not matter
    assert _shared(_fact("de", "X", "p", "Peking", "beijing ", aliases=["Beijing"]))
    assert not _shared(_fact("fr", "X", "p", "Tirana", ""))  # no English answer known


def test_a_continuation_glued_to_the_prompts_last_word_is_flagged():
    assert continues_prompt(STADT.prompt, "bibliothek von Bern", "de")
    assert not continues_prompt(STADT.prompt, " Bern", "de")  # a new word
    assert not continues_prompt(STADT.prompt, ", die Stadt", "de")  # punctuation
    assert not continues_prompt("Die Hauptstadt ist:", "Bern", "de")  # ends in punctuation
    assert not continues_prompt(TOKYO.prompt, "東京", "ja")  # no spaces between words in ja
    assert not continues_prompt(STADT.prompt, "", "de")


def test_an_answer_repeating_the_subject_is_flagged_unless_the_answer_starts_with_it():
    assert _echoes("日本の首都は東京です", TOKYO)
    assert not _echoes("東京", TOKYO)
    assert _echoes("Albanie, dont la capitale est Tirana", TIRANA)
    assert not _echoes("Albanien", TIRANA)  # the subject is not a whole word there
    assert not _echoes("Mexico City", MEXICO)  # the answer itself starts with Mexico


def test_the_decision_point_is_the_shortest_prefix_with_a_final_verdict():
    bw = _fact("en", "Botswana", "The capital of Botswana is", "Gaborone", "Gaborone")
    # "B" can no longer become "Gaborone": wrong from the first letter on
    assert _cut("Botswana is a country", bw) == "B"
    # right once the word boundary after the answer is seen
    assert _cut("Gaborone, the city", bw) == "Gaborone,"
    # "Gaborone" alone may still go on ("Gaboronex"): only the end of the line decides
    assert _cut("Gaborone", bw) == "Gaborone"
    # fr Londres: "Lond" could still be English "London", "Londr" no longer
    assert _cut("Londrina", LONDRES) == "Londri"
    for gen, f in (("Botswana is", bw), ("Londres est", LONDRES), ("Lon", LONDRES)):
        cut = _cut(gen, f)  # the verdict on the prefix is the whole line's
        assert gen.startswith(cut) and is_correct(cut + " x", f.answers, f.lang) == is_correct(
            gen, f.answers, f.lang
        )


def test_answer_flags_read_the_raw_continuation():
    got = answer_flags(STADT, "bibliothek\nmore")  # "b" could still be Bern (case is folded)
    assert got == {"shared_form": True, "continues_prompt": True, "echoes_subject": False,
                   "decided_at": "bi", "generation_lang": None}  # fmt: skip
    assert answer_flags(TOKYO, None) == {"shared_form": False, "continues_prompt": False,
                                         "echoes_subject": False, "decided_at": None,
                                         "generation_lang": None}  # fmt: skip
    assert answer_flags(TOKYO, "日本の首都")["echoes_subject"]
    # the language of the first word, for the fact's language and English
    assert answer_flags(TIRANA, " Tirana, la capitale")["generation_lang"] == "shared"
    assert answer_flags(LONDRES, " London is")["generation_lang"] == "en"  # French: Londres
    assert answer_flags(LONDRES, " the city")["generation_lang"] == "en"
    assert answer_flags(TOKYO, "東京です")["generation_lang"] == "ja"


def test_generation_flags_are_the_predicates_with_the_language_looked_up_once():
    seoul = _fact("ko", "한국", "한국의 수도는", "서울", "Seoul")  # spaces, no word boundary
    cases = [(STADT, "bibliothek\nmore"), (TOKYO, "日本の首都は東京"), (TOKYO, "東京です"),
             (MEXICO, " Mexico City is"), (LONDRES, " Londres, bien sûr"), (TIRANA, "  "),
             (seoul, "서울은 수도"), (seoul, "한국의 수도"), (seoul, "x")]  # fmt: skip
    seen = set()
    for f, gen in cases:
        line = first_line(gen)
        want = {"shared_form": shared_form(f.lang, f.answers, f.answer_en),
                "continues_prompt": continues_prompt(f.prompt, gen, f.lang),
                "echoes_subject": echoes_subject(line, f.subject, f.answers, f.lang),
                "decided_at": decision_prefix(line, f.answers, f.lang, f.answer_en)}  # fmt: skip
        got = generation_flags(f.prompt, f.subject, f.lang, f.answers, f.answer_en, gen)
        assert got == want, (f.lang, gen)
        seen |= {k for k, v in got.items() if v is True}
    assert seen == {"shared_form", "continues_prompt", "echoes_subject"}  # each flag is met
    assert first_line("  \n") == "" and first_line(" Rom\nmehr") == "Rom"
    assert continues_prompt(seoul.prompt, "x", "ko")  # Korean writes a space before answers


def _rec(lang="fr", **kw):
    base = {"id": "x", "lang": lang, "correct": False, "answered_in": None,
            "en_decodable_mid": False, "answer_decodable_mid": False}  # fmt: skip
    rec = {**base, **kw}
    rec["class"] = classify(rec)
    return rec


def test_a_wrong_shared_form_is_its_own_class_whatever_the_lens_shows():
    assert "shared_form" in CLASSES
    assert _rec(shared_form=True, en_decodable_mid=True)["class"] == "shared_form"
    assert _rec(shared_form=True)["class"] == "shared_form"  # not a recall failure either
    assert _rec(shared_form=True, correct=True)["class"] == "correct"
    assert _rec(shared_form=True, answered_in="es")["class"] == "wrong_language"
    assert _rec(en_decodable_mid=True)["class"] == "translation_failure"
    # English has no shared form: its lost answers stay recall failures or other
    assert _rec("en", shared_form=True)["class"] == "recall_failure"


RECORDS = [
    _rec(id="a"),  # recall failure
    _rec(id="b"),  # recall failure
    _rec(id="c", en_decodable_mid=True),  # translation failure
    _rec(id="d", continues_prompt=True),  # recall failure, flagged: no attempt at an answer
    _rec("de", id="e", echoes_subject=True, en_decodable_mid=True),  # flagged translation
    _rec("de", id="f", shared_form=True),  # shared form: in neither
    _rec("de", id="g"),  # recall failure
    _rec("en", id="h"),  # English: never in the split
]


def test_the_recall_share_without_and_with_the_flagged_answers():
    assert [r["id"] for r in failure_records(RECORDS)] == ["a", "b", "c", "g"]
    kept = failure_records(RECORDS, keep_flagged=True)
    assert [r["id"] for r in kept] == ["a", "b", "c", "d", "e", "g"]
    without = failure_split(RECORDS)
    assert without["fr"] == {"recall_failure": 2, "translation_failure": 1,
                             "recall_share": pytest.approx(2 / 3)}  # fmt: skip
    assert without["de"] == {"recall_failure": 1, "translation_failure": 0, "recall_share": 1.0}
    assert without["non-English"]["recall_share"] == pytest.approx(3 / 4)
    assert failure_split(RECORDS, keep_flagged=True)["non-English"] == {
        "recall_failure": 4, "translation_failure": 2, "recall_share": pytest.approx(4 / 6)}  # fmt: skip
    assert "en" not in without
    assert failure_split([_rec("fr", id="z", correct=True)])["fr"]["recall_share"] is None
    assert flag_counts(RECORDS)["fr"] == {"continues_prompt": 1, "echoes_subject": 0}


def test_the_card_row_reads_the_same_records_as_the_trace_headline():
    from mechlingo.card.stages.trace import rows_trace

    recs = [{**r, "answer": "A", "answer_en": "B", "relation": "capital", "first_en_layer": -1,
             "first_answer_layer": -1, "first_mismatch_en_layer": -1} for r in RECORDS]  # fmt: skip
    _, row = rows_trace({"records": recs})
    assert "3 recall failures, 1 translation failures" in row["details"]
    assert "2 flagged (no attempt at the answer) left out" in row["details"]
    assert "0 other (wrong language or L-only), 1 shared forms" in row["details"]


def test_the_trace_headline_gives_the_recall_share_of_the_cards_rule():
    from mechlingo.kernels.significance import wilson
    from mechlingo.report.page import Report, fmt_interval
    from mechlingo.report.trace import add_failure_split, add_trace_headline

    counts: dict[str, dict[str, int]] = {}
    for r in RECORDS:
        counts.setdefault(r["lang"], dict.fromkeys(CLASSES, 0))[r["class"]] += 1
    summary = {"classification": counts, "flags": flag_counts(RECORDS),
               "failure_split": {"without_flagged": failure_split(RECORDS),
                                 "with_flagged": failure_split(RECORDS, keep_flagged=True)}}  # fmt: skip
    rep = Report("t")
    add_trace_headline(rep, summary)
    head = dict(rep.headline)
    w = wilson(3, 4)  # a, b, g of a, b, c, g: the card's 3 recall of 4 failures
    key = "Recall failures among recall + translation failures, non-English"
    assert head[f"{key} (flagged answers left out)"] == fmt_interval(w.estimate, w.lo, w.hi, 4)
    w = wilson(4, 6)
    assert head[f"{key} (flagged answers kept)"] == fmt_interval(w.estimate, w.lo, w.hi, 6)
    add_failure_split(rep, summary)
    table = rep.parts[-1]
    assert "<td>fr</td><td>2 / 1</td><td>0.667</td><td>3 / 1</td><td>0.750</td><td>1</td>" in table
