"""The report of ``mechlingo eval``: accuracy per language under the chosen metric."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mechlingo.report.page import Report, fmt_interval
from mechlingo.viz.evaluate import accuracy_bars

#: Generations shown in the report's table (all of them are in generations.jsonl).
MAX_ROWS = 300

_NOTES = {
    "generate": "Correct = the greedy continuation starts with the answer or an alias after "
    "normalisation (case, whitespace, leading punctuation; word boundary in languages "
    "written with spaces).",
    "klar": "KLAR's rule: 3 solved demonstrations, 10 greedy tokens; correct = the "
    "lower-cased, stripped continuation is a non-empty prefix of the target or the target a "
    "prefix of it. CLC = Jaccard overlap of each language's correct facts with English's.",
    "rank": "Candidate ranking (BMLAMA): every candidate filled in at the mask, scored by the "
    "mean token cross-entropy of the filled sentence; correct (P@1) = a gold candidate "
    "scores best. RankC = rank-weighted overlap of two languages' candidate rankings.",
}


def eval_report(records: list[Mapping[str, Any]], summary: Mapping[str, Any]) -> Report:
    """The eval report: accuracy per language with Wilson intervals (figure and table)
    and the first generations.

    ``records`` are the per-prompt records of
    :func:`mechlingo.scoring.evaluate.evaluate_facts`; ``summary`` has ``accuracy``,
    ``accuracy_ci`` (per language: ``p``, ``lo``, ``hi``) and ``meta``.
    """
    ci = summary["accuracy_ci"]
    metric = summary.get("metric", {}).get("metric", "generate")
    report = Report(f"mechlingo: accuracy ({metric})", summary["meta"])
    add_eval_headline(report, summary)
    report.add_text(_NOTES[metric], note=True)
    for why, n in summary.get("skipped", {}).items():
        report.add_text(f"Skipped under {metric}: {n} record(s): {why}.")
    report.add_figure(
        accuracy_bars(
            {"accuracy": summary["accuracy"]},
            "Greedy accuracy per language (Wilson 95% intervals)",
            {"accuracy": ci},
        )
    )
    report.add_table([{"lang": lg, **c} for lg, c in ci.items()])
    if summary.get("rankc"):
        report.add_heading("RankC per language pair (bootstrap 95% intervals over facts)")
        report.add_table([{"pair": k, **v} for k, v in summary["rankc"].items()])
    if summary.get("gold_rank"):
        report.add_heading("Rank of the gold candidate (1 = best; bootstrap 95% intervals)")
        report.add_table([{"lang": k, **v} for k, v in summary["gold_rank"].items()])
    if summary.get("clc"):
        report.add_heading("CLC against English (bootstrap 95% intervals over facts)")
        report.add_table([{"lang": k, **v} for k, v in summary["clc"].items()])
    report.add_heading("Generations")
    report.add_table(
        records[:MAX_ROWS], ["lang", "id", "prompt", "answer", "generation", "correct"]
    )
    return report


def add_eval_headline(report: Report, summary: Mapping[str, Any]) -> None:
    """The accuracy of every language with its Wilson interval (lowest first, at most six),
    and the share answered in English."""
    ci = summary["accuracy_ci"]
    n = sum(int(c.get("n") or 0) for c in ci.values())
    report.add_headline("Queries", f"{n} in {len(ci)} languages")
    for lg in sorted(ci, key=lambda k: (ci[k].get("p") is None, ci[k].get("p") or 0.0))[:6]:
        c = ci[lg]
        report.add_headline(f"Accuracy, {lg}", fmt_interval(c.get("p"), c.get("lo"), c.get("hi"),
                                                             c.get("n")))  # fmt: skip
    en = summary.get("answered_in_english") or {}
    if isinstance(en, Mapping) and en:
        report.add_headline("Answered in English (per language)",
                            ", ".join(f"{lg} {v:.2f}" for lg, v in en.items() if v is not None))  # fmt: skip
