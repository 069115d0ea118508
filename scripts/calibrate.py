"""The claims card's calibration table (``make calibrate``): every row type's verdict procedure
on simulated data, under its null and under the claim's truth (:mod:`mechlingo.card.calibration`).

    python scripts/calibrate.py                       # print the table
    python scripts/calibrate.py --write docs/calibration.md --jobs 2

``--write`` replaces the table between the ``<!-- calibration table -->`` markers of the page
(and the JSON of every rate beside it, ``--json``). The bootstrap rows resample 2,000 times per
sample, as the card does, so they get fewer samples (``--boot-reps``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from mechlingo.card.calibration import ROW_TYPES, run_row, table_markdown

BEGIN, END = "<!-- calibration table -->", "<!-- end of the calibration table -->"
WILD_BEGIN, WILD_END = "<!-- wild bootstrap table -->", "<!-- end of the wild bootstrap table -->"
FAMILY_BEGIN, FAMILY_END = "<!-- family table -->", "<!-- end of the family table -->"
SUBJ_BEGIN, SUBJ_END = "<!-- subjects table -->", "<!-- end of the subjects table -->"


def _task(args: tuple[int, int, int, tuple[float, ...], int]) -> list[dict[str, Any]]:
    i, j, reps, ks, seed = args
    row = ROW_TYPES[i]
    return run_row(row, row.designs[j], reps, ks, seed)


def merge(old: str, table: str, note: str, only: set[str]) -> str:
    """The page's table with the rows of the row types in ``only`` replaced by ``table``'s
    (every row type in :data:`ROW_TYPES` order; rows of row types that no longer exist
    dropped), the old notes kept and ``note`` added under them."""

    def rows(text: str) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for line in text.splitlines()[2:]:
            if line.startswith("| "):
                out.setdefault(line.split(" | ")[0][2:], []).append(line)
        return out

    before, now = rows(old), rows(table)
    lines = table.splitlines()[:2]
    for r in ROW_TYPES:
        lines += now.get(r.name, []) if r.name in only else before.get(r.name, [])
    notes = [x for x in old.strip().splitlines() if x and not x.startswith("|")]
    return "\n".join(lines) + "\n\n" + "\n".join(notes) + "\n" + note.strip() + "\n"


def _comparison(
    a: argparse.Namespace,
    calls: list[tuple[Callable[..., Any], tuple, dict]],
    table_markdown: Callable[[list[Any]], str],
    markers: tuple[str, str],
) -> int:
    """Run one comparison table's ``calls`` (function, args, keywords) in ``--jobs``
    processes, print the table and with ``--write`` put it between the page's ``markers``;
    exit 1 when a row reports ``ok`` false."""
    start = time.perf_counter()
    with ProcessPoolExecutor(max(1, a.jobs)) as pool:
        results = [f.result() for f in [pool.submit(fn, *args, **kw) for fn, args, kw in calls]]
    took = time.perf_counter() - start
    table = table_markdown(results) + (f"\n{len(results)} designs, {took / 60:.1f} min with "
                                       f"{a.jobs} process(es), seed {a.seed}\n")  # fmt: skip
    if a.json:
        a.json.write_text(json.dumps(results, indent=1), encoding="utf-8")
    if a.write and not _splice(a.write, *markers, lambda old: table):
        return 2
    print(table)
    return 0 if all(r.get("ok", True) for r in results if isinstance(r, dict)) else 1


def wild(a: argparse.Namespace) -> int:
    """The wild cluster bootstrap beside the card's CR2-BM intervals
    (:mod:`mechlingo.card.calibration_wild`)."""
    from mechlingo.card.calibration_wild import COMPARISON_DESIGNS, compare_wild, table_markdown

    calls = [(compare_wild, (k, d, a.wild), {"b": a.wild_draws, "seed": a.seed})
             for k, d in COMPARISON_DESIGNS]  # fmt: skip
    return _comparison(a, calls, table_markdown, (WILD_BEGIN, WILD_END))


def family(a: argparse.Namespace) -> int:
    """The Holm family's error (:mod:`mechlingo.card.calibration_family`)."""
    from mechlingo.card.calibration_family import FAMILY_DESIGNS, family_error, table_markdown

    calls = [(family_error, (d, a.family, a.seed), {}) for d in FAMILY_DESIGNS]
    return _comparison(a, calls, table_markdown, (FAMILY_BEGIN, FAMILY_END))


def subjects(a: argparse.Namespace) -> int:
    """The coverage of the rows over facts clustered by fact id and by subject on facts whose
    subjects are shared across relations (:mod:`mechlingo.card.calibration_subjects`)."""
    from mechlingo.card.calibration_subjects import (
        SUBJECT_DESIGNS,
        compare_subjects,
        table_markdown,
    )

    calls = [(compare_subjects, (*d, a.subjects), {"seed": a.seed}) for d in SUBJECT_DESIGNS]
    return _comparison(a, calls, table_markdown, (SUBJ_BEGIN, SUBJ_END))


def _splice(path: Path, begin: str, end: str, body: Callable[[str], str]) -> bool:
    """Write ``body(old)`` between the ``begin`` and ``end`` markers of ``path`` (``old``: what
    stands between them now); False, with one line on stderr, when a marker is missing."""
    text = path.read_text(encoding="utf-8")
    if begin not in text or end not in text:
        print(f"{path} has no {begin} ... {end} markers", file=sys.stderr)
        return False
    head, rest = text.split(begin, 1)
    old, tail = rest.split(end, 1)
    path.write_text(head + begin + "\n\n" + body(old) + "\n" + end + tail, encoding="utf-8")
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=1000, help="samples per design (null and truth)")
    ap.add_argument("--boot-reps", type=int, default=200, help="samples of the bootstrap rows")
    ap.add_argument("--k", default="1,5", help="multipliers (level 0.05 / k), comma-separated")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rows", default=None, help="only these row types (comma-separated)")
    ap.add_argument("--write", type=Path, default=None, help="the docs page to update")
    ap.add_argument("--json", type=Path, default=None, help="every rate as JSON")
    ap.add_argument(
        "--wild",
        type=int,
        default=0,
        metavar="REPS",
        help="instead: the wild cluster bootstrap beside CR2-BM on the few-cluster "
        "designs, REPS samples each (needs wildboottest)",
    )
    ap.add_argument("--wild-draws", type=int, default=399, help="the wild bootstrap's draws")
    ap.add_argument(
        "--family",
        type=int,
        default=0,
        metavar="REPS",
        help="instead: the family-wise error of whole Holm families, REPS families per design",
    )
    ap.add_argument(
        "--subjects",
        type=int,
        default=0,
        metavar="REPS",
        help="instead: the coverage of the rows over facts clustered by fact id and by "
        "subject, on facts sharing subjects across relations, REPS samples each",
    )
    a = ap.parse_args(argv)
    if a.wild:
        return wild(a)
    if a.family:
        return family(a)
    if a.subjects:
        return subjects(a)
    ks = tuple(float(x) for x in a.k.split(","))
    only = None if a.rows is None else set(a.rows.split(","))
    tasks = [(i, j, a.boot_reps if r.name.startswith("bootstrap") else a.reps, ks, a.seed)
             for i, r in enumerate(ROW_TYPES) if only is None or r.name in only
             for j in range(len(r.designs))]  # fmt: skip
    start = time.perf_counter()
    done: dict[int, list[dict[str, Any]]] = {}
    with ProcessPoolExecutor(max(1, a.jobs)) as pool:
        futures = {pool.submit(_task, t): n for n, t in enumerate(tasks)}
        for fut in as_completed(futures):
            done[futures[fut]] = fut.result()
            if a.json:  # what is finished so far, in the table's order
                a.json.write_text(json.dumps([r for n in sorted(done) for r in done[n]], indent=1))
    results = [r for n in sorted(done) for r in done[n]]
    table = table_markdown(results)
    took = time.perf_counter() - start
    note = f"\n{len(tasks)} designs, {took / 60:.1f} min with {a.jobs} process(es), seed {a.seed}\n"

    def body(old: str) -> str:
        return table + note if only is None else merge(old, table, note, only)

    if a.write and not _splice(a.write, BEGIN, END, body):
        return 2
    print(table + note)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
