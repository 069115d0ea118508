"""mLAMA (Kassner et al. 2021), mParaRel (Fierro and Søgaard 2022) and the flat rows of their
hub exports (layouts in :mod:`mechlingo.data.benchmarks`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from mechlingo.core.answers import distinct_aliases
from mechlingo.core.errors import InputError
from mechlingo.data.benchmarks import common
from mechlingo.data.benchmarks.common import Benchmark, PathLike
from mechlingo.data.facts import RecordError, check_langs


def mlama_root(path: Path) -> Path:
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
        count = lambda fs=files: sum(1 for f in fs for _ in common.jsonl_objects(f))  # noqa: E731
        lang = common.lang_selected(bench, folder.name, wanted, str(folder), count)
        if lang is None:
            continue
        templates: dict[str, str] = {}
        for number, obj in common.jsonl_objects(tfile):
            if not isinstance(obj.get("relation"), str) or not isinstance(obj.get("template"), str):
                raise RecordError(f"{tfile}, line {number}: needs 'relation' and 'template'")
            templates[obj["relation"]] = obj["template"]
        for file in files:
            for number, obj in common.jsonl_objects(file):
                where = f"{folder.name}/{file.name}, line {number}"
                rows.append(_row(where, obj, lang, file.stem, templates.get(file.stem, "")))
    return rows


def _mpararel_rows(root: Path, wanted: tuple[str, ...] | None, bench: Benchmark) -> list[dict]:
    """Flat rows from ``patterns/<lang>/<relation>.jsonl`` x ``tuples/<lang>/<relation>.jsonl``
    (one row per tuple and pattern; ``template_id`` is the pattern's line order)."""
    rows: list[dict[str, Any]] = []
    for folder in sorted(p for p in (root / "tuples").iterdir() if p.is_dir()):
        files = sorted(folder.glob("*.jsonl"))
        count = lambda fs=files: sum(1 for f in fs for _ in common.jsonl_objects(f))  # noqa: E731
        lang = common.lang_selected(bench, folder.name, wanted, str(folder), count)
        if lang is None:
            continue
        for file in files:
            pfile = root / "patterns" / folder.name / file.name
            patterns = []
            if pfile.is_file():
                for number, obj in common.jsonl_objects(pfile):
                    if not isinstance(obj.get("pattern"), str):
                        raise RecordError(f"{pfile}, line {number}: needs a 'pattern' string")
                    patterns.append(obj["pattern"])
            for number, obj in common.jsonl_objects(file):
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
        lang = common.lang_selected(bench, code, wanted, where, lambda: 1)
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
        parts = common.answer_slot(bench, where, template, "[Y]")
        if parts is None:
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
            "aliases": distinct_aliases(answer, r["labels"][1:]),
            "candidates": pools.get((r["relation"], r["lang"]), []) if candidates else [],
        }
        fact = common.cloze_fact(bench, where, record, head, tail)
        if fact is None:
            continue
        if (fact.id, fact.lang) in seen:
            bench.skip("duplicate_id", where)
            continue
        seen.add((fact.id, fact.lang))
        bench.facts.append(fact)
    common.fill_english(bench)


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
        rows = rows_from_records(
            (obj for _, obj in common.jsonl_objects(path)), path.name, wanted, bench
        )
    elif (path / "tuples").is_dir():
        bench = Benchmark([], "mpararel", str(path))
        rows = _mpararel_rows(path, wanted, bench)
    else:
        bench = Benchmark([], "mlama", str(path))
        rows = _mlama_rows(mlama_root(path), wanted, bench)
    facts_from_rows(bench, rows, template_index=template_index, candidates=candidates)
    return bench
