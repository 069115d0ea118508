"""A small, deterministic language identifier for prompts: script first, then words.

:func:`identify_language` tells which of the twelve bundled languages a *prompt* is in (the
Unicode script of its letters, then, for Latin script, hits in short per-language word lists,
:data:`LATIN_WORDS`; ``None`` when unsure), so that an intervention can be gated by language
(:class:`mechlingo.interventions.Gated`) when the language is not declared.
:func:`identify_languages` identifies generated text with py3langid among given languages.
It is a heuristic outside the bundled prompts (about 4% of the ``tuned`` prompts stay
ambiguous); the rule and its limits: ``docs/data.md``."""

from __future__ import annotations

import functools
import re
import unicodedata
from collections import Counter
from collections.abc import Sequence
from typing import Any

import py3langid.langid as lid

from mechlingo.core.errors import InputError

__all__ = ["LATIN_WORDS", "identify_language", "identify_languages", "script_counts"]

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


@functools.lru_cache(maxsize=4)
def _langid(langs: tuple[str, ...]) -> Any:
    ident = lid.LanguageIdentifier.from_model_file(lid.MODEL_FILE, norm_probs=True)
    unknown = [lang for lang in langs if lang not in ident.labels]
    if unknown:
        raise InputError(f"py3langid does not know language(s) {unknown}")
    ident.set_languages(list(langs))
    return ident


def identify_languages(texts: Sequence[str], langs: Sequence[str]) -> list[str | None]:
    """Language of each text (e.g. a generation) among ``langs`` by py3langid (offline,
    probabilities normalised over ``langs`` only); ``None`` for a text with no letters
    (nothing to identify).

    Raises:
        InputError: a language py3langid does not know.
    """
    ident = _langid(tuple(langs))
    out: list[str | None] = []
    for t in texts:
        if not any(ch.isalpha() for ch in t):
            out.append(None)
        else:
            out.append(ident.classify(t)[0])
    return out
