"""A comparison procedure for the calibration harness: the wild cluster bootstrap.

The card judges a continuous mean over few documents and a paired 0/1 gain over few facts
with CR2 standard errors and t on the Bell-McCaffrey df (:mod:`mechlingo.card.clustered`).
The restricted wild cluster bootstrap (WCR, Webb's six-point weights; Cameron, Gelbach and
Miller 2008, Webb 2023) is the usual alternative for 8 to 12 clusters. :func:`compare_wild`
runs both on the harness's own samples (:mod:`mechlingo.card.calibration`: the continuous
mean in documents, the paired 0/1 gain in facts): the type-I error of the two-sided test of
the true null at 0.05, and the coverage of the true value by its 95% region (the values the
test does not reject: one minus the rejection rate of the true value). The wild bootstrap
is the ``wildboottest`` package's (an optional test/dev dependency: ``pip install
wildboottest``); it is a comparison only, never the card's verdict.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

from mechlingo.card import calibration as cal
from mechlingo.card.clustered_tests import mean_test, paired_test
from mechlingo.core.defaults import SEED
from mechlingo.core.errors import InputError

__all__ = ["COMPARISON_DESIGNS", "compare_wild", "table_markdown", "wild_p"]

#: The few-cluster designs the comparison runs on: (sample kind, design).
COMPARISON_DESIGNS: tuple[tuple[str, cal.Design], ...] = (
    ("mean", cal.Design("documents", "unbalanced", cal.cluster_sizes(8, "unbalanced", 10))),
    ("mean", cal.Design("documents", "skewed", cal.cluster_sizes(8, "skewed", 10))),
    ("mean", cal.Design("documents", "skewed", cal.cluster_sizes(12, "skewed", 10))),
    ("paired", cal.Design("facts", "unbalanced", cal.cluster_sizes(8, "unbalanced", 3, cap=5))),
    ("paired", cal.Design("facts", "unbalanced", cal.cluster_sizes(12, "unbalanced", 3, cap=5))),
)


def wild_p(
    y: np.ndarray, codes: np.ndarray, null: float, *, b: int = 399, seed: int = SEED
) -> float:
    """The two-sided p of H0 "mean of ``y`` = ``null``" by the restricted wild cluster
    bootstrap (WCR11, Webb weights, ``b`` draws) of ``wildboottest``, on a regression of
    ``y - null`` on a constant, clustered by ``codes``.

    Raises:
        InputError: ``wildboottest`` is not installed.
    """
    try:
        from wildboottest.wildboottest import WildboottestCL
    except ImportError as e:  # an optional comparison, not a dependency of the card
        raise InputError("the wild cluster bootstrap needs wildboottest",
                         fix="pip install wildboottest") from e  # fmt: skip
    yy = np.asarray(y, dtype=float) - null
    with warnings.catch_warnings():  # full enumeration notices and numba's first compile
        warnings.simplefilter("ignore")
        wb = WildboottestCL(X=np.ones((len(yy), 1)), Y=yy, cluster=np.asarray(codes),
                            R=np.array([1.0]), B=b, seed=seed, parallel=False)  # fmt: skip
        wb.get_scores(bootstrap_type="11", impose_null=True, adj=True, cluster_adj=True)
        wb.get_weights(weights_type="webb")
        wb.get_numer()
        wb.get_denom()
        wb.get_tboot()
        wb.get_vcov()
        wb.get_tstat()
        wb.get_pvalue(pval_type="two-tailed")
    return float(np.asarray(wb.pvalue).ravel()[0])


def _values(kind: str, s: dict[str, Any]) -> tuple[np.ndarray, Any]:
    """The per-item values whose clustered mean is judged, and the card's test of it."""
    if kind == "mean":
        y = np.asarray(s["arrays"][0], dtype=float)
        return y, lambda null: mean_test(y, s["ids"], null=null)
    base, new = (np.asarray(a, dtype=float) for a in s["arrays"])
    return new - base, lambda null: paired_test(base, new, s["ids"], null=null)


def compare_wild(kind: str, design: cal.Design, reps: int = 200, *, b: int = 399,
                 seed: int = SEED) -> dict[str, Any]:  # fmt: skip
    """The card's CR2-BM interval and the wild cluster bootstrap on ``reps`` harness samples
    of ``kind`` (``"mean"``: a continuous mean in documents; ``"paired"``: a paired 0/1 gain
    in facts) under the null (type-I error at 0.05, two-sided: the null outside the 95% CR2
    t(BM df) interval, or the wild p below 0.05) and under the truth (coverage: the true
    value inside the interval, or the wild p of the true value at least 0.05), each rate
    with its Monte Carlo SE."""
    sim = {"mean": cal._sim_mean, "paired": cal._sim_paired}.get(kind)
    if sim is None:
        raise InputError(f"unknown comparison {kind!r}", fix="use mean or paired")
    rng = np.random.default_rng([seed, design.g, sum(design.sizes), len(kind)])
    hits = {"cr2_type1": 0, "wild_type1": 0, "cr2_cover": 0, "wild_cover": 0}
    for truth in (False, True):
        for i, s in enumerate(sim(rng, design, reps, truth)):
            y, card = _values(kind, s)
            t, p = card(s["truth"]).estimate, wild_p(y, design.codes, s["truth"], b=b, seed=i)
            inside = t.lo is not None and t.lo <= s["truth"] <= t.hi  # type: ignore[operator]
            if truth:
                hits["cr2_cover"] += inside
                hits["wild_cover"] += p >= 0.05
            else:
                hits["cr2_type1"] += not inside
                hits["wild_type1"] += p < 0.05
    out: dict[str, Any] = {"kind": kind, "design": design.name, "reps": reps, "b": b}
    for k, v in hits.items():
        out[k] = cal._rate(v, reps)
    return out


def table_markdown(results: list[dict[str, Any]]) -> str:
    """The comparison as a markdown table, each rate with its Monte Carlo SE."""
    head = ("| outcome | design | reps (wild draws) | type-I error: CR2-BM | type-I error: wild "
            "| coverage: CR2-BM | coverage: wild |\n|---|---|---|---|---|---|---|\n")  # fmt: skip
    name = {"mean": "continuous mean", "paired": "paired 0/1 gain"}

    def cell(x: tuple[float, float]) -> str:
        return "n/a" if math.isnan(x[0]) else f"{x[0]:.3f} ({x[1]:.3f})"

    return (
        head
        + "\n".join(
            f"| {name[r['kind']]} | {r['design']} | {r['reps']} ({r['b']}) | {cell(r['cr2_type1'])} | "
            f"{cell(r['wild_type1'])} | {cell(r['cr2_cover'])} | {cell(r['wild_cover'])} |"
            for r in results
        )
        + "\n"
    )
