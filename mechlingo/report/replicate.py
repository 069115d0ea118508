"""The report of ``mechlingo replicate``: the verdict table first, then one section per
figure (each row of the table links to its section by anchor)."""

from __future__ import annotations

import html
import json
from collections.abc import Mapping
from typing import Any

import torch

from mechlingo.analyses.experts import KCurve
from mechlingo.card.rules import RULES, RULES_HASH, ClaimsCard
from mechlingo.report.card_extra import config_sentence, extra_sections
from mechlingo.report.page import Report, fmt_interval
from mechlingo.viz.align import retrieval_per_layer_figure
from mechlingo.viz.claims import forest_figure, forest_rows
from mechlingo.viz.experts import interval_bars_figure, k_curve_figure, overlap_figure
from mechlingo.viz.lens import latent_curves_figure
from mechlingo.viz.steer import accuracy_ci_figure, headroom_figure
from mechlingo.viz.trace import class_fractions_figure

_CSS = ".claims td{vertical-align:top}.claims td:nth-child(2){max-width:320px}"


def _section(report: Report, anchor: str, title: str) -> None:
    report.parts.append(f"<h2 id='{html.escape(anchor)}'>{html.escape(title)}</h2>")


def _failed(report: Report, data: Mapping[str, Any] | None, name: str) -> bool:
    if data is None:
        return True
    if "error" in data:
        report.add_text(f"The {name} stage failed: {data['error']}", note=True)
        return True
    return False


def replicate_report(card: ClaimsCard) -> Report:
    """The claims card as one self-contained HTML page."""
    meta = {k: card.meta[k] for k in ("model", "budget", "mechlingo") if k in card.meta}
    report = Report("mechlingo replicate: the papers' claims on this model", meta)
    verdicts = card.verdicts()
    tally: dict[str, int] = {}
    for v in verdicts.values():
        tally[v] = tally.get(v, 0) + 1
    report.add_headline(
        "Claims", f"{len(verdicts)}: " + ", ".join(f"{n} {v}" for v, n in sorted(tally.items()))
    )
    for r in card.rows[:4]:  # the first rows; every row is in the table with its adjusted p
        v = (r.get("value") or {}).get("estimate") or {}
        est = fmt_interval(v.get("estimate"), v.get("lo"), v.get("hi"), v.get("n"))
        if r.get("p_adjusted") is not None:
            est += f", adjusted p = {r['p_adjusted']:.3g}"
        report.add_headline(f"{r['id']}: {r['verdict']}", est)
    report.parts.append(f"<style>{_CSS}</style>")
    _decision_sections(report, card)
    if forest_rows(card.rows):
        _section(report, "fig-forest", "Every claim against its threshold and control")
        report.add_figure(forest_figure(card.rows))
    report.parts.append(card.table_html())
    report.add_text(
        f"Verdict rules (frozen, hash {RULES_HASH}; budgets hash "
        f"{card.meta.get('budgets_hash', '?')}): "
        + "; ".join(f"{k}: {v}" for k, v in RULES.items()),
        note=True,
    )
    st = card.stages
    if "trace" in st:
        _trace_sections(report, st["trace"])
    if "repair" in st:
        _repair_sections(report, st["repair"])
    if "transfer_relation" in st or "transfer_lang" in st:
        _transfer_section(report, st)
    extra_sections(report, st)
    if "experts" in st:
        _experts_sections(report, st["experts"])
    if "align" in st:
        _align_section(report, st["align"])
    _timing_section(report, card.meta.get("stages", {}))
    return report


def _card_key(card: ClaimsCard, key: str) -> Any:
    """``key`` of the claims file: an attribute of the card, else its ``meta`` entry
    (``None`` when absent)."""
    value = getattr(card, key, None)
    return value if value is not None else card.meta.get(key)


def _show(report: Report, value: Any) -> None:
    """A decision record as the report shows it: text as a note, a mapping as a table of
    its entries, a list of mappings as a table."""
    if isinstance(value, str):
        report.add_text(value, note=True)
    elif isinstance(value, Mapping):
        report.add_table([{"key": k, "value": v if not isinstance(v, (dict, list)) else
                           json.dumps(v, default=str)} for k, v in value.items()])  # fmt: skip
    elif isinstance(value, list) and all(isinstance(v, Mapping) for v in value):
        report.add_table(value)
    else:
        report.add_text(json.dumps(value, default=str), note=True)


def _decision_sections(report: Report, card: ClaimsCard) -> None:
    """What was decided before the verdicts, when the claims file records it: the metric
    decision, the families of claims (primary and secondary rows) and the planner's output.
    Nothing is shown for an absent key."""
    decision = _card_key(card, "metric_decision")
    if decision is not None:
        _section(report, "metric-decision", "Metric decision")
        _show(report, decision)
    families: dict[str, list[str]] = {}
    for r in card.rows:
        if r.get("family"):
            families.setdefault(r["family"], []).append(
                r["id"] + (f"/{r['variant']}" if r.get("variant") else "")
            )
    if families:
        _section(report, "families", "Families of claims")
        report.add_table([{"family": f, "n": len(ids), "claims": ", ".join(ids)}
                          for f, ids in sorted(families.items())])  # fmt: skip
    plan = _card_key(card, "plan")
    if plan is not None:
        _section(report, "plan", "Plan")
        _show(report, plan)


def _trace_sections(report: Report, data: Mapping[str, Any]) -> None:
    import pandas as pd

    _section(report, "fig-latent", "Latent-language curves (logit lens)")
    if _failed(report, data, "trace"):
        return
    report.add_figure(
        latent_curves_figure(pd.DataFrame(data["latent_curves"]), n_layers=data["n_layers"])
    )
    _section(report, "fig-classes", "Recall pipeline classes per language (the tracer)")
    report.add_figure(class_fractions_figure(data["counts"]))


def _repair_sections(report: Report, data: Mapping[str, Any]) -> None:
    _section(report, "fig-repair", "Repair vectors on test (Wilson 95% intervals)")
    if _failed(report, data, "repair"):
        return
    s = data["summary"]
    report.add_text(config_sentence(s, data.get("n_ids")))
    report.add_figure(accuracy_ci_figure(s["intervals"]))
    _section(report, "fig-headroom", "Headroom and the lowest-performing language")
    low = data["lowest"]
    report.add_text(
        f"Literal rule ({low['literal_rule']}) -> {'+'.join(low['literal_languages']) or 'none'}. "
        f"Headroom rule ({low['rule']}) -> {'+'.join(low['languages']) or 'none'}. The card "
        "judges the claim on each rule's languages (tied languages pooled), relative and in points."
    )
    report.add_table([{"lang": lg, **t} for lg, t in low["tests"].items()])
    if s.get("headroom"):
        report.add_figure(headroom_figure(s["headroom"]))


def _transfer_section(report: Report, st: Mapping[str, Any]) -> None:
    _section(report, "fig-transfer", "Transfer matrix (vectors built with / without R)")
    for name in ("transfer_relation", "transfer_lang"):
        data = st.get(name)
        if _failed(report, data, name):
            continue
        assert data is not None
        rows = []
        for c in data["cells"]:
            g = c.get("gain") or {}
            rows.append({"by": data["by"], "row": c.get("row"), "col": c.get("col"),
                         "n": c.get("n"), "gain": g.get("estimate"), "lo": g.get("lo"),
                         "hi": g.get("hi"), "p": c.get("p"),
                         "control gain": (c.get("control_gain") or {}).get("estimate"),
                         "control p": c.get("control_p")})  # fmt: skip
        report.add_table(rows)


def _experts_sections(report: Report, data: Mapping[str, Any]) -> None:
    _section(report, "fig-experts", "Expert neurons: held-out AUROC")
    if _failed(report, data, "experts"):
        return
    a = data["auroc"]
    e, r = a["experts"]["estimate"], a["random"]["estimate"]
    metrics = {f"median AUROC, top {a['k']}": {"experts": e, "random neurons": r}}
    report.add_figure(interval_bars_figure(
        metrics, "Held-out AUROC (95% CI, sentences and their translations resampled together)"))  # fmt: skip
    ov = data["overlap"]
    _section(report, "fig-overlap", "Overlap of the expert sets")
    report.add_figure(overlap_figure(torch.tensor(ov["matrix"]), ov["langs"], ov["k"]))
    _section(report, "fig-kcurve", f"The k curve of {data['target']} and the two k rules")
    curve = KCurve(data["target"], data["curve"])
    report.add_figure(k_curve_figure(curve.rows, curve.lang, data["choice_papers"]["k"]))
    for label, ch in (("papers' rule", data["choice_papers"]),
                      ("stricter rule", data["choice_strict"])):  # fmt: skip
        report.add_text(f"{label}: k = {ch['k']}. {ch['rule']}")
        report.add_table(ch["candidates"])


def _align_section(report: Report, data: Mapping[str, Any]) -> None:
    _section(report, "fig-align", "Alignment before and after the clamp, and the control")
    if _failed(report, data, "align"):
        return
    if "untestable" in data:
        report.add_text(data["untestable"], note=True)
        return
    report.add_figure(
        interval_bars_figure(data["intervals"]["metrics"], "Per-sentence means (bootstrap 95% CI)")
    )
    report.add_figure(retrieval_per_layer_figure(data["retrieval_mean_per_layer"]))


def _timing_section(report: Report, timing: Mapping[str, Any]) -> None:
    _section(report, "timing", "Stages")
    report.add_table([{"stage": k, **v} for k, v in timing.items()])
