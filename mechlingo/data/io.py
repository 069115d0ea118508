"""Reading and writing facts (JSONL, TSV, Hugging Face ``datasets``) and parallel text.

File formats:

- **JSONL**: one JSON object per line with the fields of :class:`~mechlingo.data.facts.Fact`
  (``aliases`` a list, ``subject_span`` a two-element list). Blank lines are skipped.
- **TSV**: a header line naming the columns (any order; the required ones must be there),
  then one record per line. ``aliases`` are joined by ``|`` and ``subject_span`` is written
  ``start,end``. Tabs, newlines and backslashes inside values are escaped as ``\\t``, ``\\n``
  and ``\\\\`` (key-value prompts such as ``"Country: Italy\\nCapital:"`` contain a newline).

Any malformed record raises :class:`ValueError` naming the file, the line and the field.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mechlingo.core.errors import DataError, InputError
from mechlingo.core.languages import is_lang_code, lang_code, order_langs
from mechlingo.core.untrusted import check_depth, check_links, refuse_special
from mechlingo.data.facts import (
    CLOZE_FIELDS,
    FIELDS,
    MAX_PROBLEMS,
    RELATIONS,
    Fact,
    RecordError,
    check_langs,
    fact_from_mapping,
    unknown_field_problems,
)

if TYPE_CHECKING:
    import datasets

PathLike = str | os.PathLike[str]

#: The largest data file mechlingo reads (facts, benchmark files, parallel text): 4 GiB.
MAX_TEXT_BYTES = 4 * 2**30
#: The longest line of a data file: 16 MiB (a record or a sentence is a few hundred bytes).
MAX_LINE_BYTES = 16 * 2**20

#: File name of the bundled facts inside the ``mechlingo.data`` package.
BUNDLED_FACTS = "facts.jsonl"


_UTF16 = {b"\xff\xfe": "UTF-16 little-endian", b"\xfe\xff": "UTF-16 big-endian"}
_UTF32 = {b"\xff\xfe\x00\x00": "UTF-32 little-endian", b"\x00\x00\xfe\xff": "UTF-32 big-endian"}


def read_text(path: PathLike, what: str = "file") -> str:
    """The text of a data file, as every mechlingo loader reads it.

    UTF-8, with what other tools add read as well: a UTF-8 byte-order mark is dropped, CRLF
    (Windows) and lone CR (old Mac) line ends become ``\\n``. Trailing blank lines are kept
    (each loader skips blank lines). A file in another encoding gets a :class:`DataError`
    that names the encoding found (UTF-16 or UTF-32 by their byte-order mark or their zero
    bytes; Latin-1/Windows-1252 when the bytes are not UTF-8) and the ``iconv`` command
    that converts it.

    Raises:
        DataError: the file is missing, a folder, a named pipe, socket or device (refused
            before it is opened: a pipe would block), or not UTF-8 (see above).
    """
    refuse_special(path, DataError, fix=f"give a regular {what}")
    try:
        size = Path(path).stat().st_size
        if size > MAX_TEXT_BYTES and not Path(path).is_dir():
            raise DataError(f"{path} is {size:,} bytes; a {what} is read whole, at most "
                            f"{MAX_TEXT_BYTES:,}", fix="split it into smaller files")  # fmt: skip
        data = Path(path).read_bytes()
    except IsADirectoryError:
        raise DataError(f"{path} is a folder, not a {what}") from None
    except FileNotFoundError:
        raise DataError(f"{path} does not exist") from None
    _refuse_wide(data, path)
    _refuse_long_lines(data, path)
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        col = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        byte = data[err.start]
        guess = bytes([byte]).decode("cp1252", errors="replace")
        raise DataError(
            f"{path}, line {line}: byte 0x{byte:02x} at column {col} is not UTF-8; the file "
            f"looks like Latin-1 / Windows-1252 (where 0x{byte:02x} is {guess!r})",
            fix=f"save it as UTF-8, e.g. iconv -f cp1252 -t utf-8 {path} > fixed{Path(path).suffix}",
        ) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _refuse_long_lines(data: bytes, path: PathLike) -> None:
    """A :class:`DataError` for a line longer than :data:`MAX_LINE_BYTES` (found before the
    text is decoded, split or parsed, which would each take several times its size)."""
    if len(data) <= MAX_LINE_BYTES:
        return
    start, line = 0, 1
    while start < len(data):
        end = data.find(b"\n", start)
        end = len(data) if end < 0 else end
        if end - start > MAX_LINE_BYTES:
            raise DataError(
                f"{path}, line {line} is {end - start:,} bytes long; mechlingo reads lines of at "
                f"most {MAX_LINE_BYTES:,} bytes (a fact or a sentence is far shorter)",
                fix="check that this is the file you meant (one record per line)",
            )
        start, line = end + 1, line + 1


def _refuse_repeats(items: Iterable[str], what: str) -> None:
    """An :class:`InputError` for a list that names one item twice (``langs=["en", "en"]``):
    a repeat would be read, scored and counted twice."""
    seen: set[str] = set()
    for item in items if not isinstance(items, str) else (items,):
        if item in seen:
            raise InputError(
                f"{what} names {item!r} more than once", fix=f"give each of {what} once"
            )
        seen.add(item)


def json_record(text: str, where: str) -> Any:
    """One JSON record of a data file (``where``: the file and line): refused with a
    :class:`RecordError` when it is not valid JSON or nests deeper than
    :data:`~mechlingo.core.untrusted.MAX_JSON_DEPTH` levels (checked before parsing)."""
    check_depth(text, RecordError, where)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise RecordError(f"{where}: invalid JSON ({err.msg})") from None
    except (ValueError, RecursionError) as err:  # e.g. an integer of 5,000 digits
        raise RecordError(f"{where}: invalid JSON ({str(err)[:120]})") from None


def _refuse_wide(data: bytes, path: PathLike) -> None:
    """A :class:`DataError` for UTF-16/UTF-32 text (a byte-order mark, or text whose every
    other byte is zero)."""
    found = next((n for bom, n in _UTF32.items() if data.startswith(bom)), None)
    found = found or next((n for bom, n in _UTF16.items() if data.startswith(bom)), None)
    head = data[:4096]
    if found is None and len(head) >= 4 and head.count(0) * 3 > len(head):
        even, odd = head[0::2].count(0), head[1::2].count(0)
        found = "UTF-16 little-endian" if odd > even else "UTF-16 big-endian"
        found += " (no byte-order mark; guessed from its zero bytes)"
    if found is None:
        return
    code = found.split(" (")[0].replace(" little-endian", "LE").replace(" big-endian", "BE")
    raise DataError(
        f"{path} is {found} text, not UTF-8",
        fix=f"convert it: iconv -f {code.replace(' ', '')} -t utf-8 {path} > "
        f"fixed{Path(path).suffix} (or save it as UTF-8 in your editor)",
    )


def bundled_path() -> Path:
    """Path of the bundled ``facts.jsonl`` (generated by ``scripts/generate_data.py``)."""
    return Path(str(resources.files("mechlingo.data").joinpath(BUNDLED_FACTS)))


def _repeat_problems(facts: Sequence[Fact], source: str, lines: Sequence[int]) -> list[str]:
    """One message per repeated (id, lang) pair, naming both lines."""
    seen: dict[tuple[str, str], int] = {}
    out = []
    for fact, line in zip(facts, lines, strict=True):
        key = (fact.id, fact.lang)
        if key in seen:
            out.append(
                f"{source}, line {line}: field 'id' repeats {fact.id!r} in language "
                f"{fact.lang!r} (first on line {seen[key]})"
            )
        else:
            seen[key] = line
    return out


def _check_unique(facts: Sequence[Fact], source: str, lines: Sequence[int]) -> None:
    problems = _repeat_problems(facts, source, lines)
    if problems:
        raise RecordError(problems[0])


def problems_error(problems: Sequence[str], source: str) -> RecordError:
    """One error for all the problems of a file: the one message when there is one, else a
    count and the first :data:`~mechlingo.data.facts.MAX_PROBLEMS`, one per line."""
    if len(problems) == 1:
        return RecordError(problems[0])
    shown = list(problems[:MAX_PROBLEMS])
    more = len(problems) - len(shown)
    head = f"{source}: {len(problems)} problems" + (
        f" (the first {len(shown)} listed)" if more else ""
    )
    return RecordError(head + "".join(f"\n  {p}" for p in shown))


def _facts_of(
    records: Iterable[tuple[int, Any]], source: str, empty: DataError, strict: bool = True
) -> list[Fact]:
    """The checked facts of ``(line, record)`` pairs, read in order; a record may be a
    :class:`RecordError` (a line that could not be read). Every problem of the file (each
    record's first bad field, fields a fact lacks when ``strict``, repeated (id, lang) pairs)
    is reported at once in one :class:`RecordError` (:func:`problems_error`); ``empty`` is
    raised when there are no records."""
    facts: list[Fact] = []
    lines: list[int] = []
    problems: list[str] = []
    for number, record in records:
        if isinstance(record, RecordError):
            problems.append(str(record))
            continue
        if strict:
            problems += unknown_field_problems(record, f"{source}, line {number}")
        try:
            facts.append(fact_from_mapping(record, source, number))
            lines.append(number)
        except RecordError as err:
            problems.append(str(err))
    if not facts and not problems:
        raise empty
    problems += _repeat_problems(facts, source, lines)
    if problems:
        raise problems_error(problems, source)
    return facts


def read_jsonl(path: PathLike) -> list[Fact]:
    """Read facts from a JSONL file, one record per line.

    Raises:
        ValueError: for invalid JSON, a missing or malformed field, an unknown language or a
            repeated (id, lang) pair, naming the file, the line number and the field.
    """
    source = str(path)

    def records() -> Iterator[tuple[int, Any]]:
        for number, text in enumerate(read_text(path, "facts file").split("\n"), start=1):
            if text.strip():
                try:
                    yield number, json_record(text, f"{source}, line {number}")
                except RecordError as err:
                    yield number, err

    empty = DataError(
        f"{source}, line 1: the file holds no facts (empty)",
        fix="add one JSON object per line (see docs/data.md)",
    )
    return _facts_of(records(), source, empty)


def write_jsonl(facts: Iterable[Fact], path: PathLike) -> None:
    """Write facts as JSONL (UTF-8, one compact object per line, fields in a fixed order)."""
    with open(path, "w", encoding="utf-8", newline="\n") as handle:
        for fact in facts:
            handle.write(json.dumps(fact.to_json(), ensure_ascii=False, separators=(",", ":")))
            handle.write("\n")


_ESCAPES = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}
_UNESCAPES = {"\\": "\\", "t": "\t", "n": "\n", "r": "\r"}


def _escape(value: str) -> str:
    return "".join(_ESCAPES.get(ch, ch) for ch in value)


def _unescape(value: str, source: str, line: int, field: str) -> str:
    out: list[str] = []
    chars = iter(value)
    for ch in chars:
        if ch != "\\":
            out.append(ch)
            continue
        nxt = next(chars, None)
        if nxt not in _UNESCAPES:
            raise RecordError(
                f"{source}, line {line}: field '{field}' has an unknown escape '\\{nxt or ''}'"
            )
        out.append(_UNESCAPES[nxt])
    return "".join(out)


def _quoted_cell(text: str, start: int) -> tuple[str, int] | None:
    """The quoted cell that starts at ``text[start] == '"'``: its value (``""`` read as
    ``"``; tabs and line breaks inside kept) and the index just after its closing quote, or
    ``None`` when the quote does not close right before a tab, a line end or the end (then
    the quote is an ordinary character of an unquoted cell)."""
    out: list[str] = []
    i = start + 1
    while True:
        j = text.find('"', i)
        if j < 0:
            return None
        out.append(text[i:j])
        if text.startswith('"', j + 1):
            out.append('"')
            i = j + 2
            continue
        if j + 1 == len(text) or text[j + 1] in "\t\n":
            return "".join(out), j + 1
        return None


def tsv_rows(text: str) -> list[tuple[int, list[str], list[bool]]]:
    """Split tab-separated text into rows: ``(line number where the row starts, cells,
    whether each cell was quoted)``. A cell that starts with ``"`` and whose quote closes
    right before a tab or a line end is a quoted cell, as spreadsheets and ``csv`` write
    them: ``""`` inside is one ``"``, and tabs and line breaks inside belong to the cell.
    Blank rows are left out. ``text`` has ``\\n`` line ends (:func:`read_text`)."""
    rows: list[tuple[int, list[str], list[bool]]] = []
    cells: list[str] = []
    quoted: list[bool] = []
    line, row_line, i, n = 1, 1, 0, len(text)
    while i <= n:
        q = _quoted_cell(text, i) if i < n and text[i] == '"' else None
        if q is not None:
            value, i = q
            line += value.count("\n")
        else:
            nl = text.find("\n", i)
            nl = n if nl < 0 else nl
            tab = text.find("\t", i, nl)
            stop = nl if tab < 0 else tab
            value, i = text[i:stop], stop
        cells.append(value)
        quoted.append(q is not None)
        if i < n and text[i] == "\t":
            i += 1
            continue
        if any(c.strip() for c in cells) or any(quoted):
            rows.append((row_line, cells, quoted))
        cells, quoted = [], []
        line += 1
        row_line = line
        i += 1
    return rows


def read_tsv(path: PathLike) -> list[Fact]:
    """Read facts from a TSV file with a header line (see the module docstring).

    Cells quoted as spreadsheets write them (``"a ""b"" c"``) are read as they are: ``""``
    is one ``"``, tabs and line breaks inside are kept, and backslashes are not escapes.

    Raises:
        ValueError: naming the file, line and field for a missing column or a bad value.
    """
    source = str(path)
    text = read_text(path, "facts file")
    rows = tsv_rows(text)
    if not rows or rows[0][0] != 1:
        raise RecordError(f"{source}, line 1: missing header line (column names)")
    header = [name.strip() for name in rows[0][1]]

    def record(number: int, cells: list[str], quoted: list[bool]) -> dict[str, Any]:
        if len(cells) != len(header):
            raise RecordError(
                f"{source}, line {number}: has {len(cells)} columns, the header has {len(header)}"
            )
        out: dict[str, Any] = {}
        for name, cell, q in zip(header, cells, quoted, strict=True):
            if cell == "" and name not in ("answer_en", "subject_en", "aliases"):
                continue  # an empty required cell is reported as missing
            out[name] = cell if q else _unescape(cell, source, number, name)
        return out

    def records() -> Iterator[tuple[int, Any]]:
        for number, cells, quoted in rows[1:]:
            try:
                yield number, record(number, cells, quoted)
            except RecordError as err:
                yield number, err

    empty = DataError(
        f"{source}, line 2: the file has a header line but no facts",
        fix="add one tab-separated record per line after the header",
    )
    return _facts_of(records(), source, empty)


def write_tsv(facts: Iterable[Fact], path: PathLike) -> None:
    """Write facts as TSV with a header line (see the module docstring for escaping)."""
    facts = list(facts)
    names = FIELDS + tuple(f for f in CLOZE_FIELDS if any(getattr(x, f) for x in facts))
    with open(path, "w", encoding="utf-8", newline="\n") as handle:
        handle.write("\t".join(names) + "\n")
        for fact in facts:
            row = fact.to_json()
            row["aliases"] = "|".join(fact.aliases)
            row["candidates"] = "|".join(fact.candidates)
            row["subject_span"] = f"{fact.subject_span[0]},{fact.subject_span[1]}"
            row.setdefault("suffix", "")
            handle.write("\t".join(_escape(str(row[name])) for name in names) + "\n")


def read_facts(path: PathLike) -> list[Fact]:
    """Read a ``.jsonl`` or ``.tsv`` facts file, chosen by extension."""
    suffix = Path(path).suffix.lower()
    if suffix in (".jsonl", ".json"):
        return read_jsonl(path)
    if suffix in (".tsv", ".tab"):
        return read_tsv(path)
    raise DataError(f"{path}: unknown facts file extension {suffix!r}; use .jsonl or .tsv")


def to_dataset(facts: Iterable[Fact]) -> datasets.Dataset:
    """A ``datasets.Dataset`` with one row per fact and the columns of :data:`FIELDS`
    (``aliases`` a list of strings, ``subject_span`` a list of two ints)."""
    import datasets

    rows = [fact.to_json() for fact in facts]
    features = datasets.Features(
        {
            **{name: datasets.Value("string") for name in FIELDS},
            "aliases": datasets.Sequence(datasets.Value("string")),
            "subject_span": datasets.Sequence(datasets.Value("int64")),
        }
    )
    columns = {name: [row[name] for row in rows] for name in FIELDS}
    return datasets.Dataset.from_dict(columns, features=features)


def from_dataset(ds: datasets.Dataset | Iterable[dict[str, Any]]) -> list[Fact]:
    """Facts from a ``datasets.Dataset`` (or any iterable of dicts) with the Fact fields.

    Works for datasets you build from BMLAMA, KLAR or your own tables once the columns are
    renamed to the Fact fields (``ds.rename_column``). Errors name the row as ``line``
    (1-based row number).
    """
    facts = [fact_from_mapping(row, "<dataset>", i) for i, row in enumerate(ds, start=1)]
    _check_unique(facts, "<dataset>", range(1, len(facts) + 1))
    return facts


@lru_cache(maxsize=8)
def _read_cached(path: str, mtime_ns: int) -> tuple[Fact, ...]:
    del mtime_ns  # part of the cache key only
    return tuple(read_facts(path))


def _relation_key(relation: str) -> tuple[int, str]:
    return (RELATIONS.index(relation) if relation in RELATIONS else len(RELATIONS), relation)


def load_facts(
    langs: Iterable[str] | str | None = None,
    relations: Iterable[str] | str | None = None,
    limit: int | None = None,
    path: PathLike | None = None,
    templates: str = "measured",
) -> list[Fact]:
    """Load facts from the bundled data (or from ``path``, a ``.jsonl``/``.tsv`` file).

    Args:
        langs: language codes to keep (default: all of :data:`LANGS` for the bundled data;
            a file may hold any language, see :func:`~mechlingo.core.languages.lang_code`).
        relations: relations to keep (default: all in the file).
        limit: at most this many fact ids per relation. The ids are the first ``limit`` in
            sorted order among those present in *every* requested language, so the result
            stays aligned across languages (same ids in each).
        path: a user file instead of the bundled data.
        templates: which prompts the bundled facts get: ``"measured"`` (the stems chosen per
            language for the highest zero-shot accuracy on the embedded model, see
            ``docs/data.md``) or ``"natural"`` (plain fact-completion stems written once and
            never measured on a model, :func:`natural_templates`). A user file keeps its own
            prompts and takes only ``"measured"`` (meaning "as written").

    Returns:
        Facts sorted by relation (bundled order), id, then language (order of ``langs``).

    Raises:
        ValueError: for an unknown language or relation (listing the valid ones) or a
            selection that matches nothing.
    """
    lang_sel = check_langs(langs)
    _refuse_repeats(lang_sel, "langs")
    _refuse_repeats(relations or (), "relations")
    if templates not in TEMPLATE_FAMILIES:
        raise InputError(f"templates must be one of {TEMPLATE_FAMILIES}, got {templates!r}")
    if templates == "natural" and path is not None:
        raise InputError(
            "templates='natural' re-renders the bundled facts; a facts file keeps its own "
            "prompts (leave templates at 'measured')"
        )
    source = bundled_path() if path is None else Path(path)
    refuse_special(source, DataError, fix="give a regular .jsonl or .tsv facts file")
    if not source.is_file():
        raise DataError(
            f"{source} "
            + ("is a folder, not a facts file" if source.is_dir() else "does not exist")
        )
    everything = _read_cached(str(source), source.stat().st_mtime_ns)
    available = sorted({fact.relation for fact in everything}, key=_relation_key)
    if relations is None:
        rel_sel = tuple(available)
    else:
        rel_sel = (relations,) if isinstance(relations, str) else tuple(relations)
        unknown = [rel for rel in rel_sel if rel not in available]
        if unknown:
            raise InputError(
                f"unknown relation(s) {unknown} in {source}; valid relations are {available}"
            )
    if limit is not None and limit < 1:
        raise InputError(f"limit must be a positive number of fact ids, got {limit}")
    lang_rank = {lang: i for i, lang in enumerate(lang_sel)}
    rel_set = set(rel_sel)
    facts = [f for f in everything if f.lang in lang_rank and f.relation in rel_set]
    if limit is not None:
        langs_of: dict[str, set[str]] = {}
        for fact in facts:
            langs_of.setdefault(fact.id, set()).add(fact.lang)
        complete_ids: dict[str, list[str]] = {}
        for fact in facts:
            if len(langs_of[fact.id]) == len(lang_sel):
                complete_ids.setdefault(fact.relation, []).append(fact.id)
        keep = {fid for ids in complete_ids.values() for fid in sorted(set(ids))[:limit]}
        facts = [f for f in facts if f.id in keep]
    if not facts:
        present = sorted({f.lang for f in everything if f.relation in rel_set})
        raise InputError(
            f"no facts in {source} for languages {list(lang_sel)}, relations {list(rel_sel)}"
            + (f", limit {limit}" if limit is not None else "")
            + f"; the file has languages {present} for these relations"
        )
    facts.sort(key=lambda f: (_relation_key(f.relation), f.id, lang_rank[f.lang]))
    if path is not None:
        facts = with_english_rows(facts, everything)
    if templates == "natural":
        facts = [with_template(f, natural_templates()[f.relation][f.lang]) for f in facts]
    return facts


def with_english_rows(facts: Sequence[Fact], pool: Iterable[Fact]) -> list[Fact]:
    """``facts`` with the English answer and subject of the English row of the same id in
    ``pool`` wherever a fact has none of its own: a file's English rows still give the
    English answers when ``langs`` leaves English out."""
    english = {f.id: f for f in pool if f.lang == "en"}

    def fill(f: Fact) -> Fact:
        en = english.get(f.id)
        if en is None or (f.answer_en and f.subject_en):
            return f
        return dataclasses.replace(f, answer_en=f.answer_en or en.answer,
                                   subject_en=f.subject_en or en.subject)  # fmt: skip

    return [fill(f) for f in facts]


TEMPLATE_FAMILIES = ("measured", "natural")
#: the command line's retired ``--templates`` values, read only there (the Python API takes
#: :data:`TEMPLATE_FAMILIES`)
RETIRED_TEMPLATES = {"tuned": "measured"}


@lru_cache(maxsize=1)
def natural_templates() -> dict[str, dict[str, str]]:
    """``{relation: {lang: stem}}``: the ``natural`` template family, plain fact-completion
    stems (``"The capital of {s} is"``, ``"{s}の首都は"``) written once by hand from each
    relation's meaning and never chosen or tuned on a model (``natural_templates.json``)."""
    text = resources.files("mechlingo.data").joinpath("natural_templates.json").read_text("utf-8")
    return json.loads(text)["templates"]


def with_template(fact: Fact, template: str) -> Fact:
    """``fact`` with its prompt rendered from ``template`` (``{s}`` = the subject) and the
    subject span moved accordingly."""

    if template.count("{s}") != 1:
        raise InputError(f"template {template!r} must hold {{s}} exactly once")
    start = template.index("{s}")
    prompt = template.replace("{s}", fact.subject).rstrip()
    return dataclasses.replace(fact, prompt=prompt, subject_span=(start, start + len(fact.subject)))


def _txt_files(folder: Path) -> dict[str, str]:
    """``{canonical code: file stem}`` of the ``<lang>.txt`` files of ``folder`` named by a
    language code (``sv.txt``, ``swh_Latn.txt``), the bundled twelve first."""
    found: dict[str, str] = {}
    for p in sorted(folder.glob("*.txt")):
        if p.is_file() and is_lang_code(p.stem):
            found.setdefault(lang_code(p.stem), p.stem)
    return {lang: found[lang] for lang in order_langs(list(found))}


def read_parallel_dir(path: PathLike, langs: Iterable[str] | None = None) -> dict[str, list[str]]:
    """Read a folder of line-aligned ``<lang>.txt`` files (line i is the same sentence in
    every language), e.g. an NTREX or FLORES export.

    Args:
        path: the folder.
        langs: languages to read, any code :func:`~mechlingo.core.languages.lang_code` takes
            (default: every file named by a language code, the bundled twelve first). A file
            is found by the code as given or by any code of the same language (``sw`` finds
            ``swh_Latn.txt``).

    Returns:
        ``{lang: [sentence, ...]}`` keyed by canonical codes, in the order of ``langs``.

    Raises:
        ValueError: if the folder or a requested language file is missing, no file is
            found, or the files have different line counts.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise DataError(f"{folder} is not a folder of <lang>.txt files")
    check_links(folder, DataError)
    for p in folder.glob("*.txt"):  # a pipe or device named like a language: refused
        if is_lang_code(p.stem):
            refuse_special(p, DataError, fix="give regular <lang>.txt files")
    present = _txt_files(folder)
    if langs is None:
        stems = present
        if not stems:
            raise DataError(f"{folder} has no <lang>.txt file named by a language code",
                            fix="name each file by its language: en.txt, sv.txt, ...")  # fmt: skip
    else:
        asked = list((langs,) if isinstance(langs, str) else langs)
        _refuse_repeats(asked, "langs")
        stems = {}
        missing = []
        for lang in asked:
            if (folder / f"{lang}.txt").is_file():
                stems[lang_code(lang) if is_lang_code(lang) else lang] = lang
            elif is_lang_code(lang) and lang_code(lang) in present:
                stems[lang_code(lang)] = present[lang_code(lang)]
            else:
                missing.append(lang)
        if missing:
            raise DataError(f"{folder}: no file for language(s) {missing} (expected <lang>.txt)")
    wanted = list(stems)
    texts: dict[str, list[str]] = {}
    for lang in wanted:
        content = read_text(folder / f"{stems[lang]}.txt", "text file")
        lines = content.split("\n")
        while lines and not lines[-1].strip():  # trailing blank lines (editors add them)
            lines.pop()
        texts[lang] = lines
    counts = {lang: len(lines) for lang, lines in texts.items()}
    if len(set(counts.values())) > 1:
        raise DataError(f"{folder}: files are not line-aligned, line counts {counts}")
    return texts
