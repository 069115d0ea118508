"""The repair stage's rows judged against their controls: the two vectors and the lowest
language, each against **its own condition's** random population (random task, random diff,
random both: norm-matched to the vector it controls, at that condition's layer and scale;
:func:`~mechlingo.analyses.recall.steer_eval.population_names`), by the effect's rank
among the draws (:func:`~mechlingo.card.population.rank_population_test`), and the
random-vector null; the outcome they judge (the gold share, or 0/1 correctness without
candidate scores) and the floor of a 0/1 outcome."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from mechlingo.card import claims as C
from mechlingo.card.claims import Claim
from mechlingo.card.clustered_tests import Test, paired_test, relative_test
from mechlingo.card.population import (
    no_change_relative,
    pool_controls,
    population_gain_test,
    rank_population_test,
)
from mechlingo.card.repair_items import cluster_note, item_clusters
from mechlingo.card.rules import make_row

__all__ = ["NO_BASELINE", "OUTCOME_NAMES", "draws", "outcome_key", "population_conditions",
           "relative_tests", "repair_floor", "rows_lowest", "rows_repair"]  # fmt: skip


#: The judged outcome of the repair rows, by the stored key it is read from.
OUTCOME_NAMES = {"share": "gold share", "outcomes": "accuracy"}


def outcome_key(data: Mapping[str, Any]) -> str:
    """The repair rows' judged outcome (:data:`RULES` "outcome"): ``"share"``, the gold
    answer's probability share among the candidates, where every item of every condition
    has one (candidate scores: ``rank``); else ``"outcomes"``, 0/1 correctness (``generate``
    and ``klar`` give no candidate scores)."""
    share = data.get("share") or {}
    conds = list(data["outcomes"])
    ok = bool(share) and all(
        c in share and all(x is not None for v in share[c].values() for x in v) for c in conds
    )
    return "share" if ok else "outcomes"


def pooled(data: Mapping[str, Any], langs: Sequence[str], cond: str, key: str = "outcomes"
            ) -> list[float]:  # fmt: skip
    out = data[key][cond]
    return [float(x) for lg in langs for x in out.get(lg, [])]


def item_ids(data: Mapping[str, Any], langs: Sequence[str]) -> list[str]:
    return [i for lg in langs for i in data["ids"].get(lg, [])]


def subject_clusters(data: Mapping[str, Any], ids: Sequence[str]) -> list[str]:
    """The clusters of the items ``ids``: their facts' subjects by the stage's stored
    ``subjects`` map (derived from the ids in a result stored without one):
    :func:`~mechlingo.card.repair_items.item_clusters`."""
    return item_clusters(ids, data.get("subjects"))


def population_conditions(data: Mapping[str, Any], cond: str | None = None) -> list[str]:
    """The conditions of ``cond``'s random population (``"task"``, ``"diff"``, ``"both"``; the
    stored ``populations`` give each one's prefix), in seed order: ``random_<cond>_s<seed>``,
    or ``random_s<seed>`` (the population matched to the condition dev selected; also every
    condition's in a result stored before populations were drawn per condition, and
    ``cond=None``: the random-vector null's)."""
    prefix = (data.get("populations") or {}).get(cond, "random_s") if cond else "random_s"
    pat = re.compile(re.escape(prefix) + r"(\d+)$")
    found = [(int(m.group(1)), c) for c in data["outcomes"] if (m := pat.match(c))]
    return [c for _, c in sorted(found)]


def draws(data: Mapping[str, Any], langs: Sequence[str], key: str = "outcomes",
          cond: str | None = None) -> list[list[float]]:  # fmt: skip
    """``cond``'s random population: one outcome list per draw
    (:func:`population_conditions`)."""
    return [pooled(data, langs, c, key) for c in population_conditions(data, cond)]


def _population_text(data: Mapping[str, Any], cond: str) -> str:
    conds = population_conditions(data, cond)
    return (f"control: {len(conds)} norm-matched random vectors ({conds[0] if conds else 'none'}"
            f"...) at the layer and scale of '{cond}' (rank p floor 1/{len(conds) + 1})")  # fmt: skip


def repair_floor(data: Mapping[str, Any], langs: Sequence[str], key: str = "outcomes"
                 ) -> str | None:  # fmt: skip
    """Why the 0/1 repair outcome of ``langs`` sits at its floor, or ``None``: every
    condition (orig, the vectors, every random draw) at 0 successes on these items, where no
    vector can show anything. A gold share is never at a floor (``None``)."""
    if key != "outcomes":
        return None
    conds = list(data["outcomes"])
    if all(not any(pooled(data, langs, c)) for c in conds):
        n = len(pooled(data, langs, "orig"))
        return (f"orig and every condition ({', '.join(sorted(conds))}) score 0 of {n} on "
                f"{'+'.join(langs)}: the outcome sits at its floor")  # fmt: skip
    return None


def rows_repair(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The two vectors (effect; the random population's gain; effect against the population:
    its rank, exact permutation p), the lowest language in four readings and the
    random-vector null (the population's gain, equivalence), clustered by subject (the
    fact id where no subject is shared across relations: :func:`subject_clusters`)."""
    s = data["summary"]
    key = outcome_key(data)
    langs = sorted(lg for lg in data["outcomes"]["orig"] if lg != "en")
    fact_ids = item_ids(data, langs)
    ids = subject_clusters(data, fact_ids)
    base = pooled(data, langs, "orig", key)
    floor = repair_floor(data, langs, key)
    sel = s.get("selected")
    note = (f"outcome: {OUTCOME_NAMES[key]}; selected on dev: {sel} ({s['dev_effect']}); "
            f"config {s['config']}; ids build/dev/test {data['n_ids']}; {len(ids)} items, "
            f"{len(set(fact_ids))} facts{cluster_note(fact_ids, ids)}")  # fmt: skip
    rows = []
    extra = {"outcome": OUTCOME_NAMES[key]}
    for claim, cond in ((C.TASK_VECTOR, "task"), (C.DIFF_VECTOR, "diff")):
        pop = draws(data, langs, key, cond)
        new = pooled(data, langs, cond, key)
        vs = rank_population_test(new, pop, ids, base=base, direction=claim.direction)
        rows.append(make_row(claim, paired_test(base, new, ids), population_gain_test(base, pop, ids),
                             vs_control=vs, floor=floor, extra=extra,
                             details=f"{note}; {_population_text(data, cond)}"
                             + format_control(data, langs, cond)))  # fmt: skip
    rows += rows_lowest(data)
    c, pop = C.RANDOM_VECTOR, draws(data, langs, key)
    rows.append(make_row(c, population_gain_test(base, pop, ids, null=c.null_value),
                         floor=floor, details=f"outcome: {OUTCOME_NAMES[key]}; {len(pop)} "
                         f"random vectors matched to '{sel}': their mean gain, with the "
                         "between-draw variance (n = items)" + cluster_note(fact_ids, ids),
                         extra=extra))  # fmt: skip
    return rows


def format_control(data: Mapping[str, Any], langs: Sequence[str], cond: str) -> str:
    """The format control in words: the gain of ``cond`` in lenient accuracy (the answer
    anywhere in the generation's first line), beside the judged outcome; empty when the
    stage stored no lenient outcomes."""
    if not data.get("lenient") or cond not in data["lenient"]:
        return ""
    a, b = pooled(data, langs, "orig", "lenient"), pooled(data, langs, cond, "lenient")
    return f"; format control (lenient accuracy) {np.mean(a):.3f} -> {np.mean(b):.3f}"


def both_condition(data: Mapping[str, Any]) -> str:
    return "both_pair" if "both_pair" in data["outcomes"] else "both"


def rows_lowest(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``lowest_language`` judged on the literal and on the headroom rule's languages (a tie:
    their pooled items), each relative (when the baseline is above 0) and in points."""
    low, claim = data["lowest"], C.LOWEST_LANGUAGE
    rows = []
    for rule, key in (("literal rule", "literal_languages"), ("headroom rule", "languages")):
        langs = list(low.get(key) or [])
        for reading in ("relative", "points"):
            extra = {"variant": f"{rule}, {reading}", "langs": langs}
            rows.append(_lowest_row(data, claim, langs, rule, reading, extra))
    return rows


def _lowest_row(data: Mapping[str, Any], claim: Claim, langs: list[str], rule: str,
                reading: str, extra: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    low = data["lowest"]
    tie = "" if len(langs) < 2 else f" (tied on dev: {len(langs)} languages pooled)"
    details = (f"{rule}: {'+'.join(langs) or 'none'}{tie}; "
               f"{low['rule'] if rule.startswith('headroom') else low['literal_rule']}")  # fmt: skip
    if not langs:
        why = ("no headroom: no non-English language's dev few-shot accuracy beats zero-shot "
               f"(McNemar p < {low.get('p_threshold', 0.1):g})")  # fmt: skip
        return make_row(claim, None, untestable=why, details=details, extra=extra)
    fact_ids, key = item_ids(data, langs), outcome_key(data)
    ids = subject_clusters(data, fact_ids)
    base, both, pop = (
        pooled(data, langs, "orig", key),
        pooled(data, langs, both_condition(data), key),
        draws(data, langs, key, "both"),
    )
    extra = {**extra, "outcome": OUTCOME_NAMES[key]}
    details += (f"; outcome {OUTCOME_NAMES[key]}: orig {sum(base):.3g} of {len(base)}, "
                f"{both_condition(data)} {sum(both):.3g}; {_population_text(data, 'both')}"
                + cluster_note(fact_ids, ids))  # fmt: skip
    floor = repair_floor(data, langs, key)
    if floor:
        return make_row(claim, None, floor=floor, details=details, extra=extra)
    if reading == "points":
        vs = rank_population_test(both, pop, ids, base=base, direction=claim.direction)
        eff = paired_test(base, both, ids, null=claim.threshold)
        return make_row(claim, eff, population_gain_test(base, pop, ids), vs_control=vs,
                        details=details + f"; gain in {OUTCOME_NAMES[key]} points", extra=extra)  # fmt: skip
    eff, ctl, vs, why = relative_tests(claim, base, both, pop, ids)
    if why == NO_BASELINE:
        why = (f"the test {OUTCOME_NAMES[key]} of {'+'.join(langs)} without intervention is 0 "
               f"(0 of {len(base)}): a relative gain is undefined; the points reading is judged")  # fmt: skip
    if why:
        return make_row(claim, None, untestable=why, details=details, extra=extra)
    how = "; relative gain: no item changes" if eff.extra.get("no_change") else "; relative gain"  # type: ignore[union-attr]
    return make_row(claim, eff, ctl, vs_control=vs, details=details + how, extra=extra)


#: :func:`relative_tests`' reason when the baseline has no success: the ratio is undefined.
NO_BASELINE = "no baseline"


def relative_tests(claim: Claim, base: Sequence[float], both: Sequence[float],
                   pop: Sequence[Sequence[float]], ids: Sequence[Any] | None
                   ) -> tuple[Test | None, Test | None, Test | None, str | None]:  # fmt: skip
    """The tests of ``lowest_language``'s relative reading, as the card judges it: the
    effect (the relative gain of ``both`` over ``base`` against the claim's threshold; a
    testable zero, :func:`~mechlingo.card.population.no_change_relative`, when no item
    changes), the control (the pooled random draws' relative gain, shown) and the effect
    against the draws by its rank (:func:`~mechlingo.card.population.rank_population_test`),
    with why the row is not testable (``None`` when it is): :data:`NO_BASELINE` when the
    baseline is 0, or the relative test's own reason (e.g. every success in one fact)."""
    ctl = pool_controls(pop)
    vs = rank_population_test(both, pop, ids, base=base, direction=claim.direction)
    if sum(base) == 0:
        return None, None, vs, NO_BASELINE
    if np.array_equal(np.asarray(base), np.asarray(both)):  # nothing changes: a testable zero
        return no_change_relative(base, ids, null=claim.threshold), relative_test(base, ctl, ids), vs, None  # fmt: skip
    eff = relative_test(base, both, ids, null=claim.threshold)
    if eff.p is None and eff.extra.get("undefined"):  # e.g. the successes in one fact
        return None, None, vs, f"the relative gain is undefined here: {eff.extra['undefined']}"
    return eff, relative_test(base, ctl, ids), vs, None
