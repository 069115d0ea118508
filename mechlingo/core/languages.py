"""Languages: standard codes, names, scripts and word-boundary rules for any language.

:func:`lang_code` accepts BCP 47 / ISO 639 tags (``sv``, ``swe``, ``pt-BR``, ``zh-Hans``,
``sr-Latn``) and FLORES codes (``swh_Latn``) and returns one canonical form: the shortest tag
that means the same language and script (CLDR's "remove likely subtags", favouring the
script): ``swh_Latn`` -> ``sw``, ``zho_Hans`` -> ``zh``, ``en-US`` -> ``en``; ``zh-Hant``,
``sr-Latn`` and ``pt-PT`` stay. Codes are resolved by ``langcodes``, not by a table here.

What depends on the language is told from its script (:func:`lang_script`): scripts in
:data:`SPACELESS_SCRIPTS` write no space between words, so an answer follows its prompt
directly and needs no word boundary after it; Korean writes spaces but attaches particles
to a noun, so it needs no word boundary either (:func:`needs_word_boundary`). The rules and
what degrades for a language without bundled data: ``docs/data.md``.
"""

from __future__ import annotations

import difflib
from functools import lru_cache

import langcodes

from mechlingo.core.errors import InputError

__all__ = [
    "BUNDLED_NAMES",
    "SPACELESS_SCRIPTS",
    "is_lang_code",
    "lang_code",
    "lang_name",
    "lang_script",
    "native_name",
    "needs_word_boundary",
    "order_langs",
    "writes_spaces",
]

#: English names of the twelve languages of the bundled data, in the bundled order (what
#: reports and translation prompts call them; other languages are named by ``langcodes``).
BUNDLED_NAMES: dict[str, str] = {
    "en": "English",
    "de": "German",
    "fr": "French",
    "es": "Spanish",
    "it": "Italian",
    "pt": "Portuguese",
    "ru": "Russian",
    "zh": "Chinese",
    "ja": "Japanese",
    "ko": "Korean",
    "ar": "Arabic",
    "hi": "Hindi",
}

#: ISO 15924 scripts written without spaces between words: Han (simplified, traditional),
#: Japanese and its kana, Thai, Lao, Khmer, Myanmar, Tibetan, and the Balinese, Javanese and
#: Sundanese-era Brahmic scripts that run words together (``scriptio continua``).
SPACELESS_SCRIPTS: frozenset[str] = frozenset(
    {"Hani", "Hans", "Hant", "Jpan", "Hira", "Kana", "Thai", "Laoo", "Khmr", "Mymr", "Tibt"}
    | {"Bali", "Java", "Lana", "Talu", "Tale"}
)
#: Scripts written with spaces whose words take attached particles (Korean ``서울은``): an
#: answer is matched without a word boundary after it, as in the spaceless scripts.
_PARTICLE_SCRIPTS = frozenset({"Kore", "Hang"})


@lru_cache(maxsize=4096)
def _resolve(code: str) -> str | None:
    """The canonical tag of ``code`` (see the module docstring), ``None`` if not a language."""
    text = code.strip().replace("_", "-")
    if not text or text.lower() in ("und", "mul", "zxx", "mis"):
        return None
    try:
        tag = langcodes.Language.get(langcodes.standardize_tag(text, macro=True))
    except (ValueError, LookupError):
        return None
    if not tag.is_valid() or tag.language is None or tag.extlangs or tag.variants:
        return None
    full = tag.maximize()
    base = tag.language
    for candidate in (base, f"{base}-{full.script}", f"{base}-{full.territory}"):
        if langcodes.Language.get(candidate).maximize() == full:
            return candidate
    return str(tag.to_tag())


def is_lang_code(code: str) -> bool:
    """Whether ``code`` names a language (any form :func:`lang_code` accepts)."""
    return isinstance(code, str) and _resolve(code) is not None


def lang_code(code: str, where: str = "language") -> str:
    """The canonical code of a language tag (see the module docstring).

    Raises:
        InputError: (a ``ValueError``) ``code`` is not a language tag; the message suggests
            close bundled codes.
    """
    canonical = _resolve(code) if isinstance(code, str) else None
    if canonical is None:
        near = difflib.get_close_matches(str(code).lower(), list(BUNDLED_NAMES), n=2)
        hint = f" (did you mean {' or '.join(near)}?)" if near else ""
        raise InputError(
            f"{where} {code!r} is not a language code{hint}",
            fix="use an ISO 639 / BCP 47 code such as sv, sw, fi, zh-Hant or sr-Latn, or a "
            "FLORES code such as swh_Latn",
        )
    return canonical


@lru_cache(maxsize=1024)
def lang_script(code: str) -> str:
    """The ISO 15924 script of a language: the code's own (``sr-Latn`` -> ``Latn``) or its
    likely one by CLDR (``sv`` -> ``Latn``, ``ja`` -> ``Jpan``, ``th`` -> ``Thai``).

    Raises:
        InputError: ``code`` is not a language code.
    """
    return str(langcodes.Language.get(lang_code(code)).maximize().script)


def _script_or_none(code: str | None) -> str | None:
    return lang_script(code) if code is not None and is_lang_code(code) else None


def writes_spaces(code: str | None) -> bool:
    """Whether the language's script separates words (and an answer from its prompt) by
    spaces: ``False`` for the scripts of :data:`SPACELESS_SCRIPTS` (Chinese, Japanese, Thai,
    Khmer, ...); ``True`` for ``None`` or a string that is no language code (the common
    case)."""
    return _script_or_none(code) not in SPACELESS_SCRIPTS


def needs_word_boundary(code: str | None) -> bool:
    """Whether a generation must continue with a word boundary after the answer to match it:
    ``False`` for spaceless scripts and for Korean (particles attach to the noun); ``True``
    for ``None`` or a string that is no language code."""
    return _script_or_none(code) not in SPACELESS_SCRIPTS | _PARTICLE_SCRIPTS


@lru_cache(maxsize=1024)
def lang_name(code: str) -> str:
    """The English name of a language: :data:`BUNDLED_NAMES` for the bundled twelve, else
    the CLDR name (``sv`` -> ``"Swedish"``, ``sr-Latn`` -> ``"Serbian (Latin)"``)."""
    canonical = lang_code(code)
    if canonical in BUNDLED_NAMES:
        return BUNDLED_NAMES[canonical]
    return str(langcodes.Language.get(canonical).display_name("en"))


@lru_cache(maxsize=1024)
def native_name(code: str) -> str | None:
    """The language's name in itself by CLDR, capitalised (``sv`` -> ``"Svenska"``,
    ``sw`` -> ``"Kiswahili"``), or ``None`` when CLDR has none."""
    tag = langcodes.Language.get(lang_code(code))
    name = str(tag.display_name(tag))
    if not name or "Unknown" in name or name == tag.to_tag():
        return None
    return name[:1].upper() + name[1:]


def order_langs(codes: set[str] | list[str] | tuple[str, ...]) -> list[str]:
    """``codes`` in a stable order: the bundled twelve in their order, then the others
    sorted."""
    present = set(codes)
    return [lg for lg in BUNDLED_NAMES if lg in present] + sorted(present - set(BUNDLED_NAMES))
