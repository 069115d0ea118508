"""The report of ``mechlingo replicate``: the verdict table first, then one section per
figure (each row of the table links to its section by anchor)."""

from __future__ import annotations

import html
import json
from collections.abc import Mapping
from typing import Any

from mechlingo.card import stages as card_stages
from mechlingo.card.population import p_text
from mechlingo.card.rules import RULES, ClaimsCard
from mechlingo.report.page import Report, fmt_interval
from mechlingo.viz.claims import forest_figure, forest_rows

_CSS = ".claims td{vertical-align:top}.claims td:nth-child(2){max-width:320px}"


def _section(report: Report, anchor: str, title: str) -> None:
    report.parts.append(f"<h2 id='{html.escape(anchor)}'>{html.escape(title)}</h2>")


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
    for r in card.rows[:4]:  # the first rows; every row is in the table with its deciding p
        v = (r.get("value") or {}).get("estimate") or {}
        est = fmt_interval(v.get("estimate"), v.get("lo"), v.get("hi"), v.get("n"))
        p = r.get("p_deciding_adjusted", r.get("p_adjusted"))
        if p is not None:  # the p that decided the verdict, adjusted (never shown as 0)
            est += f", deciding adjusted p = {p_text(p)}"
        report.add_headline(f"{r['id']}: {r['verdict']}", est)
    report.parts.append(f"<style>{_CSS}</style>")
    _decision_sections(report, card)
    if forest_rows(card.rows):
        _section(report, "fig-forest", "Every claim against its threshold and control")
        report.add_figure(forest_figure(card.rows))
    report.parts.append(card.table_html())
    report.add_text(
        f"Verdict rules (frozen, hash {card.rules_hash}; budgets hash "
        f"{card.meta.get('budgets_hash', '?')}): "
        + "; ".join(f"{k}: {v}" for k, v in RULES.items()),
        note=True,
    )
    st = card.stages
    written: list[object] = []
    for stage in card_stages.STAGES:  # each stage's own section, in the card's stage order
        if stage.report is not None and stage.name in st and stage.report not in written:
            written.append(stage.report)
            stage.report(report, st)
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


def _timing_section(report: Report, timing: Mapping[str, Any]) -> None:
    _section(report, "timing", "Stages")
    report.add_table([{"stage": k, **v} for k, v in timing.items()])
