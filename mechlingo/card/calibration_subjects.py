"""A calibration design for the rows over facts: subjects shared across relations.

The bundled facts ask about one subject in several relations (``capital/IT``,
``language/IT``, ``currency/IT``), and what a vector does to a subject's facts goes together.
:func:`compare_subjects` simulates facts x languages whose subjects are shared by
``relations`` relations, with a random effect of the subject (on the gain of a paired 0/1
row, or on a continuous mean) and a smaller one of the fact, and gives the coverage of the
true value by the card's 95% interval (``paired_test`` or ``mean_test`` of
:mod:`mechlingo.card.clustered_tests`) clustered two ways: by fact id (the card's rows before
they were clustered by subject) and by subject, the clusters the row builders now pass
(:func:`~mechlingo.card.repair_items.item_clusters` of the ids). ``scripts/calibrate.py
--subjects REPS`` writes its table into ``docs/calibration.md``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mechlingo.card import calibration as cal
from mechlingo.card.clustered_tests import mean_test, paired_test
from mechlingo.card.repair_items import item_clusters
from mechlingo.core.defaults import SEED
from mechlingo.core.errors import InputError

__all__ = ["SUBJECT_DESIGNS", "compare_subjects", "subject_ids", "table_markdown"]

#: (outcome, subjects, relations per subject, languages): the designs of the table; 5 and 11
#: languages are the non-English languages of the quick and the full card's repair rows.
SUBJECT_DESIGNS: tuple[tuple[str, int, int, int], ...] = (
    ("paired", 20, 2, 5),
    ("paired", 20, 3, 5),
    ("paired", 20, 3, 11),
    ("mean", 20, 2, 4),
    ("mean", 20, 3, 4),
)

#: The paired 0/1 gain: the baseline of a subject (0.2-0.4), the gain of a subject (_GAIN
#: +/- _GAIN_HALF: the vector works on some subjects and not on others) and how far a fact's
#: own gain strays from its subject's (+/- _FACT_HALF); every probability within [0, 1].
_BASE, _BASE_HALF, _GAIN, _GAIN_HALF, _FACT_HALF = 0.3, 0.1, 0.2, 0.35, 0.05
#: The continuous mean: subject, fact and item SDs, and the true mean.
_SD_SUBJECT, _SD_FACT, _SD_ITEM, _MEAN = 1.0, 0.3, 0.5, 0.6


def subject_ids(subjects: int, relations: int, langs: int) -> list[str]:
    """Each item's fact id, in (language, fact) order as the stages store them: ``r1/S07``
    (relation 1 of subject 7); every fact in ``langs`` languages."""
    facts = [f"r{r}/S{s:02d}" for s in range(subjects) for r in range(relations)]
    return facts * langs


def _codes(ids: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Each item's subject and fact index."""
    subj = {s: k for k, s in enumerate(dict.fromkeys(i.split("/")[1] for i in ids))}
    fact = {f: k for k, f in enumerate(dict.fromkeys(ids))}
    return np.array([subj[i.split("/")[1]] for i in ids]), np.array([fact[i] for i in ids])


def _samples(kind: str, rng: np.random.Generator, ids: list[str], reps: int) -> list[Any]:
    """``reps`` samples of ``kind`` on the items ``ids``: ``(base, new)`` 0/1 arrays with a
    subject's gain shared by its facts (``"paired"``), or one array of continuous values
    with a subject and a fact effect (``"mean"``)."""
    s, f = _codes(ids)
    n_s, n_f = int(s.max()) + 1, int(f.max()) + 1
    if kind == "paired":
        p = cal._spread(rng, reps, n_s, _BASE, _BASE_HALF)[:, s]
        gain = cal._spread(rng, reps, n_s, _GAIN, _GAIN_HALF)[:, s]
        gain = gain + cal._spread(rng, reps, n_f, 0.0, _FACT_HALF)[:, f]
        base, new = cal._arms(rng, [p, p + gain])
        return [(base[r], new[r]) for r in range(reps)]
    y = (_MEAN + rng.normal(0, _SD_SUBJECT, (reps, n_s))[:, s]
         + rng.normal(0, _SD_FACT, (reps, n_f))[:, f] + rng.normal(0, _SD_ITEM, (reps, len(ids))))  # fmt: skip
    return list(y)


def compare_subjects(kind: str, subjects: int, relations: int, langs: int, reps: int = 200,
                     *, seed: int = SEED) -> dict[str, Any]:  # fmt: skip
    """The coverage of the true value (the gain ``_GAIN`` or the mean ``_MEAN``) by the
    card's 95% interval over ``reps`` samples, clustered by fact id (``fact``) and by subject
    (``subject``, :func:`~mechlingo.card.repair_items.item_clusters`), each with its Monte
    Carlo SE, and the clusters of each (``g_fact``, ``g_subject``).

    Raises:
        InputError: an unknown ``kind`` (use ``paired`` or ``mean``), or fewer than two
            relations (no subject shared).
    """
    if kind not in ("paired", "mean"):
        raise InputError(f"unknown outcome {kind!r}", fix="use paired or mean")
    if relations < 2:
        raise InputError("subjects are shared only across two relations or more",
                         fix="give relations >= 2")  # fmt: skip
    ids = subject_ids(subjects, relations, langs)
    by = {"fact": ids, "subject": item_clusters(ids)}
    truth = _GAIN if kind == "paired" else _MEAN
    rng = np.random.default_rng([seed, subjects, relations, langs, len(kind)])
    hits = dict.fromkeys(by, 0)
    for x in _samples(kind, rng, ids, reps):
        for name, cl in by.items():
            t = paired_test(x[0], x[1], cl) if kind == "paired" else mean_test(x, cl)
            iv = t.estimate
            hits[name] += iv.lo is not None and iv.lo <= truth <= iv.hi  # type: ignore[operator]
    return {"kind": kind, "subjects": subjects, "relations": relations, "langs": langs,
            "reps": reps, "g_fact": len(set(by["fact"])), "g_subject": len(set(by["subject"])),
            **{name: cal._rate(h, reps) for name, h in hits.items()}}  # fmt: skip


def table_markdown(results: list[dict[str, Any]]) -> str:
    """The comparison as a markdown table, each coverage with its Monte Carlo SE."""
    name = {"paired": "paired 0/1 gain", "mean": "continuous mean"}

    def cell(x: tuple[float, float]) -> str:
        return "n/a" if math.isnan(x[0]) else f"{x[0]:.3f} ({x[1]:.3f})"

    head = ("| outcome | design | reps | coverage: by fact id | coverage: by subject |\n"
            "|---|---|---|---|---|\n")  # fmt: skip
    return head + "".join(
        f"| {name[r['kind']]} | {r['subjects']} subjects x {r['relations']} relations "
        f"({r['g_fact']} facts) x {r['langs']} languages | {r['reps']} | "
        f"{cell(r['fact'])} | {cell(r['subject'])} |\n"
        for r in results
    )
