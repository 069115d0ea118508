"""Planned power by simulation: each primary row's own tests and verdict on simulated data.

A :class:`Scenario` is one primary row at the units a run will have (clusters after every
cap, items per cluster, random draws, the family's Holm multiplier), with its outcome's
baseline, spread and intra-cluster correlation. :func:`simulate_power` draws data of that
design at a true effect, builds the row with the same calls the row's stage makes (the
tests of :mod:`mechlingo.card.clustered_tests`, the rank of
:mod:`mechlingo.card.population`, the overlap and rank tests of the experts stage) and
judges it with :func:`mechlingo.card.rules.verdict` at the row's adjusted level through the
calibration harness's :class:`~mechlingo.card.calibration.Judged`; the power is the rate of
``holds``, with its Monte Carlo standard error. :func:`minimum_detectable` finds the effect
at which that rate reaches 80% by bisection, :func:`units_for_power` the clusters it needs.
No formula of a test is repeated here: a row's power is whatever its verdict code does.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from mechlingo.card import claims as C
from mechlingo.card.calibration import Judged, _arms, _rate
from mechlingo.card.clustered_tests import mean_test, paired_test, relative_test
from mechlingo.card.population import (
    by_rank,
    draws_needed,
    no_change_relative,
    rank_population_test,
)
from mechlingo.card.rules import ALPHA, HOLDS
from mechlingo.card.stages.experts import overlap_test, rank_test
from mechlingo.core.defaults import SEED

__all__ = ["POWER", "Scenario", "minimum_detectable", "simulate_power", "units_for_power"]

#: The power a plan asks of each primary row.
POWER = 0.8
#: The largest Monte Carlo standard error of a planned power.
MAX_SE = 0.02
#: How strongly two conditions on one item go together (the share of items whose
#: conditions share one uniform: :func:`mechlingo.card.calibration._arms`); the calibration
#: harness's value, a stated bound (no split measures it before the vectors exist).
RHO = 0.7
#: The spread (SD) of the random draws' own gains around no gain, in outcome units
#: (per SD of a standardised outcome): the calibration harness's population.
DRAW_SD = 0.02


@dataclass(frozen=True)
class Scenario:
    """One primary row as a run will judge it. ``kind``: how its data is drawn and its row
    built (:data:`SIMULATORS`); ``g`` clusters (facts, documents, languages, BOS samples)
    of ``per`` items; ``draws`` random draws in its control (``None``: no population);
    ``k`` the family's Holm multiplier (its first step: every row planned as the one that
    must pass at ``0.05 / k``); ``binary`` 0/1 outcomes (else continuous); ``base`` the
    baseline mean (a probability when binary), ``sd`` one item's SD (continuous), ``icc``
    the intra-cluster correlation; ``clustered``: whether the row passes cluster ids."""

    row: str
    kind: str
    unit: str
    g: int
    per: int = 1
    draws: int | None = None
    k: float = 1.0
    binary: bool = True
    base: float = 0.5
    sd: float = 1.0
    icc: float = 0.0
    clustered: bool = True

    @property
    def claim(self) -> C.Claim:
        """The row's claim."""
        return C.claim_by_id(self.row)

    @property
    def draw_limited(self) -> bool:
        """Whether its rank p can never reach the adjusted level: fewer draws than
        :func:`~mechlingo.card.population.draws_needed` (its power is 0 at any effect)."""
        return self.draws is not None and self.draws < draws_needed(self.k, ALPHA)

    def to_json(self) -> dict[str, Any]:
        """The scenario's fields (what the simulation assumed)."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


# --------------------------------------------------------------------------------------
# Drawing data
# --------------------------------------------------------------------------------------


def _fact_probs(rng: np.random.Generator, reps: int, g: int, mean: float, icc: float) -> np.ndarray:
    """``[reps, g]`` cluster probabilities with mean ``mean`` whose 0/1 items have the
    intra-cluster correlation ``icc``: Beta(a, b) with ``a + b = 1 / icc - 1``."""
    mean = min(max(mean, 1e-3), 1 - 1e-3)
    if icc <= 1e-6:
        return np.full((reps, g), mean)
    s = 1 / min(icc, 0.999) - 1
    return rng.beta(mean * s, (1 - mean) * s, (reps, g))


def _conditions(rng: np.random.Generator, sc: Scenario, reps: int, gains: list[np.ndarray],
                relative: int = 0) -> tuple[list[np.ndarray], np.ndarray]:  # fmt: skip
    """Outcomes of conditions on the same ``g * per`` items: condition ``j`` gains
    ``gains[j]`` (``[reps, 1]``) over the baseline, the first ``relative`` of them as a
    factor ``1 + gain`` of it; 0/1 through the harness's dependent arms, continuous as a
    cluster effect, an item effect shared by the conditions (correlation :data:`RHO`) and a
    fresh one."""
    codes = np.repeat(np.arange(sc.g), sc.per)
    if sc.binary:
        p = _fact_probs(rng, reps, sc.g, sc.base, sc.icc)[:, codes]
        probs = [np.clip(p * (1 + gj) if j < relative else p + gj, 0, 1)
                 for j, gj in enumerate(gains)]  # fmt: skip
        return _arms(rng, probs, RHO), codes
    n = len(codes)
    base = sc.base + rng.normal(0, sc.sd * math.sqrt(sc.icc), (reps, sc.g))[:, codes]
    within = sc.sd * math.sqrt(1 - sc.icc)
    shared = rng.normal(0, 1, (reps, n))
    out = []
    for j, gj in enumerate(gains):
        noise = math.sqrt(RHO) * shared + math.sqrt(1 - RHO) * rng.normal(0, 1, (reps, n))
        out.append((base * (1 + gj) if j < relative else base + gj) + within * noise)
    return out, codes


def _draw_gains(rng: np.random.Generator, sc: Scenario, reps: int) -> list[np.ndarray]:
    """The random draws' own gains, ``DRAW_SD`` apart around no gain (per SD when
    continuous); none without a population."""
    sd = DRAW_SD * (1.0 if sc.binary else sc.sd)
    return [rng.normal(0, sd, (reps, 1)) for _ in range(sc.draws or 0)]


# --------------------------------------------------------------------------------------
# The rows, built as their stages build them
# --------------------------------------------------------------------------------------


def _ids(sc: Scenario, codes: np.ndarray) -> np.ndarray | None:
    return codes if sc.clustered else None


def _sim_share(rng: np.random.Generator, sc: Scenario, effect: float, reps: int) -> list[Judged]:
    """``latent_english`` (with its mismatched-fact control on the same items, as the trace
    stage judges it) and ``recall_failures``: a 0/1 share against 1/2 by ``mean_test``."""
    c = sc.claim
    zero = np.zeros((reps, 1))
    if sc.row == "latent_english":
        (real, ctl), codes = _conditions(rng, replace(sc, base=0.5), reps, [zero + effect, zero])
    else:
        (real,), codes = _conditions(rng, replace(sc, base=0.5 + effect), reps, [zero])
        ctl = None
    ids = _ids(sc, codes)
    out = []
    for r in range(reps):
        t = mean_test(real[r], ids, null=c.null_value)
        vs = None if ctl is None else paired_test(ctl[r], real[r], ids)
        out.append(Judged(c, t, vs, t, 0.5 + effect))
    return out


def _sim_population(rng: np.random.Generator, sc: Scenario, effect: float,
                    reps: int) -> list[Judged]:  # fmt: skip
    """A paired gain judged with its rank among random draws (task and diff vectors, the
    held-out transfer gain, the clamp's steering, distances and retrieval): ``paired_test``
    of the effect and ``rank_population_test`` of the draws, as the stages call them."""
    c = sc.claim
    gains = [np.zeros((reps, 1)), np.zeros((reps, 1)) + c.direction * effect]
    gains += _draw_gains(rng, sc, reps)
    arms, codes = _conditions(rng, sc, reps, gains)
    base, new, draws = arms[0], arms[1], arms[2:]
    ids = _ids(sc, codes)
    out = []
    for r in range(reps):
        eff = paired_test(base[r], new[r], ids)
        vs = (rank_population_test(new[r], [d[r] for d in draws], ids, base=base[r],
                                   direction=c.direction) if draws else None)  # fmt: skip
        out.append(Judged(c, eff, vs, eff, c.direction * effect))
    return out


def _sim_relative(rng: np.random.Generator, sc: Scenario, effect: float,
                  reps: int) -> list[Judged]:  # fmt: skip
    """``lowest_language`` in its primary reading: the relative gain of 'both' over the
    baseline against +35%, ranked among the random draws (the repair stage's relative row:
    a testable zero when nothing changes, not testable when the baseline is 0)."""
    c = sc.claim
    rel = c.threshold + effect
    gains = [np.zeros((reps, 1)), np.zeros((reps, 1)) + rel] + _draw_gains(rng, sc, reps)
    arms, codes = _conditions(rng, sc, reps, gains, relative=2)
    base, both, extra = arms[0], arms[1], arms[2:]
    ids = _ids(sc, codes)
    out = []
    for r in range(reps):
        draws = [d[r] for d in extra]
        vs = (rank_population_test(both[r], draws, ids, base=base[r], direction=c.direction)
              if draws else None)  # fmt: skip
        if base[r].sum() <= 0:
            out.append(Judged(c, None, vs, None, rel))
            continue
        if np.array_equal(base[r], both[r]):
            eff = no_change_relative(base[r], ids, null=c.threshold)
        else:
            eff = relative_test(base[r], both[r], ids, null=c.threshold)
        out.append(Judged(c, eff, vs, eff, rel))
    return out


def _sim_overlap(rng: np.random.Generator, sc: Scenario, effect: float,
                 reps: int) -> list[Judged]:  # fmt: skip
    """``experts_disjoint``: the pairs' excess overlap over chance (SD ``sd`` across pairs)
    at ``threshold - effect``, judged by ``overlap_test`` with the languages as units."""
    c = sc.claim
    n = sc.g
    out = []
    for _ in range(reps):
        m = rng.normal(c.threshold - effect, sc.sd, (n, n))
        m = np.triu(m, 1) + np.triu(m, 1).T
        t = overlap_test(m, c.null_value)
        out.append(Judged(c, t, None, t, c.threshold - effect))
    return out


def _sim_rank(rng: np.random.Generator, sc: Scenario, effect: float, reps: int) -> list[Judged]:
    """A statistic against the same statistic of its random draws (``experts_exist``: the
    experts' AUROC against random neuron sets', draws ``sd`` apart; ``retrieval_gain_max``:
    exact) through ``rank_test`` and :func:`~mechlingo.card.population.by_rank`, as the
    experts and align stages call them; the effect is judged above the draws' mean."""
    exact = sc.row == "retrieval_gain_max"
    c = replace(sc.claim, threshold=0.0, sesoi=None)
    m = sc.draws or 1
    out = []
    for _ in range(reps):
        x = rng.normal(0, sc.sd, m + 1)
        x[0] += effect
        t = rank_test(float(x[0]), list(x[1:]), exact=exact)
        out.append(Judged(c, t, by_rank(t), t, effect))
    return out


#: How each kind of primary row is drawn and built.
SIMULATORS: dict[str, Callable[[np.random.Generator, Scenario, float, int], list[Judged]]] = {
    "share": _sim_share,
    "population": _sim_population,
    "relative": _sim_relative,
    "overlap": _sim_overlap,
    "rank": _sim_rank,
}


# --------------------------------------------------------------------------------------
# Power, minimum detectable effect, units needed
# --------------------------------------------------------------------------------------


def _holds(sc: Scenario, effect: float, reps: int, rng: np.random.Generator) -> int:
    return sum(j.outcome(sc.k).verdict == HOLDS for j in SIMULATORS[sc.kind](rng, sc, effect, reps))


def _rng(sc: Scenario, seed: int, *salt: int) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(sc.row.encode()), sc.g, sc.per, *salt])


def simulate_power(sc: Scenario, effect: float, *, seed: int = SEED, max_se: float = MAX_SE,
                   batch: int = 100, max_reps: int = 1000) -> dict[str, float]:  # fmt: skip
    """The rate of ``holds`` of ``sc`` at a true ``effect`` (beyond the threshold, in the
    claim's direction; for a null claim its deviation from no effect), in batches of
    ``batch`` simulated rows until its Monte Carlo SE is at most ``max_se`` (or
    ``max_reps``): ``{"power", "se", "reps"}``."""
    rng = _rng(sc, seed)
    hits = n = 0
    p, se = math.nan, math.nan
    while n < max_reps:
        hits += _holds(sc, effect, batch, rng)
        n += batch
        p, se = _rate(hits, n)
        if se <= max_se:
            break
    return {"power": p, "se": se, "reps": n}


def _bracket(f: Callable[[float], float], lo: float, hi: float, steps: int) -> float:
    for _ in range(steps):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if f(mid) >= POWER else (mid, hi)
    return hi


def effect_cap(sc: Scenario) -> float:
    """The largest true effect the outcome allows: a probability stays in [0, 1]."""
    c = sc.claim
    if sc.kind == "share":
        return 0.5 - 1e-3
    if sc.kind == "relative":
        return max(0.0, 1 / max(sc.base, 1e-3) - 1 - c.threshold) if sc.binary else 4.0
    if sc.kind == "population" and sc.binary:
        return max(1e-3, (1 - sc.base) if c.direction > 0 else sc.base)
    if sc.kind == "overlap":
        return c.threshold
    return 5.0 * (sc.sd or 1.0)


def minimum_detectable(sc: Scenario, *, reps: int = 150, seed: int = SEED,
                       steps: int = 6) -> float | None:  # fmt: skip
    """The true effect at which ``sc`` holds with :data:`POWER` (simulated, ``reps`` rows per
    step, the same random numbers at every step, bisection over ``steps``); ``None`` when
    no effect the outcome allows reaches it (e.g. too few random draws for its rank p)."""
    if sc.draw_limited:
        return None

    def power(e: float) -> float:
        return _holds(sc, e, reps, _rng(sc, seed + 1, 7)) / reps

    cap = effect_cap(sc)
    if power(cap) < POWER:
        return None
    return _bracket(power, 0.0, cap, steps)


def units_for_power(sc: Scenario, effect: float, *, reps: int = 100, seed: int = SEED,
                    max_g: int = 2048) -> int | None:  # fmt: skip
    """The fewest clusters (``g``, the items per cluster kept) at which ``sc`` holds with
    :data:`POWER` at ``effect`` (doubling, then bisection; ``reps`` rows per step);
    ``None`` when the draws cap it or ``max_g`` clusters do not reach it."""
    if sc.draw_limited or effect <= 0:
        return None

    def power(g: int) -> float:
        s = replace(sc, g=g)
        return _holds(s, effect, reps, _rng(s, seed + 2, 11)) / reps

    lo = 2 if sc.kind != "overlap" else 3
    hi = lo
    while power(hi) < POWER:
        lo, hi = hi, hi * 2
        if hi > max_g:
            return None
    while hi - lo > max(1, lo // 16):
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if power(mid) >= POWER else (mid, hi)
    return hi
