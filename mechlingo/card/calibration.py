"""The card's calibration harness: every row type's verdict procedure run on simulated data.

Each :class:`RowType` simulates per-item data in the card's real units (facts asked in
several languages with 0/1 outcomes, sentences in documents with continuous outcomes, pairs of
languages, populations of random draws) and hands it to the card's own tests
(:mod:`mechlingo.card.clustered_tests`, :func:`mechlingo.card.stages.experts.rank_test`) and to the
card's own verdict (:func:`mechlingo.card.rules.verdict`, at the row's adjusted level), twice:
under the row's null (the effect exactly at its threshold, the effect no better than its
control, or for a null claim an effect exactly at its margin) and under the claim's truth.
:func:`calibrate` returns, per row type, design and multiplier, the rate of ``holds`` under
the null (a type-I error: at most ``0.05 / k``), the rate of ``does not hold`` under the truth
(at most ``0.05 / k`` too), the power (``holds`` under the truth) and the coverage of the 95%
intervals of the true value (at least 0.93), each with its Monte Carlo standard error.
``scripts/calibrate.py`` (``make calibrate``) writes the table of ``docs/calibration.md``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np

from mechlingo.card import claims as C
from mechlingo.card.clustered_tests import (
    Test,
    cluster_bootstrap,
    group_difference_test,
    mean_test,
    paired_test,
)
from mechlingo.card.population import by_rank, population_gain_test, rank_population_test
from mechlingo.card.rules import ALPHA, HOLDS, NOT_HOLDS, RETAINED_SHARE, verdict
from mechlingo.card.stages.align import _row_ratio
from mechlingo.card.stages.experts import overlap_test, rank_test
from mechlingo.card.stages.repair_controls import relative_tests
from mechlingo.card.stages.transfer import retained_test
from mechlingo.core.defaults import SEED
from mechlingo.core.errors import InputError

__all__ = [
    "DESIGNS",
    "ROW_TYPES",
    "Design",
    "Outcome",
    "RowType",
    "calibrate",
    "cluster_sizes",
    "run_row",
    "table_markdown",
]

#: The least coverage of a nominal 95% interval that the card accepts.
MIN_COVERAGE = 0.93


def cluster_sizes(g: int, shape: str, mean: int, cap: int | None = None) -> tuple[int, ...]:
    """Items per cluster of ``g`` clusters averaging about ``mean`` items: ``balanced`` (all
    ``mean``), ``unbalanced`` (evenly spread from 1 to ``2 mean - 1``: a ratio of up to
    ``2 mean - 1`` between the largest and the smallest), ``skewed`` (halving: the largest
    cluster holds about half the items, the smallest one item). ``cap``: at most that many
    (a fact has at most one item per language)."""
    if g < 2 or mean < 1:
        raise InputError(f"need at least 2 clusters of at least 1 item, got {g} of {mean}")
    if shape == "balanced":
        n = np.full(g, mean)
    elif shape == "unbalanced":
        n = np.rint(np.linspace(1, 2 * mean - 1, g))
    elif shape == "skewed":
        w = 0.5 ** np.arange(g)
        n = np.maximum(1, np.rint(w / w.sum() * g * mean))
    else:
        raise InputError(
            f"unknown cluster shape {shape!r}", fix="use balanced, unbalanced or skewed"
        )
    if cap is not None:
        n = np.minimum(n, cap)
    return tuple(int(x) for x in n)


@dataclass(frozen=True)
class Design:
    """The units of one simulated row: ``unit`` (facts, documents, draws), the items of each
    cluster (``sizes``), and ``shape`` (how ``sizes`` was made) for the table."""

    unit: str
    shape: str
    sizes: tuple[int, ...]

    @property
    def g(self) -> int:
        """The number of clusters."""
        return len(self.sizes)

    @property
    def codes(self) -> np.ndarray:
        """Each item's cluster, ``0..g-1``."""
        return np.repeat(np.arange(self.g), self.sizes)

    @property
    def name(self) -> str:
        """``"8 facts, unbalanced (1-5 items)"``."""
        lo, hi = min(self.sizes), max(self.sizes)
        span = f"{lo} items" if lo == hi else f"{lo}-{hi} items"
        return f"{self.g} {self.unit}, {self.shape} ({span})"


def _facts(g: int, shape: str) -> Design:
    """Facts in 5 non-English languages (balanced) or in 1 to 5 of them (unbalanced, skewed)."""
    return Design("facts", shape, cluster_sizes(g, shape, 3 if shape != "balanced" else 5, cap=5))


def _docs(g: int, shape: str) -> Design:
    """Documents of 10 sentences (balanced), 1 to 19 (unbalanced), or one holding half."""
    return Design("documents", shape, cluster_sizes(g, shape, 10))


#: The designs of each unit: 8 to 60 clusters, balanced, unbalanced and skewed.
DESIGNS: dict[str, tuple[Design, ...]] = {
    "facts": tuple(_facts(g, s) for g in (8, 24, 60) for s in ("balanced", "unbalanced")),
    "documents": tuple(
        _docs(g, s) for g in (8, 12, 24) for s in ("balanced", "unbalanced", "skewed")
    ),
    "single facts": tuple(Design("facts", "balanced", (n,) * g) for g in (24, 60) for n in (1, 2)),
}


@dataclass(frozen=True)
class Outcome:
    """One simulated row: its verdict, the 95% interval of the judged estimate (``None``
    when undefined) and the true value it estimates."""

    verdict: str
    lo: float | None
    hi: float | None
    truth: float


Sample = dict[str, Any]
Simulate = Callable[[np.random.Generator, Design, int, bool], list[Sample]]
Judge = Callable[[Sample], "Judged"]


@dataclass(frozen=True)
class RowType:
    """One kind of card row: which claim it judges, what the card calls, the designs it is
    run on, and how one sample is drawn (``simulate(rng, design, reps, truth)``) and judged
    (``judge(sample)``: the tests the card's stage makes, judged by its verdict); ``stage``:
    the stage function that builds the card rows it stands for."""

    name: str
    claim: str
    calls: str
    designs: tuple[Design, ...]
    simulate: Simulate
    judge: Judge
    null: str
    truth: str
    stage: str = ""


# --------------------------------------------------------------------------------------
# Simulated outcomes
# --------------------------------------------------------------------------------------


def _spread(rng: np.random.Generator, reps: int, g: int, centre: float, half: float) -> np.ndarray:
    """``[reps, g]`` cluster values ``centre + half (2 B - 1)``, ``B ~ Beta(2, 2)``: mean
    ``centre`` exactly, bounded by ``centre +/- half`` (so probabilities stay in [0, 1])."""
    return centre + half * (2 * rng.beta(2.0, 2.0, (reps, g)) - 1)


def _arms(
    rng: np.random.Generator, probs: Sequence[np.ndarray], rho: float = 0.7
) -> list[np.ndarray]:
    """0/1 outcomes of several conditions on the same items: condition ``j`` is 1 when a
    uniform is below ``probs[j]``; the uniform is the item's own (shared by every condition)
    with probability ``rho``, else a fresh one. Each condition's mean is ``probs[j]``; the
    conditions of an item are positively dependent, as an intervention's are, and
    exchangeable where their probabilities are equal."""
    shape = probs[0].shape
    u0 = rng.random(shape)
    out = []
    for p in probs:
        u = np.where(rng.random(shape) < rho, u0, rng.random(shape))
        out.append((u < p).astype(float))
    return out


def _split(arrays: Sequence[np.ndarray], ids: np.ndarray, **fixed: Any) -> list[Sample]:
    """One sample per repetition: ``{"arrays": [a[r] for a], "ids": ids, **fixed}``."""
    return [{"arrays": [a[r] for a in arrays], "ids": ids, **fixed} for r in range(len(arrays[0]))]


@dataclass(frozen=True)
class Judged:
    """One simulated row as the card judges it: the claim, the effect's test, the effect -
    control test (or ``None``), the test whose 95% interval estimates ``truth``."""

    claim: C.Claim
    effect: Test | None
    vs: Test | None
    shown: Test | None
    truth: float

    def outcome(self, k: float) -> Outcome:
        """The card's verdict at multiplier ``k`` with the 95% interval of ``shown``."""
        v, _ = verdict(self.claim, self.effect, self.vs, k)
        iv = None if self.shown is None else self.shown.estimate
        lo, hi = (iv.lo, iv.hi) if iv is not None and iv.defined else (None, None)
        return Outcome(v, lo, hi, self.truth)


def _judged(claim: C.Claim, effect: Test | None, truth: float, vs: Test | None = None,
            shown: Test | None = None) -> Judged:  # fmt: skip
    return Judged(claim, effect, vs, shown or effect, truth)


# paired 0/1 gains, clustered by fact ---------------------------------------------------

_P0, _P_HALF = 0.4, 0.25  # the baseline accuracy of a fact: 0.15 to 0.65
_GAIN = 0.15  # the true gain of a vector that works
_TAU = 0.1  # how far a fact's own gain strays from the mean gain


def _sim_paired(rng: np.random.Generator, d: Design, reps: int, truth: bool) -> list[Sample]:
    codes = d.codes
    p = _spread(rng, reps, d.g, _P0, _P_HALF)
    gain = _spread(rng, reps, d.g, _GAIN if truth else 0.0, _TAU)
    base, new = _arms(rng, [p[:, codes], (p + gain)[:, codes]])
    return _split([base, new], codes, truth=_GAIN if truth else 0.0)


def _judge_paired(s: Sample) -> Judged:
    base, new = s["arrays"]
    return _judged(C.BOTH_BEAT_SINGLE, paired_test(base, new, s["ids"]), s["truth"])


# a 0/1 share against one half (latent English, recall failures) ------------------------

_SHARE = 0.65


def _sim_share(rng: np.random.Generator, d: Design, reps: int, truth: bool) -> list[Sample]:
    codes = d.codes
    centre = _SHARE if truth else 0.5
    p = _spread(rng, reps, d.g, centre, 0.3)
    (x,) = _arms(rng, [p[:, codes]])
    return _split([x], codes, truth=centre)


def _judge_share(s: Sample) -> Judged:
    """``recall_failures`` (and the decoders' rows): ``mean_test`` against 1/2, no control,
    as ``rows_trace`` and ``rows_decoders`` call it."""
    c = C.RECALL_FAILURES
    return _judged(c, mean_test(s["arrays"][0], s["ids"], null=c.null_value), s["truth"])


_CTL_NULL, _CTL_TRUE = 0.35, 0.5  # the mismatched-fact control's share: null, truth


def _sim_share_control(rng: np.random.Generator, d: Design, reps: int,
                       truth: bool) -> list[Sample]:  # fmt: skip
    """The English-first share and its control (the mismatched fact's English answer) on the
    same queries: at the threshold with the control beaten (null), or {_SHARE} against a
    control at 1/2 (truth: the planner's case)."""
    codes = d.codes
    centre, ctl = (_SHARE, _CTL_TRUE) if truth else (0.5, _CTL_NULL)
    p = _spread(rng, reps, d.g, 0.5, 0.15)
    real, control = _arms(rng, [(p + centre - 0.5)[:, codes], (p + ctl - 0.5)[:, codes]])
    return _split([real, control], codes, truth=centre)


def _judge_share_control(s: Sample) -> Judged:
    """``latent_english`` as ``rows_trace`` judges it: ``mean_test`` of the share against
    1/2 and ``paired_test(control, real)`` (the share beyond its control)."""
    c = C.LATENT_ENGLISH
    real, ctl = s["arrays"]
    eff = mean_test(real, s["ids"], null=c.null_value)
    return _judged(c, eff, s["truth"], paired_test(ctl, real, s["ids"]), eff)


# a continuous mean, sentences in documents (restored log-probability, distances) ----------

_SD_DOC, _SD_SENT, _MEAN = 1.0, 0.5, 0.6


def _sim_mean(rng: np.random.Generator, d: Design, reps: int, truth: bool) -> list[Sample]:
    """Per-sentence values (document SD ``_SD_DOC``, sentence SD ``_SD_SENT``) of mean 0
    (null) or ``_MEAN`` (truth), and a control on the same sentences (half the document
    effect shared): ``_MEAN`` below the effect under the null (only the effect half can
    stop the row), at 0 under the truth."""
    codes = d.codes
    mu = _MEAN if truth else 0.0
    doc = rng.normal(0, _SD_DOC, (reps, d.g))[:, codes]
    y = mu + doc + rng.normal(0, _SD_SENT, doc.shape)
    ctl = (0.0 if truth else -_MEAN) + 0.5 * doc + rng.normal(0, _SD_SENT, doc.shape)
    return _split([y, ctl], codes, truth=mu)


def _judge_mean(s: Sample) -> Judged:
    """``conversion_causal`` as ``rows_conversion`` judges it: ``mean_test`` of the restored
    log-probability and ``paired_test(control, band)`` (beyond the random sites)."""
    c = C.CONVERSION_CAUSAL
    y, ctl = s["arrays"]
    eff = mean_test(y, s["ids"], null=c.null_value)
    return _judged(c, eff, s["truth"], paired_test(ctl, y, s["ids"]), eff)


_DRAW_GAIN, _DRAW_SD = 0.03, 0.02  # the random vectors' mean gain and its spread over draws
_HALF_SD = math.sqrt(5)  # the half-width of a _spread whose SD is 1 (Var(2B - 1) = 1/5)


# a relative gain in the lowest language (one or two items per fact) -------------------

_LOW = 0.3  # the lowest language's baseline accuracy
_REL_TRUE = 1.0  # a vector that doubles it


def _sim_relative(rng: np.random.Generator, d: Design, reps: int, truth: bool,
                  m: int = 100, draw_gain: float = _DRAW_GAIN) -> list[Sample]:  # fmt: skip
    """The lowest language's baseline, 'both' at ``1 + rel`` times it, and ``m`` random
    draws of 'both' (each its own gain, ``_DRAW_GAIN`` +/- ``_DRAW_SD`` in points)."""
    codes = d.codes
    rel = _REL_TRUE if truth else C.LOWEST_LANGUAGE.threshold
    p = _spread(rng, reps, d.g, _LOW, 0.15)
    gains = _spread(rng, reps, m, draw_gain, _HALF_SD * _DRAW_SD)
    probs = [p[:, codes], ((1 + rel) * p)[:, codes]]
    probs += [(p + gains[:, [j]])[:, codes] for j in range(m)]
    out = _arms(rng, probs)
    stacked = np.stack(out[2:], axis=1)
    return [{"arrays": [out[0][r], out[1][r], stacked[r]], "ids": codes, "truth": rel}
            for r in range(reps)]  # fmt: skip


def _judge_relative(s: Sample) -> Judged:
    """``lowest_language`` (relative) through the repair stage's own ``relative_tests``:
    ``relative_test`` against +35% (a testable zero when nothing changes; not testable with
    a baseline of 0), ranked among the draws by ``rank_population_test``."""
    c = C.LOWEST_LANGUAGE
    base, new, draws = s["arrays"]
    eff, _, vs, _ = relative_tests(c, base, new, draws, s["ids"])
    return _judged(c, eff, s["truth"], vs, eff)


# a ratio of sums: the share of the in-pool gain that held-out vectors keep --------------

_KEPT = 0.9


def _sim_ratio(rng: np.random.Generator, d: Design, reps: int, truth: bool) -> list[Sample]:
    codes = d.codes
    share = _KEPT if truth else RETAINED_SHARE
    p = _spread(rng, reps, d.g, 0.35, 0.2)  # at most 0.55 + a gain of 0.4: no clipping
    gain = _spread(rng, reps, d.g, 0.3, _TAU)
    orig, pool, held = _arms(rng, [p[:, codes], (p + gain)[:, codes],
                                   (p + share * gain)[:, codes]])  # fmt: skip
    return _split([held - orig, pool - orig], codes, truth=share)


def _judge_ratio(s: Sample) -> Judged:
    """The retained share through the transfer stage's own ``retained_test``: ``ratio_test``
    against 0.5, not testable when the in-pool gain is not shown above 0."""
    c = replace(C.INDEPENDENT_RELATIONS, threshold=RETAINED_SHARE)
    num, den = s["arrays"]
    t, _, _ = retained_test(num, den, s["ids"])
    return _judged(c, t, s["truth"])


# an effect against a population of random draws (task, diff, both; the clamps) ---------


def _population(rng: np.random.Generator, d: Design, reps: int, truth: bool, m: int,
                null_gain: float = _DRAW_GAIN) -> list[Sample]:  # fmt: skip
    """Base, effect and ``m`` random draws on the same facts: each draw's gain is its own
    (``_DRAW_SD`` apart), the effect's is one more draw's (null) or ``_GAIN`` above the
    draws' mean (truth)."""
    codes = d.codes
    p = _spread(rng, reps, d.g, _P0, _P_HALF)
    gains = _spread(rng, reps, m + 1, null_gain, _HALF_SD * _DRAW_SD)  # SD _DRAW_SD
    if truth:
        gains[:, 0] = null_gain + _GAIN
    probs = [p[:, codes]] + [(p + gains[:, [j]])[:, codes] for j in range(m + 1)]
    out = _arms(rng, probs)
    stacked = np.stack(out[2:], axis=1)  # [reps, draw, item]
    # the target of effect - population mean: the effect's own gain over the draws' mean
    # gain (under the null, one more draw: its own deviation from that mean, not 0)
    return [{"arrays": [out[0][r], out[1][r], stacked[r]], "ids": codes,
             "truth": float(gains[r, 0] - null_gain), "gain": null_gain + (_GAIN if truth else 0.0)}
            for r in range(reps)]  # fmt: skip


def _judge_population(s: Sample) -> Judged:
    """``task_vector`` as the repair stage judges it (and the transfer, external, experts
    and align stages their rows): ``paired_test`` of the gain and ``rank_population_test``
    (the effect's exact rank among the draws) of effect against the draws."""
    c = C.TASK_VECTOR
    base, new, draws = s["arrays"]
    vs = rank_population_test(new, draws, s["ids"], base=base, direction=c.direction)
    return _judged(c, paired_test(base, new, s["ids"]), s["truth"], vs, vs)


_SHIFT = 0.5  # the clamp's true shift of a standardised per-sentence distance (paired d)


def _sim_population_docs(rng: np.random.Generator, d: Design, reps: int, truth: bool,
                         m: int = 20, shift: float = _SHIFT) -> list[Sample]:  # fmt: skip
    """Continuous per-sentence outcomes in documents before ('pre') and after the clamp and
    ``m`` random clamps (document SD 0.55, sentence SD 0.84: ICC 0.3, total SD 1; each
    condition's sentence noise shares 0.7 of its variance with pre's): each random clamp
    shifts by its own N(0, 0.02), the clamp by one more (null) or by ``-_SHIFT`` (truth: the
    distances fall)."""
    codes, n = d.codes, len(d.codes)
    doc = rng.normal(0, math.sqrt(0.3), (reps, d.g))[:, codes]
    shared = rng.normal(0, 1, (reps, n))
    shifts = rng.normal(0, _DRAW_SD, (reps, m + 1))
    if truth:
        shifts[:, 0] = -shift

    def arm(shift: np.ndarray | float) -> np.ndarray:
        noise = math.sqrt(0.7) * shared + math.sqrt(0.3) * rng.normal(0, 1, (reps, n))
        return doc + shift + math.sqrt(0.7) * noise

    pre = arm(0.0)
    arms = [arm(shifts[:, [j]]) for j in range(m + 1)]
    stacked = np.stack(arms[1:], axis=1)
    return [{"arrays": [pre[r], arms[0][r], stacked[r]], "ids": codes,
             "truth": float(shifts[r, 0])} for r in range(reps)]  # fmt: skip


def _judge_population_docs(s: Sample) -> Judged:
    """``clamp_closer`` as ``rows_align`` judges it: ``paired_test(pre, post, docs)`` and
    ``rank_population_test`` of post among the random clamps, direction down."""
    c = C.CLAMP_CLOSER
    pre, post, draws = s["arrays"]
    vs = rank_population_test(post, draws, s["ids"], base=pre, direction=c.direction)
    return _judged(c, paired_test(pre, post, s["ids"]), s["truth"], vs, vs)


def _sim_equivalence(rng: np.random.Generator, d: Design, reps: int, truth: bool,
                     m: int) -> list[Sample]:  # fmt: skip
    """The random population's own gain: at the margin (null) or 0 (truth)."""
    g0 = 0.0 if truth else float(C.RANDOM_VECTOR.margin or 0.0)
    out = _population(rng, d, reps, False, m, null_gain=g0)
    return [{**s, "truth": g0} for s in out]


def _judge_equivalence(s: Sample) -> Judged:
    c = C.RANDOM_VECTOR
    base, _, draws = s["arrays"]
    t = population_gain_test(base, draws, s["ids"], null=c.null_value)
    return _judged(c, t, s["truth"])


# an effect's statistic ranked among m random draws' (AUROC of experts vs random neurons) --

_AUROC_SD, _AUROC_GAIN = 0.03, 0.1


def _sim_rank(rng: np.random.Generator, d: Design, reps: int, truth: bool) -> list[Sample]:
    m = d.g
    x = 0.5 + rng.normal(0, _AUROC_SD, (reps, m + 1))
    delta = _AUROC_GAIN if truth else 0.0
    x[:, 0] += delta
    return [{"arrays": [x[r]], "ids": None, "truth": delta} for r in range(reps)]


def _judge_rank(s: Sample, exact: bool = False) -> Judged:
    """The control half as ``rows_experts`` (``experts_exist``) and the align stage
    (``retrieval_gain_max``, ``exact``) judge it: ``by_rank(rank_test(effect, draws))``, the
    effect's exact rank among the draws. The effect half (the stage's own test of the AUROC
    against 0.5, or of the maximum against 2) needs per-sentence data and is stood in for by
    ``rank_test`` itself (the effect above the draws' mean)."""
    x = s["arrays"][0]
    c = replace(C.EXPERTS_EXIST, threshold=0.0, sesoi=None)
    t = rank_test(float(x[0]), list(x[1:]), exact=exact)
    return _judged(c, t, s["truth"], by_rank(t), t)


# the overlap of the languages' expert sets (experts_disjoint) -----------------------------

_OVERLAP_SD, _OVERLAP_BELOW = 0.05, 0.05  # the pairs' spread; the truth's excess below 0.10


def _sim_overlap(rng: np.random.Generator, d: Design, reps: int, truth: bool) -> list[Sample]:
    """A symmetric matrix of the language pairs' excess overlap over chance, pairs ``N(mu,
    _OVERLAP_SD)``: ``mu`` at the threshold 0.10 (null) or ``_OVERLAP_BELOW`` under it."""
    n, c = d.g, C.EXPERTS_DISJOINT
    mu = c.threshold - (_OVERLAP_BELOW if truth else 0.0)
    out = []
    for _ in range(reps):
        m = np.triu(rng.normal(mu, _OVERLAP_SD, (n, n)), 1)
        out.append({"arrays": [m + m.T], "ids": None, "truth": mu})
    return out


def _judge_overlap(s: Sample) -> Judged:
    """``experts_disjoint`` as ``rows_experts`` judges it: ``overlap_test`` (languages as
    units, delete-one-language jackknife) below 0.10."""
    c = C.EXPERTS_DISJOINT
    return _judged(c, overlap_test(s["arrays"][0], c.null_value), s["truth"])


# a difference in differences (each vector on its own failure class) --------------------

_DID = 0.3


def _sim_did(rng: np.random.Generator, d: Design, reps: int, truth: bool) -> list[Sample]:
    codes = d.codes
    n = len(codes)
    p = _spread(rng, reps, d.g, _P0, 0.2)[:, codes]
    recall = rng.random((reps, n)) < 0.5
    a = np.where(recall, 0.2 + (_DID / 2 if truth else 0.0), 0.2)  # the task vector's gain
    b = np.where(recall, 0.2, 0.2 + (_DID / 2 if truth else 0.0))  # the diff vector's gain
    task, diff = _arms(rng, [p + a, p + b])
    groups = np.where(recall, "recall_failure", "translation_failure")
    return [{"arrays": [task[r] - diff[r], groups[r]], "ids": codes,
             "truth": _DID if truth else 0.0} for r in range(reps)]  # fmt: skip


def _judge_did(s: Sample) -> Judged:
    y, groups = s["arrays"]
    t = group_difference_test(y, list(groups), s["ids"], "recall_failure", "translation_failure")
    return _judged(C.TASK_REPAIRS_RECALL, t, s["truth"])


# cluster-bootstrap rows: a mean over sentences, a median over language pairs --------------


def _judge_boot_mean(s: Sample, resamples: int = 2000) -> Judged:
    c = C.CONVERSION_CAUSAL
    y = np.asarray(s["arrays"][0])[:, None]
    t = cluster_bootstrap(y, s["ids"], lambda r: float(r.mean()), null=c.null_value,
                          n_resamples=resamples)  # fmt: skip
    return _judged(c, t, s["truth"])


_PAIRS = 12  # ordered pairs of 4 languages
_PAIR_GAINS = np.linspace(-0.3, 0.3, _PAIRS)  # relative top-1 gains: median 0 (null)
_MEDIAN_TRUE = 0.3


def _sim_pairs(rng: np.random.Generator, d: Design, reps: int, truth: bool) -> list[Sample]:
    """Top-1 hits of every sentence and ordered pair before the clamp, after it and after a
    random clamp: pair ``j``'s hit rate rises by the factor ``1 + r_j`` (median of ``r``: 0
    or ``_MEDIAN_TRUE``), the random clamp's by ``1 - _MEDIAN_TRUE`` (null: only the effect
    half can stop the row) or 1 (truth); each document shifts its pairs' rates together."""
    codes = d.codes
    r = _PAIR_GAINS + (_MEDIAN_TRUE if truth else 0.0)
    q = np.clip(_spread(rng, reps, d.g, 0.4, 0.2)[:, codes, None], 0, 1)  # [reps, sent, 1]
    pre, post, ctl = _arms(rng, [np.broadcast_to(q, q.shape[:2] + (_PAIRS,)), q * (1 + r),
                                 q * (1.0 if truth else 1 - _MEDIAN_TRUE)])  # fmt: skip
    return [{"arrays": [pre[i], post[i], ctl[i]], "ids": codes,
             "truth": float(np.median(r))} for i in range(reps)]  # fmt: skip


def _judge_pairs(s: Sample) -> Judged:
    """``retrieval_gain_median`` built by the align stage's own row builder (``_row_ratio``:
    ``cluster_bootstrap`` of the median over pairs of post / pre - 1, and of the clamp minus
    the random clamp), judged from the row's tests."""
    c = C.RETRIEVAL_GAIN_MEDIAN
    pre, post, ctl = s["arrays"]
    data = {"pre": {"hits": pre.T}, "post": {"hits": post.T}, "control": {"hits": ctl.T},
            "pairs": [f"p{j}" for j in range(_PAIRS)], "docs": [str(x) for x in s["ids"]]}  # fmt: skip
    row = _row_ratio(data, "median")
    eff, vs = (
        None if row.get(k) is None else Test.from_json(row[k]) for k in ("value", "vs_control")
    )
    return _judged(c, eff, s["truth"], vs, eff)


# --------------------------------------------------------------------------------------
# The registry and the runner
# --------------------------------------------------------------------------------------


def _draw_designs(*ms: int) -> tuple[Design, ...]:
    return tuple(Design("draws", "population", (1,) * m) for m in ms)


_FACTS, _DOCS, _SINGLE = DESIGNS["facts"], DESIGNS["documents"], DESIGNS["single facts"]

#: Every row type of the card, with the designs it is simulated on.
ROW_TYPES: tuple[RowType, ...] = (
    RowType("paired 0/1", "both_beat_single, english_gap", "paired_test", _FACTS,
            _sim_paired, _judge_paired,
            "the same accuracy (exchangeable pairs, fact gains spread +/-0.1 around 0)",
            f"+{_GAIN:g} (fact gains +/-0.1 around it)", "repair._row_both_better, repair._row_gap"),
    RowType("0/1 share vs 1/2", "recall_failures, latent_english_tuned/_patchscope",
            "mean_test (null 0.5)", _FACTS, _sim_share, _judge_share,
            "a share of 0.5 (facts 0.2-0.8)", f"a share of {_SHARE:g}",
            "trace.rows_trace, decoders.rows_decoders"),
    RowType("0/1 share vs 1/2 with its control", "latent_english",
            "mean_test (null 0.5) + paired_test (control, share)", _FACTS, _sim_share_control,
            _judge_share_control, f"a share of 0.5, the control's {_CTL_NULL:g}",
            f"a share of {_SHARE:g}, the control's {_CTL_TRUE:g}", "trace.rows_trace"),
    RowType("continuous mean", "conversion_causal", "mean_test + paired_test (control, effect)",
            _DOCS, _sim_mean, _judge_mean,
            f"mean 0 (document SD {_SD_DOC:g}, sentence SD {_SD_SENT:g}), the control "
            f"{_MEAN:g} below", f"mean {_MEAN:g}, the control 0", "conversion.rows_conversion"),
    RowType("relative gain vs population (100 draws)", "lowest_language (relative)",
            "relative_tests: relative_test (null 0.35) + rank_population_test", _SINGLE,
            _sim_relative, _judge_relative, f"+35% over a baseline of {_LOW:g}",
            f"+{100 * _REL_TRUE:g}%", "repair_controls.rows_lowest (relative_tests)"),
    RowType("ratio of sums", "independent_* (retained share)",
            "retained_test: ratio_test (null 0.5)", _FACTS, _sim_ratio, _judge_ratio,
            "half the in-pool gain kept", f"{_KEPT:g} of it kept",
            "transfer._retained_row (retained_test)"),
    RowType("effect vs population (20 draws)",
            "task_vector, diff_vector, independent_* (held-out gain), external_*, "
            "lowest_language (points), clamp_steers", "paired_test + rank_population_test",
            _FACTS, partial(_population, m=20), _judge_population,
            f"the effect one more random draw (draw gains {_DRAW_GAIN:g} +/- {_DRAW_SD:g})",
            f"{_GAIN:g} above the draws' mean", "repair_controls.rows_repair, "
            "transfer.rows_transfer, external.rows_external, experts._row_steers"),
    RowType("effect vs population (100 draws)", "as above", "paired_test + rank_population_test",
            _FACTS[2:4], partial(_population, m=100), _judge_population,
            "the effect one more random draw", f"{_GAIN:g} above the draws' mean",
            "repair_controls.rows_repair"),
    RowType("continuous effect vs population (20 draws)",
            "clamp_closer, retrieval_improves, clamp_closer_centred",
            "paired_test + rank_population_test", _DOCS, _sim_population_docs,
            _judge_population_docs, "the clamp one more random clamp (shifts SD 0.02)",
            f"the distances {_SHIFT:g} SD down", "align.rows_align, align._row_closer"),
    RowType("equivalence", "random_vector, random_neurons", "population_gain_test (TOST)",
            _FACTS, partial(_sim_equivalence, m=20), _judge_equivalence,
            f"the random draws' gain at the margin, +{C.RANDOM_VECTOR.margin:g}", "no gain",
            "repair_controls.rows_repair, align.rows_align"),
    RowType("rank vs population (AUROC)", "experts_exist",
            "by_rank(rank_test) (effect: rank_test)", _draw_designs(20, 50, 100), _sim_rank,
            _judge_rank, "the effect one more draw (SD 0.03)", f"+{_AUROC_GAIN:g} over the draws",
            "experts.rows_experts"),
    RowType("rank vs population (maximum)", "retrieval_gain_max",
            "by_rank(rank_test(exact=True))", _draw_designs(20, 50, 100), _sim_rank,
            partial(_judge_rank, exact=True), "the effect one more draw (SD 0.03)",
            f"+{_AUROC_GAIN:g} over the draws", "align._row_ratio"),
    RowType("overlap (languages as units)", "experts_disjoint", "overlap_test (below 0.10)",
            tuple(Design("languages", "pairs", (1,) * n) for n in (5, 8, 12)), _sim_overlap,
            _judge_overlap, f"excess overlap at 0.10 (pairs SD {_OVERLAP_SD:g})",
            f"{_OVERLAP_BELOW:g} below it", "experts._row_disjoint"),
    RowType("difference in differences", "task_repairs_recall", "group_difference_test",
            _FACTS, _sim_did, _judge_did, "each vector's gain the same on both classes",
            f"a contrast of {_DID:g}", "repair._row_own_failure"),
    RowType("bootstrap mean", "the cluster-bootstrap procedure (consistency, "
            "distance_predicts_retrieval) on a mean whose truth is known",
            "cluster_bootstrap", _DOCS, _sim_mean, _judge_boot_mean, "mean 0", f"mean {_MEAN:g}",
            "repair.row_consistency, align._row_predicts"),
    RowType("bootstrap median over pairs", "retrieval_gain_median",
            "cluster_bootstrap (effect; effect - random clamp)", _DOCS[:6], _sim_pairs,
            _judge_pairs, "median relative top-1 gain 0 over 12 pairs, the random clamp's -0.3",
            f"median gain {_MEDIAN_TRUE:g}, the random clamp's 0", "align._row_ratio"),
)  # fmt: skip


def _rate(hits: int, n: int) -> tuple[float, float]:
    """A rate and its Monte Carlo standard error (``nan`` when ``n`` is 0)."""
    if n == 0:
        return math.nan, math.nan
    p = hits / n
    return p, math.sqrt(max(p * (1 - p), 1 / n) / n)


def _outcomes(row: RowType, design: Design, reps: int, truth: bool, ks: Sequence[float],
              rng: np.random.Generator, batch: int = 200) -> dict[float, list[Outcome]]:  # fmt: skip
    out: dict[float, list[Outcome]] = {k: [] for k in ks}
    for start in range(0, reps, batch):
        for s in row.simulate(rng, design, min(batch, reps - start), truth):
            j = row.judge(s)
            for k in ks:
                out[k].append(j.outcome(k))
    return out


def run_row(row: RowType, design: Design, reps: int, ks: Sequence[float] = (1.0,),
            seed: int = SEED) -> list[dict[str, Any]]:  # fmt: skip
    """``reps`` samples of ``row`` on ``design`` under its null and under its truth, judged at
    each multiplier of ``ks`` (level ``0.05 / k``): one table row per ``k`` with each rate and
    its Monte Carlo SE (``null_holds``, ``truth_not_holds``, ``power``, ``coverage`` of the
    95% intervals of the true value, ``coverage_null`` the same under the null, ``defined``
    the share of samples with an interval) and whether the bounds are met (``ok``: the two
    error rates at most ``0.05 / k`` and coverage at least 0.93, each within two SEs)."""
    rng = np.random.default_rng([seed, reps, design.g, sum(design.sizes), len(row.name)])
    null = _outcomes(row, design, reps, False, ks, rng)
    true = _outcomes(row, design, reps, True, ks, rng)
    rows = []
    for k in ks:
        bound = ALPHA / k
        n_h, n_n = _rate(sum(o.verdict == HOLDS for o in null[k]), reps), _rate(
            sum(o.verdict == NOT_HOLDS for o in true[k]), reps)  # fmt: skip
        power = _rate(sum(o.verdict == HOLDS for o in true[k]), reps)
        cov, cov0, defined = (
            _coverage(true[k]),
            _coverage(null[k]),
            [o.lo is not None for o in true[k]],
        )
        ok = (n_h[0] - 2 * n_h[1] <= bound and n_n[0] - 2 * n_n[1] <= bound
              and (math.isnan(cov[0]) or cov[0] + 2 * cov[1] >= MIN_COVERAGE)
              and (math.isnan(cov0[0]) or cov0[0] + 2 * cov0[1] >= MIN_COVERAGE))  # fmt: skip
        rows.append({"row": row.name, "design": design.name, "g": design.g, "k": k,
                     "level": bound, "reps": reps, "null_holds": n_h, "truth_not_holds": n_n,
                     "power": power, "coverage": cov, "coverage_null": cov0,
                     "defined": float(np.mean(defined)), "ok": bool(ok)})  # fmt: skip
    return rows


def _coverage(outs: Sequence[Outcome]) -> tuple[float, float]:
    """The share of defined 95% intervals that hold the true value, with its SE."""
    got = [o for o in outs if o.lo is not None and o.hi is not None]
    return _rate(sum(o.lo <= o.truth <= o.hi for o in got), len(got))  # type: ignore[operator]


def calibrate(reps: int = 1000, ks: Sequence[float] = (1.0,), rows: Sequence[str] | None = None,
              max_clusters: int | None = None, seed: int = SEED,
              on_design: Callable[[str], None] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """:func:`run_row` of every row type (``rows``: only those names) on each of its designs
    (``max_clusters``: only designs with at most that many clusters), ``reps`` samples each;
    ``on_design`` is called with a line as each design finishes.

    Raises:
        InputError: a row name that is not one of :data:`ROW_TYPES`.
    """
    names = {r.name for r in ROW_TYPES}
    unknown = sorted(set(rows or ()) - names)
    if unknown:
        raise InputError(f"unknown row type(s) {unknown}", fix=f"use {sorted(names)}")
    out = []
    for row in ROW_TYPES:
        if rows is not None and row.name not in rows:
            continue
        for d in row.designs:
            if max_clusters is None or d.g <= max_clusters:
                out += run_row(row, d, reps, ks, seed)
                if on_design:
                    on_design(f"{row.name}: {d.name} done")
    return out


def _cell(x: tuple[float, float], digits: int = 3) -> str:
    return "n/a" if math.isnan(x[0]) else f"{x[0]:.{digits}f} ({x[1]:.{digits}f})"


def table_markdown(results: Sequence[dict[str, Any]]) -> str:
    """The results as a markdown table: each rate with its Monte Carlo SE in brackets."""
    head = ("| row type | design | k (level) | reps | holds under the null | does not hold "
            "under the truth | power | coverage (truth) | coverage (null) | bounds |\n"
            "|---|---|---|---|---|---|---|---|---|---|\n")  # fmt: skip
    lines = [
        f"| {r['row']} | {r['design']} | {r['k']:g} ({r['level']:.3g}) | {r['reps']} | "
        f"{_cell(r['null_holds'])} | {_cell(r['truth_not_holds'])} | {_cell(r['power'])} | "
        f"{_cell(r['coverage'])} | {_cell(r['coverage_null'])} | "
        f"{'met' if r['ok'] else '**not met**'} |"
        for r in results
    ]
    return head + "\n".join(lines) + "\n"
