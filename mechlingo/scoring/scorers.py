"""The three scorers behind ``--metric``, their rules, and the statistics of each.

* ``generate`` (the default): the *eval rule* (:func:`mechlingo.core.answers.is_correct`): the
  greedy continuation, cut at its first line break, starts with the answer or an alias after
  normalisation, at a word boundary in languages written with spaces;
* ``klar``: the KLAR benchmark's reference rule (:func:`klar_match`), consistency by CLC
  (:func:`clc`);
* ``rank``: candidate ranking by cross-entropy (:mod:`mechlingo.scoring.rank`), P@1,
  consistency by RankC (:func:`rankc`).

A :class:`Scorer` (or its name) is passed as ``metric=`` to
:func:`mechlingo.scoring.evaluate.evaluate_facts`. This module holds what counts as correct
and usable (:func:`klar_decided`, :func:`in_english`, :func:`skip_reason`,
:func:`split_usable`), a fact's record (:func:`generate_record`, :func:`klar_record`) and what a
generation metric decodes (:func:`generation_rule`). Every rule: ``docs/methods/scoring.md``."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mechlingo.core.answers import decided, is_correct, normalize
from mechlingo.core.defaults import SEED
from mechlingo.core.errors import InputError
from mechlingo.data import Fact
from mechlingo.kernels.significance import bootstrap_mean, bootstrap_ratio, wilson

__all__ = [
    "KLAR_MAX_NEW_TOKENS",
    "GenerationRule",
    "METRICS",
    "Scorer",
    "as_scorer",
    "clc",
    "fact_record",
    "generate_record",
    "generation_rule",
    "gold_indices",
    "in_english",
    "klar_decided",
    "klar_match",
    "klar_prompt",
    "klar_record",
    "metric_summary",
    "rankc",
    "rankc_fact",
    "skip_reason",
    "split_usable",
]

METRICS: tuple[str, ...] = ("generate", "klar", "rank")
#: the KLAR reference code's generation length
KLAR_MAX_NEW_TOKENS = 10
#: the KLAR reference code's demonstrations per query
KLAR_SHOTS = 3

SKIP_NO_STEM = "no text before the mask (generation needs a prompt to continue)"
SKIP_NO_CANDIDATES = "no candidates to rank"
SKIP_GOLD_MISSING = "the gold answer is not among the candidates"
SKIP_NO_BOS = "the mask opens the sentence and the model adds no BOS"


@dataclass(frozen=True)
class Scorer:
    """How facts are scored: the metric and its options.

    Attributes:
        metric: ``"generate"``, ``"klar"`` or ``"rank"`` (see the module docstring).
        rank_tokens: under ``rank``, average the cross-entropy over the whole
            ``"sentence"`` (the reference code's rule) or the ``"candidate"``'s tokens only.
        klar_shots: under ``klar``, demonstrations per query (the benchmark uses 3).
    """

    metric: str = "generate"
    rank_tokens: str = "sentence"
    klar_shots: int = KLAR_SHOTS

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise InputError(f"unknown metric {self.metric!r}", fix=f"use one of {list(METRICS)}")
        if self.rank_tokens not in ("sentence", "candidate"):
            raise InputError(
                f"rank_tokens must be 'sentence' or 'candidate', got {self.rank_tokens!r}"
            )
        if self.klar_shots < 0:
            raise InputError(f"klar_shots must be >= 0, got {self.klar_shots}")

    def to_json(self) -> dict[str, Any]:
        """The scorer as JSON: ``metric`` and the settings that metric uses."""
        out: dict[str, Any] = {"metric": self.metric}
        if self.metric == "rank":
            out["rank_tokens"] = self.rank_tokens
        if self.metric == "klar":
            out["klar_shots"] = self.klar_shots
            out["max_new_tokens"] = KLAR_MAX_NEW_TOKENS
        return out


def as_scorer(metric: str | Scorer) -> Scorer:
    """A :class:`Scorer` from a metric name (default options) or a scorer."""
    return metric if isinstance(metric, Scorer) else Scorer(str(metric))


def gold_indices(fact: Fact) -> list[int]:
    """Indices of the candidates that are gold (the answer or an alias, compared stripped)."""
    golds = {a.strip() for a in fact.answers}
    return [i for i, c in enumerate(fact.candidates) if c.strip() in golds]


def skip_reason(fact: Fact, metric: str, *, bos: bool = True, prefix: str = "") -> str | None:
    """Why ``metric`` cannot score ``fact`` (``None`` when it can)."""
    if metric in ("generate", "klar"):
        return SKIP_NO_STEM if not fact.prompt else None
    if not fact.candidates:
        return SKIP_NO_CANDIDATES
    if not gold_indices(fact):
        return SKIP_GOLD_MISSING
    if not fact.prompt and not prefix and not bos:
        return SKIP_NO_BOS
    return None


def split_usable(
    facts: Sequence[Fact], metric: str, *, bos: bool = True, prefixes: Sequence[str] | None = None
) -> tuple[list[int], dict[str, int]]:
    """The indices of the facts ``metric`` can score, and the others counted by reason.

    Raises:
        InputError: every fact is skipped (the message gives the reasons).
    """
    keep: list[int] = []
    skipped: dict[str, int] = {}
    for i, f in enumerate(facts):
        why = skip_reason(f, metric, bos=bos, prefix=prefixes[i] if prefixes else "")
        if why is None:
            keep.append(i)
        else:
            skipped[why] = skipped.get(why, 0) + 1
    if facts and not keep:
        reasons = "; ".join(f"{n} x {why}" for why, n in skipped.items())
        raise InputError(
            f"--metric {metric} can score none of the {len(facts)} records ({reasons})",
            fix="rank needs records with candidates (the gold among them); generate and klar "
            "need a prompt before the answer",
        )
    return keep, skipped


# --------------------------------------------------------------------------------------
# An answer given in English (the eval rule itself: mechlingo.core.answers)
# --------------------------------------------------------------------------------------


def in_english(f: Fact, correct: bool, said: str, match: Callable[[str, str], bool]) -> bool:
    """Whether a wrong answer ``said`` is the fact's English answer instead (``match``
    decides, e.g. the eval rule)."""
    return (
        f.lang != "en"
        and not correct
        and bool(f.answer_en)
        and normalize(f.answer_en) != normalize(f.answer)
        and match(said, f.answer_en)
    )


# --------------------------------------------------------------------------------------
# One fact's record under each metric (the keys: mechlingo.scoring.evaluate.EvalResult)
# --------------------------------------------------------------------------------------


def fact_record(
    f: Fact, prompt: str, generation: str, correct: bool, in_en: bool
) -> dict[str, Any]:
    """The keys every metric's record of ``f`` has, in their order (see
    :class:`~mechlingo.scoring.evaluate.EvalResult`)."""
    return {
        "id": f.id,
        "relation": f.relation,
        "lang": f.lang,
        "prompt": prompt,
        "answer": f.answer,
        "generation": generation,
        "correct": correct,
        "in_english": in_en,
    }


def generate_record(f: Fact, prompt: str, generation: str) -> dict[str, Any]:
    """``f``'s record under the eval rule, from its greedy continuation of ``prompt``: the
    first line as ``generation``, whether it is correct (:func:`is_correct`) and whether a
    wrong one is the English answer (:func:`in_english`)."""
    first_line = generation.strip().split("\n")[0] if generation.strip() else ""
    correct = is_correct(generation, f.answers, f.lang)
    in_en = in_english(f, correct, generation, lambda g, a: is_correct(g, [a], "en"))
    return fact_record(f, prompt, first_line, correct, in_en)


def klar_record(f: Fact, prompt: str, generation: str) -> dict[str, Any]:
    """``f``'s record under KLAR's rule (:func:`klar_match` against each answer), from its
    continuation of the few-shot ``prompt``; ``shots`` counts the prompt's demonstrations."""
    correct = any(klar_match(generation, a) for a in f.answers)
    in_en = in_english(f, correct, generation, klar_match)
    rec = fact_record(f, prompt, generation.strip(), correct, in_en)
    return {**rec, "shots": prompt.count("\n")}


# --------------------------------------------------------------------------------------
# KLAR
# --------------------------------------------------------------------------------------


def klar_normalize(text: str) -> str:
    """The reference code's normalisation: lower-cased, surrounding whitespace stripped."""
    return text.lower().strip()


def _prefix_of(short: str, long: str) -> bool:
    return bool(short) and long.startswith(short)


def klar_match(prediction: str, target: str) -> bool:
    """KLAR's verdict: after :func:`klar_normalize`, the prediction is a non-empty prefix of
    the target or the target a non-empty prefix of the prediction."""
    p, t = klar_normalize(prediction), klar_normalize(target)
    return _prefix_of(p, t) or _prefix_of(t, p)


def klar_decided(text: str, targets: Sequence[str]) -> bool:
    """Whether the verdicts of :func:`klar_match` on a *partial* continuation ``text``
    against every target are final whatever is generated next: for each target the
    normalised text already starts with it (right for good) or has left it (wrong for
    good); a text that is still a proper prefix of a target is open. Used to stop decoding
    early; equals the verdicts of the full continuation (tested)."""
    if text.endswith("\ufffd") or "Σ" in text:  # an unfinished character; final-sigma casing
        return False
    p = klar_normalize(text)
    if not p:
        return False
    for t in targets:
        tn = klar_normalize(t)
        if tn.startswith(p) and len(p) < len(tn):
            return False
    return True


def klar_prompt(fact: Fact, pool: Iterable[Fact], k: int = KLAR_SHOTS, seed: int = SEED) -> str:
    """The KLAR few-shot prompt: up to ``k`` demonstrations (facts of ``pool`` with the same
    relation and language, another id and a prompt), each ``prompt + " " + answer + "\\n"``,
    then the query's prompt. Fewer than ``k`` when the pool has fewer, as in the reference
    code; drawn with a generator seeded by ``seed`` and the query's id."""
    by_id: dict[str, Fact] = {}
    for other in pool:
        if (
            other.relation == fact.relation
            and other.lang == fact.lang
            and other.id != fact.id
            and other.prompt
        ):
            by_id.setdefault(other.id, other)
    cands = [by_id[i] for i in sorted(by_id)]
    demos = random.Random(f"{seed}|{fact.id}").sample(cands, min(k, len(cands)))
    return "".join(f"{d.prompt} {d.answer}\n" for d in demos) + fact.prompt


def clc(records: Sequence[Mapping[str, Any]], reference: str = "en") -> dict[str, dict[str, Any]]:
    """KLAR's cross-lingual consistency per language: the Jaccard overlap of the fact ids it
    answers correctly with those ``reference`` (English) answers correctly, over the ids
    scored in both, with a percentile bootstrap interval over those ids
    (``{lang: {"estimate", "lo", "hi", "n", "confidence", "both", "either"}}``: an
    :class:`~mechlingo.kernels.significance.Interval` as JSON; 0 when neither gets any
    right, as in the reference code). Empty without reference records."""
    by_lang: dict[str, dict[str, bool]] = {}
    for r in records:
        by_lang.setdefault(r["lang"], {})[r["id"]] = bool(r["correct"])
    ref = by_lang.get(reference)
    if not ref:
        return {}
    out = {}
    for lg, got in sorted(by_lang.items()):
        ids = sorted(set(got) & set(ref))
        both = [float(got[i] and ref[i]) for i in ids]
        either = [float(got[i] or ref[i]) for i in ids]
        stats = bootstrap_ratio(both, either)
        out[lg] = {**stats.to_json(), "both": int(sum(both)), "either": int(sum(either))}
    return out


# --------------------------------------------------------------------------------------
# What a generation metric decodes and records
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GenerationRule:
    """How a generation metric (``generate``, ``klar``) scores facts: each fact's text to
    continue, the greedy tokens at most and whether a line break ends them, the early-stop
    test ``stop(i, text)`` (``None``: decode in full) and the record of a fact's
    continuation, ``record(fact, text, generation)``."""

    texts: list[str]
    max_new_tokens: int
    stop_at_newline: bool
    stop: Callable[[int, str], bool] | None
    record: Callable[[Fact, str, str], dict[str, Any]]


def generation_rule(
    scorer: Scorer,
    facts: Sequence[Fact],
    texts: Sequence[str],
    pool: Sequence[Fact],
    *,
    max_new_tokens: int,
    early_stop: bool,
) -> GenerationRule:
    """The :class:`GenerationRule` of ``scorer`` on ``facts``. ``generate`` continues
    ``texts`` (one per fact) for ``max_new_tokens`` up to a line break and stops early once
    :func:`~mechlingo.core.answers.decided`; ``klar`` continues its few-shot prompts
    (:func:`klar_prompt`, the demonstrations drawn from ``pool``) for
    :data:`KLAR_MAX_NEW_TOKENS` and stops early once
    :func:`klar_decided` against the answers and the English answer.

    Raises:
        InputError: ``scorer`` ranks candidates (it generates nothing)."""
    if scorer.metric not in ("generate", "klar"):
        raise InputError(f"{scorer.metric!r} is not a generation metric")
    facts = list(facts)
    if scorer.metric == "klar":
        prompts = [klar_prompt(f, pool, scorer.klar_shots) for f in facts]
        targets = [[*f.answers, *([f.answer_en] if f.answer_en else [])] for f in facts]
        klar_stop = (lambda i, text: klar_decided(text, targets[i])) if early_stop else None
        return GenerationRule(prompts, KLAR_MAX_NEW_TOKENS, False, klar_stop, klar_record)
    stop = (
        (lambda i, text: decided(text, facts[i].answers, facts[i].lang, facts[i].answer_en))
        if early_stop
        else None
    )
    return GenerationRule(list(texts), max_new_tokens, True, stop, generate_record)


# --------------------------------------------------------------------------------------
# RankC
# --------------------------------------------------------------------------------------


def rankc_weights(n: int) -> np.ndarray:
    """Qi et al.'s weights of the top-j overlaps: ``softmax(n, n-1, ..., 1)``."""
    order = np.arange(n, 0, -1, dtype=float)
    e = np.exp(order - order.max())
    return e / e.sum()


def rankc_fact(ranking_a: Sequence[int], ranking_b: Sequence[int]) -> float:
    """RankC of one fact: ``sum_j w_j |top_j(a) & top_j(b)| / j`` over ``j = 1..n``, where
    ``top_j`` is the set of the ``j`` best candidates (by index into the candidate list,
    which is aligned across languages) and ``w = softmax(n, ..., 1)``."""
    n = len(ranking_a)
    if n != len(ranking_b) or n == 0:
        raise InputError(f"rankings of different lengths: {len(ranking_a)} and {len(ranking_b)}")
    w = rankc_weights(n)
    total = 0.0
    for j in range(1, n + 1):
        total += w[j - 1] * len(set(ranking_a[:j]) & set(ranking_b[:j])) / j
    return float(total)


def rankc(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """RankC (Qi et al. 2023) for every pair of languages: the mean over the facts ranked in
    both (same id, same number of candidates) of :func:`rankc_fact`, with a bootstrap
    interval over those facts. Keys ``"a|b"`` with ``a < b``; each value an
    :class:`~mechlingo.kernels.significance.Interval` as JSON (``estimate``, ``lo``, ``hi``,
    ``n``, ``confidence``)."""
    by_lang: dict[str, dict[str, list[int]]] = {}
    for r in records:
        if r.get("ranking") is not None:
            by_lang.setdefault(r["lang"], {})[r["id"]] = list(r["ranking"])
    langs = sorted(by_lang)
    out = {}
    for i, a in enumerate(langs):
        for b in langs[i + 1 :]:
            ids = [
                k
                for k in sorted(set(by_lang[a]) & set(by_lang[b]))
                if len(by_lang[a][k]) == len(by_lang[b][k])
            ]
            vals = [rankc_fact(by_lang[a][k], by_lang[b][k]) for k in ids]
            out[f"{a}|{b}"] = bootstrap_mean(vals).to_json()
    return out


# --------------------------------------------------------------------------------------
# Summaries
# --------------------------------------------------------------------------------------


def _by_lang(records: Sequence[Mapping[str, Any]], key: str) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for r in records:
        out.setdefault(r["lang"], []).append(r[key])
    return dict(sorted(out.items()))


def metric_summary(records: Sequence[Mapping[str, Any]], scorer: Scorer) -> dict[str, Any]:
    """The metric's own statistics over the records of one evaluation: for ``rank``, P@1
    (Wilson) and the gold candidate's mean rank (bootstrap) per language and RankC for every
    pair; for ``klar``, CLC per language against English. Empty for ``generate``."""
    if scorer.metric == "rank":
        p1 = {
            lg: wilson(sum(map(bool, v)), len(v)).to_json()
            for lg, v in _by_lang(records, "correct").items()
        }
        ranks = {
            lg: bootstrap_mean(v).to_json() for lg, v in _by_lang(records, "gold_rank").items()
        }
        return {"p_at_1": p1, "gold_rank": ranks, "rankc": rankc(records)}
    if scorer.metric == "klar":
        values = clc(records)
        non_en = [
            v["estimate"] for lg, v in values.items() if lg != "en" and v["estimate"] is not None
        ]
        return {"clc": values, "clc_mean_non_english": float(np.mean(non_en)) if non_en else None}
    return {}
