"""The report of ``mechlingo trace``: recall-pipeline classes and, per language, the
corrupted-subject patching (exact and/or attribution patching) and attention knockout."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mechlingo.analyses.trace import CLASSES
from mechlingo.core.jsonable import finite_or_none
from mechlingo.report.page import Report
from mechlingo.viz.common import accuracy_bars
from mechlingo.viz.pipeline import circuit_figure

#: Queries shown in the report's table (all of them are in trace.json).
MAX_ROWS = 300
QUERY_COLUMNS = [
    "lang",
    "id",
    "answer",
    "generation",
    "class",
    "first_en_layer",
    "first_answer_layer",
]


@dataclass
class LanguagePatching:
    """What the corrupted-subject patching of one language produced.

    ``sweep`` is the exact :class:`~mechlingo.analyses.patching.PatchSweep` (or, with
    ``--method atp``, the attribution-patching one); ``atp`` the attribution-patching sweep
    when one ran (methods ``atp`` and ``both``). ``comparison`` (AtP against exact, per
    site), ``seconds`` (of each method) and ``verified_heads`` (the top AtP heads patched
    exactly) are ``None`` when not measured. ``stages`` are the pipeline stages drawn on
    the circuit, ``token_labels`` the grid positions' labels.
    """

    lang: str
    method: str
    sweep: Any
    knockout: Any
    stages: dict[str, Any]
    token_labels: list[str]
    atp: Any = None
    comparison: dict[str, Any] | None = None
    seconds: dict[str, float] | None = None
    verified_heads: list[dict[str, Any]] | None = None

    @property
    def separate_atp(self) -> bool:
        """Whether the AtP sweep is measured beside an exact one (``--method both``)."""
        return self.atp is not None and self.atp is not self.sweep

    def to_json(self) -> dict[str, Any]:
        """The language's record of ``patching.json`` (NaN left as is: see
        :func:`mechlingo.core.jsonable.finite_or_none`)."""
        out: dict[str, Any] = {
            "method": self.method,
            "sweep": self.sweep.summary(),
            "cells": self.sweep.to_dataframe().to_dict(orient="records"),
            "knockout": self.knockout.to_dataframe().to_dict(orient="records"),
        }
        if self.separate_atp:
            out["atp_sweep"] = self.atp.summary()
            out["atp_cells"] = self.atp.to_dataframe().to_dict(orient="records")
        for key in ("comparison", "seconds", "verified_heads"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        out["stages"] = self.stages
        return out


def trace_report(
    trace: Any,
    summary: Mapping[str, Any],
    patched: Sequence[LanguagePatching] = (),
    *,
    max_rank: int,
) -> Report:
    """The trace report: class fractions per language (with Wilson intervals), the
    lens layers, latent-language curves per class, each language's patching sections and
    the first queries.

    ``trace`` is a :class:`mechlingo.analyses.trace.TraceResult`; ``summary`` its
    ``summary()`` with ``classification_ci`` and ``meta`` added; ``max_rank`` the rank
    counted as decodable (``--max-rank``).
    """
    report = Report("mechlingo: recall pipeline tracer", summary["meta"])
    report.add_text(
        "Each query is classified from its greedy answer and the logit lens on the same prompt: "
        "correct; wrong language (the right answer in English or another language); "
        f"translation failure (wrong, but the English answer reached rank <= {max_rank} "
        "mid-network); recall failure (neither the English nor the prompt-language answer did); "
        f"other. Mid-network = lens entries {summary['mid_layers']}.",
        note=True,
    )
    report.add_heading("Classes per language")
    report.add_figure(trace.fig_class_fractions())
    report.add_table(
        [{"lang": lg, **c} for lg, c in summary["classification"].items()], ["lang", *CLASSES]
    )
    cls_ci = summary["classification_ci"]
    report.add_figure(
        accuracy_bars(
            {c: {lg: v[c]["p"] for lg, v in cls_ci.items()} for c in CLASSES},
            "Class fractions per language (Wilson 95% intervals)",
            {c: {lg: v[c] for lg, v in cls_ci.items()} for c in CLASSES},
            y_title="fraction of queries",
        )
    )
    report.add_table([{"lang": lg, **v} for lg, v in summary["layers"].items()])
    report.add_heading("Latent-language curves per class")
    report.add_figure(trace.fig_profiles())
    for p in patched:
        add_patching(report, p)
    report.add_heading("Queries")
    report.add_table(trace.records[:MAX_ROWS], QUERY_COLUMNS)
    return report


def add_patching(report: Report, p: LanguagePatching) -> None:
    """One language's patching sections: the circuit diagram, AtP against exact patching
    and the verified heads (when measured), the heatmaps and the attention knockout."""
    how = "attribution patching, heads shown" if p.atp is not None else "patching"
    report.add_heading(f"Circuit ({p.lang})")
    report.add_figure(
        circuit_figure(
            p.atp if p.atp is not None else p.sweep,
            stages=p.stages,
            token_labels=p.token_labels,
            heads=p.atp is not None,
            verified=p.verified_heads,
            title=f"{p.lang}: components that restore the clean answer (corrupted-subject {how})",
        )
    )
    if p.comparison is not None:
        seconds = {f"seconds_{k}": t for k, t in (p.seconds or {}).items()}
        report.add_heading(f"AtP vs exact patching ({p.lang})")
        report.add_table(
            finite_or_none([{"site": s, **v, **seconds} for s, v in p.comparison.items()])
        )
    if p.verified_heads is not None:
        report.add_heading(f"Top heads by AtP, verified exactly ({p.lang})")
        report.add_table(finite_or_none(p.verified_heads))
    report.add_heading(f"Patching heatmaps ({p.lang})")
    report.add_figure(p.sweep.fig_heatmap())
    if p.separate_atp:
        report.add_heading(f"Attribution patching heatmaps ({p.lang})")
        report.add_figure(p.atp.fig_heatmap())
    report.add_heading(f"Attention knockout ({p.lang})")
    report.add_figure(p.knockout.fig_knockout())
