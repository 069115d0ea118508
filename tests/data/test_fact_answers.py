"""The answers of a fact beyond its own, prepared once for the facts a trace reads (no model):
the lens tracks with the mismatched-fact control, the language a wrong answer is given in and
the flags of each greedy answer."""

from __future__ import annotations

import pytest

from mechlingo.data import Fact
from mechlingo.data.fact_answers import answer_flags, mismatch_tracks, trace_answers


def _fact(key: str, lang: str, answer: str, en: str, cands: tuple[str, ...] = ()) -> Fact:
    return Fact(f"town/{key}", "town", lang, key, f"{key}:", answer, answer_en=en,
                candidates=cands)  # fmt: skip


FACTS = [_fact("A", "fr", "Londres", "London", ("Paris", "Londres")),
         _fact("B", "fr", "Pékin", "Beijing")]  # fmt: skip


def test_trace_answers_prepares_tracks_mismatch_and_languages_once():
    pool = [_fact("B", "de", "Peking", "Beijing")]
    got = trace_answers(FACTS, [None, "Peking, die Hauptstadt"], pool)
    assert got.tracks == {"answer": ["Londres", "Pékin"], "en": ["London", "Beijing"],
                          "mismatch_en": ["Beijing", "London"]}  # fmt: skip
    assert got.mismatch == ["Beijing", "London"]
    # the wrong answer is the pool's German one; a right (None) generation is not placed
    assert got.answered_in == [None, "de"]
    # without the pool the German answer is unknown: nothing to place it in
    assert trace_answers(FACTS, [None, "Peking"], None).answered_in == [None, None]
    assert mismatch_tracks(FACTS, pool) == (got.tracks, got.mismatch)
    # nothing generated: no flag, nothing decided (the flags of candidate ranking)
    assert [f["continues_prompt"] or f["echoes_subject"] for f in got.flags] == [False, False]
    assert [f["decided_at"] for f in got.flags] == [None, None]


def test_the_flags_of_each_answer_come_with_the_answers():
    raw = [" Londres, bien sûr", "B: Pékin"]
    got = trace_answers(FACTS, [None, None], None, raw)
    assert got.flags == [answer_flags(f, c) for f, c in zip(FACTS, raw, strict=True)]
    # the second continuation starts by repeating the subject; the first is decided once
    # the word Londres has ended
    assert [f["echoes_subject"] for f in got.flags] == [False, True]
    assert got.flags[0]["decided_at"] == "Londres,"
    with pytest.raises(ValueError, match="1 continuations for 2 facts"):
        trace_answers(FACTS, [None, None], None, raw[:1])
