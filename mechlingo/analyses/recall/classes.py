"""The recall-pipeline classes of a traced query and the recall share read from them.

:func:`classify` puts a query's record (:func:`mechlingo.analyses.recall.trace.trace_recall`)
into one of :data:`CLASSES`; :func:`failure_records` are the non-English recall and
translation failures the recall share is read from, the same for the trace's headline and the
claim card's ``recall_failures`` row; :func:`failure_split` gives that share per language with
and without the flagged answers (:data:`FLAGS`). Why each
class and flag: ``docs/methods/recall-pipeline.md``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "CLASSES",
    "FLAGS",
    "classify",
    "failure_records",
    "failure_split",
    "flag_counts",
    "flagged",
]

CLASSES: tuple[str, ...] = (
    "correct",
    "wrong_language",
    "translation_failure",
    "recall_failure",
    "shared_form",
    "other",
)

#: The flags of a greedy answer that is no attempt at the answer (left out of the recall
#: share: :func:`failure_records`; each answer's flags:
#: :func:`mechlingo.data.fact_answers.answer_flags`).
FLAGS = ("continues_prompt", "echoes_subject")

#: The pooled group of :func:`failure_split`.
NON_ENGLISH = "non-English"


def classify(rec: Mapping[str, Any]) -> str:
    """The class of one query's record: ``correct``; ``wrong_language`` (the right answer in
    another language); ``shared_form`` (wrong, non-English, and the answer is written as the
    English one: no translation was needed, so neither a translation failure nor a recall
    failure of a translated answer; ``en_decodable_mid`` still says whether it was
    recalled); ``translation_failure`` (non-English, the English answer decodable
    mid-network); ``recall_failure`` (neither the English nor the L answer decodable);
    ``other`` (only the L answer decodable, or an English query recalled and lost)."""
    if rec["correct"]:
        return "correct"
    if rec["answered_in"]:
        return "wrong_language"
    if rec.get("shared_form") and rec["lang"] != "en":
        return "shared_form"
    if rec["lang"] != "en" and rec["en_decodable_mid"]:
        return "translation_failure"
    if not rec["en_decodable_mid"] and not rec["answer_decodable_mid"]:
        return "recall_failure"
    return "other"


def flagged(rec: Mapping[str, Any]) -> bool:
    """Whether the record's answer carries a flag of :data:`FLAGS` (records without the
    flag fields, from older runs, carry none)."""
    return any(bool(rec.get(f)) for f in FLAGS)


def failure_records(
    records: Iterable[Mapping[str, Any]], *, keep_flagged: bool = False
) -> list[Mapping[str, Any]]:
    """The non-English ``recall_failure`` and ``translation_failure`` records the recall
    share is read from; flagged answers (a continuation of the prompt's last word, an echo
    of the subject: no attempt at the answer) left out unless ``keep_flagged``. The trace's
    headline and the card's ``recall_failures`` row both read this."""
    return [
        r
        for r in records
        if r["lang"] != "en"
        and r["class"] in ("recall_failure", "translation_failure")
        and (keep_flagged or not flagged(r))
    ]


def _split(recs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    rf = sum(r["class"] == "recall_failure" for r in recs)
    return {
        "recall_failure": rf,
        "translation_failure": len(recs) - rf,
        "recall_share": rf / len(recs) if recs else None,
    }


def failure_split(
    records: Sequence[Mapping[str, Any]], *, keep_flagged: bool = False
) -> dict[str, dict[str, Any]]:
    """Per non-English language and pooled (``"non-English"``): the recall and translation
    failures of :func:`failure_records` and the recall share among them (``None``: no
    failure)."""
    fails = failure_records(records, keep_flagged=keep_flagged)
    langs = list(dict.fromkeys(r["lang"] for r in records if r["lang"] != "en"))
    out = {lg: _split([r for r in fails if r["lang"] == lg]) for lg in langs}
    if langs:
        out[NON_ENGLISH] = _split(fails)
    return out


def flag_counts(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Per language, how many answers carry each flag of :data:`FLAGS`."""
    out: dict[str, dict[str, int]] = {}
    for r in records:
        c = out.setdefault(r["lang"], dict.fromkeys(FLAGS, 0))
        for f in FLAGS:
            c[f] += bool(r.get(f))
    return out
