"""A small, deterministic language identifier for prompts: script first, then words.

:func:`identify_language` tells which of the twelve bundled languages a *prompt* is in (the
Unicode script of its letters, then, for Latin script, hits in short per-language word lists,
:data:`LATIN_WORDS`; ``None`` when unsure), so that an intervention can be gated by language
(:class:`mechlingo.interventions.Gated`) when the language is not declared.
:func:`identify_languages` identifies generated text with py3langid among given languages
(a language py3langid lacks: by its own script, else :data:`UNKNOWN`, with a note).
It is a heuristic outside the bundled prompts (about 4% of the ``tuned`` prompts stay
ambiguous; ``docs/data.md``). :func:`token_language` tags a single token for the languages
in use: :data:`SHARED`, the language of its script (:func:`char_script`), or of its word in
the bundled lexicons (:func:`lexicon`); ``None`` when nothing places it
(``docs/methods/logit-lens.md``)."""

from __future__ import annotations

import functools
import json
import re
import unicodedata
import warnings
from collections import Counter
from collections.abc import Sequence
from importlib import resources
from typing import Any

import py3langid.langid as lid
import regex

__all__ = [
    "LATIN_WORDS",
    "SCRIPT_LANGUAGE",
    "SHARED",
    "SHARED_IN",
    "UNKNOWN",
    "char_script",
    "identify_language",
    "identify_languages",
    "language_id_notes",
    "lexicon",
    "script_counts",
    "token_language",
]

#: Function words and relation words per Latin-script language (lower case).
LATIN_WORDS: dict[str, frozenset[str]] = {
    "en": frozenset(
        "the of is a an in and to on by its it was are which what city country capital "
        "language official currency written continent located script".split()
    ),
    "de": frozenset(
        "die der das den dem des von ist ein eine einer und im in zu mit wird heißt "
        "hauptstadt sprache amtssprache stadt land währung kontinent geschrieben liegt "
        "schrift auf".split()
    ),
    "fr": frozenset(
        "la le les de du des est un une et en au aux avec dans pays ville capitale langue "
        "officielle monnaie situé située s'écrit l'alphabet alphabet continent écrit".split()
    ),
    "es": frozenset(
        "el la los las de del es un una y en con se escribe país ciudad capital idioma "
        "oficial moneda alfabeto continente está".split()
    ),
    "it": frozenset(
        "il lo la gli le di del della è un una e in si con trova scrive città paese "
        "capitale lingua ufficiale valuta l'alfabeto alfabeto continente".split()
    ),
    "pt": frozenset(
        "o a os as de do da dos das é um uma e em no na com país cidade capital língua "
        "oficial moeda escrita alfabeto continente fica".split()
    ),
}

_MARKS = {"de": "ßäöü", "fr": "çèêëœ", "es": "ñ¿¡", "pt": "ãõâô", "it": "ìò"}
_WORD = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)?", re.UNICODE)


def _script(ch: str) -> str | None:
    code = ord(ch)
    if 0xAC00 <= code <= 0xD7AF or 0x1100 <= code <= 0x11FF or 0x3130 <= code <= 0x318F:
        return "hangul"
    if 0x3040 <= code <= 0x30FF or 0x31F0 <= code <= 0x31FF:
        return "kana"
    if 0x4E00 <= code <= 0x9FFF or 0x3400 <= code <= 0x4DBF or 0xF900 <= code <= 0xFAFF:
        return "han"
    if 0x0600 <= code <= 0x06FF or 0x0750 <= code <= 0x077F or 0xFB50 <= code <= 0xFEFF:
        return "arabic"
    if 0x0900 <= code <= 0x097F:
        return "devanagari"
    if 0x0400 <= code <= 0x04FF:
        return "cyrillic"
    if ch.isalpha() and unicodedata.name(ch, "").startswith("LATIN"):
        return "latin"
    return None


def script_counts(text: str) -> Counter[str]:
    """Letters of ``text`` per script (``latin``, ``cyrillic``, ``han``, ``kana``,
    ``hangul``, ``arabic``, ``devanagari``)."""
    return Counter(s for s in map(_script, text) if s is not None)


_BY_SCRIPT = {"hangul": "ko", "arabic": "ar", "devanagari": "hi", "cyrillic": "ru"}


def identify_language(text: str) -> str | None:
    """The language code of ``text`` among the bundled languages, or ``None`` (see the
    module docstring for the rule)."""
    counts = script_counts(text)
    if not counts:
        return None
    cjk = counts.get("han", 0) + counts.get("kana", 0)
    best = max(counts, key=lambda s: (cjk if s in ("han", "kana") else counts[s], s == "kana"))
    if best in ("han", "kana"):
        return "ja" if counts.get("kana", 0) else "zh"
    if best != "latin":
        return _BY_SCRIPT[best]
    words = [w.lower() for w in _WORD.findall(text)]
    hits = {lg: sum(w in vocab for w in words) for lg, vocab in LATIN_WORDS.items()}
    top = max(hits.values())
    tied = [lg for lg, h in hits.items() if h == top]
    if len(tied) == 1:
        return tied[0]
    low = text.lower()
    marked = [lg for lg in tied if any(m in low for m in _MARKS.get(lg, ""))]
    return marked[0] if len(marked) == 1 else None


#: The label :func:`identify_languages` gives a text that no identifier can place among the
#: languages asked for, when one of them is outside py3langid (:func:`language_id_notes`).
UNKNOWN = "unknown"


@functools.lru_cache(maxsize=1)
def _model() -> Any:
    return lid.LanguageIdentifier.from_model_file(lid.MODEL_FILE, norm_probs=True)


def _base(lang: str) -> str:
    """py3langid's label of a language code: its first subtag (``zh-Hant`` -> ``zh``)."""
    return lang.split("-", 1)[0].split("_", 1)[0].lower()


def _split_langs(langs: Sequence[str]) -> tuple[list[str], dict[str, str], list[str]]:
    """``langs`` as (those py3langid knows, ``{script: language}`` of the others that a
    script of their own identifies (:data:`SCRIPT_LANGUAGE`), the rest)."""
    labels = set(_model().labels)
    known = [lg for lg in langs if _base(lg) in labels]
    by_script = {sc: lg for lg in langs if lg not in known
                 for sc, own in SCRIPT_LANGUAGE.items() if own == _base(lg)}  # fmt: skip
    opaque = [lg for lg in langs if lg not in known and lg not in by_script.values()]
    return known, by_script, opaque


def language_id_notes(langs: Sequence[str]) -> list[str]:
    """One line per language of ``langs`` that py3langid has no model of, saying how
    :func:`identify_languages` identifies it instead: by its own script, or not at all (its
    texts are :data:`UNKNOWN`); empty when py3langid knows every language."""
    _known, by_script, opaque = _split_langs(langs)
    notes = [f"{lg}: py3langid has no model of it; a text mostly in the {sc} script is {lg}"
             for sc, lg in by_script.items()]  # fmt: skip
    notes += [f"{lg}: py3langid has no model of it and its script is shared; a text that "
              f"py3langid places in none of the other languages is '{UNKNOWN}'"
              for lg in opaque]  # fmt: skip
    return notes


@functools.lru_cache(maxsize=4)
def _langid(langs: tuple[str, ...]) -> Any:
    ident = lid.LanguageIdentifier.from_model_file(lid.MODEL_FILE, norm_probs=True)
    ident.set_languages([_base(lg) for lg in langs])
    return ident


def _main_script(text: str) -> str | None:
    counts = Counter(sc for sc in map(char_script, text) if sc is not None)
    return counts.most_common(1)[0][0] if counts else None


def identify_languages(texts: Sequence[str], langs: Sequence[str]) -> list[str | None]:
    """Language of each text (e.g. a generation) among ``langs`` by py3langid (offline,
    probabilities normalised over ``langs`` only); ``None`` for a text with no letters
    (nothing to identify).

    A language py3langid has no model of degrades, as :func:`language_id_notes` states (and a
    warning says once per set of languages): when a script is its own (Thaana for ``dv``), a
    text mostly in that script is that language; otherwise py3langid reads the text among
    all of its languages, and a text it places in none of ``langs`` is :data:`UNKNOWN` (it
    may be in the language py3langid lacks, or in another).
    """
    known, by_script, opaque = _split_langs(langs)
    if len(known) < len(langs):
        _warn_once(tuple(langs))
    by_label = {_base(lg): lg for lg in known}
    ident = _langid(tuple(known)) if known and not opaque else _model()
    out: list[str | None] = []
    for t in texts:
        if not any(ch.isalpha() for ch in t):
            out.append(None)
            continue
        script = _main_script(t) if by_script else None
        if script in by_script:
            out.append(by_script[script])
            continue
        label = ident.classify(t)[0] if known else None
        out.append(by_label.get(label, UNKNOWN) if label is not None else UNKNOWN)
    return out


@functools.lru_cache(maxsize=64)
def _warn_once(langs: tuple[str, ...]) -> None:
    for note in language_id_notes(langs):
        warnings.warn(f"language identification: {note}", stacklevel=3)


# --------------------------------------------------------------------------------------
# The language of a single token
# --------------------------------------------------------------------------------------

#: The tag of a string written the same in several languages (numbers, punctuation, spaces,
#: most names): it tells no language apart.
SHARED = "shared"

#: Scripts told apart (Unicode ``Script`` names); a letter of any other script is ``"Other"``.
SCRIPTS = (
    "Latin Cyrillic Greek Armenian Georgian Hebrew Arabic Syriac Thaana Devanagari Bengali "
    "Gurmukhi Gujarati Oriya Tamil Telugu Kannada Malayalam Sinhala Thai Lao Tibetan Myanmar "
    "Khmer Mongolian Ethiopic Hangul Hiragana Katakana Han Tifinagh Cherokee"
).split()

#: The language a script names on its own (one main language writes it); scripts several
#: languages share (Latin, Cyrillic, Arabic, Devanagari, Han, ...) are told by words.
SCRIPT_LANGUAGE: dict[str, str] = {
    "Greek": "el", "Armenian": "hy", "Georgian": "ka", "Hebrew": "he", "Thaana": "dv",
    "Bengali": "bn", "Gurmukhi": "pa", "Gujarati": "gu", "Oriya": "or", "Tamil": "ta",
    "Telugu": "te", "Kannada": "kn", "Malayalam": "ml", "Sinhala": "si", "Thai": "th",
    "Lao": "lo", "Tibetan": "bo", "Myanmar": "my", "Khmer": "km", "Hangul": "ko",
    "Hiragana": "ja", "Katakana": "ja", "Cherokee": "chr",
}  # fmt: skip

#: The language a shared script falls back to when no word places a token and no language
#: in use writes the script (a Han token alone reads as Chinese).
SCRIPT_DEFAULT: dict[str, str] = {"Han": "zh", "Cyrillic": "ru", "Arabic": "ar",
                                  "Devanagari": "hi"}  # fmt: skip

_SCRIPT_RE = regex.compile("|".join(f"(?P<{n}>\\p{{Script_Extensions={n}}})" for n in SCRIPTS))


@functools.lru_cache(maxsize=16384)
def char_script(ch: str) -> str | None:
    """The Unicode script of one letter (a name of :data:`SCRIPTS`, the first of its
    ``Script_Extensions``: the prolonged sound mark ー is Hiragana; ``"Other"`` for a script
    not listed); ``None`` for a character that is not a letter (digits, punctuation,
    symbols, spaces and combining marks)."""
    if not (ch.isalpha() or unicodedata.category(ch) == "Lm"):
        return None
    m = _SCRIPT_RE.match(ch)
    return m.lastgroup if m is not None else "Other"


_LEX_WORD = regex.compile(r"[\p{L}\p{M}]+(?:['’][\p{L}\p{M}]+)?")


def _words(text: str) -> set[str]:
    return {w.casefold() for w in _LEX_WORD.findall(text)}


@functools.lru_cache(maxsize=1)
def lexicon() -> dict[str, dict[str, frozenset[str]]]:
    """The words (case-folded) each bundled language is known to write, in two tiers:
    ``"words"``, its function words (:data:`LATIN_WORDS`) and the words of its bundled
    prompt templates (``templates.json``, ``natural_templates.json``); and ``"names"``, the
    words of its facts' subjects and answers (``facts.jsonl``: names, many written the same
    in several languages, and some kept in English, "Port of Spain")."""
    words: dict[str, set[str]] = {lg: set(ws) for lg, ws in LATIN_WORDS.items()}
    root = resources.files("mechlingo.data")
    for name in ("templates.json", "natural_templates.json"):
        for by_lang in json.loads((root / name).read_text("utf-8"))["templates"].values():
            for lg, t in by_lang.items():
                texts = [t] if isinstance(t, str) else [t["template"], *t.get("candidates", {})]
                for text in texts:
                    words.setdefault(lg, set()).update(_words(text.replace("{s}", " ")))
    names: dict[str, set[str]] = {}
    for line in (root / "facts.jsonl").read_text("utf-8").splitlines():
        if line.strip():
            f = json.loads(line)
            names.setdefault(f["lang"], set()).update(_words(f"{f['subject']} {f['answer']}"))
    return {"words": {lg: frozenset(ws) for lg, ws in words.items()},
            "names": {lg: frozenset(ws) for lg, ws in names.items()}}  # fmt: skip


#: A name in the names of at least this many bundled languages is :data:`SHARED` whatever
#: the languages in use ("Paris" is written so in every Latin-script language).
SHARED_IN = 3


def _word_languages(word: str, langs: Sequence[str]) -> set[str] | None:
    """The languages ``word`` places a token in (``None``: no lexicon has it; several:
    shared): the languages whose template and function words have it, else those whose names
    have it (all of them from :data:`SHARED_IN` on); of these, the ones in use when any is."""
    lex = lexicon()
    w = word.casefold()
    every = {lg for lg, ws in lex["words"].items() if w in ws}
    if not every:
        every = {lg for lg, ws in lex["names"].items() if w in ws}
        if len(every) >= SHARED_IN:
            return every
    used = every & set(langs)
    return (used or every) or None


@functools.lru_cache(maxsize=65536)
def _tag(token: str, langs: tuple[str, ...]) -> str | None:
    scripts = Counter(s for s in map(char_script, token) if s is not None)
    if not scripts:
        return SHARED
    script = scripts.most_common(1)[0][0]
    if script in SCRIPT_LANGUAGE:
        return SCRIPT_LANGUAGE[script]
    found = [w for w in (_word_languages(w, langs) for w in _LEX_WORD.findall(token)) if w]
    hits = set().union(*found) if found else set()
    if len(hits) == 1:
        return hits.pop()
    if hits:
        return SHARED
    if script == "Han" and "ja" in langs and "zh" not in langs:
        return "ja"
    return SCRIPT_DEFAULT.get(script)


def token_language(token: str, langs: Sequence[str] | None = None) -> str | None:
    """The language a single token looks like, for the languages in use ``langs`` (e.g. the
    prompt's and English; the first ones are preferred where a word is in several lexicons):

    * :data:`SHARED` when it has no letters (numbers, punctuation, spaces);
    * the language its script names (:data:`SCRIPT_LANGUAGE`: kana -> ja, Hangul -> ko,
      Greek -> el, Thai -> th, ...);
    * by its word (:func:`lexicon`): the languages whose template and function words have
      it, else those whose names have it (:data:`SHARED` when :data:`SHARED_IN` or more do:
      "Paris", "Tirana"); of these the ones in use when any is ("capitale" or "la" in a
      French prompt: fr); one language is the tag, several are :data:`SHARED`;
    * for a shared script with no word found, its default language
      (:data:`SCRIPT_DEFAULT`: Han -> zh, or ja when Japanese is in use and Chinese is not;
      Cyrillic -> ru, Arabic -> ar, Devanagari -> hi);
    * ``None`` ("none") otherwise: a Latin word piece no lexicon has ("bibli", "ipt").
    """
    return _tag(token.strip(), tuple(langs or ()))
