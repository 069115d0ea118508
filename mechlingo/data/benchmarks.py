"""Loaders for the public multilingual fact benchmarks, as their authors ship them.

:func:`load_benchmark` reads a local file or folder (the format told from its layout, or
given with ``format=``) or a Hugging Face hub id (through ``datasets``), and returns a
:class:`Benchmark`: the :class:`~mechlingo.data.facts.Fact` records and, for every record
that could not become one, a count by reason (:data:`SKIP_REASONS`). Formats
(:data:`FORMATS`; ``docs/benchmarks.md`` has each layout, metric and difference):

- ``bmlama``: BMLAMA-17/53 (Qi et al. 2023), one TSV per language with the columns
  ``Prompt`` (a ``<mask>`` anywhere), ``Ans``, ``Candidate Ans`` (``", "`` between
  candidates) and ``Subject``; row ``i`` is the same fact in every file. The relation of row
  ``i`` is its English prompt with the subject replaced by ``[X]`` (a template id such as
  ``the_capital_of_x_is_y``), shared by that row in every language; fact ids are
  ``<relation>/<i>`` (``i`` counts data rows from 0, as the reference code's record files do).
- ``klar``: KLAR (Wang et al. 2025), ``klar_source/<lang>/<relation>.json`` with ``samples``
  (``subject``, ``object``, ``index``) and ``prompt_templates`` (``<subject>``, ``<mask>``;
  the first template is used, as in the reference code); ids ``<relation>/<index>``.
- ``klar_flat``: KLAR's parallel variant, ``<lang_Script>.txt`` with lines
  ``question ... The answer is: X`` (the answer follows the last colon); one relation
  ``klar``, ids ``klar/<line>``; the subject is the whole question (the files name none).
- ``mlama``: mLAMA (Kassner et al. 2021), ``<lang>/templates.jsonl`` (``relation``,
  ``template`` with ``[X]``/``[Y]``) and ``<lang>/<relation>.jsonl`` (``sub_label``,
  ``obj_label``, ``lineid``); ids ``<relation>/<lineid>``.
- ``mpararel``: mParaRel (Fierro and Søgaard 2022), ``patterns/<lang>/<relation>.jsonl``
  (``pattern``) and ``tuples/<lang>/<relation>.jsonl``.
- ``mlama_rows``: one JSONL file (or hub dataset) of flat rows as the hub exports of mLAMA and
  mParaRel hold them: ``sub_label``, ``obj_label`` (a string, or a list whose first item is
  the gold answer and the rest its aliases), ``template``, ``language``, ``predicate_id`` or
  ``relation``, ``lineid``, optional ``template_id`` and ``obj_aliases``.

The mLAMA family gets, by default, every object of the relation in the language as its
candidate set (``candidates="relation"``, the typed querying of mLAMA); ``candidates=None``
leaves the facts without candidates.

FLORES parallel text is read by :func:`mechlingo.data.parallel_text.read_parallel`;
:func:`load_benchmark` with a FLORES folder returns it as :attr:`Benchmark.texts`.

A structurally malformed file (a wrong header, invalid JSON, a row with the wrong number of
fields, files of different lengths) raises :class:`~mechlingo.data.facts.RecordError` or
:class:`~mechlingo.core.errors.DataError` naming the file and line. A well-formed record
that cannot become a Fact is skipped and counted, never dropped silently.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mechlingo.core.errors import DataError, InputError
from mechlingo.core.untrusted import check_depth, check_links
from mechlingo.data.facts import (
    LANGS,
    Fact,
    RecordError,
    answer_key,
    answer_separator,
    check_langs,
    fact_from_mapping,
)
from mechlingo.data.io import json_record, read_text
from mechlingo.data.parallel_text import SPLITS, lang_of, parallel_layout, read_parallel

PathLike = str | os.PathLike[str]

#: The fact formats :func:`load_benchmark` reads, and ``flores`` (parallel text).
FORMATS = ("bmlama", "klar", "klar_flat", "mlama", "mpararel", "mlama_rows", "flores")

#: Why a record was skipped (the keys of :attr:`Benchmark.skipped`).
SKIP_REASONS: dict[str, str] = {
    "unsupported_language": "the file's language is not one of mechlingo's twelve",
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

_MASK = "<mask>"
#: Codes the mParaRel and hub exports use for Simplified Chinese.
_ZH_CODES = {"zh-hans": "zh", "zh-cn": "zh", "zh_hans": "zh"}
_BMLAMA_HEADER = ["Prompt", "Ans", "Candidate", "Ans", "Subject"]


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


def split_at_mask(text: str, mask: str = _MASK) -> tuple[str, str] | None:
    """``(before, after)`` around the one ``mask`` in ``text``; ``None`` unless exactly one."""
    if text.count(mask) != 1:
        return None
    head, tail = text.split(mask)
    return head, tail


def _spacing_ok(head: str, lang: str) -> bool:
    """Whether ``Fact.filled`` rebuilds ``head + candidate`` exactly: the whitespace between
    the prompt and the mask is the language's separator (nothing after an empty prompt)."""
    prompt = head.rstrip()
    gap = head[len(prompt) :]
    return gap == ("" if not prompt else answer_separator(lang))


def _cloze_fact(
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


def _aliases(answer: str, extra: Iterable[str]) -> list[str]:
    """``extra`` without empty items and without repeats of the answer or of each other."""
    seen = {answer_key(answer)}
    out = []
    for alias in extra:
        key = answer_key(alias)
        if alias and key and key not in seen:
            seen.add(key)
            out.append(alias)
    return out


def _slug(template: str) -> str:
    """A relation id from a template: its words, lower-cased, ``[X]`` -> ``x``, mask -> ``y``."""
    text = template.replace("[X]", " X ").replace(_MASK, " Y ").replace("[Y]", " Y ")
    return "_".join(re.findall(r"\w+", text.lower())) or "relation"


def _jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line, object)`` for every non-blank line of a JSONL file."""
    text = read_text(path, "JSONL file")
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        obj = json_record(line, f"{path}, line {number}")
        if not isinstance(obj, dict):
            raise RecordError(f"{path}, line {number}: expected a JSON object, got {obj!r:.40}")
        yield number, obj


def _lang_selected(
    bench: Benchmark,
    code: str,
    wanted: tuple[str, ...] | None,
    where: str,
    count: Callable[[], int],
) -> str | None:
    """mechlingo's code for a file's language when it is to be read, else ``None``. When
    every language was asked for (``wanted`` is ``None``), the records of a language outside
    mechlingo's twelve are counted (``count()``) as ``unsupported_language``."""
    lang = lang_of(code) or _ZH_CODES.get(code.lower())
    if lang is None:
        if wanted is None:
            bench.skip("unsupported_language", where, count())
            bench.unsupported_langs = tuple(sorted({*bench.unsupported_langs, code}))
        return None
    bench.available_langs.add(lang)
    if wanted is not None and lang not in wanted:
        return None
    return lang


# --------------------------------------------------------------------------------------
# BMLAMA
# --------------------------------------------------------------------------------------


def _bmlama_rows(path: Path) -> list[tuple[int, list[str]]]:
    """``(line, [prompt, ans, candidates, subject])`` for every data row of one TSV file
    (quoted fields as the ``csv`` module reads them; blank lines skipped, as the reference
    code does, so row ``i`` is the ``i``-th non-blank data line)."""
    reader = csv.reader(io.StringIO(read_text(path, "BMLAMA file"), newline=""), delimiter="\t")
    rows: list[tuple[int, list[str]]] = []
    header_seen = False
    try:
        for cells in reader:
            line = reader.line_num
            if not cells or not "".join(cells).strip():
                continue
            if not header_seen:
                # the 17-language zh file writes "Candidate Ans" as two cells; accept both
                if " ".join(cells).split() != _BMLAMA_HEADER:
                    raise RecordError(
                        f"{path}, line {line}: header {cells} is not BMLAMA's "
                        "(Prompt, Ans, Candidate Ans, Subject, tab-separated)"
                    )
                header_seen = True
                continue
            if len(cells) != 4:
                raise RecordError(
                    f"{path}, line {line}: has {len(cells)} fields, BMLAMA rows have 4 "
                    "(Prompt, Ans, Candidate Ans, Subject)"
                )
            rows.append((line, cells))
    except csv.Error as err:
        raise RecordError(f"{path}, line {reader.line_num}: {err}") from None
    if not header_seen:
        raise RecordError(f"{path}, line 1: empty file (no header)")
    return rows


def _bmlama_relations(path: Path, rows: list[tuple[int, list[str]]]) -> list[str | None]:
    """The relation id of every row, from the English prompt with the subject removed."""
    slugs: dict[str, str] = {}
    used: set[str] = set()
    out: list[str | None] = []
    for _, (prompt, _ans, _cands, subject) in rows:
        if not subject.strip() or subject not in prompt or prompt.count(_MASK) != 1:
            out.append(None)
            continue
        template = prompt.replace(subject, "[X]", 1)
        if template not in slugs:
            slug, k = _slug(template), 2
            while slug in used:
                slug, k = f"{_slug(template)}_{k}", k + 1
            slugs[template] = slug
            used.add(slug)
        out.append(slugs[template])
    return out


def _bmlama_files(path: Path) -> dict[str, Path]:
    folder = path.parent if path.is_file() else path
    files = {p.stem: p for p in sorted(folder.glob("*.tsv")) if p.is_file()}
    if path.is_file():
        files = {path.stem: path, **({"en": files["en"]} if "en" in files else {})}
    if "en" not in files:
        raise DataError(
            f"{folder}: BMLAMA needs en.tsv next to the other languages",
            fix="relations are named from the English prompts; add en.tsv from the release",
        )
    return files


def load_bmlama(path: PathLike, langs: Iterable[str] | None = None) -> Benchmark:
    """Read a BMLAMA folder (``<lang>.tsv`` files) or one of its files (see the module
    docstring). ``langs``: mechlingo codes to keep (default all, unsupported files counted)."""
    path = Path(path)
    wanted = None if langs is None else check_langs(langs)
    bench = Benchmark([], "bmlama", str(path))
    files = _bmlama_files(path)
    en_rows = _bmlama_rows(files["en"])
    relations = _bmlama_relations(files["en"], en_rows)
    for code, file in files.items():
        if path.is_file() and code != path.stem:
            continue
        lang = _lang_selected(bench, code, wanted, str(file), lambda f=file: len(_bmlama_rows(f)))  # type: ignore[misc]
        if lang is None:
            continue
        rows = en_rows if code == "en" else _bmlama_rows(file)
        if len(rows) != len(en_rows):
            raise DataError(
                f"{file}: {len(rows)} rows, en.tsv has {len(en_rows)}; BMLAMA files are "
                "aligned by row, so they must have the same number of rows",
                fix="use the files of one release (BMLAMA17 or BMLAMA53) together",
            )
        for i, ((line, cells), relation) in enumerate(zip(rows, relations, strict=True)):
            fact = _bmlama_fact(bench, f"{file.name}, line {line}", lang, i, cells, relation)
            if fact is not None:
                en_cells = en_rows[i][1]
                bench.facts.append(_with_english(fact, en_cells[3], en_cells[1].split(", ")[0]))
    return bench


def _with_english(fact: Fact, subject_en: str, answer_en: str) -> Fact:
    return replace(fact, subject_en=fact.subject_en or subject_en, answer_en=answer_en)


def _bmlama_fact(
    bench: Benchmark, where: str, lang: str, i: int, cells: list[str], relation: str | None
) -> Fact | None:
    prompt, ans, cands, subject = cells
    if relation is None:
        bench.skip("no_english_template", where)
        return None
    parts = split_at_mask(prompt)
    if parts is None:
        bench.skip("no_mask" if _MASK not in prompt else "several_masks", where)
        return None
    golds = [g for g in ans.split(", ") if g]
    if not golds:
        bench.skip("empty_answer", where)
        return None
    candidates = [c for c in cands.split(", ") if c]
    if not all(g in candidates for g in golds):  # the reference ranks every gold answer
        bench.skip("gold_not_in_candidates", where)
        return None
    record = {
        "id": f"{relation}/{i}",
        "relation": relation,
        "lang": lang,
        "subject": subject,
        "answer": golds[0],
        "aliases": golds[1:],
        "candidates": candidates,
    }
    return _cloze_fact(bench, where, record, *parts)


# --------------------------------------------------------------------------------------
# KLAR
# --------------------------------------------------------------------------------------


def _klar_root(path: Path) -> Path:
    return path / "klar_source" if (path / "klar_source").is_dir() else path


def _klar_json(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """``(samples, prompt_templates)`` of one KLAR relation file, checked for structure."""
    text = read_text(path, "KLAR file")
    check_depth(text, RecordError, str(path))
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise RecordError(f"{path}, line {err.lineno}: invalid JSON ({err.msg})") from None
    except ValueError as err:  # e.g. an integer of 5,000 digits
        raise RecordError(f"{path}: invalid JSON ({str(err)[:120]})") from None
    if not isinstance(data, dict) or not isinstance(data.get("samples"), list):
        raise RecordError(f"{path}, line 1: expected an object with a 'samples' list")
    templates = data.get("prompt_templates")
    if not isinstance(templates, list) or not templates or not isinstance(templates[0], str):
        raise RecordError(f"{path}, line 1: expected 'prompt_templates', a list of strings")
    for k, sample in enumerate(data["samples"]):
        if not isinstance(sample, dict):
            raise RecordError(f"{path}: samples[{k}] is not an object")
        for key in ("subject", "object", "index"):
            if key not in sample:
                raise RecordError(f"{path}: samples[{k}] has no field {key!r}")
        if not isinstance(sample["subject"], str) or not isinstance(sample["object"], str):
            raise RecordError(f"{path}: samples[{k}]: 'subject' and 'object' must be strings")
    return data["samples"], templates


def load_klar(path: PathLike, langs: Iterable[str] | None = None) -> Benchmark:
    """Read ``klar_source/<lang>/<relation>.json`` files (the folder, ``klar_source`` itself
    or one file). The prompt is the first template up to ``<mask>`` with the subject filled
    in and stripped (as the reference code builds it); the text after ``<mask>`` is kept as
    ``suffix``."""
    path = Path(path)
    wanted = None if langs is None else check_langs(langs)
    bench = Benchmark([], "klar", str(path))
    if path.is_file():
        files = [path]
    else:
        files = sorted(p for p in _klar_root(path).glob("*/*.json") if p.is_file())
    if not files:
        raise DataError(f"{path}: no <lang>/<relation>.json file (KLAR's klar_source layout)")
    english: dict[str, tuple[str, str]] = {}
    for file in files:
        code, relation = file.parent.name, file.stem
        lang = _lang_selected(bench, code, wanted, str(file), lambda f=file: len(_klar_json(f)[0]))  # type: ignore[misc]
        if lang is None:
            continue
        samples, templates = _klar_json(file)
        seen: set[str] = set()
        for k, sample in enumerate(samples):
            fact = _klar_fact(bench, f"{file}: samples[{k}]", lang, relation, sample, templates)
            if fact is None:
                continue
            if fact.id in seen:
                bench.skip("duplicate_id", f"{file}: samples[{k}]")
                continue
            seen.add(fact.id)
            bench.facts.append(fact)
            if lang == "en":
                english[fact.id] = (fact.subject, fact.answer)
    bench.facts = [
        _with_english(f, *english[f.id]) if f.id in english and not f.answer_en else f
        for f in bench.facts
    ]
    return bench


def _klar_fact(
    bench: Benchmark,
    where: str,
    lang: str,
    relation: str,
    sample: dict[str, Any],
    templates: list[str],
) -> Fact | None:
    template = templates[0].replace("<MASK>", _MASK)
    if "<subject>" not in template:
        bench.skip("no_subject_slot", where)
        return None
    parts = split_at_mask(template)
    if parts is None:
        bench.skip("no_mask" if _MASK not in template else "several_masks", where)
        return None
    subject = sample["subject"]
    head, tail = (p.replace("<subject>", subject) for p in parts)
    record = {
        "id": f"{relation}/{sample['index']}",
        "relation": relation,
        "lang": lang,
        "subject": subject,
        "answer": sample["object"].strip(),
        "subject_en": sample.get("subject_en") or "",
        "answer_en": sample.get("object_en") or "",
    }
    return _cloze_fact(bench, where, record, head.strip(), tail, check_spacing=False)


_ANSWER_COLON = re.compile(r"[:：]")
_QUESTION_END = re.compile(r"[?？;;؟]")


def _klar_flat_lines(path: Path) -> list[tuple[int, str]]:
    lines = read_text(path, "KLAR text file").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [(n, line.rstrip("\r")) for n, line in enumerate(lines, start=1)]


def _klar_flat_fact(bench: Benchmark, path: Path, number: int, line: str, lang: str) -> Fact | None:
    where = f"{path.name}, line {number}"
    if not line.strip():
        bench.skip("empty_answer", where)
        return None
    colons = list(_ANSWER_COLON.finditer(line))
    if not colons:
        raise RecordError(
            f"{path}, line {number}: no ':' before an answer; KLAR's text variant has lines "
            "'question ... The answer is: X'"
        )
    cut = colons[-1].end()
    prompt, answer = line[:cut].strip(), line[cut:].strip()
    ends = list(_QUESTION_END.finditer(prompt))
    question = prompt[: ends[-1].end()] if ends else prompt
    record = {
        "id": f"klar/{number - 1}",
        "relation": "klar",
        "lang": lang,
        "subject": question,
        "answer": answer,
        "subject_span": [0, len(question)],
    }
    return _cloze_fact(bench, where, record, prompt, "", check_spacing=False)


def load_klar_flat(path: PathLike, langs: Iterable[str] | None = None) -> Benchmark:
    """Read KLAR's parallel text variant: ``<lang_Script>.txt`` files (a folder or one file),
    line ``i`` the same fact in every language. The prompt is the line up to and including
    its last colon, the answer what follows; the subject is the question (the text up to its
    question mark), as the files do not name the subject."""
    path = Path(path)
    wanted = None if langs is None else check_langs(langs)
    bench = Benchmark([], "klar_flat", str(path))
    files = [path] if path.is_file() else sorted(p for p in path.glob("*.txt") if p.is_file())
    counts: dict[str, int] = {}
    for file in files:
        lines = _klar_flat_lines(file)
        n_lines = len(lines)
        lang = _lang_selected(bench, file.stem, wanted, str(file), lambda n=n_lines: n)  # type: ignore[misc]
        if lang is None:
            continue
        counts[file.name] = len(lines)
        for number, line in lines:
            fact = _klar_flat_fact(bench, file, number, line, lang)
            if fact is not None:
                bench.facts.append(fact)
    if len(set(counts.values())) > 1:
        raise DataError(f"{path}: KLAR text files are not line-aligned, line counts {counts}")
    english = {f.id: (f.subject, f.answer) for f in bench.facts if f.lang == "en"}
    bench.facts = [_with_english(f, *english[f.id]) if f.id in english else f for f in bench.facts]
    return bench


# --------------------------------------------------------------------------------------
# mLAMA, mParaRel and their flat hub rows
# --------------------------------------------------------------------------------------


def _mlama_root(path: Path) -> Path:
    return path / "mlama1.1" if (path / "mlama1.1").is_dir() else path


def _row(
    where: str, obj: dict[str, Any], lang: str, relation: str, template: str, tid: int = 0
) -> dict[str, Any]:
    """One flat row (see :func:`facts_from_rows`), its fields checked for structure."""
    for key in ("sub_label", "obj_label"):
        if key not in obj:
            raise RecordError(f"{where}: no field {key!r} (mLAMA rows have sub_label, obj_label)")
    labels = obj["obj_label"]
    labels = [labels] if isinstance(labels, str) else labels
    extra = obj.get("obj_aliases") or []
    if not isinstance(labels, list) or not all(isinstance(x, str) for x in [*labels, *extra]):
        raise RecordError(f"{where}: 'obj_label' must be a string or a list of strings")
    if not isinstance(obj["sub_label"], str):
        raise RecordError(f"{where}: 'sub_label' must be a string")
    lineid = obj.get("lineid", obj.get("uuid"))
    if lineid is None:
        raise RecordError(f"{where}: no 'lineid' (or 'uuid') to align the fact across languages")
    return {
        "where": where,
        "lang": lang,
        "relation": relation,
        "key": str(lineid),
        "subject": obj["sub_label"],
        "labels": [*labels, *extra],
        "template": template,
        "template_id": int(tid),
    }


def _mlama_rows(root: Path, wanted: tuple[str, ...] | None, bench: Benchmark) -> list[dict]:
    """Flat rows from ``<lang>/templates.jsonl`` and ``<lang>/<relation>.jsonl``."""
    rows: list[dict[str, Any]] = []
    for tfile in sorted(root.glob("*/templates.jsonl")):
        folder = tfile.parent
        files = sorted(p for p in folder.glob("*.jsonl") if p.name != "templates.jsonl")
        count = lambda fs=files: sum(1 for f in fs for _ in _jsonl(f))  # noqa: E731
        lang = _lang_selected(bench, folder.name, wanted, str(folder), count)
        if lang is None:
            continue
        templates: dict[str, str] = {}
        for number, obj in _jsonl(tfile):
            if not isinstance(obj.get("relation"), str) or not isinstance(obj.get("template"), str):
                raise RecordError(f"{tfile}, line {number}: needs 'relation' and 'template'")
            templates[obj["relation"]] = obj["template"]
        for file in files:
            for number, obj in _jsonl(file):
                where = f"{folder.name}/{file.name}, line {number}"
                rows.append(_row(where, obj, lang, file.stem, templates.get(file.stem, "")))
    return rows


def _mpararel_rows(root: Path, wanted: tuple[str, ...] | None, bench: Benchmark) -> list[dict]:
    """Flat rows from ``patterns/<lang>/<relation>.jsonl`` x ``tuples/<lang>/<relation>.jsonl``
    (one row per tuple and pattern; ``template_id`` is the pattern's line order)."""
    rows: list[dict[str, Any]] = []
    for folder in sorted(p for p in (root / "tuples").iterdir() if p.is_dir()):
        files = sorted(folder.glob("*.jsonl"))
        count = lambda fs=files: sum(1 for f in fs for _ in _jsonl(f))  # noqa: E731
        lang = _lang_selected(bench, folder.name, wanted, str(folder), count)
        if lang is None:
            continue
        for file in files:
            pfile = root / "patterns" / folder.name / file.name
            patterns = []
            if pfile.is_file():
                for number, obj in _jsonl(pfile):
                    if not isinstance(obj.get("pattern"), str):
                        raise RecordError(f"{pfile}, line {number}: needs a 'pattern' string")
                    patterns.append(obj["pattern"])
            for number, obj in _jsonl(file):
                where = f"tuples/{folder.name}/{file.name}, line {number}"
                for tid, pattern in enumerate(patterns or [""]):
                    rows.append(_row(where, obj, lang, file.stem, pattern, tid))
    return rows


def rows_from_records(
    records: Iterable[Mapping[str, Any]],
    source: str,
    wanted: tuple[str, ...] | None,
    bench: Benchmark,
) -> list[dict[str, Any]]:
    """Flat rows from hub-style records (``language``, ``predicate_id``/``relation``,
    ``template``, ``template_id``, ``sub_label``, ``obj_label``, ``lineid``)."""
    rows = []
    for number, obj in enumerate(records, start=1):
        where = f"{source}, line {number}"
        code = obj.get("language", obj.get("lang"))
        relation = obj.get("predicate_id", obj.get("relation"))
        if not isinstance(code, str) or not isinstance(relation, str):
            raise RecordError(f"{where}: needs 'language' and 'predicate_id' (or 'relation')")
        lang = _lang_selected(bench, code, wanted, where, lambda: 1)
        if lang is None:
            continue
        template = obj.get("template") or ""
        rows.append(_row(where, dict(obj), lang, relation, template, obj.get("template_id") or 0))
    return rows


def facts_from_rows(
    bench: Benchmark,
    rows: list[dict[str, Any]],
    *,
    template_index: int | None = 0,
    candidates: str | None = "relation",
) -> None:
    """Turn flat mLAMA-family rows into facts on ``bench`` (skips counted there).

    Args:
        template_index: keep the rows of this template of each relation (mParaRel has several
            paraphrases; mLAMA one, index 0); ``None`` keeps all, with ids ``<relation>/<key>#<k>``.
        candidates: ``"relation"``: every fact's candidates are the gold objects of all the
            relation's rows in its language (mLAMA's typed querying); ``None``: no candidates.
    """
    if candidates not in ("relation", None):
        raise InputError(f"candidates must be 'relation' or None, got {candidates!r}")
    rows = [r for r in rows if template_index is None or r["template_id"] == template_index]
    pools: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        if r["labels"] and r["labels"][0]:
            pool = pools.setdefault((r["relation"], r["lang"]), [])
            if r["labels"][0] not in pool:
                pool.append(r["labels"][0])
    seen: set[tuple[str, str]] = set()
    for r in rows:
        where, template = r["where"], r["template"]
        if not template:
            bench.skip("no_template", where)
            continue
        if "[X]" not in template:
            bench.skip("no_subject_slot", where)
            continue
        parts = split_at_mask(template, "[Y]")
        if parts is None:
            bench.skip("no_mask" if "[Y]" not in template else "several_masks", where)
            continue
        head, tail = (p.replace("[X]", r["subject"]) for p in parts)
        answer = r["labels"][0] if r["labels"] else ""
        fid = f"{r['relation']}/{r['key']}" + (
            "" if template_index is not None else f"#{r['template_id']}"
        )
        record = {
            "id": fid,
            "relation": r["relation"],
            "lang": r["lang"],
            "subject": r["subject"],
            "answer": answer,
            "aliases": _aliases(answer, r["labels"][1:]),
            "candidates": pools.get((r["relation"], r["lang"]), []) if candidates else [],
        }
        fact = _cloze_fact(bench, where, record, head, tail)
        if fact is None:
            continue
        if (fact.id, fact.lang) in seen:
            bench.skip("duplicate_id", where)
            continue
        seen.add((fact.id, fact.lang))
        bench.facts.append(fact)
    english = {f.id: (f.subject, f.answer) for f in bench.facts if f.lang == "en"}
    bench.facts = [_with_english(f, *english[f.id]) if f.id in english else f for f in bench.facts]


def load_mlama(
    path: PathLike,
    langs: Iterable[str] | None = None,
    *,
    template_index: int | None = 0,
    candidates: str | None = "relation",
) -> Benchmark:
    """Read mLAMA (``[mlama1.1/]<lang>/templates.jsonl`` + ``<lang>/<relation>.jsonl``),
    mParaRel (``patterns/`` + ``tuples/``) or one JSONL file of flat rows; see
    :func:`facts_from_rows` for ``template_index`` and ``candidates``."""
    path = Path(path)
    wanted = None if langs is None else check_langs(langs)
    if path.is_file():
        bench = Benchmark([], "mlama_rows", str(path))
        rows = rows_from_records((obj for _, obj in _jsonl(path)), path.name, wanted, bench)
    elif (path / "tuples").is_dir():
        bench = Benchmark([], "mpararel", str(path))
        rows = _mpararel_rows(path, wanted, bench)
    else:
        bench = Benchmark([], "mlama", str(path))
        rows = _mlama_rows(_mlama_root(path), wanted, bench)
    facts_from_rows(bench, rows, template_index=template_index, candidates=candidates)
    return bench


# --------------------------------------------------------------------------------------
# Detection, selection, the entry point
# --------------------------------------------------------------------------------------


def _first_record(path: Path) -> dict[str, Any]:
    for line in read_text(path, "JSONL file").split("\n"):
        if line.strip():
            try:
                obj = json_record(line, str(path))
            except RecordError:
                return {}
            return obj if isinstance(obj, dict) else {}
    return {}


def _is_bmlama_tsv(path: Path) -> bool:
    head = read_text(path, "TSV file").split("\n", 1)[0]
    return head.split("\t", 1)[0].strip() == "Prompt"


def _file_format(path: Path) -> str | None:
    ext = path.suffix.lower()
    if ext == ".tsv":
        return "bmlama" if _is_bmlama_tsv(path) else "facts"
    if ext == ".json":
        return "klar"
    if ext == ".jsonl":
        return "mlama_rows" if "sub_label" in _first_record(path) else "facts"
    if ext == ".txt":
        return "klar_flat"
    if ext in (".parquet", ".dev", ".devtest"):
        return "flores"
    return None


def detect_format(path: PathLike) -> str:
    """The format of a local file or folder: one of :data:`FORMATS`, or ``"facts"`` for
    mechlingo's own ``.jsonl``/``.tsv`` facts files.

    Raises:
        DataError: the path does not exist or matches no layout.
    """
    path = Path(path)
    if path.is_file():
        found = _file_format(path)
        if found is None:
            raise DataError(f"{path}: unknown file type {path.suffix!r}", fix=_FORMAT_FIX)
        return found
    if not path.is_dir():
        raise DataError(f"{path} does not exist")
    if (_klar_root(path) != path) or any(
        _LANG_DIR.fullmatch(p.parent.name) for p in path.glob("*/*.json")
    ):
        return "klar"
    if (path / "tuples").is_dir() and (path / "patterns").is_dir():
        return "mpararel"
    if any(_mlama_root(path).glob("*/templates.jsonl")):
        return "mlama"
    tsvs = sorted(path.glob("*.tsv"))
    if any(_is_bmlama_tsv(p) for p in tsvs):
        return "bmlama"
    txts = sorted(path.glob("*.txt"))
    if txts and all(lang_of(p.stem) is not None or "_" in p.stem for p in txts):
        if any(_ANSWER_COLON.search(line) for _, line in _klar_flat_lines(txts[0])[:3]):
            return "klar_flat"
    for split in SPLITS:
        try:
            if parallel_layout(path, split)[0] != "txt":
                return "flores"
        except (DataError, InputError):
            continue
    raise DataError(
        f"{path} is a folder, not a facts file, and no benchmark layout was recognised in it",
        fix=_FORMAT_FIX,
    )


#: A folder named like a language code (``en``, ``ceb``, ``zh-hans``): KLAR's and mLAMA's.
_LANG_DIR = re.compile(r"[a-z]{2,3}([-_][A-Za-z]+)?")

_FORMAT_FIX = (
    "expected a BMLAMA folder of <lang>.tsv, KLAR's klar_source/<lang>/<relation>.json or "
    "<lang_Script>.txt, mLAMA's <lang>/templates.jsonl, mParaRel's patterns/ and tuples/, or "
    "FLORES's <split>/<lang_Script>.parquet|.devtest; or pass format= (docs/benchmarks.md)"
)


def select(
    bench: Benchmark,
    langs: tuple[str, ...] | None,
    relations: Iterable[str] | str | None = None,
    limit: int | None = None,
) -> list[Fact]:
    """The benchmark's facts for ``relations`` (default all), at most ``limit`` fact ids per
    relation present in every language of ``langs`` (default: the languages read), sorted
    by relation and id (first appearance) and language (order of ``langs``/``LANGS``).

    Raises:
        InputError: a language of ``langs`` without facts, an unknown relation, a bad
            limit, or nothing selected.
    """
    facts = bench.facts
    if langs is not None:
        have = {f.lang for f in facts}
        missing = [lang for lang in langs if lang not in have]
        if missing:
            has = [lang for lang in LANGS if lang in bench.available_langs]
            raise InputError(
                f"{bench.source} has no facts in language(s) {missing}; it has files for {has}"
                + (f" (records skipped: {bench.skipped})" if bench.skipped else ""),
                fix="choose languages it has (--langs)",
            )
    available = list(dict.fromkeys(f.relation for f in facts))
    if relations is not None:
        rel_sel = (relations,) if isinstance(relations, str) else tuple(relations)
        unknown = [r for r in rel_sel if r not in available]
        if unknown:
            raise InputError(f"unknown relation(s) {unknown} in {bench.source}; it has {available}")
        facts = [f for f in facts if f.relation in set(rel_sel)]
    order = langs or tuple(lang for lang in LANGS if any(f.lang == lang for f in facts))
    if limit is not None:
        if limit < 1:
            raise InputError(f"limit must be a positive number of fact ids, got {limit}")
        langs_of: dict[str, set[str]] = {}
        for f in facts:
            langs_of.setdefault(f.id, set()).add(f.lang)
        keep: dict[str, list[str]] = {}
        for fid in dict.fromkeys(f.id for f in facts):
            rel = fid.split("/", 1)[0]
            if set(order) <= langs_of[fid] and len(keep.setdefault(rel, [])) < limit:
                keep[rel].append(fid)
        chosen = {fid for ids in keep.values() for fid in ids}
        facts = [f for f in facts if f.id in chosen]
    if not facts:
        raise InputError(
            f"no facts selected from {bench.source} (languages {list(order)}, relations "
            f"{relations or 'all'}, limit {limit}); skipped: {bench.skipped}"
        )
    rel_rank = {r: i for i, r in enumerate(available)}
    id_rank = {fid: i for i, fid in enumerate(dict.fromkeys(f.id for f in facts))}
    lang_rank = {lang: i for i, lang in enumerate(order)}
    return sorted(
        facts, key=lambda f: (rel_rank[f.relation], id_rank[f.id], lang_rank.get(f.lang, 99))
    )


_DATA_EXTS = (".jsonl", ".json", ".tsv", ".txt", ".parquet", ".csv", ".dev", ".devtest")


def is_hub_id(text: str) -> bool:
    """Whether ``text`` reads as a hub id (``owner/name``) rather than a file path: one
    slash, no data-file extension, and no local folder named like the owner (so a mistyped
    ``results/mydata`` is reported as a missing path, not looked up on the hub)."""
    if not re.fullmatch(r"[\w-][\w.-]*/[\w-][\w.-]*", text):
        return False
    return not text.lower().endswith(_DATA_EXTS) and not Path(text.split("/")[0]).exists()


def benchmark_format(text: str) -> str | None:
    """The benchmark format ``--facts`` names (a folder, a benchmark file or a hub id), or
    ``None`` for one of mechlingo's own facts files (and for a path that does not exist,
    which the facts-file check reports).

    Raises:
        DataError: a folder that matches no layout.
    """
    path = Path(text).expanduser()
    if not path.exists():
        return "mlama_rows" if is_hub_id(text) else None
    if path.is_file() and _file_format(path) is None:
        return None  # the facts-file check names the unknown extension
    found = detect_format(path)
    return None if found == "facts" else found


def _hub_records(source: str, config: str | None, split: str) -> Any:
    """The rows of a hub dataset, through ``datasets.load_dataset``."""
    import datasets

    try:
        return datasets.load_dataset(source, name=config, split=split)
    except Exception as err:  # the hub client raises many types (offline, missing, auth)
        raise DataError(
            f"{source}: not a local path, and the hub dataset could not be loaded "
            f"({type(err).__name__}: {err})",
            fix="check the path, or the hub id, config and split (and the network)",
        ) from None


def _texts_from_records(records: Iterable[Mapping[str, Any]], source: str) -> dict[str, list]:
    """Parallel text from hub rows with ``text`` and a language (``iso_639_3`` +
    ``iso_15924`` as FLORES+ has them, or ``language``/``lang``)."""
    texts: dict[str, list[str]] = {}
    for number, row in enumerate(records, start=1):
        code = row.get("language") or row.get("lang")
        if code is None and row.get("iso_639_3"):
            code = f"{row['iso_639_3']}_{row.get('iso_15924', '')}"
        if not isinstance(code, str) or not isinstance(row.get("text"), str):
            raise RecordError(f"{source}, row {number}: needs 'text' and a language column")
        lang = lang_of(code)
        if lang is not None:
            texts.setdefault(lang, []).append(row["text"])
    return texts


def load_benchmark(
    source: PathLike | Iterable[Mapping[str, Any]],
    format: str | None = None,
    langs: Iterable[str] | str | None = None,
    relations: Iterable[str] | str | None = None,
    limit: int | None = None,
    *,
    split: str = "devtest",
    template_index: int | None = 0,
    candidates: str | None = "relation",
    hub_config: str | None = None,
    hub_split: str = "test",
) -> Benchmark:
    """Load a benchmark from a local path, a hub id or rows (see the module docstring).

    Args:
        source: a file or folder in one of :data:`FORMATS` (told from its layout unless
            ``format`` is given); a Hugging Face hub id (``"owner/name"``, not a local path),
            loaded with ``datasets.load_dataset(source, name=hub_config, split=hub_split)``;
            or an iterable of row dicts (a ``datasets.Dataset``). Hub ids and rows take the
            flat formats: ``mlama_rows`` (the default) and ``flores`` (``text`` rows).
        format: one of :data:`FORMATS` (default: detected).
        langs: mechlingo codes to keep (default: every supported language present; records
            of files in other languages are counted as ``unsupported_language``).
        relations: relations to keep (default all); ``limit``: fact ids per relation, the
            same ids in every language (as :func:`mechlingo.data.load_facts`).
        split: FLORES split (``dev`` or ``devtest``).
        template_index, candidates: mLAMA family, see :func:`facts_from_rows`.

    Returns:
        A :class:`Benchmark`: ``facts`` (selected and sorted), ``skipped`` by reason; for
        ``flores``, ``texts`` instead of facts.

    Raises:
        DataError / RecordError: a missing path, an unknown layout, or a malformed file
            (naming the file and line). InputError: bad arguments or nothing selected.
    """
    if format is not None and format not in FORMATS:
        raise InputError(f"format must be one of {FORMATS}, got {format!r}")
    wanted = None if langs is None else check_langs(langs)
    if isinstance(source, str | os.PathLike):
        path = Path(source).expanduser()
        if not path.exists() and is_hub_id(str(source)):
            records = _hub_records(str(source), hub_config, hub_split)
            return _from_records(
                records, str(source), format, wanted, relations, limit, candidates, template_index
            )
        check_links(path, DataError)  # a file linked in from outside the folder: refused
        fmt = format or detect_format(path)
        if fmt == "facts":
            raise InputError(
                f"{path} is a mechlingo facts file, not a benchmark; read it with load_facts"
            )
        bench = _load_local(path, fmt, wanted, split, template_index, candidates)
    else:
        return _from_records(
            source, "<rows>", format, wanted, relations, limit, candidates, template_index
        )
    if bench.texts is None:
        bench.facts = select(bench, wanted, relations, limit)
    return bench


def _load_local(
    path: Path,
    fmt: str,
    wanted: tuple[str, ...] | None,
    split: str,
    template_index: int | None,
    candidates: str | None,
) -> Benchmark:
    if fmt == "bmlama":
        return load_bmlama(path, wanted)
    if fmt == "klar":
        return load_klar(path, wanted)
    if fmt == "klar_flat":
        return load_klar_flat(path, wanted)
    if fmt in ("mlama", "mpararel", "mlama_rows"):
        return load_mlama(path, wanted, template_index=template_index, candidates=candidates)
    folder = path.parent.parent if path.is_file() else path
    texts = read_parallel(folder, wanted, split)
    return Benchmark([], "flores", str(path), texts=texts)


def _from_records(
    records: Iterable[Mapping[str, Any]],
    source: str,
    fmt: str | None,
    wanted: tuple[str, ...] | None,
    relations: Iterable[str] | str | None,
    limit: int | None,
    candidates: str | None,
    template_index: int | None,
) -> Benchmark:
    fmt = fmt or "mlama_rows"
    if fmt == "flores":
        texts = _texts_from_records(records, source)
        if wanted is not None:
            texts = {lang: texts[lang] for lang in wanted if lang in texts}
        return Benchmark([], "flores", source, texts=texts)
    if fmt != "mlama_rows":
        raise InputError(
            f"rows and hub ids are read as 'mlama_rows' or 'flores', not {fmt!r}; download "
            f"{fmt} files and pass their folder (docs/benchmarks.md)"
        )
    bench = Benchmark([], "mlama_rows", source)
    rows = rows_from_records(records, source, wanted, bench)
    facts_from_rows(bench, rows, template_index=template_index, candidates=candidates)
    bench.facts = select(bench, wanted, relations, limit)
    return bench
