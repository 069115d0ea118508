"""The card's stages read their typed budget (no string-keyed budget lookup is left in
``mechlingo/card``), and a new card stage is one module: declared, registered, run."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

import mechlingo.card
from mechlingo.card import stages as card_stages
from mechlingo.card.replicate import CardOptions, replicate
from mechlingo.card.stages import CardBudget, register_stage, unregister_stage
from mechlingo.card.stages.base import Budget, Context, ReportLike, Stage, data_section
from mechlingo.card.stages.trace import TraceBudget
from mechlingo.core.errors import InputError
from mechlingo.report.replicate import replicate_report

CARD = Path(mechlingo.card.__file__).parent
#: A lookup on the plain settings dict (``cfg["repair"]``, ``section.get("langs")``).
PLAIN = re.compile(r"\b(cfg|budget|section|sec)\s*(\[|\.get\()")
#: ``x["repair"]["seeds"]``: a budget section's field by string key (checked against the
#: budget's own sections and fields below, so that result lookups do not count).
CHAINED = re.compile(r'\[\s*"(\w+)"\s*\]\s*\[\s*"(\w+)"\s*\]')
#: ``x.get("repair", {})``: a budget section by string key.
SECTION_GET = re.compile(r'\.get\(\s*"(\w+)"\s*,\s*\{\}\s*\)')
#: What remains, each for a reason: the plain settings that enter the stage key are merged,
#: checked and turned into the typed settings in one place, and the metric the rule chose is
#: written back into that plain dict (the stored card's ``settings``).
ALLOWED = {
    ("stages/__init__.py", 'return cls(budget, str(cfg.get("budget", "quick")), str(cfg.get("metric", "generate")),'),
    ("stages/__init__.py", 'cfg.get("batch_size"))  # fmt: skip'),
    ("stages/__init__.py", "if isinstance(v, Mapping) and isinstance(cfg.get(k), dict):"),
    ("stages/__init__.py", "_merge(cfg[k], v)"),
    ("stages/__init__.py", "cfg[k] = copy.deepcopy(v)"),
    ("stages/__init__.py", 'bs = cfg.get("batch_size")'),
    ("stages/__init__.py", 'cfg["budget"] = budget'),
    ("replicate.py", 'cfg["metric"] = decision["metric"]'),
    ("replicate.py", "stage) and its decision; ``cfg[\"metric\"]`` (and the context's settings' metric) becomes"),
}  # fmt: skip


def _fields(cls: type[Budget]) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _sections() -> dict[str, set[str]]:
    """Every budget section and its fields (nested ones under their own name too)."""
    out: dict[str, set[str]] = {}
    todo: list[tuple[str, type[Budget]]] = list(CardBudget.NESTED.items())
    while todo:
        name, cls = todo.pop()
        out[name] = _fields(cls)
        todo += list(cls.NESTED.items())
    return out


def _hits(text: str, sections: dict[str, set[str]]) -> list[str]:
    """The lines of ``text`` that read a budget value by string key."""
    out = []
    for line in text.splitlines():
        chained = any(sec in sections and key in sections[sec]
                      for sec, key in CHAINED.findall(line))  # fmt: skip
        got = [s for s in SECTION_GET.findall(line) if s in sections]
        if PLAIN.search(line) or chained or got:
            out.append(line.strip())
    return out


def test_no_string_keyed_budget_lookup_remains():
    sections = _sections()
    # the scan sees the patterns the stages used before they read the typed budget
    old = ['r = cfg["repair"]', 'd = cfg.get("decoders", {})', 'x = c["repair"]["seeds"]',
           'langs = sec.get("langs") or lu', 'n = ctx.cfg.get("conversion", {})']  # fmt: skip
    assert all(_hits(line, sections) for line in old)
    assert not _hits('e, r = a["experts"]["estimate"], a["random"]["estimate"]', sections)
    found = {(str(p.relative_to(CARD)), hit) for p in sorted(CARD.rglob("*.py"))
             for hit in _hits(p.read_text(encoding="utf-8"), sections)}  # fmt: skip
    assert found == ALLOWED, sorted(found ^ ALLOWED)


# --------------------------------------------------------------------------------------
# A new stage in one module: what a contributor writes
# --------------------------------------------------------------------------------------


def _run_toy(ctx: Context) -> dict[str, Any]:
    """Reads its typed budget section and the card's settings, and the repair facts."""
    return {"max_rank": ctx.budget.trace.max_rank, "metric": ctx.settings.metric,
            "langs": sorted({f.lang for f in ctx.lu_facts("repair")})}  # fmt: skip


def _draw_toy(rep: ReportLike, data: Any) -> None:
    rep.add_text(f"The toy stage read max_rank {data['max_rank']}.")


def _cost_toy(settings: Any, sizes: Any, unit: Any) -> float:
    return 1.0


TOY = Stage(name="toy", paper="toy2026", run=_run_toy, section="trace", budget=TraceBudget,
            report=data_section("toy", "fig-toy", "A toy stage", _draw_toy),
            cost=_cost_toy)  # fmt: skip


def test_a_new_card_stage_is_one_module(tiny, tmp_path):
    register_stage(TOY)
    try:
        with pytest.raises(InputError, match="exists"):
            register_stage(TOY)
        assert card_stages.PAPERS["toy2026"] == ("toy",) and card_stages.STAGES[-1] is TOY
        opts = CardOptions(paper="toy2026", metric="generate", settings={"trace": {"max_rank": 7}})
        card = replicate(tiny, opts, work=tmp_path)
        assert card.stages["toy"] == {"max_rank": 7, "metric": "generate",
                                      "langs": sorted(card_stages.QUICK.lu_langs)}  # fmt: skip
        assert card.meta["stages"]["toy"]["error"] is None
        assert card.meta["plan"]["seconds"]["stages"] == {"toy": 1.0}
        page = replicate_report(card).render()
        assert "id='fig-toy'" in page and "The toy stage read max_rank 7." in page
    finally:
        unregister_stage("toy")
    assert "toy" not in card_stages.BY_NAME and "toy2026" not in card_stages.PAPERS
    assert TOY not in card_stages.STAGES
