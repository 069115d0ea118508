"""What every benchmark reader shares: the :class:`Benchmark` record, the skip reasons, and
the helpers that turn the text around an answer slot into a checked
:class:`~mechlingo.data.facts.Fact`."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mechlingo.core.answers import answer_separator
from mechlingo.data.facts import Fact, RecordError, fact_from_mapping
from mechlingo.data.io import json_record, read_text
from mechlingo.data.parallel_text import lang_of

PathLike = str | os.PathLike[str]

#: The fact formats :func:`load_benchmark` reads, and ``flores`` (parallel text).
FORMATS = ("bmlama", "klar", "klar_flat", "mlama", "mpararel", "mlama_rows", "flores")

#: Why a record was skipped (the keys of :attr:`Benchmark.skipped`).
SKIP_REASONS: dict[str, str] = {
    "unsupported_language": "the file's language code is not a language code mechlingo "
    "can resolve (ISO 639 / BCP 47 or FLORES)",
    "empty_subject": "the subject is empty",
    "empty_answer": "the gold answer is empty",
    "no_mask": "the prompt or template has no answer slot (<mask>, [Y])",
    "several_masks": "the prompt or template has more than one answer slot",
    "no_subject_slot": "the template has no subject slot (<subject>, [X])",
    "subject_not_in_prompt": "the subject is not written in the prompt",
    "gold_not_in_candidates": "a gold answer is not among the candidates",
    "mask_spacing": "the text before the mask does not end with the language's separator "
    "(a space; none in Chinese and Japanese), so the filled sentence would differ",
    "no_template": "the relation has no template in this language",
    "no_english_template": "BMLAMA: the English row of this fact has no usable template, "
    "so the fact has no relation",
    "duplicate_id": "a second record with the same fact id in the same language",
    "invalid_record": "the record fails the Fact checks (see the examples)",
}

MASK = "<mask>"
#: Codes the mParaRel and hub exports use for Simplified Chinese.
_ZH_CODES = {"zh-hans": "zh", "zh-cn": "zh", "zh_hans": "zh"}


@dataclass
class Benchmark:
    """What :func:`load_benchmark` read.

    Attributes:
        facts: the facts, sorted by relation (first appearance), fact id (first appearance)
            and language (order of ``langs``).
        format: one of :data:`FORMATS`.
        source: the path or hub id read.
        skipped: ``{reason: number of records}`` for the records that did not become facts
            (reasons in :data:`SKIP_REASONS`).
        examples: ``{reason: [where, ...]}``, up to five locations (``"fr.tsv, line 3"``) per
            reason.
        unsupported_langs: language codes of files skipped as ``unsupported_language``.
        texts: parallel text (``{lang: [sentence, ...]}``) for ``flores``; else ``None``.
        available_langs: mechlingo's languages the source has files for (read or not).
    """

    facts: list[Fact]
    format: str
    source: str
    skipped: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)
    unsupported_langs: tuple[str, ...] = ()
    texts: dict[str, list[str]] | None = None
    available_langs: set[str] = field(default_factory=set)

    def skip(self, reason: str, where: str, n: int = 1) -> None:
        """Count ``n`` skipped records for ``reason`` (one of :data:`SKIP_REASONS`)."""
        if reason not in SKIP_REASONS:
            raise ValueError(f"unknown skip reason {reason!r}")
        self.skipped[reason] = self.skipped.get(reason, 0) + n
        seen = self.examples.setdefault(reason, [])
        if len(seen) < 5:
            seen.append(where)

    def summary(self) -> dict[str, Any]:
        """A JSON-ready record: format, source, facts per language, skips by reason."""
        per_lang: dict[str, int] = {}
        for fact in self.facts:
            per_lang[fact.lang] = per_lang.get(fact.lang, 0) + 1
        return {
            "format": self.format,
            "source": self.source,
            "n_facts": len(self.facts),
            "facts_per_lang": per_lang,
            "relations": sorted({f.relation for f in self.facts}),
            "skipped": dict(sorted(self.skipped.items())),
            "skip_examples": {k: list(v) for k, v in sorted(self.examples.items())},
            "unsupported_langs": list(self.unsupported_langs),
        }


# --------------------------------------------------------------------------------------
# Shared pieces
# --------------------------------------------------------------------------------------


def split_at_mask(text: str, mask: str = MASK) -> tuple[str, str] | None:
    """``(before, after)`` around the one ``mask`` in ``text``; ``None`` unless exactly one."""
    if text.count(mask) != 1:
        return None
    head, tail = text.split(mask)
    return head, tail


def answer_slot(
    bench: Benchmark, where: str, text: str, mask: str = MASK
) -> tuple[str, str] | None:
    """:func:`split_at_mask`, or ``None`` after counting ``no_mask``/``several_masks``."""
    parts = split_at_mask(text, mask)
    if parts is None:
        bench.skip("no_mask" if mask not in text else "several_masks", where)
    return parts


def _spacing_ok(head: str, lang: str) -> bool:
    """Whether ``Fact.filled`` rebuilds ``head + candidate`` exactly: the whitespace between
    the prompt and the mask is the language's separator (nothing after an empty prompt)."""
    prompt = head.rstrip()
    gap = head[len(prompt) :]
    return gap == ("" if not prompt else answer_separator(lang))


def cloze_fact(
    bench: Benchmark,
    where: str,
    record: dict[str, Any],
    head: str,
    tail: str,
    *,
    check_spacing: bool = True,
) -> Fact | None:
    """A Fact from the text around the mask, or ``None`` after counting why not."""
    lang = record["lang"]
    if not record["subject"].strip():
        bench.skip("empty_subject", where)
        return None
    if not record["answer"].strip():
        bench.skip("empty_answer", where)
        return None
    if record["subject"] not in head and record["subject"] not in tail:
        bench.skip("subject_not_in_prompt", where)
        return None
    cands = record.get("candidates") or ()
    if cands and record["answer"] not in cands:
        bench.skip("gold_not_in_candidates", where)
        return None
    if check_spacing and not _spacing_ok(head, lang):
        bench.skip("mask_spacing", where)
        return None
    try:
        return fact_from_mapping({**record, "prompt": head.rstrip(), "suffix": tail}, where)
    except RecordError as err:
        bench.skip("invalid_record", f"{where}: {err}")
        return None


def relation_slug(template: str) -> str:
    """A relation id from a template: its words, lower-cased, ``[X]`` -> ``x``, mask -> ``y``."""
    text = template.replace("[X]", " X ").replace(MASK, " Y ").replace("[Y]", " Y ")
    return "_".join(re.findall(r"\w+", text.lower())) or "relation"


def jsonl_objects(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line, object)`` for every non-blank line of a JSONL file."""
    text = read_text(path, "JSONL file")
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        obj = json_record(line, f"{path}, line {number}")
        if not isinstance(obj, dict):
            raise RecordError(f"{path}, line {number}: expected a JSON object, got {obj!r:.40}")
        yield number, obj


def lang_selected(
    bench: Benchmark,
    code: str,
    wanted: tuple[str, ...] | None,
    where: str,
    count: Callable[[], int],
) -> str | None:
    """mechlingo's code for a file's language when it is to be read, else ``None``. When
    every language was asked for (``wanted`` is ``None``), the records of a file whose
    code names no language are counted (``count()``) as ``unsupported_language``; every
    language is read (canonical codes, :func:`~mechlingo.core.languages.lang_code`)."""
    lang = _ZH_CODES.get(code.lower()) or lang_of(code)
    if lang is None:
        if wanted is None:
            bench.skip("unsupported_language", where, count())
            bench.unsupported_langs = tuple(sorted({*bench.unsupported_langs, code}))
        return None
    bench.available_langs.add(lang)
    if wanted is not None and lang not in wanted:
        return None
    return lang


def with_english(fact: Fact, subject_en: str, answer_en: str) -> Fact:
    """``fact`` with the English subject (unless it has one) and answer of its English row."""
    return replace(fact, subject_en=fact.subject_en or subject_en, answer_en=answer_en)


def fill_english(bench: Benchmark) -> None:
    """Give every fact of ``bench`` whose id has an English fact that fact's subject (unless
    it has its own English subject) and answer (:func:`with_english`)."""
    english = {f.id: (f.subject, f.answer) for f in bench.facts if f.lang == "en"}
    bench.facts = [with_english(f, *english[f.id]) if f.id in english else f for f in bench.facts]
