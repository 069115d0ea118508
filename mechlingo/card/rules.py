"""The frozen rules that turn the claims' measurements into verdicts, and the card.

:func:`mechlingo.card.replicate.replicate` measures each :class:`~mechlingo.card.claims.Claim`,
makes its row with :func:`make_row` from :class:`~mechlingo.card.clustered_tests.Test` objects and
calls :func:`finalize` once on all rows: Holm inside each paper's primary family,
Benjamini-Hochberg over the other rows, and each row's :func:`verdict` (``holds``, ``does not
hold``, ``inconclusive``, ``not testable here``, its ``(floor)`` form, or ``error``) by
:data:`RULES` at its adjusted level. :class:`ClaimsCard` holds the rows. The rules and every
claim's parameters are hashed (:data:`RULES_HASH`) into ``claims.json``; ``docs/replicate.md``
("The verdict rules") states each rule and logs every change made after a card was seen.
"""

from __future__ import annotations

import dataclasses
import hashlib
import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mechlingo.card.claims import CLAIMS, LU, PRIMARY, SUNDAR, Claim, claim_by_id, row_family
from mechlingo.card.clustered import p_floor
from mechlingo.card.clustered_tests import Test
from mechlingo.card.multiplicity import adjust
from mechlingo.card.population import draws_needed, p_text
from mechlingo.kernels.significance import Interval

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "ALPHA",
    "CLAIMS",
    "FLOOR",
    "HOLDS",
    "INCONCLUSIVE",
    "LU",
    "NOT_HOLDS",
    "NOT_TESTABLE",
    "PRIMARY",
    "RULES",
    "RETAINED_SHARE",
    "RULES_HASH",
    "SUNDAR",
    "VERDICTS",
    "Claim",
    "ClaimsCard",
    "claim_by_id",
    "error_row",
    "finalize",
    "make_row",
    "preregistration_hash",
    "rules_hash",
    "verdict",
]

HOLDS = "holds"
NOT_HOLDS = "does not hold"
INCONCLUSIVE = "inconclusive"
NOT_TESTABLE = "not testable here"
FLOOR = "not testable here (floor)"
ERROR = "error"
VERDICTS = (HOLDS, NOT_HOLDS, INCONCLUSIVE, NOT_TESTABLE, FLOOR)
#: The family-wise level (primary) and false-discovery rate (secondary) of the card.
ALPHA = 0.05
#: The independence claims' second reading: vectors built without R keep more than this
#: share of the in-pool gain on R (mechlingo's reading; the paper gives no number).
RETAINED_SHARE = 0.5


def _families_text() -> str:
    names = "; ".join(f"{paper}: {', '.join(ids)}" for paper, ids in PRIMARY.items())
    return (f"one primary family per paper ({names}), Holm inside each: the papers' headline "
            "claims, 'independent of languages and datasets' (the held-out gain) and 'up to 2x' "
            "among them; no control is a primary row (random_neurons, retrieval_improves' "
            "control, is secondary); the lowest-language "
            "claim's primary reading is the relative gain in the headroom rule's lowest "
            "language(s) (the paper's '>35%' is relative, and the headroom language is one the "
            "vectors can move); every other row is secondary, Benjamini-Hochberg over each "
            "paper's secondary rows, and marked exploratory; one measurement has one row, and "
            "rows that read the same numbers (identical tests) count once inside a family")  # fmt: skip


#: The verdict rules in words (written into claims.json and the report; hashed).
RULES = {
    "families": _families_text(),
    "adjusted level": "a row with multiplier k on a side of its family (Holm: adjusted p over "
    "raw p, or where capped at 1 its step; BH: likewise) is judged on that side at level "
    "0.05 / k: the interval that decides 'holds', and the minimum detectable effect, at "
    "confidence 1 - 0.05 / k of the claim side; the interval that decides 'does not hold' at "
    "that of the other side",
    "family order": "Holm (primary) or Benjamini-Hochberg (secondary) runs twice in each "
    "family, once per side: over the rows' claim-side p-values, whose multipliers decide "
    "'holds', and over their other-side p-values (against the claim, or the precise-zero p), "
    "whose multipliers decide 'does not hold'; each side's p is a valid one-sided p fixed by "
    "the rule before the data (a two-sided test's p counts only on the side where its "
    "estimate lies, 1 on the other; a rank among draws gives its p and its opposite p), so "
    "a row is never placed by a p that cannot decide what it is judged on, and each side is "
    "Holm's step-down over one hypothesis per row (family-wise error simulated in "
    "docs/calibration.md); one family over the smaller of the two sides let the rows at the "
    "threshold beside precise zeros hold too often (0.12 of families at 0.05); this rule was "
    "changed after the full card of 7 December was seen, and docs/replicate-log.md lists "
    "the verdicts it moved",
    "holds": "adjusted p < 0.05 on the claim's side, the adjusted-level interval beyond the "
    "threshold in the paper's direction, and the effect beyond its control (where there is "
    "one): against a random population by the effect's rank among the draws, otherwise the "
    "effect - control adjusted-level interval beyond 0 in that direction",
    "does not hold": "the same rule on the other side, at the other side's multiplier: the "
    "adjusted p of the opposite side < 0.05 and the adjusted-level interval short of the "
    "threshold, or the effect below its control (the opposite rank p, or the effect - "
    "control interval short of 0, adjusted below 0.05); or, for a claim with a smallest "
    "effect of interest (sesoi), a precise zero: the adjusted-level interval short of "
    "threshold + sesoi and, at either side's level, not beyond the threshold, with the "
    "adjusted one-sided p of H0 'effect = threshold + sesoi' < 0.05",
    "beating a control": "one definition: the effect's rank among m random draws on the "
    "same items, the exact permutation p (1 + #draws at least as good) / (m + 1); its floor "
    "1 / (m + 1) must lie below the row's adjusted level, so a row with Holm multiplier k "
    "needs at least floor(20 k) draws to be decided (a primary family of K rows: 20 K); "
    "each condition is judged against its own population: random task, random diff and "
    "random both, each random vector norm-matched to the vector it controls at that "
    "condition's layer and scale (the repair and external rows), and the independence rows "
    "against a population of random vectors per transfer cell (draw i pooled over the "
    "held-out cells); a row whose draws cannot decide it says: undecidable at this budget, "
    "needs N draws",
    "outcome": "the repair rows (task_vector, diff_vector, lowest_language, random_vector), "
    "the independence rows and the external rows judge the gold answer's probability share "
    "among the candidates where the metric gives candidate scores for every item (rank), 0/1 "
    "correctness otherwise (generate, klar); the row says which",
    "margins": "an equivalence margin is at most half the smallest effect of interest "
    "(0.05 in the gold share and in mean top-1 retrieval: margin 0.025)",
    "inconclusive": "neither; the row gives the minimum detectable effect (80% power) at its "
    "adjusted level",
    "null claims": "equivalence (two one-sided t tests at threshold +/- margin, margin "
    "0.025): holds when "
    "the adjusted-level interval lies inside the margin and the larger one-sided p, "
    "adjusted, is < 0.05; does not hold when the interval lies wholly beyond the margin "
    "(either side) with adjusted p < 0.05; inconclusive otherwise",
    "p-values": "cluster sign-flip permutation tests where H0 makes cluster totals symmetric "
    "(exact McNemar for unclustered 0/1 pairs), CR2 t tests on G - 1 df otherwise; against a "
    "random population, the exact permutation rank p (1 + #draws at least as far) / (m + 1) "
    "(the t test of effect - population mean reported beside it); one draw: floor 0.5, never "
    "enough; with a control, the claim's side p is the larger of the effect's p "
    "and the effect - control p; no p is 0 (a zero-variance estimate gets 1 / 2^(G-1)) and "
    "none is shown as 0 (below 1e-12: '< 1e-k'); the p column shows the p that decided the "
    "verdict (the claim's side for holds, the other side for does not hold; for an "
    "inconclusive row the side on which the effect's estimate lies: beyond the threshold in "
    "the claim's direction, or inside a null claim's margin, is the claim's side) beside its "
    "adjusted value, and the adjusted interval is given at that side's level (the minimum "
    "detectable effect at the claim side's, as the reason states it)",
    "intervals": "CR2 cluster-robust standard errors with Student's t on the Bell-McCaffrey "
    "degrees of freedom (G - 1 with balanced clusters, fewer with unbalanced ones; calibrated "
    "by simulation in docs/calibration.md); effect - control against a population adds the "
    "between-draw variance (Satterthwaite df); rank statistics and medians: cluster bootstrap "
    "percentile intervals widened by t_df / z * sqrt(G / (G - 1))",
    "clusters": "the items of one subject move together: a fact in all its languages and "
    "the facts of other relations on that subject (capital/IT, language/IT and currency/IT "
    "are one cluster), in every row over the card's facts, also where a rule says "
    "'clustered by fact' (each fact is its own cluster where no subject is shared across "
    "relations, and in the external rows; a benchmark id's row number, such as P17/0, names "
    "no subject: its English subject is used where the facts give one); "
    "the sentences of one document move together",
    "floor": "not testable here (floor): a 0/1 outcome sits at its floor (the baseline and "
    "every condition at 0 successes on the row's items); never holds",
    "missing control": "a row whose control is missing (named in the row) cannot hold",
    "independence": "two rows per claim: the pooled held-out (all_but_R on R) gain, clustered "
    "by fact, against its random control by rank (one random draw per cell: a population of "
    "one, which can never decide; primary); and the retained share, held-out gain over the "
    "in-pool (all) gain on the same items, above 0.5 (not testable when the in-pool gain is "
    "not above 0)",
    "latent english": "the share of English-first queries is read on the queries where the "
    "English or the L answer is decodable; its control (the mismatched fact's English "
    "answer) is compared with it on the same, symmetric item set: the queries where the "
    "English, the mismatched English or the L answer is decodable",
    "consistency": "net of accuracy under every metric: under rank the RankC change on the "
    "items whose correctness in L and in English does not change, otherwise the CLC change "
    "minus the change that the accuracies alone give",
    "relative gains": "a condition that changes no item has a relative gain of exactly 0 with "
    "the exact no-change bound (a testable zero that stays in its family); a baseline of 0 "
    "leaves the ratio undefined (not testable, the points reading is judged)",
    "lowest language": "the literal rule (lowest dev zero-shot accuracy among non-English "
    "languages) and the headroom rule (the same among those whose dev few-shot beats "
    "zero-shot, McNemar p < 0.1), fixed on dev; tied languages are judged on their pooled "
    "test items",
    "same mechanism": "per language L: the English EAP-IG circuit (the smallest top-n of "
    "5, 10, 20, 50, 100, 200, 500, 1000 edges reaching faithfulness 0.8 on English dev facts) "
    "on L's test subject pairs, the ratio of sums with a CR2 delta-method interval clustered "
    "by fact, above 0.5; control: the edge Jaccard of the English and L dev circuits, its "
    "rank among size-matched random circuits from the same scored graph; secondary",
    "not testable here": "the measurement could not be made on this model and data (the "
    "reason is given)",
    "error": "the stage that measures the claim failed; the row carries its error",
}


# --------------------------------------------------------------------------------------
# The rules: a row from its tests, the families' adjustments, the verdict
# --------------------------------------------------------------------------------------


def _side_p(t: Test, side: int, direction: int, null: float) -> float | None:
    """The p of ``t`` against its null value ``null`` on the claim's side (``side`` +1, the
    claim's ``direction``) or the other (-1): a one-sided population test's ``p`` or
    ``p_opposite``; a two-sided test's ``p`` only on the side where its estimate lies, and 1
    on the other (a two-sided p is evidence only for the side its estimate is on; 1 there is
    a valid, conservative one-sided p). Counting it on both sides placed a row that cannot be
    decided (an effect far beyond 0 whose rank among its draws cannot reach the level) first
    in its Holm family, and judged the rows after it at smaller multipliers than Holm's
    step-down allows."""
    if t.extra.get("one_sided"):
        return t.p if side > 0 else t.extra.get("p_opposite")
    est = t.estimate.estimate
    if t.p is None or est is None:
        return t.p
    on_claim_side = direction * (est - null) >= 0
    return t.p if on_claim_side == (side > 0) else 1.0


def _tost(claim: Claim, t: Test) -> tuple[float | None, float | None]:
    """The equivalence p (the larger of the two one-sided t tests that the effect lies inside
    threshold +/- margin) and the p that it lies beyond the margin (twice the smaller one-sided
    p of the two edges), from the test's SE and df; without them the test's own p where the
    estimate lies inside (equivalence) or outside (beyond), 1 elsewhere."""
    from scipy import stats as sps

    est, m, c = t.estimate.estimate, claim.margin or 0.0, claim.threshold
    if est is None:
        return None, None
    se, df = t.extra.get("se"), t.extra.get("df")
    inside = abs(est - c) < m
    if se is None or df is None:
        return (t.p, 1.0) if inside else (1.0, t.p)
    if se == 0:
        floor = p_floor(t.n_clusters)
        return (floor, 1.0) if inside else (1.0, floor)
    lo, hi = float(sps.t.sf((est - (c - m)) / se, df)), float(sps.t.sf((c + m - est) / se, df))
    beyond = min(1.0, 2 * min(float(sps.t.sf((est - c - m) / se, df)),
                              float(sps.t.sf((c - m - est) / se, df))))  # fmt: skip
    return max(lo, hi), beyond


def _sesoi_p(claim: Claim, t: Test) -> float | None:
    """The one-sided p of H0 "effect = threshold + direction * sesoi" against an effect on
    the near side of that edge (small when the effect is shown smaller than the smallest
    effect of interest: a precise zero); ``None`` without a sesoi or the test's SE and df."""
    from scipy import stats as sps

    se, df, est = t.extra.get("se"), t.extra.get("df"), t.estimate.estimate
    if claim.sesoi is None or se is None or df is None or est is None:
        return None
    edge = claim.threshold + claim.direction * claim.sesoi
    gap = claim.direction * (edge - est)  # > 0: the estimate lies short of the edge
    if se == 0:
        return p_floor(t.n_clusters) if gap > 0 else 1.0
    return float(sps.t.sf(gap / se, df))


def _rule_p(claim: Claim, effect: Test, vs_control: Test | None) -> tuple[float | None, float | None, str]:  # fmt: skip
    """The row's p on the claim's side, its p on the other side (for a claim with a sesoi,
    the smaller of the opposite side's and the precise-zero p), and how (:data:`RULES`)."""
    if claim.kind == "null":
        p, against = _tost(claim, effect)
        return p, against, f"equivalence at {claim.threshold:g} +/- {claim.margin:g}"
    d, c = claim.direction, claim.null_value
    pe, ae = _side_p(effect, 1, d, c), _side_p(effect, -1, d, c)
    if pe is None:
        return None, None, "no p-value"
    ps = _sesoi_p(claim, effect)
    if ps is not None:
        ae = min(ae if ae is not None else 1.0, ps)
    if vs_control is None:
        return pe, ae, f"effect vs {claim.threshold:g}"
    pv, av = _side_p(vs_control, 1, d, 0.0), _side_p(vs_control, -1, d, 0.0)
    if pv is None or av is None:
        return None, None, "no p-value for the effect vs its control"
    how = "rank among the draws" if vs_control.extra.get("decides") == "rank" else "control"
    return max(pe, pv), min(ae or 1.0, av), f"max(effect, effect vs {how})"


def _beyond(iv: Interval, t: float, d: int) -> bool:
    return iv.above(t) if d > 0 else iv.below(t)


def _short(iv: Interval, t: float, d: int) -> bool:
    return iv.below(t) if d > 0 else iv.above(t)


def _mde_at(t: Test, level: float) -> float | None:
    """The test's minimum detectable effect (80% power) at two-sided level ``level``, from
    its 0.05 one by the ratio of the quantile sums (t on the test's df where it has one)."""
    from scipy import stats as sps

    if t.mde is None:
        return None
    base = 1 - t.estimate.confidence
    df = t.extra.get("df")
    q = lambda a: float(sps.t.ppf(1 - a / 2, df) if df else sps.norm.ppf(1 - a / 2))  # noqa: E731
    z8 = float(sps.t.ppf(0.8, df) if df else sps.norm.ppf(0.8))
    return t.mde * (q(level) + z8) / (q(base) + z8)


def _precise_zero(claim: Claim, effect: Test, iv: Interval, k: float) -> str | None:
    """Why the row is a precise zero (its adjusted-level interval ``iv`` short of threshold +
    sesoi, the adjusted precise-zero p below 0.05), or ``None``."""
    ps = _sesoi_p(claim, effect)
    if claim.sesoi is None or ps is None or ps * k >= ALPHA:
        return None
    d = claim.direction
    edge = claim.threshold + d * claim.sesoi
    if not _short(iv, edge, d):
        return None
    return (f"a precise zero: the {100 * iv.confidence:.3g}% interval lies "
            f"{'below' if d > 0 else 'above'} {edge:g}, the smallest effect of interest "
            f"(adjusted p = {p_text(min(1.0, ps * k))})")  # fmt: skip


def _equivalence(claim: Claim, iv: Interval, iv_o: Interval, padj: float | None,
                 aadj: float | None, mdt: str) -> tuple[str, str]:  # fmt: skip
    """The verdict of a null claim (:data:`RULES` "null claims"): ``iv`` and ``padj`` at the
    claim side's level, ``iv_o`` and ``aadj`` at the other side's."""
    t, m = claim.threshold, claim.margin or 0.0
    pct, pct_o = f"{100 * iv.confidence:.3g}%", f"{100 * iv_o.confidence:.3g}%"
    ptxt = "no p" if padj is None else f"adjusted p = {p_text(padj)}"
    if iv.defined and iv.lo > t - m and iv.hi < t + m and padj is not None and padj < ALPHA:  # type: ignore[operator]
        return HOLDS, f"the {pct} interval lies inside {t:g} +/- {m:g} ({ptxt})"
    if (iv_o.above(t + m) or iv_o.below(t - m)) and aadj is not None and aadj < ALPHA:
        return NOT_HOLDS, (f"the {pct_o} interval lies beyond the margin {t:g} +/- {m:g} "
                           f"(adjusted p = {p_text(aadj)}): there is an effect")  # fmt: skip
    return INCONCLUSIVE, (f"the {pct} interval neither lies inside nor wholly beyond "
                          f"{t:g} +/- {m:g} ({ptxt}){mdt}")  # fmt: skip


def verdict(
    claim: Claim,
    effect: Test | None,
    vs_control: Test | None = None,
    multiplier: float = 1.0,
    *,
    against_multiplier: float | None = None,
    untestable: str | None = None,
    floor: str | None = None,
    missing_control: str | None = None,
) -> tuple[str, str]:
    """The verdict of ``claim`` and its reason by the frozen :data:`RULES`: ``holds`` at the
    claim side's adjusted level ``ALPHA / multiplier`` (its p scaled by ``multiplier``, its
    intervals at confidence ``1 - ALPHA / multiplier``), ``does not hold`` at the other
    side's, ``ALPHA / against_multiplier`` (``multiplier`` where not given; 1 for a row
    alone). :func:`finalize` gives each side its own family multiplier."""
    if floor:
        return FLOOR, floor
    if untestable:
        return NOT_TESTABLE, untestable
    if effect is None or not effect.estimate.defined:
        if effect is not None and effect.extra.get("undefined"):
            return INCONCLUSIVE, str(effect.extra["undefined"])
        n = 0 if effect is None else effect.estimate.n
        return NOT_TESTABLE, f"no interval: {n} items, fewer than two independent units"
    k = max(1.0, float(multiplier))
    ko = k if against_multiplier is None else max(1.0, float(against_multiplier))
    level, level_o = 1 - ALPHA / k, 1 - ALPHA / ko
    iv, iv_o, d, t = (
        effect.at_level(level),
        effect.at_level(level_o),
        claim.direction,
        claim.threshold,
    )
    vs = None if vs_control is None else vs_control.at_level(level)
    vs_o = None if vs_control is None else vs_control.at_level(level_o)
    pct, pct_o = f"{100 * level:.3g}%", f"{100 * level_o:.3g}%"
    p, against, _ = _rule_p(claim, effect, vs_control)
    padj = None if p is None else min(1.0, p * k)
    aadj = None if against is None else min(1.0, against * ko)
    ptxt = "no p" if padj is None else f"adjusted p = {p_text(padj)}"
    md = _mde_at(effect, ALPHA / k)
    mdt = "" if md is None else f"; minimum detectable effect {md:.3f} at the adjusted level"
    if claim.kind == "null":
        return _equivalence(claim, iv, iv_o, padj, aadj, mdt)
    side, other = ("above", "below") if d > 0 else ("below", "above")
    e_against = _side_p(effect, -1, d, claim.null_value)
    if _short(iv_o, t, d) and e_against is not None and min(1.0, e_against * ko) < ALPHA:
        return NOT_HOLDS, (f"the {pct_o} interval lies {other} {t:g} (adjusted p = "
                           f"{p_text(min(1.0, e_against * ko))})")  # fmt: skip
    v_against = None if vs_control is None else _side_p(vs_control, -1, d, 0.0)
    rank = vs_control is not None and vs_control.extra.get("decides") == "rank"
    if v_against is not None and v_against * ko < ALPHA and (rank or (vs_o is not None and _short(vs_o, 0.0, d))):  # fmt: skip
        how = (f"its rank among {vs_control.extra.get('draws')} random draws"  # type: ignore[union-attr]
               if rank else f"{pct_o} effect - control interval")  # fmt: skip
        return NOT_HOLDS, (f"the effect lies {other} its control ({how}, adjusted p = "
                           f"{p_text(min(1.0, v_against * ko))})")  # fmt: skip
    beyond = _beyond(iv, t, d)
    zero = None if beyond or _beyond(iv_o, t, d) else _precise_zero(claim, effect, iv_o, ko)
    if zero:
        return NOT_HOLDS, zero
    ctl_ok = vs is None or rank or _beyond(vs, 0.0, d)
    if beyond and ctl_ok and padj is not None and padj < ALPHA:
        if missing_control:
            return INCONCLUSIVE, f"the control is missing: {missing_control} ({ptxt})"
        tail = "" if vs is None else " and beyond its control"
        return HOLDS, f"the {pct} interval lies {side} {t:g}{tail} ({ptxt})"
    why = []
    if not beyond:
        why.append(f"the {pct} interval straddles {t:g}")
    if not ctl_ok:
        why.append(f"the {pct} effect - control interval straddles 0")
    if padj is None or padj >= ALPHA:
        why.append(ptxt if padj is None else f"{ptxt} >= {ALPHA:g}")
    if (
        vs_control is not None
        and vs_control.extra.get("one_sided")
        and vs_control.extra.get("p_floor", 0) * k >= ALPHA
    ):  # the permutation p cannot reach the adjusted level with this many draws
        need = draws_needed(k, ALPHA)  # the fewest m with k / (m + 1) < ALPHA
        adj = "" if k == 1 else f" ({min(1.0, vs_control.extra['p_floor'] * k):.3g} adjusted)"
        why.append(f"undecidable at this budget: needs {need} draws ({vs_control.extra['draws']} "
                   f"control draw(s): the permutation p is at least "
                   f"{vs_control.extra['p_floor']:.3g}{adj})")  # fmt: skip
    return INCONCLUSIVE, "; ".join(why) + mdt


def _as_test(x: Test | Interval | None) -> Test | None:
    """A bare :class:`Interval` (no p) as a :class:`Test`; a :class:`Test` as it is."""
    if x is None or isinstance(x, Test):
        return x
    return Test(x, None, None, x.n, "interval only (no test)")


def _text(t: Test | None) -> str:
    if t is None:
        return ""
    s = t.estimate.format(3)
    return s if t.p is None else f"{s}, p = {p_text(t.p)}"


def make_row(
    claim: Claim,
    effect: Test | Interval | None,
    control: Test | Interval | None = None,
    *,
    vs_control: Test | None = None,
    untestable: str | None = None,
    floor: str | None = None,
    missing_control: str | None = None,
    details: str = "",
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A card row: the claim, the paper's number, mechlingo's tests and a provisional verdict.

    Args:
        claim: the claim (its rule's parameters and family).
        effect: the effect's :class:`Test`, whose ``p`` tests H0 "effect == ``claim.null_value``".
        control: the control's own test (shown; not judged).
        vs_control: effect minus control (judged: the effect must lie beyond its control), a
            paired test or a :func:`~mechlingo.card.population.population_test`.
        untestable: why the measurement cannot be made (then ``not testable here``).
        floor: why the outcome sits at its floor (then ``not testable here (floor)``).
        missing_control: the control the claim needs and the data lacks (then never ``holds``).
        extra: more fields of the row (``lang``, ``reading``, ``variant`` ...).

    The row's ``family`` is the claim's (:func:`~mechlingo.card.claims.row_family`); the
    verdict here is the row alone at level 0.05; :func:`finalize` judges it in its family.
    """
    eff, ctl = _as_test(effect), _as_test(control)
    p, against, how = (None, None, "") if eff is None or untestable or floor else _rule_p(
        claim, eff, vs_control)  # fmt: skip
    v, reason = verdict(claim, eff, vs_control, untestable=untestable, floor=floor,
                        missing_control=missing_control)  # fmt: skip
    ex = dict(extra or {})
    return {
        "id": claim.id, "paper": claim.paper, "claim": claim.text,
        "paper_number": claim.paper_number, "measure": claim.measure,
        "rule": {"kind": claim.kind, "direction": claim.direction, "threshold": claim.threshold,
                 "margin": claim.margin, "sesoi": claim.sesoi, "untestable": untestable,
                 "floor": floor, "missing_control": missing_control},
        "family": row_family(claim, ex.get("variant")),
        "post_hoc": claim.post_hoc if row_family(claim, ex.get("variant")) == "primary" else None,
        "value": None if eff is None else eff.to_json(), "value_text": _text(eff) or "n/a",
        "control": None if ctl is None else ctl.to_json(), "control_text": _text(ctl),
        "vs_control": None if vs_control is None else vs_control.to_json(),
        "vs_control_text": _text(vs_control),
        "p": p, "p_against": against, "p_rule": how, "p_adjusted": None, "adjustment": None,
        "mde": None if eff is None else eff.mde,
        "verdict": v, "reason": reason, "details": details, "figure": claim.figure,
        "stage": claim.stage, "error": None, **ex,
    }  # fmt: skip


def _claim_of(row: Mapping[str, Any]) -> Claim:
    r = row["rule"]
    return Claim(row["id"], row["paper"], row["claim"], row["paper_number"], row["measure"],
                 row["stage"], row["figure"], kind=r["kind"], direction=r["direction"],
                 threshold=r["threshold"], margin=r["margin"], sesoi=r.get("sesoi"))  # fmt: skip


def _side_ps(row: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """The row's p on each side of its family: the claim side's (it decides ``holds``) and
    the other side's (it decides ``does not hold``; 1 where the row has none); ``None`` for
    both where the row has no p (an error, untestable or floor row)."""
    if row.get("verdict") == ERROR or row.get("p") is None:
        return None, None
    a = row.get("p_against")
    return float(row["p"]), 1.0 if a is None else float(a)


def finalize(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The card's rows, each adjusted in its family (Holm inside each paper's primary family,
    Benjamini-Hochberg over each paper's secondary rows), once per side (the claim side's
    p-values decide ``holds``, the other side's ``does not hold``), and judged at its
    adjusted levels: ``p`` raw, ``p_adjusted``, ``p_against_adjusted``, ``adjustment`` (the
    procedure, the family's size, each side's multiplier and level). Error, untestable and
    floor rows keep theirs. Call it once, on all the rows of a card."""
    out = [dict(r) for r in rows]
    fams: dict[tuple[str, str], list[int]] = {}
    for i, r in enumerate(out):
        fams.setdefault((r.get("paper", ""), r.get("family", "secondary")), []).append(i)
    for (paper, fam), idx in fams.items():
        method = "holm" if fam == "primary" else "bh"
        twin = {i: i for i in idx} if fam == "primary" else _twins(out, idx)
        sides = {i: _side_ps(out[i]) if twin[i] == i else (None, None) for i in idx}
        claim = dict(zip(idx, adjust([sides[i][0] for i in idx], method), strict=True))
        other = dict(zip(idx, adjust([sides[i][1] for i in idx], method), strict=True))
        size = sum(sides[i][0] is not None for i in idx)
        for i in idx:
            same = "" if twin[i] == i else (f"; the same test as the row "
                                            f"{_key(out[twin[i]])}: counted once")  # fmt: skip
            _judge(out[i], claim[twin[i]], other[twin[i]],
                   f"{'Holm' if fam == 'primary' else 'Benjamini-Hochberg'} over the {size} "
                   f"{fam} rows of {paper}, once per side" + ("" if fam == "primary" else
                   " (exploratory)") + same)  # fmt: skip
    return out


def _twins(rows: Sequence[Mapping[str, Any]], idx: Sequence[int]) -> dict[int, int]:
    """``{row: the first row of the family with the same reading}``: rows whose effect,
    control, effect - control and rule are identical (one measurement read twice, e.g. the
    literal and headroom rules on the same languages) count once inside their family."""
    first: dict[str, int] = {}
    out = {}
    for i in idx:
        r = rows[i]
        if _side_ps(r)[0] is None:
            out[i] = i
            continue
        key = json.dumps([r.get("value"), r.get("control"), r.get("vs_control"), r.get("rule")],
                         sort_keys=True, default=str)  # fmt: skip
        out[i] = first.setdefault(key, i)
    return out


def _judge(r: dict[str, Any], claim: tuple[float | None, float],
           other: tuple[float | None, float], how: str) -> None:  # fmt: skip
    """Row ``r`` in its family: each side's ``(adjusted p, multiplier)``, the verdict at
    each side's level; the adjusted interval (``value_adjusted``) at the level of the side
    that decided (:func:`_deciding_p`: for an inconclusive row, the side on which its
    estimate lies), the MDE at the claim side's level (as the verdict's reason gives it)."""
    (pa, k), (pa_o, ko) = claim, other
    k, ko = max(1.0, k), max(1.0, ko)
    r["p_adjusted"] = None if r.get("p") is None else min(1.0, r["p"] * k)
    r["p_against_adjusted"] = None if r.get("p_against") is None else min(1.0, r["p_against"] * ko)
    level = 1 - ALPHA / k
    r["adjustment"] = {"method": how, "multiplier": k, "level": level, "p_decision": pa,
                       "multiplier_against": ko, "level_against": 1 - ALPHA / ko,
                       "p_against_decision": pa_o}  # fmt: skip
    if r.get("verdict") == ERROR or "rule" not in r:
        return
    head = f"({r['variant']}) " if r.get("variant") else ""
    eff = None if r.get("value") is None else Test.from_json(r["value"])
    vs = None if r.get("vs_control") is None else Test.from_json(r["vs_control"])
    rule = r["rule"]
    r["verdict"], r["reason"] = verdict(_claim_of(r), eff, vs, k, against_multiplier=ko,
                                        untestable=rule.get("untestable"),
                                        floor=rule.get("floor"),
                                        missing_control=rule.get("missing_control"))  # fmt: skip
    r["p_deciding"], r["p_deciding_adjusted"], claim_side = _deciding_p(r)
    r["adjustment"]["deciding_side"] = "claim" if claim_side else "other"
    if eff is not None:  # the interval at the level of the side that decided; the MDE of
        shown = k if claim_side else ko  # the claimed effect at the claim side's, as the reason
        r["value_adjusted"] = eff.at_level(1 - ALPHA / shown).to_json()
        r["mde"] = _mde_at(eff, ALPHA / k)
    pd = r["p_deciding_adjusted"]
    r["value_text"] = head + (_text(eff) or "n/a") + (
        "" if pd is None else f", adjusted p = {p_text(pd)}")  # fmt: skip


def _deciding_p(row: Mapping[str, Any]) -> tuple[float | None, float | None, bool]:
    """The p that decided the row's verdict, raw and adjusted, and whether it is the claim
    side's: the claim side's for ``holds``, the other side's for ``does not hold``; for an
    inconclusive row the side on which the effect's estimate lies (beyond the threshold in
    the claim's direction, or inside a null claim's margin: the claim side). The smaller
    adjusted p of the two could be a precise-zero p that cannot decide the row."""
    if row.get("p") is None:
        return None, None, True
    claim = float(row["p"]), row.get("p_adjusted"), True
    if row.get("p_against") is None or row.get("verdict") == HOLDS:
        return claim
    other = float(row["p_against"]), row.get("p_against_adjusted"), False
    if row.get("verdict") == NOT_HOLDS:
        return other
    est = ((row.get("value") or {}).get("estimate") or {}).get("estimate")
    if est is None:
        return claim
    c = _claim_of(row)
    if c.kind == "null":
        return claim if abs(est - c.threshold) < (c.margin or 0.0) else other
    return claim if c.direction * (est - c.threshold) >= 0 else other


def error_row(claim: Claim, error: str) -> dict[str, Any]:
    """The row of a claim whose stage failed: it carries the error."""
    row = make_row(claim, None)
    row.update(verdict=ERROR, reason=f"the stage '{claim.stage}' failed", error=error)
    return row


def rules_hash(claims: Sequence[Claim] = ()) -> str:
    """sha256 (16 hex digits) of :data:`RULES` and of the whole claims table (every field of
    every claim: its texts, rule parameters, family, sesoi and post-hoc note; not the
    planner's facts, ``plan``, which change no verdict)."""
    table = [{k: v for k, v in dataclasses.asdict(c).items() if k != "plan"} for c in claims]
    text = json.dumps({"rules": RULES, "alpha": ALPHA, "retained_share": RETAINED_SHARE,
                       "claims": table}, sort_keys=True)  # fmt: skip
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def preregistration_hash(rules: str, budgets: str) -> str:
    """sha256 (16 hex digits) of the rules hash and the budgets hash together: the one number
    a reader compares with the one published before a card was run."""
    return hashlib.sha256(f"rules {rules}; budgets {budgets}".encode()).hexdigest()[:16]


#: The hash of the frozen rules and claims, written into ``claims.json``.
RULES_HASH = rules_hash(CLAIMS)


# --------------------------------------------------------------------------------------
# The card
# --------------------------------------------------------------------------------------

_VERDICT_COLOUR = {HOLDS: "#2a7", NOT_HOLDS: "#c33", INCONCLUSIVE: "#a70", NOT_TESTABLE: "#888",
                   FLOOR: "#888", ERROR: "#d80"}  # fmt: skip


@dataclass
class ClaimsCard:
    """The verdict of every claim on one model and data.

    ``rows``: one dict per claim (``id``, ``paper``, ``claim``, ``paper_number``, ``value``
    with ``estimate``/``lo``/``hi``/``n``, ``control``, ``verdict``, ``reason``, ``figure``,
    ``error``...). ``stages``: each stage's stored result (the numbers behind the rows and the
    figures) or ``{"error": ...}``. ``meta``: model, budget, settings, timings.
    """

    rows: list[dict[str, Any]]
    stages: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def verdicts(self) -> dict[str, str]:
        """``{row key: verdict}``; the key is the claim id, ``id/variant`` for a claim judged
        in several readings (the lowest language: literal and headroom, relative and points)."""
        return {_key(r): r["verdict"] for r in self.rows}

    def to_json(self) -> dict[str, Any]:
        """``claims.json``: the rules, their hash and the budgets' (``preregistration``:
        the rules and budgets hashed together), the rows and the run's metadata."""
        return {"meta": self.meta, "rules": RULES, "rules_hash": self.rules_hash,
                "preregistration": self.preregistration(), "claims": self.rows}  # fmt: skip

    @property
    def rules_hash(self) -> str:
        """The hash of the rules and claims the card was judged by: ``meta["rules_hash"]``
        (:data:`RULES_HASH`, or with a registered stage's claims the hash over them too),
        :data:`RULES_HASH` when the meta has none."""
        return str(self.meta.get("rules_hash", RULES_HASH))

    def preregistration(self) -> dict[str, str]:
        """The frozen rules' and budgets' hashes and :func:`preregistration_hash` of both."""
        b = str(self.meta.get("budgets_hash", "?"))
        return {"rules_hash": self.rules_hash, "budgets_hash": b,
                "hash": preregistration_hash(self.rules_hash, b)}  # fmt: skip

    def to_dataframe(self) -> pd.DataFrame:
        """One row per claim: paper, claim, paper's number, mechlingo's estimate, lo, hi, n,
        control, verdict, reason."""
        import pandas as pd

        recs = []
        for r in self.rows:
            v = (r.get("value") or {}).get("estimate") or {}
            recs.append(
                {
                    "id": r["id"],
                    "variant": r.get("variant", ""),
                    "paper": r["paper"],
                    "family": r.get("family", "secondary"),
                    "claim": r["claim"],
                    "paper_number": r["paper_number"],
                    "estimate": v.get("estimate"),
                    "lo": v.get("lo"),
                    "hi": v.get("hi"),
                    "n": v.get("n"),
                    "p": r.get("p"),
                    "p_adjusted": r.get("p_adjusted"),
                    "mde": r.get("mde"),
                    "control": r.get("control_text", ""),
                    "vs_control": r.get("vs_control_text", ""),
                    "verdict": r["verdict"],
                    "reason": r["error"] or r["reason"],
                }
            )
        return pd.DataFrame(recs)

    def to_markdown(self) -> str:
        """``claims.md``: the verdict table (every p beside its Holm-adjusted value)."""
        head = ("| paper | claim | paper's number | mechlingo (95% CI, n) | control "
                "| effect - control | p (adjusted) | verdict |\n|---|---|---|---|---|---|---|---|\n")  # fmt: skip
        lines = []
        for r in self.rows:
            why = r["error"] or r["reason"]
            cells = [r["paper"], _label(r), r["paper_number"], _est(r),
                     r.get("control_text") or "", r.get("vs_control_text") or "", _ptext(r),
                     f"**{r['verdict']}** ({why})"]  # fmt: skip
            lines.append("| " + " | ".join(_md(c) for c in cells) + " |")
        meta = ", ".join(f"{k}: {self.meta[k]}" for k in ("model", "budget") if k in self.meta)
        pre = self.preregistration()
        return (f"# Claims card\n\n{meta}; rules {pre['rules_hash']}, budgets "
                f"{pre['budgets_hash']} (pre-registration {pre['hash']})\n\n" + head
                + "\n".join(lines) + "\n")  # fmt: skip

    def table_html(self, link: bool = True) -> str:
        """The verdict table as HTML (links to the report's figures with ``link``)."""
        th = "".join(f"<th>{h}</th>" for h in ("paper", "claim", "paper's number",
                     "mechlingo (95% CI, n)", "control", "effect - control", "p (adjusted)",
                     "verdict", "why", "figure"))  # fmt: skip
        body = []
        for r in self.rows:
            col = _VERDICT_COLOUR.get(r["verdict"], "#222")
            fig = f"<a href='#{r['figure']}'>figure</a>" if link else html.escape(r["figure"])
            why = html.escape(r["error"] or r["reason"])
            body.append(
                "<tr>" + "".join(f"<td>{html.escape(str(x))}</td>" for x in (
                    r["paper"], _label(r), r["paper_number"], _est(r),
                    r.get("control_text") or "", r.get("vs_control_text") or "", _ptext(r)))
                + f"<td style='color:{col};font-weight:bold'>{html.escape(r['verdict'])}</td>"
                f"<td>{why}</td><td>{fig}</td></tr>"
            )  # fmt: skip
        return f"<table class='claims'><tr>{th}</tr>{''.join(body)}</table>"

    def _repr_html_(self) -> str:
        n = len(self.rows)
        counts = {v: sum(r["verdict"] == v for r in self.rows) for v in _VERDICT_COLOUR}
        summary = ", ".join(f"{k}: {v}" for k, v in counts.items() if v)
        return (
            f"<b>ClaimsCard</b> ({html.escape(str(self.meta.get('model', '?')))}, budget "
            f"{html.escape(str(self.meta.get('budget', '?')))}): {n} claims; {summary}"
            + self.table_html(link=False)
        )


def _est(row: Mapping[str, Any]) -> str:
    """The row's estimate with its 95% interval and n (no p: the p column has it)."""
    v = row.get("value")
    return "n/a" if not v else Interval.from_json(v["estimate"]).format(3)


def _key(row: Mapping[str, Any]) -> str:
    """A row's key: the claim id, with ``/variant`` for a claim judged in several readings."""
    return row["id"] + (f"/{row['variant']}" if row.get("variant") else "")


def _ptext(row: Mapping[str, Any]) -> str:
    """``"0.004 (0.031)"``: the p that decided the row's verdict and its adjusted value
    (never shown as 0: ``"< 1e-k"``)."""
    p, pa = row.get("p_deciding"), row.get("p_deciding_adjusted")
    if p is None:
        p, pa = row.get("p"), row.get("p_adjusted")
    if p is None:
        return ""
    return p_text(p) + ("" if pa is None else f" ({p_text(pa)})")


def _label(row: Mapping[str, Any]) -> str:
    v = row.get("variant")
    tag = " (exploratory)" if row.get("family") == "secondary" else ""
    post = (f" [reading chosen after the data was seen: {row['post_hoc']}]"
            if row.get("post_hoc") else "")  # fmt: skip
    weak = f" [underpowered: {row['underpowered']}]" if row.get("underpowered") else ""
    return row["claim"] + (f" [{v}]" if v else "") + tag + post + weak


def _md(x: Any) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")
