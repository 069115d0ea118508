"""The fact record, the languages and relations of the bundled data, and record validation.

A :class:`Fact` is one factual-recall query in one language: a completion stem (``prompt``)
whose continuation is ``answer``. The same fact in different languages shares its ``id``
(``"capital/IT"`` is "the capital of Italy" in all twelve languages), which is what keeps
cross-lingual comparisons aligned.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Required, TypedDict, Unpack

from mechlingo.core.answers import answer_key, complete, distinct_aliases
from mechlingo.core.errors import InputError, MechlingoError
from mechlingo.core.languages import BUNDLED_NAMES, lang_code, writes_spaces

#: The twelve languages of the bundled data, as ISO 639-1 codes. They are the bundled data's
#: languages, not the toolkit's: a facts file, a benchmark or parallel text may be in any
#: language with a standard code (:func:`mechlingo.core.languages.lang_code`).
LANGS: tuple[str, ...] = tuple(BUNDLED_NAMES)

#: English names of :data:`LANGS` (other languages: :func:`mechlingo.core.languages.lang_name`).
LANG_NAMES: dict[str, str] = dict(BUNDLED_NAMES)

#: The relations of the bundled data, in a fixed order (also the sort order of loaded facts).
RELATIONS: tuple[str, ...] = (
    "capital",
    "language",
    "currency",
    "continent",
    "city_country",
    "script",
)

#: The bundled languages written without a space between a prompt and its answer (any
#: language: :func:`mechlingo.core.languages.writes_spaces`).
NO_SPACE_LANGS: frozenset[str] = frozenset(lg for lg in LANGS if not writes_spaces(lg))

#: Fields every record must have; the others have defaults (see :func:`fact_from_mapping`).
REQUIRED_FIELDS: tuple[str, ...] = ("id", "relation", "lang", "subject", "prompt", "answer")

#: All fields, in the order they are written.
FIELDS: tuple[str, ...] = (
    "id",
    "relation",
    "lang",
    "subject",
    "subject_en",
    "prompt",
    "answer",
    "answer_en",
    "aliases",
    "subject_span",
)

#: Fields written only when set: text after the answer, and a candidate set for ranking.
CLOZE_FIELDS: tuple[str, ...] = ("suffix", "candidates")

#: The most problems of one facts file reported at once (the rest are counted).
MAX_PROBLEMS = 20


def unknown_field_problems(record: Any, where: str) -> list[str]:
    """One message per field of ``record`` that a fact does not have, naming the nearest
    known field (``answers`` -> ``answer``, ``alias`` -> ``aliases``): a misspelt field
    would otherwise be dropped without a word."""
    if not isinstance(record, Mapping):
        return []
    known = FIELDS + CLOZE_FIELDS
    out = []
    for key in record:
        if key in known:
            continue
        near = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
        hint = f"did you mean '{near[0]}'?" if near else f"known fields: {', '.join(known)}"
        out.append(f"{where}: field '{key}' is not a field of a fact ({hint})")
    return out


@dataclass(frozen=True)
class Fact:
    """One factual-recall query in one language.

    Attributes:
        id: fact id shared by all languages, ``"<relation>/<key>"`` (e.g. ``"capital/IT"``).
        relation: relation name (e.g. ``"capital"``).
        lang: language code of ``prompt`` and ``answer``, canonical
            (:func:`~mechlingo.core.languages.lang_code`): any language, not only :data:`LANGS`.
        subject: the subject as written inside ``prompt`` (e.g. ``"Italie"``).
        prompt: a completion stem whose greedy continuation should be ``answer``; it has no
            trailing whitespace (the space before the answer belongs to the answer's token).
        answer: the gold answer in ``lang`` (e.g. ``"Rome"``).
        answer_en: the same answer in English (``""`` when unknown).
        aliases: other acceptable answers in ``lang`` (short forms, other official names).
        subject_span: ``(start, end)`` character offsets with ``prompt[start:end] == subject``.
        subject_en: the subject in English (``""`` when unknown).
        suffix: text that follows the answer in the full statement (``""`` for a completion
            stem). Cloze benchmarks such as BMLAMA put the mask mid-sentence (``"Xの首都は
            <mask>です。"``): ``prompt`` is the text before the mask, ``suffix`` the text after
            it, verbatim. A fact with a suffix can be scored by candidate ranking; greedy
            generation reads ``prompt`` only. ``prompt`` may be empty only when ``suffix``
            is not (a mask at the very start).
        candidates: the candidate answers of a ranking benchmark, the gold ``answer`` among
            them (empty when the benchmark has none).
    """

    id: str
    relation: str
    lang: str
    subject: str
    prompt: str
    answer: str
    answer_en: str = ""
    aliases: tuple[str, ...] = ()
    subject_span: tuple[int, int] = (0, 0)
    subject_en: str = ""
    suffix: str = ""
    candidates: tuple[str, ...] = ()

    @property
    def answers(self) -> tuple[str, ...]:
        """The answer followed by its aliases: every string that counts as correct."""
        return (self.answer, *self.aliases)

    @property
    def sentence(self) -> str:
        """The prompt completed with its answer and suffix (see :meth:`filled`)."""
        return self.filled(self.answer)

    def filled(self, candidate: str) -> str:
        """The full statement with ``candidate`` in the answer's place: the prompt, the
        language's separator (none after an empty prompt), the candidate, then ``suffix``."""
        if not self.prompt:
            return candidate + self.suffix
        return complete(self.prompt, candidate, self.lang) + self.suffix

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict with the fields in :data:`FIELDS` order, then those of
        :data:`CLOZE_FIELDS` that are set."""
        out = {
            "id": self.id,
            "relation": self.relation,
            "lang": self.lang,
            "subject": self.subject,
            "subject_en": self.subject_en,
            "prompt": self.prompt,
            "answer": self.answer,
            "answer_en": self.answer_en,
            "aliases": list(self.aliases),
            "subject_span": list(self.subject_span),
        }
        if self.suffix:
            out["suffix"] = self.suffix
        if self.candidates:
            out["candidates"] = list(self.candidates)
        return out


def check_langs(langs: Iterable[str] | str | None) -> tuple[str, ...]:
    """Language codes in their canonical form (``swh_Latn`` -> ``sw``, ``zh-Hans`` -> ``zh``;
    :func:`~mechlingo.core.languages.lang_code`); ``None`` means all of :data:`LANGS`.

    Raises:
        InputError: (a ``ValueError``) naming the codes that are not language codes.
    """
    if langs is None:
        return LANGS
    if isinstance(langs, str):
        langs = (langs,)
    langs = tuple(langs)
    out, unknown = [], []
    for lang in langs:
        try:
            out.append(lang_code(lang))
        except InputError:
            unknown.append(lang)
    if unknown:
        raise InputError(
            f"unknown language(s) {unknown}: not ISO 639 / BCP 47 language codes",
            fix="use codes such as sv, sw, zh-Hant or sr-Latn (FLORES swh_Latn works too); "
            f"the bundled data has {', '.join(LANGS)}",
        )
    return tuple(out)


class RecordError(MechlingoError, ValueError):
    """A malformed record: the message names the source, line and field."""


def _where(source: str, line: int | None) -> str:
    return f"{source}, line {line}" if line is not None else source


def fact_from_mapping(
    record: Mapping[str, Any], source: str = "<record>", line: int | None = None
) -> Fact:
    """Build a :class:`Fact` from a dict read from a file, checking every field.

    Required: ``id``, ``relation``, ``lang`` (a language code, stored canonical:
    ``swh_Latn`` -> ``sw``), ``subject``, ``prompt``
    (no trailing whitespace), ``answer``, all non-empty strings. Optional: ``answer_en`` and
    ``subject_en`` (default ``""``), ``aliases`` (a list of strings, or one string with
    ``|`` between aliases; default empty), ``subject_span`` (two ints; when missing it is
    the first occurrence of ``subject`` in ``prompt``).

    Raises:
        RecordError: (a ValueError) naming ``source``, ``line`` and the offending field.
    """
    where = _where(source, line)

    def fail(field: str, problem: str) -> RecordError:
        return RecordError(f"{where}: field '{field}' {problem}")

    if not isinstance(record, Mapping):
        raise RecordError(f"{where}: expected an object with fields {list(REQUIRED_FIELDS)}")
    suffix = record.get("suffix", "") or ""
    if not isinstance(suffix, str):
        raise fail("suffix", f"must be a string, got {suffix!r}")
    values: dict[str, str] = {}
    for field in REQUIRED_FIELDS:
        value = record.get(field)
        if value is None:
            raise fail(field, "is missing (required fields: " + ", ".join(REQUIRED_FIELDS) + ")")
        empty_ok = field == "prompt" and value == "" and suffix.strip()
        if not isinstance(value, str) or not (value.strip() or empty_ok):
            raise fail(field, f"must be a non-empty string, got {value!r}")
        values[field] = value
    try:
        values["lang"] = lang_code(values["lang"])
    except InputError:
        raise fail(
            "lang",
            f"has unknown language {values['lang']!r} (not an ISO 639 / BCP 47 code: use sv, "
            "sw, zh-Hant, ...; or FLORES swh_Latn)",
        ) from None
    prompt = values["prompt"]
    if prompt != prompt.rstrip():
        raise fail("prompt", "ends with whitespace; remove it (the answer carries its own space)")
    optional: dict[str, str] = {}
    for field in ("answer_en", "subject_en"):
        value = record.get(field, "")
        if value is None:
            value = ""
        if not isinstance(value, str):
            raise fail(field, f"must be a string, got {value!r}")
        optional[field] = value
    aliases_raw = _string_list(record.get("aliases", ()), "aliases", fail)
    candidates = _string_list(record.get("candidates", ()), "candidates", fail)
    if candidates and values["answer"] not in candidates:
        raise fail("candidates", f"must include the answer {values['answer']!r}")
    subject = values["subject"]
    span = _subject_span(record.get("subject_span"), prompt, subject, suffix, fail)
    return Fact(
        id=values["id"],
        relation=values["relation"],
        lang=values["lang"],
        subject=subject,
        prompt=prompt,
        answer=values["answer"],
        answer_en=optional["answer_en"],
        aliases=tuple(aliases_raw),
        subject_span=span,
        subject_en=optional["subject_en"],
        suffix=suffix,
        candidates=candidates,
    )


def _subject_span(
    span_raw: Any, prompt: str, subject: str, suffix: str, fail: Callable[[str, str], RecordError]
) -> tuple[int, int]:
    """The checked ``subject_span``: given as two ints (or ``"start,end"``), or found in the
    prompt; ``(0, 0)`` when the subject only follows the mask (it sits in ``suffix``)."""
    if span_raw is None or span_raw == "":
        start = prompt.find(subject)
        if start < 0 and subject in suffix:
            start = 0  # the subject follows the mask: (0, 0), no span inside the prompt
            subject_len = 0
        else:
            subject_len = len(subject)
        if start < 0:
            raise fail("subject_span", f"is missing and subject {subject!r} is not in the prompt")
        span = (start, start + subject_len)
    else:
        if isinstance(span_raw, str):
            try:
                span_raw = [int(x) for x in span_raw.split(",")]
            except ValueError:
                raise fail("subject_span", f"must be 'start,end', got {span_raw!r}") from None
        if (
            not isinstance(span_raw, list | tuple)
            or len(span_raw) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in span_raw)
        ):
            raise fail("subject_span", f"must be two integers, got {span_raw!r}")
        span = (span_raw[0], span_raw[1])
        if prompt[span[0] : span[1]] != subject and not (span == (0, 0) and subject in suffix):
            raise fail(
                "subject_span",
                f"{list(span)} selects {prompt[span[0] : span[1]]!r}, not the subject {subject!r}",
            )
    return span


def _string_list(raw: Any, field: str, fail: Callable[[str, str], RecordError]) -> tuple[str, ...]:
    """A list field read from JSON (a list of strings) or TSV (one string, ``|`` between
    items); ``None`` is empty."""
    if raw is None:
        return ()
    if isinstance(raw, str):
        raw = [a for a in raw.split("|") if a]
    if not isinstance(raw, list | tuple) or not all(isinstance(a, str) and a for a in raw):
        raise fail(field, f"must be a list of non-empty strings, got {raw!r}")
    return tuple(raw)


class FactFields(TypedDict, total=False):
    """The fields besides the template that :func:`make_fact` and :func:`fact_from_cloze`
    take (optional ones default to empty)."""

    id: Required[str]
    relation: Required[str]
    lang: Required[str]
    subject: Required[str]
    answer: Required[str]
    answer_en: str
    aliases: Iterable[str]
    subject_en: str


def fact_from_cloze(*, template: str, **fields: Unpack[FactFields]) -> Fact:
    """A Fact from a LAMA-style cloze template (``"[X] is the capital of [Y] ."``) as used by
    mLAMA, BMLAMA, X-FACTR or KLAR exports; ``fields`` as :func:`make_fact` takes them.

    ``[X]`` is replaced by the subject; ``[Y]`` must come last, up to punctuation and
    spaces, which are dropped (a causal LM can only complete a stem whose answer is at the
    end). Templates with the object elsewhere raise :class:`InputError` (a ``ValueError``):
    rephrase them first.
    """
    if template.count("[X]") != 1 or template.count("[Y]") != 1:
        raise InputError(f"cloze template {template!r} needs exactly one [X] and one [Y]")
    head, tail = template.split("[Y]")
    if answer_key(tail):
        raise InputError(
            f"cloze template {template!r} has text after [Y]; a completion prompt needs the "
            "answer last, so rephrase it (e.g. '[X] is the capital of' -> '[Y]')"
        )
    return make_fact(template=head.rstrip().replace("[X]", "{s}"), **fields)


def make_fact(
    *,
    id: str,
    relation: str,
    lang: str,
    template: str,
    subject: str,
    answer: str,
    answer_en: str = "",
    aliases: Iterable[str] = (),
    subject_en: str = "",
) -> Fact:
    """Fill ``template`` (which holds one ``{s}``) with ``subject`` and build the checked Fact.

    The subject span is computed from where ``{s}`` sits in the template. Aliases that
    normalize (:func:`answer_key`) to the answer or to an earlier alias are dropped.
    """
    if template.count("{s}") != 1:
        raise InputError(f"template {template!r} must contain exactly one '{{s}}'")
    start = template.index("{s}")
    prompt = template[:start] + subject + template[start + 3 :]
    kept = distinct_aliases(answer, aliases)
    return fact_from_mapping(
        {
            "id": id,
            "relation": relation,
            "lang": lang,
            "subject": subject,
            "subject_en": subject_en,
            "prompt": prompt,
            "answer": answer,
            "answer_en": answer_en,
            "aliases": kept,
            "subject_span": [start, start + len(subject)],
        },
        source=f"template {template!r}",
    )
