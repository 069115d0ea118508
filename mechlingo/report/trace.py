"""The report of ``mechlingo trace``: recall-pipeline classes and, per language, the
corrupted-subject patching (exact and/or attribution patching) and attention knockout."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mechlingo.analyses.recall.classes import NON_ENGLISH
from mechlingo.analyses.recall.trace import CLASSES, TraceResult
from mechlingo.analyses.recall.trace_circuit import TraceCircuit
from mechlingo.analyses.recall.trace_patching import LanguagePatching
from mechlingo.core.jsonable import jsonable
from mechlingo.kernels.significance import wilson
from mechlingo.report.page import Report, fmt_interval
from mechlingo.viz.evaluate import accuracy_bars

#: Queries shown in the report's table (all of them are in trace.json).
MAX_ROWS = 300
QUERY_COLUMNS = [
    "lang",
    "id",
    "answer",
    "generation",
    "decided_at",
    "class",
    "continues_prompt",
    "echoes_subject",
    "first_en_layer",
    "first_answer_layer",
]


def trace_report(
    trace: TraceResult,
    summary: Mapping[str, Any],
    patched: Sequence[LanguagePatching] = (),
    *,
    max_rank: int,
    unpatched: Mapping[str, str] | None = None,
    circuits: Mapping[str, TraceCircuit | str] | None = None,
) -> Report:
    """The trace report: class fractions per language (with Wilson intervals), the
    lens layers, latent-language curves per class, each language's patching sections and
    the first queries.

    ``trace`` is the trace of a :class:`mechlingo.analyses.recall.trace.TraceRun`; ``summary`` the
    run's ``summary(meta)``; ``max_rank`` the rank
    counted as decodable (``--max-rank``); ``unpatched`` the run's languages without
    patching and why (each gets a note where its circuit would be); ``circuits`` the run's
    measured circuits (``{lang: TraceCircuit or why none}``), each language's "Circuit"
    section.
    """
    report = Report("mechlingo: recall pipeline tracer", summary["meta"])
    add_trace_headline(report, summary)
    report.add_text(
        "Each query is classified from its greedy answer and the logit lens on the same prompt: "
        "correct; wrong language (the right answer in English or another language); "
        f"translation failure (wrong, but the English answer reached rank <= {max_rank} "
        "mid-network); recall failure (neither the English nor the prompt-language answer did); "
        "shared form (wrong, and the answer is written as the English one: no translation "
        f"was needed); other. Mid-network = lens entries {summary['mid_layers']}. Flags: an "
        "answer that glues onto the prompt's last word (continues_prompt) or starts by "
        "repeating the subject (echoes_subject) is no attempt at the answer, and the recall "
        "share of failures is given without and with them. The generation is the whole "
        "greedy first line; decided_at is the prefix at which its verdict was decided.",
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
            {c: {lg: v[c]["estimate"] for lg, v in cls_ci.items()} for c in CLASSES},
            "Class fractions per language (Wilson 95% intervals)",
            {c: {lg: v[c] for lg, v in cls_ci.items()} for c in CLASSES},
            y_title="fraction of queries",
        )
    )
    report.add_table([{"lang": lg, **layer_cells(v)} for lg, v in summary["layers"].items()])
    add_failure_split(report, summary)
    report.add_heading("Latent-language curves per class")
    report.add_figure(trace.fig_profiles())
    circuits = circuits or {}
    for p in patched:
        add_circuit(report, p.lang, circuits.get(p.lang))
        add_patching(report, p)
    for lg, why in (unpatched or {}).items():
        c = circuits.get(lg)
        if isinstance(c, TraceCircuit):
            add_circuit(report, lg, c)
            report.add_text(f"No patching for {lg}: {why}.", note=True)
        else:
            report.add_heading(f"Circuit ({lg})")
            report.add_text(f"No circuit for {lg}: {c or why}.", note=True)
    shown = {p.lang for p in patched} | set(unpatched or {})
    for lg, c in circuits.items():
        if lg not in shown:  # patching skipped (--patch-prompts 0)
            add_circuit(report, lg, c)
    report.add_heading("Queries")
    report.add_table([layer_cells(r) for r in trace.records[:MAX_ROWS]], QUERY_COLUMNS)
    return report


def layer_cells(row: Mapping[str, Any]) -> dict[str, Any]:
    """A table row with its layer columns (names containing ``layer``) readable: a whole
    layer as an integer, ``-1`` or ``None`` as "never", a median between layers as is."""
    out = dict(row)
    for k, v in row.items():
        if "layer" not in k or isinstance(v, bool):
            continue
        if v is None or (isinstance(v, (int, float)) and v < 0):
            out[k] = "never"
        elif isinstance(v, float) and v.is_integer():
            out[k] = int(v)
    return out


def add_circuit(report: Report, lang: str, c: TraceCircuit | str | None) -> None:
    """One language's "Circuit" section: the measured circuit (every line a measured edge)
    with its faithfulness curve, a plain note when fewer prompts than asked were scored, or
    why there is none."""
    report.add_heading(f"Circuit ({lang})")
    if c is None:
        report.add_text(f"No measured circuit for {lang} (--circuit-prompts 0).", note=True)
        return
    if isinstance(c, str):
        report.add_text(f"No measured circuit: {c}.", note=True)
        return
    meta = c.result.meta
    report.add_text(
        f"Edges scored by {meta['method']} ({meta['steps']} steps) on {c.n} {lang} prompts, "
        "each against a corrupted prompt with another subject of the same token length; "
        f"the top {len(c.result.verified)} edges re-scored by exact edge patching (Spearman "
        f"{c.result.spearman:.2f}); the circuit is the smallest on the curve below reaching "
        f"faithfulness {meta['target']}. Every line is a measured edge (hover: its score, 95% "
        "interval, n and exact value); the bands are the pipeline phases."
        + (f" Note: {c.shortfall()}." if c.shortfall() else ""),
        note=True,
    )
    report.add_figure(c.figure())
    report.add_table(jsonable(c.result.curve), ["n_edges", "faithfulness", "lo", "hi"])


def add_patching(report: Report, p: LanguagePatching) -> None:
    """One language's patching sections: the components that restore the answer, AtP
    against exact patching and the verified heads (when measured), the heatmaps and the
    attention knockout."""
    how = "attribution patching, heads shown" if p.atp is not None else "patching"
    report.add_heading(f"Components restoring the answer ({p.lang})")
    wrong = ""
    if p.n_unanswered:
        wrong = f"; {p.n_unanswered} answered wrongly"
        report.add_text(
            f"{p.n_unanswered} of the clean {p.lang} prompts below are answered wrongly by the "
            "model (asked for with --patch-unanswered): their effects restore a wrong run, and "
            "normalised effects can leave [-1, 1].",
            note=True,
        )
    report.add_figure(
        (p.atp if p.atp is not None else p.sweep).fig_circuit(
            phases=p.phases,
            token_labels=p.token_labels,
            heads=p.atp is not None,
            verified=p.verified_heads,
            title=f"{p.lang}: components that restore the clean answer (corrupted-subject "
            f"{how}{wrong})",
        )
    )
    if p.comparison is not None:
        seconds = {f"seconds_{k}": t for k, t in (p.seconds or {}).items()}
        report.add_heading(f"AtP vs exact patching ({p.lang})")
        report.add_table(jsonable([{"site": s, **v, **seconds} for s, v in p.comparison.items()]))
    if p.verified_heads is not None:
        report.add_heading(f"Top heads by AtP, verified exactly ({p.lang})")
        report.add_table(jsonable(p.verified_heads))
    report.add_heading(f"Patching heatmaps ({p.lang})")
    report.add_figure(p.sweep.fig_heatmap())
    if p.separate_atp:
        report.add_heading(f"Attribution patching heatmaps ({p.lang})")
        report.add_figure(p.atp.fig_heatmap())
    report.add_heading(f"Attention knockout ({p.lang})")
    report.add_figure(p.knockout.fig_knockout())


def add_failure_split(report: Report, summary: Mapping[str, Any]) -> None:
    """A table per language (and pooled) of the recall and translation failures and the
    recall share among them, without and with the flagged answers, and the flag counts."""
    split = summary.get("failure_split")
    if not split:
        return
    report.add_heading("Recall and translation failures, without and with flagged answers")
    rows = []
    for lg in split["without_flagged"]:
        row: dict[str, Any] = {"lang": lg}
        for key, tag in (("without_flagged", "without flagged"), ("with_flagged", "with flagged")):
            v = split[key][lg]
            row[f"recall / translation ({tag})"] = (
                f"{v['recall_failure']} / {v['translation_failure']}"
            )
            share = v["recall_share"]
            row[f"recall share ({tag})"] = "n/a" if share is None else round(share, 3)
        row.update(summary.get("flags", {}).get(lg, {}))
        rows.append(row)
    report.add_table(rows)


def add_trace_headline(report: Report, summary: Mapping[str, Any]) -> None:
    """The queries over every language: the fraction answered correctly, translation
    failures (recalled in English, not converted) and recall failures, each with its Wilson
    interval; then the recall share of the non-English recall and translation failures
    without the flagged answers (:func:`mechlingo.analyses.recall.classes.failure_records`,
    the rule of the card's ``recall_failures`` row) and with them."""
    counts = summary["classification"]
    n = sum(sum(c.values()) for c in counts.values())
    report.add_headline("Queries", f"{n} in {len(counts)} languages ({', '.join(counts)})")
    # English is the pivot the others are read against: never pooled with them
    groups = [(f"non-English ({', '.join(lg for lg in counts if lg != 'en')})",
               [c for lg, c in counts.items() if lg != "en"]),
              ("English", [counts["en"]] if "en" in counts else [])]  # fmt: skip
    for cls, label in (("correct", "Correct"), ("translation_failure", "Translation failure"),
                       ("recall_failure", "Recall failure")):  # fmt: skip
        for where, cs in groups:
            m = sum(sum(c.values()) for c in cs)
            if not m or (cls == "translation_failure" and where == "English"):
                continue
            w = wilson(sum(c.get(cls, 0) for c in cs), m)
            report.add_headline(f"{label}, {where}", fmt_interval(w.estimate, w.lo, w.hi, m))
    split = summary.get("failure_split", {})
    for key, how in (("without_flagged", "flagged answers left out"),
                     ("with_flagged", "flagged answers kept")):  # fmt: skip
        pooled = split.get(key, {}).get(NON_ENGLISH)
        if pooled is None:
            continue
        k, m = pooled["recall_failure"], pooled["recall_failure"] + pooled["translation_failure"]
        share = wilson(k, m)  # no failure: n/a
        report.add_headline(
            f"Recall failures among recall + translation failures, non-English ({how})",
            fmt_interval(share.estimate, share.lo, share.hi, m),
        )
