"""The circuits stage: "the model recalls a fact in language L with the same mechanism it
uses for English", measured with edge circuits (:mod:`mechlingo.analyses.circuits`).

Per language (English and each of ``circuits.langs``) the bundled facts (measured stems) are
split by id hash as the card splits them (``repair.split``). On correctly answered facts
outside the test part ("dev": build and dev parts) EAP-IG scores every edge, and the circuit
is the smallest top-n of :data:`SIZES` whose dev faithfulness reaches ``target``. On L's
test pairs the stage stores per fact the readout with only the English circuit clean (and
only L's own), the clean and the corrupted readout. The row (:func:`rows_circuits`, one per
language) is the English circuit's faithfulness there (ratio of sums, CR2 delta-method
interval clustered by subject) against :data:`~mechlingo.card.claims.SAME_MECHANISM_SHARE`, with
the edge Jaccard of the two dev circuits against ``draws`` size-matched random circuits as
its control (rank p). The rule and why: ``docs/replicate.md`` ("The verdict rules").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from mechlingo.analyses.circuits import find_circuit
from mechlingo.analyses.circuits.faithfulness import removed_mask
from mechlingo.analyses.circuits.graph import build_graph
from mechlingo.analyses.circuits.matrix import overlap_null
from mechlingo.analyses.circuits.pairs import make_pairs
from mechlingo.analyses.circuits.patching import EdgePatcher
from mechlingo.analyses.circuits.runs import readout_fn
from mechlingo.card import claims as C
from mechlingo.card.claims import LU
from mechlingo.card.clustered_tests import Test, ratio_test
from mechlingo.card.repair_items import clustered_by, item_clusters, subject_keys
from mechlingo.card.rules import make_row
from mechlingo.card.stages.base import (
    Budget,
    Context,
    ReportLike,
    Stage,
    check,
    data_section,
    processes,
)
from mechlingo.card.stages.data import FactScope, scoped_facts
from mechlingo.core.errors import InputError
from mechlingo.core.types import Model
from mechlingo.data import Fact, load_facts, template_info
from mechlingo.data.splits import split_facts
from mechlingo.kernels.significance import Interval
from mechlingo.scoring.evaluate import DecodeOptions, evaluate_facts

__all__ = [
    "FULL",
    "QUICK",
    "SIZES",
    "STAGE",
    "CircuitsBudget",
    "PartCost",
    "expected_part",
    "jaccard_rank_test",
    "plan_sizes",
    "stage_facts",
]

#: The circuit sizes tried on dev (the smallest reaching the target is the circuit).
SIZES = (5, 10, 20, 50, 100, 200, 500, 1000)
#: At most this many times the facts wanted are scored to find them (a language the model
#: rarely answers costs a bounded scan).
SCAN = 4
#: The fewest pairs a part needs (a clustered interval of fewer says nothing).
MIN_PAIRS = 3

Edge = tuple[int, int, int]

if TYPE_CHECKING:
    from mechlingo.card.stages import CardSettings


@dataclass(frozen=True)
class CircuitsBudget(Budget):
    """``langs``: the languages compared with English; ``relations``: the facts' relations;
    ``dev_per_lang`` / ``test_per_lang``: correctly answered facts per language on which the
    circuits are found (dev) and judged (test); ``steps``: EAP-IG interpolation steps;
    ``target``: the dev faithfulness a circuit must reach; ``draws``: pairs of random circuits
    for the overlap's rank p; ``max_new_tokens``: of the greedy answers that select facts."""

    langs: tuple[str, ...]
    relations: tuple[str, ...]
    dev_per_lang: int
    test_per_lang: int
    steps: int
    target: float
    draws: int
    max_new_tokens: int

    def __post_init__(self) -> None:
        check("en" not in self.langs, "circuits.langs", "must not name en (the reference)")
        check(len(self.relations) > 0, "circuits.relations", "must name a relation")
        check(self.dev_per_lang >= MIN_PAIRS, "circuits.dev_per_lang", f"must be >= {MIN_PAIRS}")
        check(self.test_per_lang >= MIN_PAIRS, "circuits.test_per_lang",
              f"must be >= {MIN_PAIRS}")  # fmt: skip
        check(self.steps >= 1, "circuits.steps", "must be at least 1")
        check(0 < self.target <= 1, "circuits.target", "must lie in (0, 1]")
        check(self.draws >= 1, "circuits.draws", "must be at least 1")
        check(self.max_new_tokens >= 1, "circuits.max_new_tokens", "must be at least 1")


QUICK = CircuitsBudget(langs=("fr", "es"), relations=("capital",), dev_per_lang=8,
                       test_per_lang=12, steps=3, target=0.8, draws=999,
                       max_new_tokens=6)  # fmt: skip
FULL = CircuitsBudget(langs=("fr", "de", "es", "ja"), relations=("capital",), dev_per_lang=16,
                      test_per_lang=24, steps=5, target=0.8, draws=1999,
                      max_new_tokens=8)  # fmt: skip


# --------------------------------------------------------------------------------------
# The measurement
# --------------------------------------------------------------------------------------


def _correct_first(model: Model, facts: Sequence[Fact], n: int, settings: CardSettings) -> list:
    """The first ``n`` correctly answered facts (greedy answers), scored ``n`` at a time
    until ``n`` are found or :data:`SCAN` times ``n`` facts were scored."""
    got: list[Fact] = []
    todo = list(facts)[: SCAN * n]
    while todo and len(got) < n:
        chunk, todo = todo[:n], todo[n:]
        res = evaluate_facts(
            model,
            chunk,
            decoding=DecodeOptions(
                max_new_tokens=settings.budget.circuits.max_new_tokens,
                early_stop=True,
                batch_size=settings.batch(),
            ),
        )
        ok = {r["id"] for r in res.records if r["correct"]}
        got += [f for f in chunk if f.id in ok]
    return got[:n]


def _parts(model: Model, facts: Sequence[Fact], settings: CardSettings) -> dict[str, Any]:
    """``{lang: {"dev": (clean, pool), "test": (clean, pool)}}`` (English: dev only): each
    part's correctly
    answered facts and the part's facts they draw partners from. The circuits are found on
    every id outside the test part (the card's build and dev parts: ids the test never sees)."""
    c = settings.budget.circuits
    split = split_facts(list(facts), tuple(settings.budget.repair.split), "")
    found = [*split["build"], *split["dev"]]
    out: dict[str, Any] = {}
    for lang in ("en", *c.langs):
        out[lang] = {}
        for part, facts_, n in (("dev", found, c.dev_per_lang),
                                ("test", split["test"], c.test_per_lang)):  # fmt: skip
            if lang == "en" and part == "test":  # English is judged on no test pair
                continue
            pool = sorted((f for f in facts_ if f.lang == lang), key=lambda f: f.id)
            out[lang][part] = (_correct_first(model, pool, int(n), settings), pool)
    return out


def _dev_circuit(model: Model, clean: list[Fact], pool: list[Fact],
                 c: CircuitsBudget) -> dict[str, Any]:  # fmt: skip
    """The dev circuit of one language: the smallest top-n of :data:`SIZES` whose dev
    faithfulness reaches the target (else the largest), with its curve and the scored graph."""
    res = find_circuit(model, clean, method="eap-ig", steps=int(c.steps), pool=pool,
                       sizes=SIZES, verify=0, target=float(c.target))  # fmt: skip
    return {"edges": [list(e) for e in res.circuit], "curve": res.curve, "n": res.n,
            "n_scored": len(res.ranked), "faithfulness": res.faithfulness,
            "labels": res.labels}  # fmt: skip


def _on_test(model: Model, clean: list[Fact], pool: list[Fact],
             circuits: Mapping[str, Sequence[Edge]]) -> dict[str, Any]:  # fmt: skip
    """Per test pair: the clean and corrupted readout and the readout with only each named
    circuit clean (every other edge corrupted)."""
    graph = build_graph(model)
    p = make_pairs(model, clean, pool=pool)
    patcher = EdgePatcher(model, graph, p.clean_batch, p.corrupted_batch,
                          readout_fn(model, p.readout), p.roles)  # fmt: skip
    K = p.roles.shape[-1]
    every = [(s, r, k) for s, r in zip(*torch.nonzero(graph.mask, as_tuple=True), strict=True)
             for k in range(K)]  # fmt: skip
    every = [(int(s), int(r), k) for s, r, k in every]
    out: dict[str, Any] = {"ids": p.fact_ids, "skipped_without_partner": p.skipped}
    out["clean"] = patcher.read(removed_mask(graph, every, K)).tolist()
    out["corrupted"] = patcher.read(removed_mask(graph, [], K)).tolist()
    for name, edges in circuits.items():
        out[name] = patcher.read(removed_mask(graph, [tuple(e) for e in edges], K)).tolist()
    return out


def jaccard_draws(n_a: int, n_b: int, universe: int, draws: int, seed: int = 0) -> list[float]:
    """Edge Jaccard indices of ``draws`` pairs of random circuits of sizes ``n_a`` and ``n_b``
    from ``universe`` edges (:func:`mechlingo.analyses.circuits.matrix.overlap_null`)."""
    return [float(x) for x in overlap_null(n_a, n_b, universe, n_null=draws, seed=seed)]


def stage_circuits(model: Model, facts: Sequence[Fact], settings: CardSettings) -> dict:
    """Per language: the dev circuit, the test readouts under the English circuit and under
    its own, and the overlap of its dev circuit with English's against random circuits."""
    c = settings.budget.circuits
    parts = _parts(model, facts, settings)
    dev: dict[str, Any] = {}
    out: dict[str, Any] = {"threshold": C.SAME_MECHANISM_SHARE, "sizes": list(SIZES),
                           "langs": {}, "subjects": subject_keys(facts)}  # fmt: skip
    for lang, p in parts.items():
        clean, pool = p["dev"]
        try:
            dev[lang] = _dev_circuit(model, clean, pool, c) if len(clean) >= MIN_PAIRS else None
        except InputError as err:  # no fact with a partner of equal length
            dev[lang] = {"untestable": str(err)}
    en = dev.get("en")
    for lang in c.langs:
        d, clean, pool = dev.get(lang), *parts[lang]["test"]
        why = _untestable(en, d, clean)
        if why:
            out["langs"][lang] = {"untestable": why}
            continue
        assert en is not None and d is not None
        test = _on_test(model, clean, pool, {"english": en["edges"], "own": d["edges"]})
        if len(test["ids"]) < MIN_PAIRS:
            out["langs"][lang] = {"untestable": f"{len(test['ids'])} test pairs of equal length"}
            continue
        a = {tuple(e) for e in en["edges"]}
        b = {tuple(e) for e in d["edges"]}
        out["langs"][lang] = {
            "test": test, "dev_en": _brief(en), "dev": _brief(d),
            "jaccard": len(a & b) / len(a | b),
            "null": jaccard_draws(len(a), len(b), int(en["n_scored"]), int(c.draws)),
        }  # fmt: skip
    return out


def _brief(d: Mapping[str, Any]) -> dict[str, Any]:
    return {"n": d["n"], "n_edges": len(d["edges"]), "faithfulness": d["faithfulness"],
            "curve": d["curve"], "n_scored": d["n_scored"]}  # fmt: skip


def _untestable(en: Any, d: Any, test: Sequence[Fact]) -> str | None:
    """Why a language's row cannot be measured, or ``None``."""
    for name, x in (("English", en), ("L", d)):
        if x is None:
            return f"fewer than {MIN_PAIRS} correctly answered {name} dev facts"
        if "untestable" in x:
            return f"{name} dev: {x['untestable']}"
    if len(test) < MIN_PAIRS:
        return f"{len(test)} correctly answered test facts (fewer than {MIN_PAIRS})"
    return None


# --------------------------------------------------------------------------------------
# The rows
# --------------------------------------------------------------------------------------


def jaccard_rank_test(observed: float, null: Sequence[float]) -> Test:
    """The overlap control as a rank test: the estimate is the observed Jaccard minus the
    null mean (its interval the null's 2.5-97.5% range, a description); ``p`` the exact
    one-sided permutation p ``(1 + #{draws >= observed}) / (m + 1)``, ``p_opposite`` the
    other side's; judged by rank (``extra["decides"] = "rank"``)."""
    x = np.asarray(null, dtype=float)
    m = len(x)
    if m == 0:
        raise InputError("the overlap's rank test needs at least one random draw")
    tol = 1e-12
    p = (1 + int((x >= observed - tol).sum())) / (m + 1)
    p_opp = (1 + int((x <= observed + tol).sum())) / (m + 1)
    mu = float(x.mean())
    lo, hi = observed - float(np.quantile(x, 0.975)), observed - float(np.quantile(x, 0.025))
    iv = Interval(observed - mu, lo if m > 1 else None, hi if m > 1 else None, m)
    method = (f"edge Jaccard - mean of {m} size-matched random circuit pairs; p: its rank "
              f"among the draws (exact permutation, floor 1/{m + 1})")  # fmt: skip
    extra = {"one_sided": True, "p_opposite": p_opp, "p_rank": p, "p_rank_opposite": p_opp,
             "decides": "rank", "draws": m, "p_floor": 1 / (m + 1), "effect_stat": observed,
             "null_mean": mu}  # fmt: skip
    return Test(iv, p, None, m, method, extra)


def rows_circuits(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One ``same_mechanism`` row per language (see the module docstring)."""
    claim = C.SAME_MECHANISM
    rows = []
    for lang, d in data["langs"].items():
        extra = {"lang": lang, "variant": lang}
        if "untestable" in d:
            rows.append(make_row(claim, None, untestable=f"{lang}: {d['untestable']}",
                                 extra=extra))  # fmt: skip
            continue
        t = d["test"]
        clean, corr = np.asarray(t["clean"]), np.asarray(t["corrupted"])
        den = clean - corr
        cl = item_clusters(t["ids"], data.get("subjects"))
        eff = ratio_test(np.asarray(t["english"]) - corr, den, cl, null=claim.threshold)
        own = ratio_test(np.asarray(t["own"]) - corr, den, cl, null=claim.threshold)
        vs = jaccard_rank_test(float(d["jaccard"]), d["null"])
        details = (
            f"{lang}: the English dev circuit ({d['dev_en']['n_edges']} edges, dev "
            f"faithfulness {d['dev_en']['faithfulness']['faithfulness']:.2f} on "
            f"{d['dev_en']['n']} facts) on {len(t['ids'])} {lang} test pairs; {lang}'s own dev "
            f"circuit ({d['dev']['n_edges']} edges) there: {own.estimate.format(2)}; edge "
            f"Jaccard of the two dev circuits {d['jaccard']:.3f} (random circuits "
            f"{vs.extra['null_mean']:.3f}, rank p {vs.p:.3g}); {clustered_by(t['ids'], cl)}"
        )
        if not eff.estimate.defined and eff.estimate.estimate is None:
            rows.append(make_row(claim, None, untestable=f"{lang}: the clean and corrupted "
                                 "test readouts do not differ (no behaviour to explain)",
                                 extra=extra))  # fmt: skip
            continue
        rows.append(make_row(claim, eff, own, vs_control=vs, details=details, extra=extra))
    if not rows:
        rows.append(make_row(claim, None, untestable="no language compared with English"))
    return rows


# --------------------------------------------------------------------------------------
# The report, the budget's cost, the stage
# --------------------------------------------------------------------------------------


def _share(t: Mapping[str, Any], key: str) -> float:
    """The faithfulness of the circuit ``key`` on the stored test pairs ``t`` (ratio of sums)."""
    corr = np.asarray(t["corrupted"])
    den = float((np.asarray(t["clean"]) - corr).sum())
    return round(float((np.asarray(t[key]) - corr).sum()) / den, 3) if den else float("nan")


def _table(report: ReportLike, data: Mapping[str, Any]) -> None:
    rows = []
    for lang, d in data["langs"].items():
        if "untestable" in d:
            rows.append({"lang": lang, "note": d["untestable"]})
            continue
        t = d["test"]
        share = lambda k, t=t: _share(t, k)  # noqa: E731
        rows.append({"lang": lang, "test pairs": len(t["ids"]),
                     "English circuit (edges)": d["dev_en"]["n_edges"],
                     "its faithfulness on L": share("english"),
                     "L circuit (edges)": d["dev"]["n_edges"],
                     "L circuit's faithfulness": share("own"),
                     "edge Jaccard": round(float(d["jaccard"]), 3),
                     "random Jaccard": round(float(np.mean(d["null"])), 4), "note": ""})  # fmt: skip
    report.add_text(
        "EAP-IG circuits found on each language's dev facts (the smallest top-n reaching the "
        "target faithfulness there), judged on the test facts: the faithfulness of the English "
        "circuit on L's subject pairs, beside L's own circuit's, and the edge Jaccard of the "
        "two circuits against random circuits of the same sizes."
    )
    report.add_table(rows)


#: The English circuit against each language's, on its test prompts.
report = data_section("circuits", "fig-circuits", "Same circuit as English (EAP-IG)", _table)

#: The stage's parts in items scored under ``rank``, from a profile of the quick stage on
#: the embedded model (one process, 7 December 2026: 60.4 CPU-seconds at 0.1525 s per ranked
#: item, 396 items; of its time 55% in the dev circuits, 29% in the greedy selection, 16% on
#: the test pairs): one dev fact's EAP-IG (3 steps) and dev-curve passes (218 items over 24
#: dev facts), one scored fact of the greedy selection (114 items over the 121 facts that
#: run scored, dev and test, until each part had its facts or its pool ran out), one test
#: pair's patched passes (clean, corrupted, each circuit; 63 items over its 22 test pairs).
#: A dev fact's cost grows by :data:`PER_STEP` of its 3-step cost with each EAP-IG step:
#: English's 16 full dev facts (one process, 7 December 2026, 7 timed runs at 1, 3 and 5
#: steps) took 9.69 + 1.39 x steps CPU-seconds (least squares; slope 95% CI 0.77 to 2.02),
#: 0.10 of the 3-step cost a step (the rest is the dev curve's patched passes).
PER_DEV_FACT = 9.1
PER_STEP = 0.1
PER_SELECTED_FACT = 0.94
PER_TEST_FACT = 2.9


@dataclass(frozen=True)
class PartCost:
    """What one part (a language's dev or test facts) costs in expectation: ``found``, the
    correctly answered facts it ends with, and ``chunks``, the sizes of the chunks it
    scores to find them."""

    found: float
    chunks: tuple[int, ...]


def expected_part(n: int, pool: int | None, rate: float) -> PartCost:
    """The selection of :func:`_correct_first` in expectation: chunks of ``n`` facts of the
    ``pool`` (at most :data:`SCAN` x ``n`` facts; ``None``: no smaller pool) are scored
    until ``rate`` x the facts scored reaches ``n``; the part keeps at most ``n``. A rate of
    1 scores one chunk and finds every fact asked for."""
    cap = SCAN * n if pool is None else min(SCAN * n, int(pool))
    chunks: list[int] = []
    done = 0
    while done < cap and rate * done < n:
        chunks.append(min(n, cap - done))
        done += chunks[-1]
    return PartCost(min(float(n), rate * done), tuple(chunks))


def cost(settings: CardSettings, sizes: Mapping[str, Any], unit: Mapping[str, float]) -> float:
    """CPU seconds of the facts the stage will use, not the facts its budget asks for.

    The stage keeps the first ``dev_per_lang`` (``test_per_lang``) facts of a language's
    part that the model answers correctly, scoring chunks of that many until it has them or
    has scored :data:`SCAN` times as many (or the part's whole pool). What it uses thus
    depends on the model's greedy accuracy on these prompts, known before the stage runs
    only as an estimate: ``sizes["circuits"]`` (:func:`plan_sizes`) gives per language the
    pools and that ``rate``, and :func:`expected_part` the facts found and the chunks
    scored. Without it every asked fact counts as found in one chunk (the budget as asked:
    an upper bound on the pairs). The terms: the dev facts of English and every language
    with at least :data:`MIN_PAIRS` (EAP-IG and the dev curve, shared out by pairs under
    torchrun; :data:`PER_STEP` more with each EAP-IG step past 3), every fact the greedy
    selection scores (chunks of at most one batch: under torchrun one process scores each
    whole) and the test pairs of every language but English with at least
    :data:`MIN_PAIRS` (their patched passes, which every process runs whole): the parts run
    whole cost ``processes`` x the per-item seconds (one process's share of sharded
    scoring)."""
    c = settings.budget.circuits
    p = processes(sizes)
    known = sizes.get("circuits") or {}
    pools, rates = known.get("pools", {}), known.get("rates", {})
    dev = whole = selected = 0.0
    for lang in ("en", *c.langs):
        pool, rate = pools.get(lang, {}), float(rates.get(lang, 1.0))
        for part, n in (("dev", c.dev_per_lang), ("test", c.test_per_lang)):
            if lang == "en" and part == "test":  # English is judged on no test pair
                continue
            got = expected_part(int(n), pool.get(part), rate)
            selected += sum(_selection_share(k, settings.batch(), p) for k in got.chunks)
            used = got.found if got.found >= MIN_PAIRS else 0.0
            dev, whole = (dev + used, whole) if part == "dev" else (dev, whole + used)
    dev_items = dev * PER_DEV_FACT * (1 + PER_STEP * (int(c.steps) - 3))
    return (dev_items + selected * PER_SELECTED_FACT + p * whole * PER_TEST_FACT) * unit.get(
        "rank", 0.0
    )


def _selection_share(n: int, batch: int, procs: int) -> float:
    """The scored facts of a chunk of ``n`` that the busiest process scores, in units of
    one process's share of a fact: its ``ceil(batches / procs)`` of the chunk's batches,
    each scored whole (a chunk of fewer batches than processes: one process scores it all)."""
    b = max(1, math.ceil(n / max(1, batch)))
    return n * math.ceil(b / procs) / b * procs


def plan_sizes(facts: Sequence[Fact] | None, settings: CardSettings, model_name: str | None,
               metric_data: Mapping[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """What :func:`cost` reads, known before the stage runs: per language the ``pools``
    each part selects from (``dev``: its build and dev facts, ``test``: its test facts, as
    :func:`_parts` splits them) and the ``rates`` at which the model answers them by greedy
    generation, with ``rate_source``.

    Why these rates: the stage's selection is greedy correctness on its own prompts, so the
    rate is that accuracy as known before the stage runs, never an outcome of this run's
    test part. For the user's facts the stage reads the prompts the metric stage already
    scored on the dev split by greedy generation (``metric_data["counts"]["generate"]``):
    the dev accuracy per language. For the bundled facts the stage reads the measured stems,
    not the natural ones the metric stage scored (whose accuracy says nothing of them); their
    accuracy on the embedded model is stored with them (:func:`mechlingo.data.template_info`:
    40 facts per relation and language), so it is the rate when ``model_name`` is that model.
    It reads a little high (each stem was the best of three candidates on those 40 facts), so
    the estimate errs toward more pairs. Any other case has no rate, and the cost counts the
    facts asked for. The rates serve the estimate only: no verdict reads them."""
    c = settings.budget.circuits
    try:
        fs = stage_facts(facts, settings)
    except InputError as err:  # the stage will say so; the estimate counts the budget
        return {"pools": {}, "rates": {}, "rate_source": f"none: {err}"}
    split = split_facts(list(fs), tuple(settings.budget.repair.split), "")
    dev_ids = [*split["build"], *split["dev"]]
    pools = {lg: {"dev": sum(f.lang == lg for f in dev_ids),
                  "test": sum(f.lang == lg for f in split["test"])}
             for lg in ("en", *c.langs)}  # fmt: skip
    rates: dict[str, float] = {}
    source = "none: every fact asked for counts as found"
    if facts is not None:
        counts = ((metric_data or {}).get("counts") or {}).get("generate") or {}
        rates = {lg: k / n for lg, (k, n) in counts.items() if lg in pools and n > 0}
        source = "the metric stage's greedy accuracy on the dev split" if rates else source
    else:
        info = template_info()
        if model_name == info["source"]["model"]:
            rates = _bundled_rates(info, ("en", *c.langs), c.relations)
            source = f"the bundled stems' measured accuracy on {model_name}"
    return {"pools": pools, "rates": rates, "rate_source": source}


def _bundled_rates(info: Mapping[str, Any], langs: Sequence[str],
                   relations: Sequence[str]) -> dict[str, float]:  # fmt: skip
    """Each language's stored accuracy of its measured stems, averaged over ``relations``
    (a language without one for every relation gets none)."""
    out = {}
    for lg in langs:
        acc = [(info["templates"].get(r) or {}).get(lg, {}).get("accuracy") for r in relations]
        if acc and all(a is not None for a in acc):
            out[lg] = float(sum(acc)) / len(acc)
    return out


def stage_facts(facts: Sequence[Fact] | None, settings: CardSettings) -> list[Fact]:
    """English and the section's languages, the section's relations: the bundled facts with
    their measured stems (a circuit needs facts the model answers; these stems were chosen
    per language for the embedded model's accuracy), or the user's ``facts`` scoped like the
    other Lu stages."""
    c = settings.budget.circuits
    langs, rels = ["en", *c.langs], list(c.relations)
    if facts is None:
        return load_facts(langs=langs, relations=rels, templates="measured")
    scope = FactScope(tuple(langs), tuple(rels))
    return scoped_facts(facts, settings.with_metric("generate"), scope)


def _facts(ctx: Context) -> list[Fact]:
    """The facts the stage reads (:func:`stage_facts`)."""
    return stage_facts(ctx.facts, ctx.settings)


def run(ctx: Context) -> dict[str, Any]:
    """The circuits stage's result (per language: dev circuits, test metrics, overlap)."""
    return stage_circuits(ctx.model, _facts(ctx), ctx.settings)


STAGE = Stage(
    name="circuits",
    paper=LU,
    run=run,
    rows=(rows_circuits,),
    report=report,
    section="circuits",
    budget=CircuitsBudget,
    cost=cost,
)
