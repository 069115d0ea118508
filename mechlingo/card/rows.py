"""The rows of the claims card, from the stages' stored results (pure; tested by hand).

Each ``rows_<stage>(data)`` reads only what :mod:`mechlingo.card.replicate` stored for its
stage and returns card rows (:func:`mechlingo.card.rules.make_row`); the card calls
:func:`mechlingo.card.rules.finalize` once on all of them. Every statistic is a
:class:`~mechlingo.kernels.significance.Test`:

* (fact, language) items are clustered by fact id (a fact asked in 11 languages is one
  unit); alignment values are per sentence, clustered by document where the stage gives
  each sentence's document; BOS samples each their own unit;
* a random control is a population of draws (a list; one draw still works, with its
  permutation p floor 1/2 stated): the effect is judged against it by its rank
  (:func:`~mechlingo.card.statistics.population_test`), and the population's own gain
  carries the between-draw variance;
* a row whose outcome sits at its floor (:func:`repair_floor`) is ``not testable here
  (floor)``; latent English without its mismatched-fact control cannot hold.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from scipy import stats as sps

from mechlingo.card.rules import CLAIMS, RETAINED_SHARE, Claim, make_row
from mechlingo.card.statistics import (
    Test,
    mde,
    mean_test,
    p_floor,
    paired_test,
    pool_controls,
    population_gain_test,
    population_test,
    ratio_test,
    relative_test,
)
from mechlingo.kernels.significance import Interval
from mechlingo.scoring.scorers import normalize

__all__ = [
    "RETAINED_SHARE",
    "chance_overlap",
    "rank_test",
    "overlap_test",
    "repair_floor",
    "rows_align",
    "rows_experts",
    "rows_repair",
    "rows_trace",
    "rows_transfer",
]


def _claim(cid: str) -> Claim:
    return next(c for c in CLAIMS if c.id == cid)


# --------------------------------------------------------------------------------------
# Lu et al.: the tracer
# --------------------------------------------------------------------------------------


def rows_trace(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``latent_english`` and ``recall_failures``: 0/1 shares against 1/2, clustered by fact."""
    recs = [r for r in data["records"] if r["lang"] != "en"]
    order, ctl, ids = [], [], []
    has_ctl = bool(recs) and all("first_mismatch_en_layer" in r for r in recs)
    for r in recs:
        if r["answer_en"] and normalize(r["answer_en"]) == normalize(r["answer"]):
            continue  # the English and the L answer are the same word: no order to see
        e, a = r["first_en_layer"], r["first_answer_layer"]
        if (e >= 0 or a >= 0) and e != a:
            order.append(float(e >= 0 and (a < 0 or e < a)))
            ids.append(r["id"])
            if has_ctl:
                m = r["first_mismatch_en_layer"]
                ctl.append(float(m >= 0 and (a < 0 or m < a)))
    c1 = _claim("latent_english")
    t1 = mean_test(order, ids, null=c1.null_value) if order else None
    vs = c = None
    missing = ("the trace records have no first_mismatch_en_layer: the mismatched-fact control "
               "(another fact's English answer under the same decoder) is missing")  # fmt: skip
    if has_ctl and order:
        c, vs, missing = mean_test(ctl, ids, null=c1.null_value), paired_test(ctl, order, ids), ""
    row1 = make_row(
        c1, t1, c, vs_control=vs, missing_control=missing or None,
        untestable=None if order else "no non-English query whose English or L answer "
        "becomes decodable (rank <= max_rank) with distinct words",
        details=f"{int(sum(order))} of {len(order)} queries: English first"
        + (f"; mismatched-fact English first: {int(sum(ctl))}" if vs is not None else "")
        + "; clustered by fact",
    )  # fmt: skip
    fails = [r for r in recs if r["class"] in ("recall_failure", "translation_failure")]
    rf = [float(r["class"] == "recall_failure") for r in fails]
    errors = sum(not r["correct"] for r in recs)
    c2 = _claim("recall_failures")
    t2 = mean_test(rf, [r["id"] for r in fails], null=c2.null_value) if fails else None
    row2 = make_row(
        c2, t2, untestable=None if fails else "no recall or translation failures among the "
        "non-English queries",
        details=f"of {errors} non-English errors: {int(sum(rf))} recall failures, "
        f"{len(rf) - int(sum(rf))} translation failures, {errors - len(rf)} other (wrong "
        "language or L-only); clustered by fact",
    )  # fmt: skip
    return [row1, row2]


# --------------------------------------------------------------------------------------
# Lu et al.: repair vectors and the lowest language
# --------------------------------------------------------------------------------------


def _pooled(data: Mapping[str, Any], langs: Sequence[str], cond: str) -> list[float]:
    out = data["outcomes"][cond]
    return [float(x) for lg in langs for x in out.get(lg, [])]


def _ids(data: Mapping[str, Any], langs: Sequence[str]) -> list[str]:
    return [i for lg in langs for i in data["ids"].get(lg, [])]


def _draws(data: Mapping[str, Any], langs: Sequence[str]) -> list[list[float]]:
    """The random population: one outcome list per draw (``outcomes["random_s<i>"]``)."""
    seeds = sorted(c for c in data["outcomes"] if c.startswith("random_s"))
    return [_pooled(data, langs, c) for c in seeds]


def repair_floor(data: Mapping[str, Any], langs: Sequence[str]) -> str | None:
    """Why the repair outcome of ``langs`` sits at its floor, or ``None``: the stage's own
    ``floor`` reason (the card's metric rule) or every condition (orig, the vectors, every
    random draw) at 0 successes on these items, where no vector can show anything."""
    if data.get("floor"):
        return str(data["floor"])
    conds = list(data["outcomes"])
    if all(not any(_pooled(data, langs, c)) for c in conds):
        n = len(_pooled(data, langs, "orig"))
        return (f"orig and every condition ({', '.join(sorted(conds))}) score 0 of {n} on "
                f"{'+'.join(langs)}: the outcome sits at its floor")  # fmt: skip
    return None


def rows_repair(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The two vectors (effect; the random population's gain; effect against the population:
    its rank, exact permutation p), the lowest language in four readings and the
    random-vector null (the population's gain, equivalence), clustered by fact id."""
    s = data["summary"]
    langs = sorted(lg for lg in data["outcomes"]["orig"] if lg != "en")
    ids = _ids(data, langs)
    base, draws = _pooled(data, langs, "orig"), _draws(data, langs)
    floor = repair_floor(data, langs)
    note = (f"selected on dev: {s['selected']} ({s['dev_effect']}); config {s['config']}; "
            f"ids build/dev/test {data['n_ids']}; {len(ids)} items, {len(set(ids))} facts; "
            f"control: a population of {len(draws)} random vectors (permutation p floor "
            f"1/{len(draws) + 1})")  # fmt: skip
    rows = []
    control = population_gain_test(base, draws, ids)
    for cid, cond in (("task_vector", "task"), ("diff_vector", "diff")):
        new = _pooled(data, langs, cond)
        vs = population_test(new, draws, ids, base=base, direction=_claim(cid).direction)
        rows.append(make_row(_claim(cid), paired_test(base, new, ids), control, vs_control=vs,
                             floor=floor, details=note))  # fmt: skip
    rows += rows_lowest(data)
    c = _claim("random_vector")
    rows.append(make_row(c, population_gain_test(base, draws, ids, null=c.null_value),
                         floor=floor, details=f"{len(draws)} random vectors: their mean gain, "
                         "with the between-draw variance (n = items)"))  # fmt: skip
    return rows


def _both(data: Mapping[str, Any]) -> str:
    return "both_pair" if "both_pair" in data["outcomes"] else "both"


def rows_lowest(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``lowest_language`` judged on the literal and on the headroom rule's languages (a tie:
    their pooled items), each relative (when the baseline is above 0) and in points."""
    low, claim = data["lowest"], _claim("lowest_language")
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
    ids = _ids(data, langs)
    base, both, draws = (
        _pooled(data, langs, "orig"),
        _pooled(data, langs, _both(data)),
        _draws(data, langs),
    )
    ctl = pool_controls(draws)
    vs = population_test(both, draws, ids, base=base, direction=claim.direction)
    details += f"; orig {sum(base):g} of {len(base)} correct, {_both(data)} {sum(both):g}"
    floor = repair_floor(data, langs)
    if floor:
        return make_row(claim, None, floor=floor, details=details, extra=extra)
    if reading == "points":
        eff = paired_test(base, both, ids, null=claim.threshold)
        return make_row(claim, eff, population_gain_test(base, draws, ids), vs_control=vs,
                        details=details + "; gain in accuracy points", extra=extra)  # fmt: skip
    if sum(base) == 0:
        why = (f"the test accuracy of {'+'.join(langs)} without intervention is 0 (0 of "
               f"{len(base)}): a relative gain is undefined; the points reading is judged")  # fmt: skip
        return make_row(claim, None, untestable=why, details=details, extra=extra)
    eff = relative_test(base, both, ids, null=claim.threshold)
    if eff.p is None and eff.extra.get("undefined"):  # e.g. the successes in one fact
        why = f"the relative gain is undefined here: {eff.extra['undefined']}"
        return make_row(claim, None, untestable=why, details=details, extra=extra)
    return make_row(claim, eff, relative_test(base, ctl, ids), vs_control=vs,
                    details=details + "; relative gain", extra=extra)  # fmt: skip


# --------------------------------------------------------------------------------------
# Lu et al.: independence (transfer matrices)
# --------------------------------------------------------------------------------------


def _items(cell: Mapping[str, Any], key: str) -> list[float]:
    return [float(x) for x in cell["items"][key]]


def rows_transfer(cid: str, data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Independence in two readings: the pooled held-out gain (every ``all_but_R`` cell's
    items on R, clustered by fact id, against its random control) and the retained share
    (the held-out gain over the in-pool ``all`` gain on the same items, > 0.5)."""
    claim = _claim(cid)
    held = [c for c in data["cells"] if str(c.get("row", "")).startswith("all_but_")
            and c.get("items")]  # fmt: skip
    if not held:
        why = ("the transfer matrix has no held-out (all_but_R) cell with per-item outcomes "
               "(too few relations or languages)")  # fmt: skip
        return [make_row(claim, None, untestable=why, extra={"variant": v})
                for v in ("held-out gain", "retained share")]  # fmt: skip
    ids = [i for c in held for i in c["items"]["ids"]]
    orig = [x for c in held for x in _items(c, "orig")]
    new = [x for c in held for x in _items(c, "steered")]
    ctl = [x for c in held for x in _items(c, "control")]
    per = "; ".join(f"{c['col']}: {paired_test(_items(c, 'orig'), _items(c, 'steered')).estimate.format(2)}"
                    for c in held)  # fmt: skip
    row1 = make_row(claim, paired_test(orig, new, ids), paired_test(orig, ctl, ids),
                    vs_control=paired_test(ctl, new, ids), extra={"variant": "held-out gain"},
                    details=f"{len(held)} held-out cells pooled, clustered by fact id ({per})")  # fmt: skip
    return [row1, _retained_row(claim, data["cells"], held)]


def _retained_row(claim: Claim, cells: Sequence[Mapping[str, Any]],
                  held: Sequence[Mapping[str, Any]]) -> dict[str, Any]:  # fmt: skip
    share = replace(claim, threshold=RETAINED_SHARE)
    extra = {"variant": "retained share"}
    num, den, ids, per = [], [], [], []
    for c in held:
        full = next((a for a in cells if a.get("row") == "all" and a.get("col") == c["col"]
                     and a.get("items")), None)  # fmt: skip
        if full is None or full["items"]["ids"] != c["items"]["ids"]:
            continue
        o = np.array(_items(c, "orig"))
        dn, dd = np.array(_items(c, "steered")) - o, np.array(_items(full, "steered")) - o
        num += list(dn)
        den += list(dd)
        ids += c["items"]["ids"]
        r = ratio_test(dn, dd, c["items"]["ids"])
        per.append(
            f"{c['col']}: {r.estimate.format(2) if r.estimate.estimate is not None else 'n/a'}"
        )
    if not num:
        why = "no held-out column also has an in-pool (all) cell on the same items"
        return make_row(share, None, untestable=why, extra=extra)
    gain_all = paired_test([0.0] * len(den), den, ids)
    details = (f"share of the in-pool gain kept without R, pooled over {len(per)} columns "
               f"({'; '.join(per)}); in-pool gain {gain_all.estimate.format(3)}, p = "
               f"{gain_all.p:.3g}; rule: > {RETAINED_SHARE:g}")  # fmt: skip
    if not (gain_all.estimate.above(0.0) and gain_all.p is not None and gain_all.p < 0.05):
        why = ("the in-pool (all) gain on the held-out columns is not above 0: there is no gain "
               "to retain")  # fmt: skip
        return make_row(share, None, untestable=why, details=details, extra=extra)
    return make_row(share, ratio_test(num, den, ids, null=RETAINED_SHARE), details=details,
                    extra=extra)  # fmt: skip


# --------------------------------------------------------------------------------------
# Sundar et al.: experts, overlap, the clamp, alignment
# --------------------------------------------------------------------------------------


def overlap_test(matrix: Sequence[Sequence[float]], null: float) -> Test:
    """The mean overlap of the language pairs' expert sets, with a delete-one-language
    jackknife standard error (the pairs that share a language are not independent: the
    languages are the units), a t interval and t test of H0 "mean == ``null``" on L - 1 df."""
    m = np.asarray(matrix, dtype=float)
    n = m.shape[0]
    iu = np.triu_indices(n, 1)
    est = float(m[iu].mean()) if n > 1 else math.nan
    method = f"mean over {len(iu[0])} language pairs; delete-one-language jackknife ({n} languages)"
    if n < 3:
        return Test(Interval(est if n > 1 else None, None, None, n), None, None, n, method)
    loo = []
    for drop in range(n):
        keep = [i for i in range(n) if i != drop]
        sub = m[np.ix_(keep, keep)]
        loo.append(float(sub[np.triu_indices(n - 1, 1)].mean()))
    se = math.sqrt((n - 1) / n * float(((np.array(loo) - np.mean(loo)) ** 2).sum()))
    half = float(sps.t.ppf(0.975, n - 1)) * se
    if se == 0:  # every language's pairs alike: bounded, never 0
        p = 1.0 if math.isclose(est, null, abs_tol=1e-12) else p_floor(n)
    else:
        p = max(float(2 * sps.t.sf(abs(est - null) / se, n - 1)), float(np.finfo(float).tiny))
    return Test(Interval(est, est - half, est + half, n), p, mde(se, df=n - 1), n, method,
                {"null": null, "se": se, "df": n - 1, "interval": "t",
                 "pairs": int(len(iu[0]))})  # fmt: skip


def chance_overlap(matrix: Sequence[Sequence[float]], k: int, n_neurons: int) -> Test:
    """The chance overlap of two top-``k`` sets drawn from ``n_neurons`` MLP neurons: the
    hypergeometric expectation ``k / N`` of the shared share, and the exact one-sided
    ``scipy.stats.hypergeom`` p that the most-shared pair shares as many neurons by chance
    (Bonferroni over the pairs, at most 1). ``extra``: each pair's p, the pairs above chance
    at 0.05."""
    m = np.asarray(matrix, dtype=float)
    iu = np.triu_indices(m.shape[0], 1)
    shared = np.rint(m[iu] * k).astype(int)
    ps = sps.hypergeom.sf(shared - 1, n_neurons, k, k)
    chance = k / n_neurons
    p = float(min(1.0, ps.min() * len(ps))) if len(ps) else None
    extra = {"chance": chance, "pair_p": [float(x) for x in ps],
             "pairs_above_chance": int((ps < 0.05).sum())}  # fmt: skip
    return Test(Interval(chance, chance, chance, len(ps)), p, None, len(ps),
                "hypergeometric chance overlap k/N; p: exact, the largest pair (Bonferroni)",
                extra)  # fmt: skip


def rank_test(effect: float | None, draws: Sequence[float], direction: int = 1) -> Test:
    """A statistic of the effect against the same statistic of m random draws (the largest
    per-pair ratio against the random clamps' own maxima; a median AUROC against random
    neuron sets'). ``p``: the exact one-sided permutation p ``(1 + #{draws at least as far in
    direction}) / (m + 1)`` (floor ``1/(m + 1)``: 0.5 for one draw); the estimate is effect -
    mean of the draws with a t interval from the draws' spread (a new draw's; undefined for
    one draw)."""
    x = np.asarray([v for v in draws if np.isfinite(v)], dtype=float)
    m = len(x)
    if effect is None or m == 0:
        return Test(Interval(None, None, None, m), None, None, m, "no random-clamp maximum")
    est = float(effect - x.mean())
    p = (1 + int((direction * (x - effect) >= -1e-12).sum())) / (m + 1)
    p_opp = (1 + int((direction * (effect - x) >= -1e-12).sum())) / (m + 1)
    lo = hi = se = p_t = None
    if m >= 2:
        se = float(x.std(ddof=1) * np.sqrt(1 + 1 / m))
        half = float(sps.t.ppf(0.975, m - 1)) * se
        lo, hi = est - half, est + half
        if se > 0:
            p_t = max(float(2 * sps.t.sf(abs(est) / se, m - 1)), 1e-300)
    extra = {"direction": direction, "draws": m, "p_rank": p, "p_rank_opposite": p_opp,
             "p_floor": 1 / (m + 1), "draw_stats": x.tolist(), "se": se, "df": m - 1,
             "interval": "t"}  # fmt: skip
    if p_t is None:  # one draw or draws all equal: only the rank p
        extra.update(one_sided=True, p_opposite=p_opp)
    method = (
        f"effect vs {m} random draws' statistic; p: "
        + ("its rank (exact permutation" if p_t is None else
           f"two-sided t of effect - draws' mean (prediction SE), rank p {p:.3g} (floor")
        + f" 1/{m + 1})"
    )  # fmt: skip
    return Test(Interval(est, lo, hi, m), p if p_t is None else p_t, None, m, method, extra)


def _draw_index(key: str) -> int:
    """``random_s12`` -> 12 (draws in their seed order; other keys first)."""
    tail = key.removeprefix("random_s")
    return int(tail) if tail.isdigit() else -1


def rows_experts(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``experts_exist`` (held-out AUROC at the clamp's k against random neurons),
    ``experts_disjoint`` (overlap, languages as units) and ``clamp_steers`` (on BOS samples
    that did not choose k)."""
    a = data["auroc"]
    eff = Test.from_json(a["experts"])
    vs = Test.from_json(a["vs_random"])
    if a.get("random_draws"):  # a population of random neuron sets: the experts' rank
        vs = rank_test(eff.estimate.estimate, [float(x) for x in a["random_draws"]])
    rows = [make_row(_claim("experts_exist"), eff, Test.from_json(a["random"]), vs_control=vs,
                     details=f"top {a['k']} {data['target']} experts (the clamp's k: "
                     f"{a['k_rule']}); {a['n_pos']} of {a['n']} held-out sentences in "
                     f"{data['target']}, {a['n_clusters']} sentence clusters")]  # fmt: skip
    rows.append(_row_disjoint(data["overlap"]))
    rows.append(_row_steers(data))
    return rows


def _row_disjoint(ov: Mapping[str, Any]) -> dict[str, Any]:
    """``experts_disjoint``: the mean shared share of the language pairs' top-k sets minus
    the chance share k/N (the excess over chance, languages as units) below the threshold;
    the control is the hypergeometric chance overlap with its exact p."""
    c, k = _claim("experts_disjoint"), int(ov["k"])
    n_neurons = int(ov.get("n_neurons") or round(k / ov["chance"]))
    ctl = chance_overlap(ov["matrix"], k, n_neurons)
    excess = (np.asarray(ov["matrix"], dtype=float) - ctl.extra["chance"]).tolist()
    eff = overlap_test(excess, c.null_value)
    raw = overlap_test(ov["matrix"], c.null_value).estimate.format(4)
    return make_row(c, eff, ctl, details=f"k = {k} of N = {n_neurons} MLP neurons; overlap "
                    f"{raw}; chance k/N {ctl.extra['chance']:.4f}; "
                    f"{ctl.extra['pairs_above_chance']} of {ctl.n_clusters} pairs above chance "
                    "(hypergeometric p < 0.05)")  # fmt: skip


def _row_steers(data: Mapping[str, Any]) -> dict[str, Any]:
    papers, strict = data["choice_papers"], data["choice_strict"]
    details = (f"papers' rule (target rate; target perplexity <= {papers['ppl_budget']:g}x): "
               f"k = {papers['k']}; stricter rule (also the geometric mean of the other "
               f"languages' perplexity ratios): k = {strict['k']}")  # fmt: skip
    k, claim = papers["k"], _claim("clamp_steers")
    if k is None or not data.get("measure_curve"):
        why = "the papers' rule chose no k (no k keeps the target's perplexity within the budget)"
        return make_row(claim, None, details=details, untestable=why)
    rows = data["measure_curve"]
    none = next(r for r in rows if r["arm"] == "none")
    exp = next(r for r in rows if r["arm"] == "experts" and r["k"] == k)
    rnds = [r for r in rows if r["arm"] == "random" and r["k"] == k]  # one row per draw
    rnd = rnds[0] if rnds else None
    n0, e = [float(x) for x in none["bos_hits"]], [float(x) for x in exp["bos_hits"]]
    draws = [[float(x) for x in r["bos_hits"]] for r in rnds]
    details += (f"; measured on fresh BOS samples (seed {data.get('measure_seed')}) and "
                f"perplexity lines that did not choose k: target rate "
                f"{none['target_rate_bos']:.2f} -> {exp['target_rate_bos']:.2f}"
                + ("" if rnd is None else f" (random {rnd['target_rate_bos']:.2f})"))  # fmt: skip
    ctl = vs = None
    if draws:
        ctl = population_gain_test(n0, draws)
        vs = population_test(e, draws, base=n0, direction=claim.direction)
        details += f"; {len(draws)} random-neuron draw(s), permutation p floor 1/{len(draws) + 1}"
    return make_row(claim, paired_test(n0, e), ctl, vs_control=vs, details=details,
                    extra={"k": k, "k_strict": strict["k"]})  # fmt: skip


def rows_align(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Distances and retrieval, pre vs post vs the random clamp, paired per sentence."""
    ids = ("clamp_closer", "retrieval_improves", "random_neurons")
    if "untestable" in data:
        return [make_row(_claim(c), None, untestable=data["untestable"]) for c in ids]
    v, d = data["per_sentence"], data["distance"]
    ratio = " -> ".join(f"{d[a]['ratio']:.3f}" for a in ("pre", "post", "control") if a in d)
    dist = " -> ".join(f"{d[a]['between_languages']:.3f}" for a in ("pre", "post", "control"))
    at = f"k = {data.get('k')}, layer {data['layer']}; {len(v['pre']['retrieval'])} sentences"
    bl, rt = {a: v[a]["between_languages"] for a in v}, {a: v[a]["retrieval"] for a in v}
    ret = ", ".join(f"{a} {np.mean(rt[a]):.3f}" for a in ("pre", "post", "control") if a in rt)
    docs = _documents(data, len(v["pre"]["retrieval"]))
    at += f", {len(set(docs))} documents" if docs is not None else ", no documents: sentences"
    # the random clamp as a population: ``controls`` (one per draw) or the one ``control``
    drawn = [v[k] for k in sorted(v, key=_draw_index) if k.startswith("random_s")]
    ctl = list(data.get("per_sentence_controls") or drawn or [v["control"]])
    dbl, drt = [c["between_languages"] for c in ctl], [c["retrieval"] for c in ctl]
    at += f"; {len(ctl)} random-neuron draw(s) (permutation p floor 1/{len(ctl) + 1})"
    closer, null = _claim("clamp_closer"), _claim("random_neurons")
    ret_c = _claim("retrieval_improves")
    return [
        make_row(closer, paired_test(bl["pre"], bl["post"], docs),
                 population_gain_test(bl["pre"], dbl, docs),
                 vs_control=population_test(bl["post"], dbl, docs, base=bl["pre"],
                                            direction=closer.direction),
                 details=f"{at}; between languages pre -> post -> control {dist}; "
                 f"same/different-sentence ratio {ratio}"),
        make_row(ret_c, paired_test(rt["pre"], rt["post"], docs),
                 population_gain_test(rt["pre"], drt, docs),
                 vs_control=population_test(rt["post"], drt, docs, base=rt["pre"],
                                            direction=ret_c.direction),
                 details=f"{at}; top-1 {ret}"),
        make_row(null, population_gain_test(rt["pre"], drt, docs, null=null.null_value),
                 details=f"{at}; top-1 {ret}"),
    ]  # fmt: skip


def _documents(data: Mapping[str, Any], n: int) -> list[str] | None:
    """Each evaluation sentence's document (the align stage's ``docs``, or its details'),
    when there is one per sentence; ``None``: every sentence its own unit."""
    docs = data.get("docs") or (data.get("details") or {}).get("docs")
    return list(map(str, docs)) if docs is not None and len(docs) == n else None
