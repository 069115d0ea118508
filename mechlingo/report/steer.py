"""The report of ``mechlingo steer eval``: the repair steering vectors on test."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from mechlingo.analyses.protocol import fig_accuracy_ci, fig_headroom, gain_rows
from mechlingo.report.page import Report


def steer_report(summary: Mapping[str, Any], sweep_result: Any = None, side: Any = None) -> Report:
    """The steering report: the chosen setting, headroom, test accuracy with intervals,
    gains over ``orig``, the dev sweep (when one ran), side effects and transfer (when
    measured).

    ``summary`` is :meth:`mechlingo.analyses.protocol.TestResult.summary` with ``meta``
    (and optionally ``transfer``) added; ``sweep_result`` the
    :func:`mechlingo.analyses.protocol.sweep` result or ``None`` (``--config``); ``side`` a
    :func:`mechlingo.analyses.side_effects.side_effects` result or ``None``.
    """
    report = Report("mechlingo: repair steering vectors", summary["meta"])
    report.add_text(_method_note(summary), note=True)
    report.add_heading("Headroom: zero-shot vs k-shot (test)")
    report.add_figure(fig_headroom(summary["headroom"]))
    report.add_heading("Test accuracy per language (Wilson 95% intervals)")
    report.add_figure(fig_accuracy_ci(summary["intervals"]))
    report.add_heading("Gains over orig on the non-English test items (bootstrap 95% CI)")
    report.add_table(gain_rows(summary))
    for w in summary.get("warnings", []):
        report.add_text(f"Warning: {w}")
    if sweep_result is not None:
        report.add_heading("Dev sweep")
        report.add_figure(sweep_result.fig_heatmap("task"))
        report.add_figure(sweep_result.fig_heatmap("diff"))
        report.add_table([r for r in sweep_result.rows if r["stage"] == "dev"])
    if side is not None:
        report.add_heading("Side effects of the selected intervention in every language")
        report.add_figure(side.fig_heatmap())
    if "transfer" in summary:
        report.add_heading("Transfer")
        report.add_table(transfer_rows(summary["transfer"]))
    return report


_METRIC_TEXT = {
    "generate": "greedy generation",
    "klar": "KLAR's 3-shot greedy prefix rule",
    "rank": "candidate ranking (the gold candidate's filled sentence scores best)",
}


def _method_note(summary: Mapping[str, Any]) -> str:
    cfg, sel = summary["config"], summary["selected"]
    metric = summary.get("metric", {}).get("metric", "generate")
    return (
        "Two steering vectors are added to the residual stream (resid_pre) at each prompt's "
        "last token: the recall-engagement (task) vector and the back-translation (diff) "
        "vector. Everything is chosen on dev facts; test facts (never used to build, to draw "
        "demonstrations or to choose) are scored by "
        f"{_METRIC_TEXT.get(metric, metric)}. 'random_s*' add "
        "norm-matched random directions at the selected places. "
        f"Prompt family: {summary['meta'].get('templates', '?')}. Chosen on dev: {sel} "
        f"(task at layer {cfg['task_layer']} x {cfg['task_alpha']:g}, diff at layer "
        f"{cfg['diff_layer']} x {cfg['diff_alpha']:g}, alpha unit {summary['alpha_unit']}); "
        f"dev effect: {summary['dev_effect']}."
    )


def transfer_rows(transfer: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per transfer setting: what the vectors were built and tested on, and the
    mean accuracy of ``orig`` and ``both``."""
    return [
        {
            "setting": name,
            "built on": json.dumps(t["built_on"]),
            "tested on": json.dumps(t["tested_on"]),
            "orig": round(t["mean"]["orig"], 3),
            "both": round(t["mean"]["both"], 3),
        }
        for name, t in transfer.items()
    ]
