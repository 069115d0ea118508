"""The entry point :func:`load_benchmark`: a local path's format told from its layout
(:func:`detect_format`), a hub id read through ``datasets``, and the selection of
languages, relations and ids (:func:`select`)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from mechlingo.core.errors import DataError, InputError
from mechlingo.core.languages import order_langs
from mechlingo.core.untrusted import check_links, expand_path, refuse_special
from mechlingo.data.benchmarks.bmlama import load_bmlama
from mechlingo.data.benchmarks.common import FORMATS, Benchmark, PathLike
from mechlingo.data.benchmarks.klar import (
    ANSWER_COLON,
    klar_flat_lines,
    klar_root,
    load_klar,
    load_klar_flat,
)
from mechlingo.data.benchmarks.mlama import (
    facts_from_rows,
    load_mlama,
    mlama_root,
    rows_from_records,
)
from mechlingo.data.facts import Fact, RecordError, check_langs
from mechlingo.data.io import json_record, read_text
from mechlingo.data.parallel_text import SPLITS, lang_of, parallel_layout, read_parallel


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
    refuse_special(path, DataError, fix="give a regular file or a folder")
    if path.is_file():
        found = _file_format(path)
        if found is None:
            raise DataError(f"{path}: unknown file type {path.suffix!r}", fix=_FORMAT_FIX)
        return found
    if not path.is_dir():
        raise DataError(f"{path} does not exist")
    if (klar_root(path) != path) or any(
        _LANG_DIR.fullmatch(p.parent.name) for p in path.glob("*/*.json")
    ):
        return "klar"
    if (path / "tuples").is_dir() and (path / "patterns").is_dir():
        return "mpararel"
    if any(mlama_root(path).glob("*/templates.jsonl")):
        return "mlama"
    tsvs = sorted(path.glob("*.tsv"))
    if any(_is_bmlama_tsv(p) for p in tsvs):
        return "bmlama"
    txts = sorted(path.glob("*.txt"))
    if txts and all(lang_of(p.stem) is not None or "_" in p.stem for p in txts):
        if any(ANSWER_COLON.search(line) for _, line in klar_flat_lines(txts[0])[:3]):
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
    by relation and id (first appearance) and language (order of ``langs``, else the
    bundled twelve first, then the others by code).

    Raises:
        InputError: a language of ``langs`` without facts, an unknown relation, a bad
            limit, or nothing selected.
    """
    facts = bench.facts
    if langs is not None:
        have = {f.lang for f in facts}
        missing = [lang for lang in langs if lang not in have]
        if missing:
            has = order_langs(bench.available_langs)
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
    order = langs or tuple(order_langs({f.lang for f in facts}))
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
    path = expand_path(text, "facts")
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
        langs: language codes to keep (default: every language present, keyed by canonical
            codes; only records whose language code names no language are skipped, as
            ``unsupported_language``).
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
        path = expand_path(source, "facts")
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
