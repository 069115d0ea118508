"""Report sections of the claims card's issue-33 stages (decoders, conversion, external) and
the repair configuration written as a sentence. :func:`mechlingo.report.replicate.replicate_report`
calls these after its own sections; each section carries the anchor its rows link to."""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping
from typing import Any, TypeGuard

import numpy as np

from mechlingo.report.page import Report

__all__ = ["config_sentence", "extra_sections"]

_NAMES = {"task": "the recall-engagement (task) vector", "diff": "the back-translation (diff) "
          "vector", "both": "both vectors together"}  # fmt: skip


def config_sentence(summary: Mapping[str, Any], n_ids: Mapping[str, Any] | None = None) -> str:
    """What dev chose, in words: ``"Dev chose both vectors together (better than no
    intervention on dev): the task vector at layer 12 with alpha 0.28 and the back-translation
    vector at layer 12 with alpha 0.13 (residual-norm units) ..."``."""
    c = summary.get("config") or {}
    sel = summary.get("selected", "?")
    unit = summary.get("alpha_unit", "resid")
    unit_txt = "residual-norm units" if unit == "resid" else f"{unit} units"
    effect = summary.get("dev_effect", "")
    head = f"Dev chose {_NAMES.get(sel, repr(sel))}"
    head += f" ({effect} on dev)" if effect else ""
    parts = [
        f"the task vector at layer {c.get('task_layer')} with alpha {c.get('task_alpha')}",
        f"the back-translation vector at layer {c.get('diff_layer')} with alpha "
        f"{c.get('diff_alpha')}",
    ]
    ids = ""
    if n_ids:
        ids = (f"; built on {n_ids.get('build')} fact ids, chosen on {n_ids.get('dev')}, "
               f"tested on {n_ids.get('test')}")  # fmt: skip
    metric = (summary.get("metric") or {}).get("metric", "generate")
    return f"{head}: {parts[0]} and {parts[1]} ({unit_txt}); scored by {metric}{ids}."


def _section(report: Report, anchor: str, title: str) -> None:
    report.parts.append(f"<h2 id='{html.escape(anchor)}'>{html.escape(title)}</h2>")


def _has_data(
    report: Report, data: Mapping[str, Any] | None, name: str
) -> TypeGuard[Mapping[str, Any]]:
    """Whether the stage ``name`` left data to show; when not, a note says why."""
    if data is None:
        report.add_text(f"The {name} stage did not run.", note=True)
        return False
    if "error" in data:
        report.add_text(f"The {name} stage failed: {data['error']}", note=True)
        return False
    if "untestable" in data:
        report.add_text(str(data["untestable"]), note=True)
        return False
    return True


def _decoders(report: Report, data: Mapping[str, Any]) -> None:
    rows = []
    for name, d in data["decoders"].items():
        if "untestable" in d:
            rows.append({"decoder": name, "lang": "-", "English first": "-",
                         "ordered prompts": 0, "note": d["untestable"]})  # fmt: skip
            continue
        per: dict[str, list[bool]] = {}
        for x in d["items"]:
            per.setdefault(x["lang"], []).append(bool(x["en_first"]))
        for lg, v in sorted(per.items()):
            rows.append({"decoder": name, "lang": lg, "English first": sum(v),
                         "ordered prompts": len(v), "note": ""})  # fmt: skip
    report.add_text("Per decoder and language: prompts whose English or L answer reaches rank "
                    f"<= {data['max_rank']} at some lens entry, with distinct words, and how "
                    "many of them reach it with the English answer first.")  # fmt: skip
    report.add_table(rows)


def _conversion(report: Report, data: Mapping[str, Any]) -> None:
    rows = []
    for lg, d in sorted(data["langs"].items()):
        if "untestable" in d:
            rows.append({"lang": lg, "band": "-", "prompts": 0, "note": d["untestable"]})
            continue
        rows.append({"lang": lg, "band": f"{d['band'][0]}-{d['band'][-1]}",
                     "prompts": len(d["ids"]),
                     "band effect (nats)": round(float(np.mean(d["band_effect"])), 3),
                     "random sites (nats)": round(float(np.mean(d["control_effect"])), 3),
                     "note": ""})  # fmt: skip
    report.add_text(
        "Clean mlp_out/attn_out patched into the corrupted-subject run at the last "
        "token; the effect is the restored log-probability of the L answer, "
        "averaged over the band's sites and over as many random sites outside it."
    )
    report.add_table(rows)


def _external(report: Report, data: Mapping[str, Any]) -> None:
    acc = []
    for cond, items in data["items"].items():
        ne = [x["correct"] for x in items if x["lang"] != "en"]
        acc.append({"condition": cond, "non-English accuracy": round(float(np.mean(ne)), 3)
                    if ne else None, "items": len(ne)})  # fmt: skip
    c = data.get("config") or {}
    report.add_text(f"{data.get('n_facts')} benchmark facts scored by {data['metric']}, with the "
                    f"configuration chosen on the bundled data (task layer {c.get('task_layer')} "
                    f"x {c.get('task_alpha')}, diff layer {c.get('diff_layer')} x "
                    f"{c.get('diff_alpha')}).")  # fmt: skip
    report.add_table(acc)


#: The sections: the stage each shows, its anchor, its title and what it writes of the
#: stage's data (when the stage ran and has some).
_SECTIONS: tuple[tuple[str, str, str, Callable[[Report, Mapping[str, Any]], None]], ...] = (
    ("decoders", "fig-decoders", "The latent-English order under each decoder", _decoders),
    ("conversion", "fig-conversion", "Patching the conversion band (last token)", _conversion),
    ("external", "fig-external", "External transfer: the bundled data's vectors on a benchmark",
     _external),
)  # fmt: skip


def extra_sections(report: Report, stages: Mapping[str, Any]) -> None:
    """The decoders, conversion and external sections (each says why when it has nothing)."""
    for key, anchor, title, write in _SECTIONS:
        if key in stages:
            _section(report, anchor, title)
            data = stages.get(key)
            if _has_data(report, data, key):
                write(report, data)
