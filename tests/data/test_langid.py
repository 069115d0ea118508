"""The language of a single token (hand-made cases): the shared class, scripts, words of the
languages in use, and "none" for a piece nothing places."""

from __future__ import annotations

import pytest

from mechlingo.data.langid import SHARED, char_script, lexicon, token_language


@pytest.mark.parametrize(
    ("token", "script"),
    [
        ("a", "Latin"),
        ("ж", "Cyrillic"),
        ("λ", "Greek"),
        ("ש", "Hebrew"),
        ("ก", "Thai"),
        ("ক", "Bengali"),
        ("த", "Tamil"),
        ("ა", "Georgian"),
        ("한", "Hangul"),
        ("の", "Hiragana"),
        ("カ", "Katakana"),
        ("ー", "Hiragana"),
        ("東", "Han"),
        ("ع", "Arabic"),
        ("अ", "Devanagari"),
        ("ñ", "Latin"),
        ("7", None),
        (",", None),
        (" ", None),
        ("\u0301", None),
    ],  # fmt: skip
)
def test_char_script_is_the_unicode_script_property(token, script):
    assert char_script(token) == script


@pytest.mark.parametrize(
    ("token", "langs", "lang"),
    [
        # no letters: the same in every language
        ("2024", (), SHARED),
        (" ,", (), SHARED),
        ("\n", (), SHARED),
        (" ", (), SHARED),
        # a script one language writes
        (" ローマ", (), "ja"),
        ("서울", (), "ko"),
        (" Αθήνα", (), "el"),
        (" กรุงเทพ", (), "th"),
        (" ঢাকা", (), "bn"),
        # shared scripts: the word (templates, function words), the languages in use first
        (" the", (), "en"),
        (" Hauptstadt", (), "de"),
        (" ville", ("fr", "en"), "fr"),
        (" capitale", ("fr", "en"), "fr"),
        (" capitale", (), SHARED),  # fr and it
        (" la", ("fr", "en"), "fr"),
        (" la", (), SHARED),
        # names written the same in three or more languages: shared whatever is in use
        (" Paris", ("fr", "en"), SHARED),
        (" Tirana", ("ja", "en"), SHARED),
        (" Frankreich", ("fr", "en"), "de"),  # a name only German writes so
        # Han: the word first, else Chinese unless Japanese alone is in use
        (" 罗马", (), "zh"),
        (" 東京", (), "ja"),
        (" 首都", (), SHARED),
        (" Москва", (), "ru"),
        # nothing places a Latin word piece
        (" bibli", ("de", "en"), None),
        ("ipt", (), None),
    ],  # fmt: skip
)
def test_token_language(token, langs, lang):
    assert token_language(token, langs) == lang


def test_the_lexicon_has_template_words_and_names_apart():
    lex = lexicon()
    assert "hauptstadt" in lex["words"]["de"] and "capitale" in lex["words"]["fr"]
    assert "paris" in lex["names"]["fr"] and "paris" in lex["names"]["en"]
    assert set(lex["words"]) >= {"en", "de", "fr", "es", "it", "pt", "ru", "zh", "ja", "ko",
                                 "ar", "hi"}  # fmt: skip
