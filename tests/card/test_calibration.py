"""The fast part of the card's calibration (``make calibrate`` runs the whole table): every
row type through the card's own tests and verdict on its hardest small design, under the
null and the truth, within its bounds; and the few-cluster cases the harness was built for."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from mechlingo.card import calibration as cal
from mechlingo.card.clustered_tests import mean_test
from mechlingo.core.errors import InputError

#: (row type, index of its design): 8 unbalanced facts, 8 skewed documents, 24 single facts,
#: 20 draws, 5 languages: the fewest and least balanced units each row type meets.
FAST = [
    ("paired 0/1", 1),
    ("0/1 share vs 1/2", 1),
    ("0/1 share vs 1/2 with its control", 1),
    ("continuous mean", 2),
    ("relative gain vs population (100 draws)", 0),
    ("ratio of sums", 1),
    ("effect vs population (20 draws)", 1),
    ("continuous effect vs population (20 draws)", 2),
    ("equivalence", 1),
    ("rank vs population (AUROC)", 0),
    ("rank vs population (maximum)", 0),
    ("overlap (languages as units)", 0),
    ("difference in differences", 1),
]


@pytest.mark.parametrize(("name", "design"), FAST)
def test_row_type_meets_its_bounds_on_few_clusters(name, design):
    """200 samples under the null and 200 under the truth: "holds" under the null and "does
    not hold" under the truth at most 0.05 (two Monte Carlo SEs), 95% intervals cover the
    true value at least 0.93 (two SEs); the claim's truth is found more often than under the
    null."""
    row = next(r for r in cal.ROW_TYPES if r.name == name)
    (res,) = cal.run_row(row, row.designs[design], 200, (1.0,), seed=1)
    assert res["ok"], res
    assert res["null_holds"][0] <= 0.05 + 2 * res["null_holds"][1]
    assert res["coverage"][0] + 2 * res["coverage"][1] >= cal.MIN_COVERAGE
    if name not in ("equivalence", "relative gain vs population (100 draws)"):
        # 8 facts cannot show a gain within +/-0.025, nor 24 single facts a doubling
        assert res["power"][0] > res["null_holds"][0]


def test_skewed_documents_need_the_bell_mccaffrey_df():
    """8 documents, one holding half the sentences: on the harness's samples the CR2 SE with
    t(G - 1) (the card's rule before) covers the true mean far less than 0.95, the card's t
    on the Bell-McCaffrey df at least 0.93."""
    d = next(x for x in cal.DESIGNS["documents"] if x.g == 8 and x.shape == "skewed")
    samples = cal._sim_mean(np.random.default_rng(0), d, 400, True)
    old = new = 0
    for s in samples:
        t = mean_test(s["arrays"][0], s["ids"], null=1.0)
        half = sps.t.ppf(0.975, d.g - 1) * t.extra["se"]
        old += abs(t.estimate.estimate - s["truth"]) <= half
        new += t.estimate.lo <= s["truth"] <= t.estimate.hi
        assert t.extra["df"] < 3  # the big document leaves about 2.3 df
    assert old / 400 < 0.9 and new / 400 >= 0.93


def test_designs_and_inputs():
    assert cal.cluster_sizes(8, "balanced", 5) == (5,) * 8
    un = cal.cluster_sizes(8, "unbalanced", 3, cap=5)
    assert min(un) == 1 and max(un) == 5 and len(un) == 8
    sk = cal.cluster_sizes(8, "skewed", 10)
    assert sk[0] >= sum(sk) / 2 - 1 and sk[-1] == 1
    units = {r.name: {d.unit for d in r.designs} for r in cal.ROW_TYPES}
    assert {"facts", "documents", "draws"} <= set().union(*units.values())
    assert {d.g for d in cal.DESIGNS["facts"]} == {8, 24, 60}
    with pytest.raises(InputError):
        cal.calibrate(rows=["no such row"])
    with pytest.raises(InputError):
        cal.cluster_sizes(8, "lopsided", 3)


def test_a_paired_gain_over_a_baseline_mean_near_zero_keeps_a_finite_relative_bound():
    """Continuous outcomes whose baseline mean is barely above 0 (standardised distances):
    the paired test's relative reading has a huge but finite upper bound instead of an
    overflow that stopped the row (the harness's continuous population row met it)."""
    from mechlingo.card.clustered_tests import paired_test

    base = np.array([0.5, 0.5, -0.5, -0.5 + 1e-12, 0.2, -0.2])  # cluster sums 1, -1, 0
    new = base + np.array([1.0, 2.0, 3.0, 4.0, 2.0, 1.0])
    t = paired_test(base, new, [0, 0, 1, 1, 2, 2])
    rel = t.extra["relative"]
    assert rel is not None and np.isfinite(rel["hi"]) and rel["hi"] > 1e100
    assert t.estimate.estimate == pytest.approx(13 / 6)
