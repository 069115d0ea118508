"""The report of ``mechlingo steer eval``: the repair steering vectors on test."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mechlingo.analyses.recall.dev_grid import DevSearch
from mechlingo.analyses.recall.steer_eval import fig_accuracy_ci, fig_headroom, gain_rows
from mechlingo.analyses.recall.transfer import TransferMatrix, cell_text
from mechlingo.report.page import Report, fmt_interval
from mechlingo.scoring.side_effects import SideEffects


def repair_report(
    summary: Mapping[str, Any], search: DevSearch | None = None, side: SideEffects | None = None
) -> Report:
    """The steering report: the chosen setting, headroom, test accuracy with intervals,
    gains over ``orig``, the dev sweep (when one ran), side effects and transfer (when
    measured).

    ``summary`` is :meth:`mechlingo.analyses.recall.steer_eval.SteerEvalResult.summary` with ``meta``;
    ``search`` the :func:`mechlingo.analyses.recall.dev_grid.choose_on_dev` result or ``None``
    (``--config``); ``side`` a :func:`mechlingo.scoring.side_effects.side_effects` result or
    ``None``.
    """
    report = Report("mechlingo: repair steering vectors", summary["meta"])
    add_repair_headline(report, summary)
    report.add_text(_method_note(summary), note=True)
    report.add_heading("Headroom: zero-shot vs k-shot (test)")
    report.add_figure(fig_headroom(summary["headroom"]))
    report.add_heading("Test accuracy per language (Wilson 95% intervals)")
    report.add_figure(fig_accuracy_ci(summary["intervals"]))
    report.add_heading("Gains over orig on the non-English test items (bootstrap 95% CI)")
    report.add_table(gain_rows(summary))
    for w in summary.get("warnings", []):
        report.add_text(f"Warning: {w}")
    if search is not None:
        report.add_heading("Dev sweep")
        report.add_figure(search.fig_heatmap("task"))
        report.add_figure(search.fig_heatmap("diff"))
        report.add_table([r for r in search.rows if r["stage"] == "dev"])
    if side is not None:
        report.add_heading("Side effects of the selected intervention in every language")
        report.add_figure(side.fig_heatmap())
    if "transfer" in summary:
        add_transfer(report, summary["transfer"])
    return report


def add_transfer(report: Report, transfer: Mapping[str, Any]) -> None:
    """The transfer matrices of ``transfer`` (``{"relation": ..., "lang": ...}`` as
    :meth:`~mechlingo.analyses.recall.transfer.TransferMatrix.to_json` writes them): heatmaps of
    the gain and of the control's gain, and one table row per cell."""
    for by in ("relation", "lang"):
        if by not in transfer:
            continue
        m = TransferMatrix(by, transfer[by]["cells"], transfer[by]["rows"], transfer[by]["cols"])
        report.add_heading(f"Transfer matrix by {by}")
        report.add_figure(m.fig_transfer("gain"))
        report.add_figure(m.fig_transfer("control_gain"))
        report.add_table(matrix_rows(m))
    for note in transfer.get("notes", []):
        report.add_text(f"Transfer: {note}")


def matrix_rows(matrix: TransferMatrix) -> list[dict[str, Any]]:
    """One row per cell: built on, tested on, n, gain [CI], McNemar p, control."""
    return [
        {"built on": c["row"], "tested on": c["col"], "n": c["n"], "selected": c["selected"],
         "dev effect": c["dev_effect"], "gain [95% CI]": cell_text(c).split(" (ctrl")[0],
         "p": f"{c['p']:.3g}", "control gain": round(c["control_gain"]["estimate"], 3),
         "control p": f"{c['control_p']:.3g}", "vs control p": f"{c['vs_control_p']:.3g}"}
        for c in matrix.cells
    ]  # fmt: skip


def transfer_report(summary: Mapping[str, Any]) -> Report:
    """The report of ``steer eval --transfer-only``: the transfer matrices alone."""
    report = Report("mechlingo: transfer of the repair vectors", summary["meta"])
    add_transfer_headline(report, summary["transfer"])
    report.add_text(
        "Rows: how the vectors were built (all relations or languages, all but the tested "
        "one, or one relation alone); columns: what they were tested on (non-English test "
        "items). Layer and alpha are chosen on the dev split of the build relations or "
        "languages only. Each cell: accuracy gain over orig in points with a paired "
        "bootstrap 95% interval; the control adds norm-matched random directions at the "
        "same places.",
        note=True,
    )
    add_transfer(report, summary["transfer"])
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


def _points(g: Mapping[str, Any] | None, n: int | None = None) -> str:
    """A gain ``{"estimate", "lo", "hi"}`` (an interval as JSON) in accuracy points."""
    g = g or {}
    return fmt_interval(g.get("estimate"), g.get("lo"), g.get("hi"), n, scale=100, digits=1, signed=True,
                        unit="points")  # fmt: skip


def add_repair_headline(report: Report, summary: Mapping[str, Any]) -> None:
    """The effect of the selected condition on the non-English test items (gain over orig
    with its bootstrap interval, exact McNemar p), the norm-matched random control, what dev
    found and the lowest language's gain."""
    sel = summary["selected"]
    gains, vs_orig = summary.get("non_english_gain", {}), summary.get("mcnemar_vs_orig", {})
    m = vs_orig.get(sel, {})
    report.add_headline(f"Effect: gain of {sel} over orig, non-English test items",
                        _points(gains.get(sel), m.get("n")))  # fmt: skip
    if m:
        report.add_headline("McNemar p (vs orig)",
                            f"{m['p']:.3g} ({m['fixed']} fixed, {m['broken']} broken)")  # fmt: skip
    randoms = [c for c in gains if c.startswith("random_s")]
    if randoms:
        est = [gains[c]["estimate"] for c in randoms if gains[c].get("estimate") is not None]
        mean = f"{100 * sum(est) / len(est):+.1f} points" if est else "n/a"
        ps = [v["p"] for v in summary.get("mcnemar_vs_random", {}).get(sel, {}).values()]
        vs = f"; {sel} vs random: McNemar p <= {max(ps):.3g}" if ps else ""
        report.add_headline("Control: norm-matched random directions",
                            f"gain {mean} (mean of {len(randoms)} seeds){vs}")  # fmt: skip
    report.add_headline("Dev", f"{summary['dev_effect']} (selected {sel})")
    head = summary.get("headline", {}).get("headroom_rule", {})
    if head.get("language") is not None:
        both = summary["headline"].get("both_condition", "both")
        report.add_headline(f"Lowest language ({head['language']}, fixed on dev): gain of "
                            f"{both}", _points(head.get("both")))  # fmt: skip


def add_transfer_headline(report: Report, transfer: Mapping[str, Any]) -> None:
    """Per matrix and kind of cell: the mean gain and how many cells' intervals lie above
    or below 0."""
    for by in ("relation", "lang"):
        for kind, t in transfer.get(by, {}).get("summary", {}).items():
            g = t.get("mean_gain")
            mean = "n/a" if g is None else f"{100 * g:+.1f} points"
            report.add_headline(f"Transfer by {by}, {kind}",
                                f"mean gain {mean} over {t['cells']} cells; interval above 0 "
                                f"in {t['ci_above_0']}, below 0 in {t['ci_below_0']}")  # fmt: skip
    if not report.headline:
        report.add_headline("Transfer", "; ".join(transfer.get("notes", [])) or "no matrix")
