"""The metric stage: the repair stage's dev split scored both ways (greedy generation and
candidate ranking) before any test item is scored, and the metric rule's decision
(:mod:`mechlingo.card.metric_rule`); the card's metric becomes the rule's choice (or the
given one). A stage like the others, declared with ``decides``: the card runs it before the
planner and the other stages read the metric its result decides."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from mechlingo.card.claims import LU
from mechlingo.card.metric_rule import decide_metric, dev_accuracies
from mechlingo.card.stages.base import Context, Stage, processes
from mechlingo.card.stages.data import lu_facts, repair_split
from mechlingo.core.errors import InputError
from mechlingo.data import Fact

if TYPE_CHECKING:
    from mechlingo.card.stages import CardSettings

__all__ = ["STAGE", "decision", "dev_facts", "run"]


def dev_facts(facts: Sequence[Fact] | None, settings: CardSettings) -> list[Fact]:
    """The repair stage's dev split with candidates (the split ignores them)."""
    return repair_split(lu_facts(facts, settings.with_metric("rank"), "repair"), settings)[1]


def run(ctx: Context) -> dict[str, Any]:
    """Dev accuracies under both metrics (with the measured seconds per item)."""
    dev = dev_facts(ctx.facts, ctx.settings)
    out = dev_accuracies(ctx.model, dev, max_new_tokens=ctx.budget.repair.max_new_tokens,
                         batch_size=ctx.settings.batch())  # fmt: skip
    out["n_dev_ids"] = len({f.id for f in dev})
    return out


def decision(data: Mapping[str, Any], given: str | None) -> dict[str, Any]:
    """The metric rule's decision on the stage's result (``{"error": ...}`` when it failed:
    then only a ``given`` metric lets the card go on)."""
    if "error" in data:
        if given is None:
            raise InputError(f"the metric rule's dev scoring failed: {data['error']}",
                             fix="pass --metric to choose the metric yourself")  # fmt: skip
        return {"metric": given, "ruled": None, "overridden": True, "given": given,
                "why": f"the rule could not run ({data['error']}): the given metric"}  # fmt: skip
    return decide_metric(data, given)


#: The untimed warm-up of each metric in greedy-generated items (one item alone, the first
#: greedy call of the process: its one-time setup) and in ranked items (one item alone),
#: measured on the embedded model (one process, 7 December 2026): the first greedy call on
#: one dev item took 4.20 CPU-seconds against 0.046 per item in batches of 16 (90 items), a
#: later one 0.21 (5); one ranked item alone 0.61 to 0.68 against 0.130 to 0.135 (5).
WARMUP_GENERATE = 90.0
WARMUP_RANK = 5.0


def cost(settings: CardSettings, sizes: Mapping[str, Any], unit: Mapping[str, float]) -> float:
    """CPU seconds: the dev items scored both ways (known once the stage has run; shared out
    under torchrun) and the warm-up of each metric, which every process runs whole
    (:data:`WARMUP_GENERATE`, :data:`WARMUP_RANK`: per process, ``processes`` x the
    per-item seconds, which are one process's share)."""
    b = settings.budget
    dev = min(int(sizes.get("dev_ids", 0)), int(b.repair.dev_per_lang or 10**9))
    items = int(sizes.get("dev_items", dev * len(b.lu_langs)))
    rank, gen = unit.get("rank", 0.0), unit.get("generate", 0.0)
    warm = processes(sizes) * (WARMUP_GENERATE * gen + WARMUP_RANK * rank)
    return items * (rank + gen) + warm


STAGE = Stage(name="metric", paper=LU, run=run, section="repair", cost=cost, decides=decision)
