"""What every stage of the steering evaluation shares: the leak check, the one scoring call,
and the headroom with the lowest-language rule fixed on dev.

* :func:`check_disjoint` (:class:`LeakError`): no test fact id is ever used to build a vector,
  to draw a demonstration or to choose a setting; called before every stage.
* :func:`score`: the one scoring call of the dev grid, the test conditions and the transfer
  matrix (one condition, or many at once through one shared-prefix pass).
* :func:`headroom`: per language, zero-shot accuracy (the floor) and k-shot accuracy (what
  engaging recall can reach: the same queries after ``k`` solved demonstrations from the build
  split), each with a Wilson interval. A repair effect can only be as large as that room.
* :func:`lowest_language_rule`: the lowest-performing language by the headroom rule and by
  the literal rule (ties pooled), the one rule the steering evaluation, ``mechlingo
  replicate`` and the reports use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from fractions import Fraction
from typing import Any

from mechlingo.core.errors import InputError, MechlingoError
from mechlingo.core.types import Model
from mechlingo.data import Fact, few_shot_prompt
from mechlingo.interventions import Intervention
from mechlingo.kernels.significance import mcnemar, wilson
from mechlingo.scoring.evaluate import EvalResult, evaluate_conditions, evaluate_facts
from mechlingo.scoring.scorers import Scorer, as_scorer

__all__ = [
    "HEADROOM_RULE",
    "LITERAL_RULE",
    "LeakError",
    "by_lang",
    "check_disjoint",
    "few_shot_prefix",
    "headroom",
    "headroom_pairs",
    "lowest_language_dev",
    "lowest_language_rule",
    "metric_options",
    "non_english_mean",
    "outcomes",
    "score",
    "score_all",
]


class LeakError(MechlingoError, AssertionError):
    """A test fact id reached building, demonstrations or choosing."""


def check_disjoint(
    stage: str, used: Sequence[Fact] | Sequence[str], test: Sequence[Fact] | Sequence[str]
) -> None:
    """Raise :class:`LeakError` when a fact id of ``test`` is among ``used`` (facts or ids)."""
    leaked = {getattr(f, "id", f) for f in used} & {getattr(f, "id", f) for f in test}
    if leaked:
        raise LeakError(f"{len(leaked)} test fact id(s) reached {stage}: {sorted(leaked)[:5]}")


def _key(r: dict[str, Any]) -> tuple[str, str]:
    return (r["id"], r["lang"])


def outcomes(res: EvalResult, non_english: bool = True) -> list[bool]:
    """Correctness per item in a fixed (id, lang) order, non-English items only by default."""
    rows = sorted(res.records, key=_key)
    return [bool(r["correct"]) for r in rows if not non_english or r["lang"] != "en"]


def by_lang(res: EvalResult) -> dict[str, list[bool]]:
    out: dict[str, list[bool]] = {}
    for r in sorted(res.records, key=_key):
        out.setdefault(r["lang"], []).append(bool(r["correct"]))
    return out


def non_english_mean(res: EvalResult) -> float:
    """Mean over non-English languages of the per-language accuracy (``nan`` if none)."""
    acc = {lg: x for lg, x in res.accuracy().items() if lg != "en"}
    return sum(acc.values()) / len(acc) if acc else float("nan")


def score(
    model: Model,
    facts: Sequence[Fact],
    iv: Intervention | None | Mapping[str, Intervention | None],
    *,
    metric: str | Scorer = "generate",
    **kw: Any,
) -> Any:
    """Score ``facts`` under ``iv`` with ``metric``: the one scoring call of every stage
    (:func:`mechlingo.scoring.evaluate.evaluate_facts`; ``kw`` are its options). Given a
    mapping ``{name: intervention or None}``, every condition at once: ``{name:
    EvalResult}``, each equal to scoring that condition alone
    (:func:`mechlingo.scoring.evaluate.evaluate_conditions`: one shared prefix pass per batch
    of prompts)."""
    if isinstance(iv, Mapping):
        return evaluate_conditions(model, list(facts), dict(iv), metric=metric, **kw)
    return evaluate_facts(model, list(facts), intervention=iv, metric=metric, **kw)


def score_all(
    model: Model, facts: Sequence[Fact], conds: Mapping[str, Intervention | None], **kw: Any
) -> dict[str, EvalResult]:
    """Every condition of ``conds`` on ``facts`` at once (:func:`score` with a mapping)."""
    return score(model, facts, dict(conds), **kw)


def few_shot_prefix(fact: Fact, pool: Sequence[Fact], k: int) -> str:
    """The demonstrations of :func:`~mechlingo.data.few_shot_prompt` without the query: the
    text placed before the query (its prompt, or under ``rank`` its filled sentence)."""
    text = few_shot_prompt(fact, pool, k=k)
    return text[: len(text) - len(fact.prompt)] if fact.prompt else text


def headroom(
    model: Model,
    facts: Sequence[Fact],
    pool: Sequence[Fact],
    *,
    k_shot: int = 3,
    zero_shot: EvalResult | None = None,
    metric: str | Scorer = "generate",
    **kw: Any,
) -> dict[str, Any]:
    """Zero-shot and ``k_shot``-shot accuracy per language with Wilson intervals, under
    ``metric`` (see the module docstring for ``rank`` and ``klar``).

    Demonstrations come from ``pool`` (the build split), never from ``facts``. Returns
    ``{"zero_shot": {lang: wilson}, "k_shot": {lang: wilson}, "k": k_shot, "results":
    {"zero_shot": EvalResult, "k_shot": EvalResult}}`` (``results`` is not JSON)."""
    facts = list(facts)
    scorer = as_scorer(metric)
    check_disjoint("few-shot demonstrations", pool, facts)
    if scorer.metric == "klar":
        zero, few = _klar_headroom(model, facts, pool, scorer, k_shot, zero_shot, kw)
    else:
        kept, texts = [], []
        for f in facts:
            try:
                texts.append(few_shot_prefix(f, pool, k_shot))
                kept.append(f)
            except ValueError:
                continue
        zero = (
            zero_shot if zero_shot is not None else score(model, facts, None, metric=scorer, **kw)
        )
        few = EvalResult([])
        if kept and scorer.metric == "rank":
            few = score(model, kept, None, metric=scorer, prefixes=texts, **kw)
        elif kept:
            prompts = [t + f.prompt for t, f in zip(texts, kept, strict=True)]
            few = evaluate_facts(model, kept, prompts=prompts, **kw)
    return {
        "k": k_shot,
        "zero_shot": {lg: wilson(sum(v), len(v)).to_json() for lg, v in by_lang(zero).items()},
        "k_shot": {lg: wilson(sum(v), len(v)).to_json() for lg, v in by_lang(few).items()},
        "results": {"zero_shot": zero, "k_shot": few},
    }


def _klar_headroom(
    model: Model,
    facts: list[Fact],
    pool: Sequence[Fact],
    scorer: Scorer,
    k_shot: int,
    scored: EvalResult | None,
    kw: dict[str, Any],
) -> tuple[EvalResult, EvalResult]:
    """KLAR's rule with no demonstrations and with ``k_shot`` from ``pool`` (``scored``, the
    objective's baseline, is reused when it has ``k_shot`` demonstrations)."""
    kw = {k: v for k, v in kw.items() if k != "pool"}
    zero = score(model, facts, None, metric=replace(scorer, klar_shots=0), **kw)
    if scored is not None and scorer.klar_shots == k_shot:
        return zero, scored
    few_scorer = replace(scorer, klar_shots=k_shot)
    return zero, score(model, facts, None, metric=few_scorer, pool=list(pool), **kw)


def _tied_lowest(acc: Mapping[str, tuple[int, int]]) -> list[str]:
    """The languages whose accuracy ``k / n`` is the lowest of ``acc`` (exact ties: every
    language at that accuracy), sorted by code; English and empty languages never count."""
    langs = [lg for lg, (_, n) in acc.items() if lg != "en" and n]
    if not langs:
        return []
    low = min(Fraction(acc[lg][0], acc[lg][1]) for lg in langs)
    return sorted(lg for lg in langs if Fraction(acc[lg][0], acc[lg][1]) == low)


def _representative(tied: Sequence[str], few: Mapping[str, float | None]) -> str | None:
    """One language of a tie, for display only (the lower few-shot accuracy, then the code):
    the claim is judged on every tied language's pooled items."""
    if not tied:
        return None
    return min(tied, key=lambda lg: (2.0 if few.get(lg) is None else few[lg], lg))  # type: ignore[operator]


def lowest_language_dev(zero: dict[str, dict], few: dict[str, dict]) -> str | None:
    """The literal rule on Wilson dicts (``{lang: {"k", "n", "p"}}``): the non-English
    language with the lowest dev zero-shot accuracy (of a tie, the one with the lower dev
    few-shot accuracy, then the code; :func:`lowest_language_rule` gives the whole tie).
    ``None`` when there is no non-English language. Never English, never chosen on test."""
    tied = _tied_lowest({lg: (int(w["k"]), int(w["n"])) for lg, w in zero.items()})
    return _representative(tied, {lg: few.get(lg, {}).get("estimate") for lg in tied})


HEADROOM_RULE = (
    "headroom rule, fixed on dev: among the non-English languages whose dev few-shot accuracy "
    "beats their zero-shot accuracy (exact McNemar, p < {p:g}, more fixed than broken), those "
    "with the lowest dev zero-shot accuracy (a tie keeps every tied language; the claim is "
    "judged on their pooled test items)"
)
LITERAL_RULE = (
    "literal rule, fixed on dev: the non-English languages with the lowest dev zero-shot "
    "accuracy (a tie keeps every tied language; the claim is judged on their pooled test items)"
)


def headroom_pairs(hr: dict[str, Any]) -> tuple[dict[str, list[bool]], dict[str, list[bool]]]:
    """Paired per-language outcomes ``(zero_shot, few_shot)`` of a :func:`headroom` result:
    the items scored both ways, in (id, lang) order."""
    res = hr["results"]
    zero = {_key(r): bool(r["correct"]) for r in res["zero_shot"].records}
    few = {_key(r): bool(r["correct"]) for r in res["k_shot"].records}
    z: dict[str, list[bool]] = {}
    f: dict[str, list[bool]] = {}
    for k in sorted(set(zero) & set(few)):
        z.setdefault(k[1], []).append(zero[k])
        f.setdefault(k[1], []).append(few[k])
    return z, f


def lowest_language_rule(
    zero: dict[str, Sequence[bool]], few: dict[str, Sequence[bool]], *, p_threshold: float = 0.1
) -> dict[str, Any]:
    """The lowest-performing language by the two rules of the card, each written once here
    and used by the protocol, ``mechlingo replicate`` and the reports.

    ``zero[lang]`` and ``few[lang]`` are paired dev outcomes (the same items zero-shot and
    few-shot). A language has *headroom* when its few-shot accuracy beats its zero-shot
    accuracy by an exact McNemar test (more fixed than broken, ``p < p_threshold``): only
    there can a vector that does what the demonstrations do show a gain.

    Returns ``languages`` (the headroom rule: the non-English languages with headroom and
    the lowest dev zero-shot accuracy; several when tied, empty when none has headroom),
    ``literal_languages`` (the literal rule, the paper's wording: the non-English languages
    with the lowest dev zero-shot accuracy), ``language`` and ``literal`` (one of each tie
    for display: the lower few-shot accuracy, then the code; ``None`` when empty),
    ``excluded`` (the non-English languages without headroom), ``tests`` (per language:
    zero-shot and few-shot accuracy, n, fixed, broken, p, ``headroom``), ``rule`` and
    ``literal_rule`` (the rules in words).

    Raises:
        InputError: outcomes that are not paired or empty.
    """
    tests: dict[str, dict[str, Any]] = {}
    for lg in sorted(zero):
        z, f = list(zero[lg]), list(few.get(lg, []))
        if not z or len(z) != len(f):
            raise InputError(f"{lg}: zero-shot and few-shot outcomes must be paired and non-empty")
        m = mcnemar(z, f)
        ok = m["fixed"] > m["broken"] and m["p"] < p_threshold
        tests[lg] = {
            "zero_shot": sum(z) / len(z),
            "few_shot": sum(f) / len(f),
            "k": sum(z),
            **m,
            "headroom": ok,
        }
    counts = {lg: (t["k"], t["n"]) for lg, t in tests.items()}
    fs = {lg: t["few_shot"] for lg, t in tests.items()}
    literal = _tied_lowest(counts)
    head = _tied_lowest({lg: c for lg, c in counts.items() if tests[lg]["headroom"]})
    return {
        "language": _representative(head, fs),
        "languages": head,
        "literal": _representative(literal, fs),
        "literal_languages": literal,
        "excluded": [lg for lg in tests if lg != "en" and not tests[lg]["headroom"]],
        "tests": tests,
        "p_threshold": p_threshold,
        "rule": HEADROOM_RULE.format(p=p_threshold),
        "literal_rule": LITERAL_RULE,
    }


def metric_options(scorer: Scorer, pool: Sequence[Fact] | None) -> dict[str, Any]:
    """The scoring options of every stage: the metric, and under ``klar`` the pool its
    demonstrations come from (the build split)."""
    out: dict[str, Any] = {"metric": scorer}
    if scorer.metric == "klar" and pool is not None:
        out["pool"] = list(pool)
    return out
