"""The Holm family's own proof: the family-wise error of the card's multiplicity step.

A card row's multiplier depends on the other rows of its family: ``finalize`` orders a family
by each row's p, once per side. This module builds whole families of rows as the card's
stages build them, through ``make_row``: clamp rows as the align stage makes them
(``paired_test`` of the change, ``rank_population_test`` against the row's own random
clamps), and gain rows as the repair stage makes its vector rows (a paired gain per fact, a
claim with a smallest effect of interest, the vector's rank among random vectors). It judges
them with the card's own ``finalize`` and counts the families with a wrong verdict
(``holds`` on a false claim, ``does not hold`` on a true one); docs/calibration.md has the
table and how to read it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mechlingo.card import calibration as cal
from mechlingo.card import claims as C
from mechlingo.card.clustered_tests import paired_test
from mechlingo.card.population import rank_population_test
from mechlingo.card.rules import ALPHA, HOLDS, NOT_HOLDS, finalize, make_row
from mechlingo.core.defaults import SEED

__all__ = ["FAMILY_DESIGNS", "FamilyDesign", "family_error", "table_markdown"]


@dataclass(frozen=True)
class FamilyDesign:
    """One family. ``kind="clamp"``: ``rows`` tuples of (how many rows, claim true?, random
    draws each, how far every condition moves the distances down; the rows of a tuple spread
    it evenly from that to 1.5 times it, so each row's own paired p differs), over ``docs``
    documents of 10 sentences. ``kind="gain"``: ``rows`` tuples of (how many rows, claim
    true?, random draws each, the true mean gain) of ``task_vector`` rows over ``docs`` facts
    (per-fact gain SD 0.06; every random vector loses 0.1, so the control never decides);
    a gain at the threshold (0) is a false claim, one at or beyond the smallest effect of
    interest (0.05) a true one."""

    name: str
    rows: tuple[tuple[int, bool, int, float], ...]
    docs: int = 24
    kind: str = "clamp"

    @property
    def size(self) -> int:
        """The rows in the family."""
        return sum(r[0] for r in self.rows)


#: The designs of the family table. The clamp designs (24 documents of 10 sentences; every
#: clamp, random or not, moves the distances down by 0.12 to 0.18, so each row's own paired
#: p is small):
#: ``one more draw``: each row's clamp is one more random draw (its claim, "beats its
#: control", is false).
#: ``undecidable beside nulls``: the card's case, rows whose effect beats every one of
#: their 20 draws (true, but 1/21 cannot reach a Holm level) beside rows that are one more
#: draw among 100. ``decidable``: true rows with 200 draws beside null rows (power kept).
#: The two ``gains`` designs are ``task_vector`` rows over 40 facts (``kind="gain"``): six
#: gains at the threshold, where the rows near 0 are precise zeros and a row beyond 0 by
#: chance must still face Holm's step on the claim side; and three at the threshold beside
#: three true gains of +0.08 (power kept).
FAMILY_DESIGNS: tuple[FamilyDesign, ...] = (
    FamilyDesign("one more draw: 6 rows, 100 draws", ((6, False, 100, 0.12),)),
    FamilyDesign(
        "undecidable beside nulls: 4 true rows (20 draws), 2 null (100)",
        ((4, True, 20, 0.12), (2, False, 100, 0.12)),
    ),  # fmt: skip
    FamilyDesign(
        "decidable: 3 true rows, 3 null (200 draws)", ((3, True, 200, 0.12), (3, False, 200, 0.12))
    ),  # fmt: skip
    FamilyDesign(
        "gains at the threshold beside precise zeros: 6 rows, 40 facts",
        ((6, False, 200, 0.0),),
        docs=40,
        kind="gain",
    ),  # fmt: skip
    FamilyDesign(
        "gains: 3 at the threshold, 3 true (+0.08), 40 facts",
        ((3, False, 200, 0.0), (3, True, 200, 0.08)),
        docs=40,
        kind="gain",
    ),  # fmt: skip
)

_GAIN_SD, _DRAW_LOSS = 0.06, -0.1  # a fact's own gain's SD; every random vector's mean gain


def _gain_rows(rng: np.random.Generator, d: FamilyDesign) -> tuple[list[dict[str, Any]], list[bool]]:  # fmt: skip
    """One family of ``task_vector`` rows as the repair stage makes them: per-fact accuracy
    before, after (before + the row's gain, SD ``_GAIN_SD`` over facts) and after each random
    vector (``_DRAW_LOSS``), the paired test of the gain and the vector's rank among the
    random vectors, and whether each row's claim is true."""
    claim, ids = C.TASK_VECTOR, np.arange(d.docs)
    rows, truth = [], []
    for n, true, m, gain in d.rows:
        for _ in range(n):
            pre = rng.uniform(0.2, 0.6, d.docs)
            post = pre + rng.normal(gain, _GAIN_SD, d.docs)
            draws = pre[None, :] + rng.normal(_DRAW_LOSS, _GAIN_SD, (m, d.docs))
            vs = rank_population_test(post, draws, ids, base=pre, direction=claim.direction)
            rows.append(make_row(claim, paired_test(pre, post, ids), vs_control=vs))
            truth.append(true)
    return rows, truth


def _rows(rng: np.random.Generator, d: FamilyDesign) -> tuple[list[dict[str, Any]], list[bool]]:
    """One family's rows as the align stage makes its clamp rows, and whether each row's claim
    is true: continuous per-sentence distances in documents before and after the clamp and
    its random clamps (:func:`~mechlingo.card.calibration._sim_population_docs`), every
    condition moved down by the row's common offset (random clamps move the distances too),
    the expert clamp one more draw (false) or 0.5 further down (true)."""
    if d.kind == "gain":
        return _gain_rows(rng, d)
    design = cal.Design("documents", "balanced", (10,) * d.docs)
    rows, truth = [], []
    claim = C.CLAMP_CLOSER
    for n, true, m, gain in d.rows:
        for off in np.linspace(gain, 1.5 * gain, n):
            (s,) = cal._sim_population_docs(rng, design, 1, true, m)
            pre, post, draws = s["arrays"]
            post, draws = post - off, draws - off
            vs = rank_population_test(post, draws, s["ids"], base=pre, direction=claim.direction)
            rows.append(make_row(claim, paired_test(pre, post, s["ids"]), vs_control=vs))
            truth.append(true)
    return rows, truth


def family_error(d: FamilyDesign, reps: int, seed: int = SEED) -> dict[str, Any]:
    """The family-wise error of ``reps`` simulated families of design ``d`` judged by
    :func:`~mechlingo.card.rules.finalize`: the share of families with a wrong verdict
    (``holds`` on a false claim, ``does not hold`` on a true one), its Monte Carlo SE, the
    share of true rows that hold (power), and ``ok``: the error at or under 0.05 plus two
    Monte Carlo SEs."""
    rng = np.random.default_rng(seed)
    wrong, held, trues = 0, 0, 0
    for _ in range(reps):
        rows, truth = _rows(rng, d)
        out = finalize(rows)
        bad = any((r["verdict"] == HOLDS and not t) or (r["verdict"] == NOT_HOLDS and t)
                  for r, t in zip(out, truth, strict=True))  # fmt: skip
        wrong += bad
        held += sum(r["verdict"] == HOLDS for r, t in zip(out, truth, strict=True) if t)
        trues += sum(truth)
    rate = wrong / reps
    se = math.sqrt(max(rate * (1 - rate), 1.0 / reps) / reps)
    return {"design": d.name, "rows": d.size, "reps": reps, "error": rate, "se": se,
            "power": None if trues == 0 else held / trues, "ok": rate <= ALPHA + 2 * se}  # fmt: skip


def table_markdown(results: Sequence[dict[str, Any]]) -> str:
    """The family table: design, rows, samples, family-wise error (MC SE), power, bound."""
    head = ("| family | rows | reps | family-wise error (MC SE) | true rows held | bound |\n"
            "| --- | --- | --- | --- | --- | --- |\n")  # fmt: skip
    body = "".join(
        f"| {r['design']} | {r['rows']} | {r['reps']} | {r['error']:.3f} ({r['se']:.3f}) | "
        f"{'n/a' if r['power'] is None else format(r['power'], '.3f')} | "
        f"{'met' if r['ok'] else 'MISSED'} |\n"
        for r in results
    )
    return head + body
