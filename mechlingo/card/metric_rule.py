"""The claims card's metric rule: how the Lu stages score facts, decided on dev data.

The rule is written down (:data:`METRIC_RULE`, stored in ``claims.json`` beside the verdict
rules) and frozen before any test item is scored: the repair stage's dev split is scored with
greedy generation and with candidate ranking, in every language, with no intervention; when
generation's accuracy pooled over the non-English languages is above :data:`METRIC_FLOOR`,
the card scores with ``generate`` (the papers' scorer), otherwise with ``rank``.

Why 0.2: with :data:`CANDIDATES` candidates the ranking's chance is 1/4 = 0.25; a generator
that answers fewer dev queries than a blind four-way guess would (0.2 leaves room for the
dev sample's noise below 0.25) gives every test item an outcome at or near 0 under every
condition, so a repair vector's gain in points can barely be seen and a row "holds" or "does
not hold" on the floor, not on the model. Above it, generation is the papers' own scorer and
keeps the answer's form. A ``metric=`` given to the card overrides the rule; the card then
says so (``metric_decision["overridden"]``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from mechlingo.card.repair_items import gold_share
from mechlingo.core.defaults import BATCH_SIZE, STEER_MAX_NEW_TOKENS
from mechlingo.core.types import Model
from mechlingo.data import Fact
from mechlingo.data.candidates import with_candidates
from mechlingo.scoring.evaluate import DecodeOptions, evaluate_facts

__all__ = ["CANDIDATES", "METRIC_FLOOR", "METRIC_RULE", "decide_metric", "dev_accuracies"]

#: Greedy generation's pooled non-English dev accuracy must be above this to be the metric.
METRIC_FLOOR = 0.2
#: Candidates per fact under ``rank`` (chance 1/4) when the facts bring none.
CANDIDATES = 4
#: The rule's text, written into ``claims.json`` (``metric_rule``).
METRIC_RULE = (
    "Before any test item is scored, the repair stage's dev split (no intervention) is scored "
    "with greedy generation and with candidate ranking (BMLAMA-style candidates, "
    f"{CANDIDATES} per fact when the facts bring none: chance 1/{CANDIDATES}). If "
    "generation's accuracy pooled over the non-English dev items is above the floor "
    f"{METRIC_FLOOR:g}, the card scores with 'generate', otherwise with 'rank'. English is "
    "reported beside it and does not decide. A metric given to the card overrides the rule "
    "and the card says so."
)


def dev_accuracies(
    model: Model,
    dev: Sequence[Fact],
    *,
    max_new_tokens: int = STEER_MAX_NEW_TOKENS,
    batch_size: int = BATCH_SIZE,
) -> dict[str, Any]:
    """The rule's inputs: per metric (``generate``, ``rank``) and language the number of
    correct dev items and ``n`` (``counts``: ``{metric: {lang: [correct, n]}}``), the
    per-item records (``items``: id, lang, correct, gold share under rank), the per-item CPU
    seconds of each metric (``time.process_time`` of this process, every thread, after an
    untimed warm-up item: another job on the machine does not inflate it), and the
    ranking's chance."""
    ranked = with_candidates(list(dev), CANDIDATES)
    out: dict[str, Any] = {"counts": {}, "seconds_per_item": {}, "items": {}}
    for metric, facts in (("generate", list(dev)), ("rank", ranked)):
        if facts:  # warm-up on one item, not timed: the first call's one-time costs
            evaluate_facts(
                model,
                facts[:1],
                metric=metric,
                decoding=DecodeOptions(max_new_tokens=max_new_tokens, batch_size=batch_size),
            )
        t0 = time.process_time()
        res = evaluate_facts(
            model,
            facts,
            metric=metric,
            decoding=DecodeOptions(max_new_tokens=max_new_tokens, batch_size=batch_size),
        )
        secs = time.process_time() - t0
        by: dict[str, list[int]] = {}
        out["items"][metric] = [{"id": r["id"], "lang": r["lang"], "correct": bool(r["correct"]),
                                 "share": gold_share(r)} for r in res.records]  # fmt: skip
        for r in res.records:
            c = by.setdefault(r["lang"], [0, 0])
            c[0] += int(bool(r["correct"]))
            c[1] += 1
        out["counts"][metric] = dict(sorted(by.items()))
        out["seconds_per_item"][metric] = round(secs / max(1, len(res.records)), 4)
    n_cands = [len(f.candidates) for f in ranked if f.candidates]
    out["chance_rank"] = sum(1 / n for n in n_cands) / len(n_cands) if n_cands else None
    return out


def _pooled(counts: Mapping[str, Sequence[int]], english: bool) -> tuple[int, int]:
    keep = [v for lg, v in counts.items() if (lg == "en") == english]
    return sum(int(v[0]) for v in keep), sum(int(v[1]) for v in keep)


def decide_metric(inputs: Mapping[str, Any], override: str | None = None) -> dict[str, Any]:
    """The rule's decision from :func:`dev_accuracies`: ``metric`` (the card's), ``ruled``
    (what the rule alone gives), ``overridden`` (a given metric replaced it), and the
    pooled accuracies it read (``{metric: {"non_english": [k, n], "en": [k, n]}}``)."""
    pooled = {m: {"non_english": list(_pooled(c, False)), "en": list(_pooled(c, True))}
              for m, c in inputs["counts"].items()}  # fmt: skip
    k, n = pooled["generate"]["non_english"]
    acc = k / n if n else 0.0
    ruled = "generate" if acc > METRIC_FLOOR else "rank"
    why = (f"greedy generation answers {k} of {n} non-English dev items ({acc:.3f}), "
           f"{'above' if ruled == 'generate' else 'at or below'} the floor {METRIC_FLOOR:g}")  # fmt: skip
    return {
        "metric": override or ruled,
        "ruled": ruled,
        "overridden": override is not None and override != ruled,
        "given": override,
        "generate_accuracy_non_english": acc,
        "floor": METRIC_FLOOR,
        "pooled": pooled,
        "why": why,
    }
