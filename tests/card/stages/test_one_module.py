"""The card's stages read their typed budget (no string-keyed budget lookup is left in
``mechlingo/card``), and a new card stage is one module: declared, registered, run."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

import mechlingo.card
from mechlingo.card import stages as card_stages
from mechlingo.card.claims import Claim
from mechlingo.card.clustered_tests import mean_test
from mechlingo.card.replicate import CardOptions, replicate
from mechlingo.card.rules import HOLDS, RULES_HASH, make_row
from mechlingo.card.stages import (
    CardBudget,
    budget_settings,
    card_rules_hash,
    register_stage,
    unregister_stage,
)
from mechlingo.card.stages.base import Budget, Context, ReportLike, Stage, check, data_section
from mechlingo.card.stages.trace import TraceBudget
from mechlingo.core.errors import InputError

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
# A new stage in one module, with its own budget section and its own claim: what a
# contributor writes (everything from here to the tests is the stage's module)
# --------------------------------------------------------------------------------------

PAPER = "toy2026"


@dataclass(frozen=True)
class ToyBudget(Budget):
    """The toy stage's budget section: how many English prompts it reads."""

    prompts: int

    def __post_init__(self) -> None:
        check(self.prompts >= 2, "toy.prompts", "must be at least 2")


#: The claim the toy stage measures: a random model's next token is not uniform.
SHARP = Claim(
    "toy_sharp", PAPER, "The next-token distribution is sharper than uniform.",
    "entropy below the uniform's", "next-token entropy over log(vocabulary) per English prompt "
    "(one fact each); threshold 1, below", "toy", "fig-toy", direction=-1, threshold=1.0,
)  # fmt: skip


def _run_toy(ctx: Context) -> dict[str, Any]:
    """Each prompt's next-token entropy over the uniform's, on the section's first prompts."""
    toy = ctx.budget.toy  # the stage's own typed section
    facts = [f for f in ctx.lu_facts("toy") if f.lang == "en"][: toy.prompts]
    with torch.no_grad():
        logp = [torch.log_softmax(ctx.model(f.prompt)[0, -1].float(), -1) for f in facts]
    ratios = [float(-(lp.exp() * lp).sum() / math.log(lp.numel())) for lp in logp]
    return {"prompts": toy.prompts, "ids": [f.id for f in facts], "ratio": ratios}


def _rows_toy(data: Any) -> list[dict[str, Any]]:
    return [make_row(SHARP, mean_test(data["ratio"], data["ids"], null=SHARP.threshold))]


def _draw_toy(rep: ReportLike, data: Any) -> None:
    rep.add_text(f"The toy stage read {data['prompts']} prompts.")


def _cost_toy(settings: Any, sizes: Any, unit: Any) -> float:
    return float(settings.budget.toy.prompts)


TOY = Stage(name="toy", paper=PAPER, run=_run_toy, rows=(_rows_toy,), section="toy",
            budget=ToyBudget, quick=ToyBudget(prompts=6), full=ToyBudget(prompts=12),
            own_claims=(SHARP,), report=data_section("toy", "fig-toy", "A toy stage", _draw_toy),
            cost=_cost_toy)  # fmt: skip

# --------------------------------------------------------------------------------------


def _card_cli(tiny_dir: Path, out: Path, *extra: str) -> dict[str, Any]:
    from mechlingo.cli import main

    args = ["replicate", "--model", str(tiny_dir), "--paper", PAPER, "--claims-metric",
            "generate", "--out", str(out), "--quiet", *extra]  # fmt: skip
    assert main(args) == 0
    return json.loads((out / "claims.json").read_text(encoding="utf-8"))


def test_a_new_card_stage_is_one_module(tiny, tiny_dir, tmp_path):
    shipped = card_stages.BUDGETS_HASH
    register_stage(TOY)
    try:
        with pytest.raises(InputError, match="exists"):
            register_stage(TOY)
        assert card_stages.PAPERS[PAPER] == ("toy",) and card_stages.STAGES[-1] is TOY
        # its section is part of both budgets (with their own values) and of their hash
        assert card_stages.QUICK.toy == ToyBudget(6) and card_stages.FULL.toy.prompts == 12
        assert budget_settings("full")["toy"] == {"prompts": 12}
        assert card_stages.BUDGETS_HASH not in (shipped, "")
        assert card_rules_hash() not in (RULES_HASH, "")  # its claim is hashed with the rules
        with pytest.raises(InputError, match=r"settings.toy: unknown setting\(s\) \['prompt'\]"):
            budget_settings("quick", {"toy": {"prompt": 3}})
        with pytest.raises(InputError, match="toy.prompts: must be at least 2"):
            budget_settings("quick", {"toy": {"prompts": 1}})
        # the library call: the quick budget's value reaches the stage, typed
        card = replicate(tiny, CardOptions(paper=PAPER, metric="generate"), work=tmp_path / "w")
        assert card.stages["toy"]["prompts"] == 6 and len(card.stages["toy"]["ratio"]) == 6
        assert card.meta["plan"]["seconds"]["stages"] == {"toy": 6.0}
        # the command: --settings overrides the section; the claim is judged by the rules
        got = _card_cli(tiny_dir, tmp_path / "out", "--settings", '{"toy": {"prompts": 5}}')
        (row,) = got["claims"]
        ratios = got["meta"]["settings"]["toy"], row["value"]["estimate"]
        assert ratios[0] == {"prompts": 5} and ratios[1]["n"] == 5
        # the value by hand: the mean of the five ratios, below 1 (a random model's next
        # token is not uniform) with an interval that excludes it
        data = json.loads((tmp_path / "out" / "claims.json").read_text(encoding="utf-8"))
        assert data["rules_hash"] == card_rules_hash() == got["meta"]["rules_hash"]
        assert got["meta"]["budgets_hash"] == card_stages.BUDGETS_HASH
        assert row["id"] == "toy_sharp" and row["family"] == "secondary"
        assert row["adjustment"]["multiplier"] == 1.0
        assert row["verdict"] == HOLDS and ratios[1]["hi"] < 1.0
        page = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
        assert "id='fig-toy'" in page and "The toy stage read 5 prompts." in page
        assert "href='#fig-toy'" in page and SHARP.text in page
        assert f"hash {card_rules_hash()}" in page
    finally:
        unregister_stage("toy")
    assert "toy" not in card_stages.BY_NAME and PAPER not in card_stages.PAPERS
    assert TOY not in card_stages.STAGES and not card_stages.ADDED_SECTIONS
    assert "toy" not in card_stages.BUDGETS["quick"] and card_stages.BUDGETS_HASH == shipped
    assert card_rules_hash() == RULES_HASH and not hasattr(card_stages.QUICK, "toy")
    with pytest.raises(InputError, match="unknown setting"):
        budget_settings("quick", {"toy": {"prompts": 5}})


def test_a_new_stage_declares_its_section_and_claims_whole():
    def stage(**kw: Any) -> Stage:
        return Stage(**{"name": "toy2", "paper": PAPER, "run": _run_toy, **kw})

    own = {"section": "toy", "budget": ToyBudget}
    bad = [
        (stage(**own, quick=ToyBudget(3)), "one of quick and full"),
        (stage(quick=ToyBudget(3), full=ToyBudget(4)), "without a section"),
        (stage(**{**own, "section": "trace"}, quick=ToyBudget(3), full=ToyBudget(4)),
         "a budget section named 'trace' exists"),
        (stage(section="toy", budget=TraceBudget, quick=ToyBudget(3), full=ToyBudget(4)),
         "must be TraceBudget"),
        (stage(own_claims=(SHARP,)), "names stage 'toy', not 'toy2'"),
        (stage(own_claims=(dataclasses.replace(SHARP, id="task_vector", stage="toy2"),)),
         "a claim named 'task_vector' exists"),
    ]  # fmt: skip
    for st, message in bad:
        with pytest.raises(InputError, match=message):
            register_stage(st)
        assert "toy2" not in card_stages.BY_NAME and not card_stages.ADDED_SECTIONS
    # a stage that borrows a shipped section reads it as the shipped stages do
    borrow = stage(section="trace", budget=TraceBudget)
    register_stage(borrow)
    try:
        assert card_stages.BY_NAME["toy2"] is borrow and not card_stages.ADDED_SECTIONS
    finally:
        unregister_stage("toy2")
