"""The report of ``mechlingo eval``: greedy accuracy per language."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mechlingo.report.page import Report
from mechlingo.viz.common import accuracy_bars

#: Generations shown in the report's table (all of them are in generations.jsonl).
MAX_ROWS = 300


def eval_report(records: list[Mapping[str, Any]], summary: Mapping[str, Any]) -> Report:
    """The eval report: accuracy per language with Wilson intervals (figure and table)
    and the first generations.

    ``records`` are the per-prompt records of
    :func:`mechlingo.analyses.evaluate.evaluate_facts`; ``summary`` has ``accuracy``,
    ``accuracy_ci`` (per language: ``p``, ``lo``, ``hi``) and ``meta``.
    """
    ci = summary["accuracy_ci"]
    report = Report("mechlingo: greedy accuracy", summary["meta"])
    report.add_text(
        "Correct = the greedy continuation starts with the answer or an alias after "
        "normalisation (case, whitespace, leading punctuation; word boundary in languages "
        "written with spaces).",
        note=True,
    )
    report.add_figure(
        accuracy_bars(
            {"accuracy": summary["accuracy"]},
            "Greedy accuracy per language (Wilson 95% intervals)",
            {"accuracy": ci},
        )
    )
    report.add_table([{"lang": lg, **c} for lg, c in ci.items()])
    report.add_heading("Generations")
    report.add_table(
        records[:MAX_ROWS], ["lang", "id", "prompt", "answer", "generation", "correct"]
    )
    return report
