"""The card's hand-written cluster-robust pieces (:mod:`mechlingo.card.clustered`: the CR2
sandwich with Bell and McCaffrey's adjustment, used by ``mean_test``, ``paired_test`` and
``group_difference_test``) against pyfixest's CRV1 and CRV3 on the same data, where they must
agree.

CR2 adjusts each cluster's residuals by ``(I - H_gg)^(-1/2)``. Where every cluster has the same
design (balanced clusters of an intercept, or the same number of items of each group in every
cluster), ``H_gg`` is ``P_g / G`` and CR2 equals CRV1 with the ``G / (G - 1)`` factor and
without the ``(N - 1) / (N - k)`` one, and the Bell-McCaffrey df is ``G - 1``, pyfixest's df:
the SE and the p must coincide. With unequal clusters the CR2 variance of a mean lies between
the unadjusted CRV1 variance and the jackknife (CRV3) one, cluster by cluster. What pyfixest
cannot check: the CR2 adjustment and the Bell-McCaffrey df themselves on unequal clusters
(pyfixest has neither); those are checked against the closed form and R's clubSandwich
values elsewhere in the suite and by simulation in ``docs/calibration.md``.
"""

from __future__ import annotations

import numpy as np
import pytest

pf = pytest.importorskip(
    "pyfixest", reason="pyfixest (the test extra) is not installed: pip install 'mechlingo[test]'"
)
pd = pytest.importorskip("pandas")

from mechlingo.card.clustered_tests import (  # noqa: E402
    group_difference_test,
    mean_test,
    paired_test,
)


def _fit(y, clusters, x=None, vcov="CRV1", **ssc):
    df = pd.DataFrame({"y": np.asarray(y, dtype=float), "g": np.asarray(clusters)})
    fml = "y ~ 1"
    if x is not None:
        df["x"] = np.asarray(x, dtype=float)
        fml = "y ~ x"
    return pf.feols(fml, data=df, vcov={vcov: "g"}, ssc=pf.ssc(**ssc))


def _balanced(rng, g=9, per=6):
    codes = np.repeat(np.arange(g), per)
    return codes, rng.normal(0, 1, g)[codes] + rng.normal(0.4, 0.7, len(codes))


@pytest.mark.parametrize("g,per", [(8, 5), (12, 3), (30, 7)])
def test_a_mean_over_balanced_clusters_is_pyfixest_crv1(g, per):
    """Intercept model, equal clusters: the card's CR2 SE is CRV1's (k = 1, so its (N - 1) /
    (N - k) is 1), its t test on G - 1 df pyfixest's p."""
    codes, y = _balanced(np.random.default_rng(g), g, per)
    t = mean_test(y, codes, null=0.25)  # a null away from 0: the CR2 t test, not sign flips
    fit = _fit(y - 0.25, codes)
    assert t.extra["df"] == pytest.approx(g - 1, rel=1e-9)
    assert t.extra["se"] == pytest.approx(float(fit.se().iloc[0]), rel=1e-7)
    assert t.estimate.estimate - 0.25 == pytest.approx(float(fit.coef().iloc[0]), rel=1e-7)
    assert t.p == pytest.approx(float(fit.pvalue().iloc[0]), rel=1e-6)


def test_a_paired_gain_over_balanced_clusters_is_pyfixest_crv1():
    """paired_test (continuous outcomes, a null gain of 0.2: the CR2 t test) is the clustered
    mean of the differences: CRV1 on new - base."""
    rng = np.random.default_rng(4)
    codes, base = _balanced(rng, 10, 4)
    new = base + 0.3 + rng.normal(0, 0.5, len(base))
    t = paired_test(base, new, codes, null=0.2)
    fit = _fit(new - base - 0.2, codes)
    assert t.extra["se"] == pytest.approx(float(fit.se().iloc[0]), rel=1e-7)
    assert t.p == pytest.approx(float(fit.pvalue().iloc[0]), rel=1e-6)


def test_a_group_difference_with_the_same_design_in_every_cluster_is_crv1_without_k_adj():
    """group_difference_test (the difference in differences): every fact holds 2 items of
    each class, so H_gg = P_g / G and CR2 = CRV1 with G / (G - 1) and no (N - 1) / (N - k);
    the Bell-McCaffrey df is G - 1 and the p is pyfixest's."""
    rng = np.random.default_rng(7)
    g = 11
    codes = np.repeat(np.arange(g), 4)
    groups = np.tile(["recall", "recall", "translation", "translation"], g)
    y = rng.normal(0, 1, g)[codes] + 0.3 * (groups == "recall") + rng.normal(0, 0.6, 4 * g)
    t = group_difference_test(list(y), list(groups), list(codes), "recall", "translation")
    fit = _fit(y, codes, x=(groups == "recall"), k_adj=False, G_adj=True)
    assert t.estimate.estimate == pytest.approx(float(fit.coef()["x"]), rel=1e-7)
    assert t.extra["se"] == pytest.approx(float(fit.se()["x"]), rel=1e-7)
    assert t.extra["df"] == pytest.approx(g - 1, rel=1e-7)
    assert t.p == pytest.approx(float(fit.pvalue()["x"]), rel=1e-6)
    # with pyfixest's default small-sample factor the SEs differ by sqrt((N - 1) / (N - 2))
    default = float(_fit(y, codes, x=(groups == "recall")).se()["x"])
    n = len(y)
    assert default == pytest.approx(t.extra["se"] * np.sqrt((n - 1) / (n - 2)), rel=1e-7)


@pytest.mark.parametrize("sizes", [(1, 2, 3, 5, 8, 13, 21, 34), (1, 3, 5, 7, 9, 11, 13, 15)])
def test_cr2_of_a_mean_over_unequal_clusters_lies_between_crv1_and_crv3(sizes):
    """Unequal clusters (skewed and unbalanced, 8 of them): the CR2 variance of a mean divides
    each cluster's squared score by 1 - n_g / N, the jackknife (CRV3) by its square, the
    unadjusted CRV1 by nothing, so CRV1 (no factors) < CR2 < CRV3 (no factors); CR2 is
    exactly the cluster-wise geometric mean, so CR2^2 <= CRV1 * CRV3 (Cauchy-Schwarz)."""
    rng = np.random.default_rng(sum(sizes))
    codes = np.repeat(np.arange(len(sizes)), sizes)
    y = rng.normal(0, 1, len(sizes))[codes] + rng.normal(0, 0.5, len(codes))
    cr2 = mean_test(y, codes, null=0.5).extra["se"] ** 2
    crv1 = float(_fit(y, codes, k_adj=False, G_adj=False).se().iloc[0]) ** 2
    crv3 = float(_fit(y, codes, vcov="CRV3", k_adj=False, G_adj=False).se().iloc[0]) ** 2
    assert crv1 < cr2 < crv3
    assert cr2**2 <= crv1 * crv3 * (1 + 1e-12)
