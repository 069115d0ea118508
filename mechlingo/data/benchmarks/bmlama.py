"""BMLAMA-17/53 (Qi et al. 2023): one TSV per language, row ``i`` the same fact in every file
(layout in :mod:`mechlingo.data.benchmarks`)."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from functools import partial
from pathlib import Path

from mechlingo.core.errors import DataError
from mechlingo.data.benchmarks import common
from mechlingo.data.benchmarks.common import MASK, Benchmark, PathLike
from mechlingo.data.facts import Fact, RecordError, check_langs
from mechlingo.data.io import read_text

_BMLAMA_HEADER = ["Prompt", "Ans", "Candidate", "Ans", "Subject"]


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


def _bmlama_count(path: Path) -> int:
    """How many records the file holds (read only when its language is asked about)."""
    return len(_bmlama_rows(path))


def _bmlama_relations(path: Path, rows: list[tuple[int, list[str]]]) -> list[str | None]:
    """The relation id of every row, from the English prompt with the subject removed."""
    slugs: dict[str, str] = {}
    used: set[str] = set()
    out: list[str | None] = []
    for _, (prompt, _ans, _cands, subject) in rows:
        if not subject.strip() or subject not in prompt or prompt.count(MASK) != 1:
            out.append(None)
            continue
        template = prompt.replace(subject, "[X]", 1)
        if template not in slugs:
            slug, k = common.relation_slug(template), 2
            while slug in used:
                slug, k = f"{common.relation_slug(template)}_{k}", k + 1
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
    docstring). ``langs``: language codes to keep (default all; every language is read)."""
    path = Path(path)
    wanted = None if langs is None else check_langs(langs)
    bench = Benchmark([], "bmlama", str(path))
    files = _bmlama_files(path)
    en_rows = _bmlama_rows(files["en"])
    relations = _bmlama_relations(files["en"], en_rows)
    for code, file in files.items():
        if path.is_file() and code != path.stem:
            continue
        lang = common.lang_selected(bench, code, wanted, str(file), partial(_bmlama_count, file))
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
                bench.facts.append(
                    common.with_english(fact, en_cells[3], en_cells[1].split(", ")[0])
                )
    return bench


def _bmlama_fact(
    bench: Benchmark, where: str, lang: str, i: int, cells: list[str], relation: str | None
) -> Fact | None:
    prompt, ans, cands, subject = cells
    if relation is None:
        bench.skip("no_english_template", where)
        return None
    parts = common.answer_slot(bench, where, prompt)
    if parts is None:
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
    return common.cloze_fact(bench, where, record, *parts)
