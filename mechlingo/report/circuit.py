"""The report of ``mechlingo circuit``: each language's measured circuit, the faithfulness
curves with their intervals and MIB's summaries, the circuits' edge overlap against random
circuits, and each language's circuit run on the other languages' prompts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mechlingo.analyses.circuits.languages import LanguageCircuits, overlap_cells
from mechlingo.report.page import Report, fmt_interval
from mechlingo.viz.circuit import faithfulness_curves_figure, language_matrix_figure
from mechlingo.viz.palette import OVERLAP

__all__ = ["circuit_report"]


def _f(d: Mapping[str, Any] | None, n: int | None = None) -> str:
    if not d:
        return "n/a"
    est = d.get("faithfulness", d.get("value"))
    return fmt_interval(est, d.get("lo"), d.get("hi"), n)


def circuit_report(lc: LanguageCircuits, meta: Mapping[str, Any]) -> Report:
    """The report of a :class:`LanguageCircuits` run (``meta``: the run's metadata)."""
    report = Report("mechlingo: measured circuits", meta)
    ns = lc.ns
    for lg, r in lc.results.items():
        report.add_headline(
            f"{lg} circuit", f"{len(r.circuit)} of {len(r.ranked)} edges, faithfulness "
            f"{_f(r.faithfulness, r.n)}, CPR {_f(r.areas.get('cpr'))}, CMD {_f(r.areas.get('cmd'))}",
        )  # fmt: skip
    report.add_text(
        "Each language's circuit is scored on subject pairs of its correctly answered facts "
        "(the corrupted prompt: another fact of the same relation and length). Faithfulness = "
        "(readout with only the circuit's edges clean - corrupted) / (clean - corrupted), a "
        "ratio of means over facts with a 95% bootstrap interval clustered by fact. CPR: the "
        "area under the faithfulness curve over circuit size as a fraction of the edges; CMD: "
        "the area between the curve and 1. The overlap's p is against random circuits of the "
        "same sizes drawn from the same scored graph. docs/methods/circuits.md has the method.",
        note=True,
    )
    report.add_heading("Circuits per language")
    report.add_table(_rows(lc))
    for lg, why in lc.skipped.items():
        report.add_text(f"No circuit for {lg}: {why}.", note=True)
    report.add_heading("Faithfulness curves")
    report.add_figure(faithfulness_curves_figure(lc.curves()))
    if len(lc.results) > 1:
        vals, text = overlap_cells(lc.overlap)
        report.add_heading("Edge overlap across languages")
        report.add_figure(
            language_matrix_figure(
                vals, ns, title="Edge Jaccard of the circuits (p against size-matched random "
                "circuits)", colorbar="edge Jaccard", text=text, x_title="circuit of language",
                colorscale=OVERLAP,
            )
        )  # fmt: skip
        report.add_heading("Cross-language faithfulness")
        cross = {a: {b: v["faithfulness"] for b, v in row.items()} for a, row in lc.cross.items()}
        cells = {a: {b: _f(v) for b, v in row.items()} for a, row in lc.cross.items()}
        report.add_figure(
            language_matrix_figure(
                cross, ns, title="Faithfulness of each language's circuit on each language's "
                "prompt pairs", colorbar="faithfulness", text=cells,
                x_title="prompts of language",
            )
        )  # fmt: skip
    for lg, r in lc.results.items():
        report.add_heading(f"Circuit ({lg})")
        report.add_figure(r.figure(title=f"{lg} ({r.meta.get('method')})"))
        report.add_table(r.verified)
    return report


def _rows(lc: LanguageCircuits) -> list[dict[str, Any]]:
    rows = []
    for lg, r in lc.results.items():
        a = lc.answered.get(lg, {})
        rows.append({
            "lang": lg, "facts read": a.get("read"), "answered correctly": a.get("correct"),
            "n (pairs' facts)": r.n, "edges": len(r.circuit), "of edges": len(r.ranked),
            "faithfulness": _f(r.faithfulness), "CPR": _f(r.areas.get("cpr")),
            "CMD": _f(r.areas.get("cmd")), "Spearman, top edges (estimate vs exact)":
            round(r.spearman, 3), "clean readout": round(float(r.clean.mean()), 3),
            "corrupted readout": round(float(r.corrupted.mean()), 3),
        })  # fmt: skip
    return rows
