"""KLAR (Wang et al. 2025): ``klar_source/<lang>/<relation>.json`` files, and its parallel
text variant ``<lang_Script>.txt`` (layouts in :mod:`mechlingo.data.benchmarks`)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import Any

from mechlingo.core.errors import DataError
from mechlingo.core.untrusted import check_depth
from mechlingo.data.benchmarks import common
from mechlingo.data.benchmarks.common import MASK, Benchmark, PathLike
from mechlingo.data.facts import Fact, RecordError, check_langs
from mechlingo.data.io import read_text


def klar_root(path: Path) -> Path:
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


def _klar_count(path: Path) -> int:
    """How many records the file holds (read only when its language is asked about)."""
    return len(_klar_json(path)[0])


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
        files = sorted(p for p in klar_root(path).glob("*/*.json") if p.is_file())
    if not files:
        raise DataError(f"{path}: no <lang>/<relation>.json file (KLAR's klar_source layout)")
    english: dict[str, tuple[str, str]] = {}
    for file in files:
        code, relation = file.parent.name, file.stem
        lang = common.lang_selected(bench, code, wanted, str(file), partial(_klar_count, file))
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
        common.with_english(f, *english[f.id]) if f.id in english and not f.answer_en else f
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
    template = templates[0].replace("<MASK>", MASK)
    if "<subject>" not in template:
        bench.skip("no_subject_slot", where)
        return None
    parts = common.answer_slot(bench, where, template)
    if parts is None:
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
    return common.cloze_fact(bench, where, record, head.strip(), tail, check_spacing=False)


ANSWER_COLON = re.compile(r"[:：]")
_QUESTION_END = re.compile(r"[?？;;؟]")


def klar_flat_lines(path: Path) -> list[tuple[int, str]]:
    lines = read_text(path, "KLAR text file").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [(n, line.rstrip("\r")) for n, line in enumerate(lines, start=1)]


def _klar_flat_fact(bench: Benchmark, path: Path, number: int, line: str, lang: str) -> Fact | None:
    where = f"{path.name}, line {number}"
    if not line.strip():
        bench.skip("empty_answer", where)
        return None
    colons = list(ANSWER_COLON.finditer(line))
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
    return common.cloze_fact(bench, where, record, prompt, "", check_spacing=False)


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
        lines = klar_flat_lines(file)
        n_lines = len(lines)
        lang = common.lang_selected(bench, file.stem, wanted, str(file), lambda n=n_lines: n)  # type: ignore[misc]
        if lang is None:
            continue
        counts[file.name] = len(lines)
        for number, line in lines:
            fact = _klar_flat_fact(bench, file, number, line, lang)
            if fact is not None:
                bench.facts.append(fact)
    if len(set(counts.values())) > 1:
        raise DataError(f"{path}: KLAR text files are not line-aligned, line counts {counts}")
    common.fill_english(bench)
    return bench
