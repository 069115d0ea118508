"""The card's statistics: few-cluster coverage, no p of 0, random-control populations,
two-group differences and the family adjustments (hand cases and references)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from mechlingo.card.clustered import p_floor
from mechlingo.card.clustered_tests import (
    Test,
    cluster_bootstrap,
    correlation_test,
    group_difference_test,
    mean_test,
    paired_test,
    ratio_test,
    relative_test,
)
from mechlingo.card.multiplicity import adjust, benjamini_hochberg
from mechlingo.card.population import population_gain_test, population_test
from mechlingo.core.errors import InputError


def test_cr2_interval_covers_with_eight_documents_and_the_naive_one_does_not():
    """8 documents of 10-17 sentences, document effects 4x the sentence noise (SD 1 vs
    0.5): the CR2 t(7) interval covers the true mean 0 at least 93% of the time (nominal
    95%); the interval that treats sentences as independent covers far less."""
    sizes = np.arange(10, 18)
    cl = np.repeat(np.arange(8), sizes)
    rng = np.random.default_rng(0)
    reps = 1000
    y = rng.normal(0, 1.0, (reps, 8))[:, cl] + rng.normal(0, 0.5, (reps, len(cl)))
    cover = naive = 0
    for r in range(reps):  # null=1.0: the t-test p (no permutation), the interval is the same
        t = mean_test(y[r], cl, null=1.0).estimate
        u = mean_test(y[r], null=1.0).estimate
        cover += t.lo <= 0 <= t.hi
        naive += u.lo <= 0 <= u.hi
    assert cover / reps >= 0.93
    assert naive / reps < 0.6


def test_cr2_of_single_items_is_hc2():
    import statsmodels.api as sm

    rng = np.random.default_rng(4)
    g = np.array([0] * 9 + [1] * 14)
    y = rng.normal(size=23) + 0.8 * g
    fit = sm.OLS(y, sm.add_constant(g.astype(float))).fit(cov_type="HC2")
    t = group_difference_test(y, g, list(range(23)), 1, 0)
    assert t.estimate.estimate == pytest.approx(y[g == 1].mean() - y[g == 0].mean())
    assert t.extra["se"] == pytest.approx(float(fit.bse[1]), rel=1e-9)
    # HC2 of a two-group difference is s_a^2/n_a + s_b^2/n_b; its Bell-McCaffrey df under
    # working independence is Satterthwaite's with equal variances (by hand)
    n_a, n_b = 14, 9
    df = (1 / n_a + 1 / n_b) ** 2 / (1 / (n_a**2 * (n_a - 1)) + 1 / (n_b**2 * (n_b - 1)))
    assert t.extra["df"] == pytest.approx(df, rel=1e-9) and df < 22
    assert t.p == pytest.approx(2 * sps.t.sf(abs(t.estimate.estimate) / t.extra["se"], df))


def test_balanced_cr2_mean_is_the_t_interval_of_cluster_means():
    rng = np.random.default_rng(7)
    cl = np.repeat(np.arange(6), 5)
    y = rng.normal(size=30) + np.repeat(rng.normal(size=6), 5)
    t = mean_test(y, cl, null=0.3)
    ref = sps.ttest_1samp(y.reshape(6, 5).mean(1), 0.3)
    lo, hi = ref.confidence_interval(0.95)
    assert (t.estimate.lo, t.estimate.hi) == pytest.approx((lo, hi), rel=1e-9)
    assert t.p == pytest.approx(ref.pvalue, rel=1e-9)


def test_no_p_is_zero_for_zero_variance_estimates():
    # every cluster's ratio is the same: the SE is 0, the p bounded by the 8-cluster floor
    num, den = [1.0] * 8, [2.0] * 8
    r = ratio_test(num, den, null=1.0)
    assert r.estimate.estimate == 0.5 and r.p == pytest.approx(p_floor(8)) == 2.0**-7
    assert ratio_test(num, den, null=0.5).p == 1.0  # the estimate equals the null
    # a constant non-binary mean away from a non-symmetric null
    m = mean_test([0.3] * 6, null=0.1)
    assert m.p == pytest.approx(1 / 32) and m.p > 0
    # every one of 6 facts fixed: the sign-flip p is exact, 2 / 2^6
    assert paired_test([0] * 6, [1] * 6).p == pytest.approx(2 / 64)
    # a perfect correlation over 5 clusters: at least the permutation minimum 2 / 5!
    c = correlation_test([1, 2, 3, 4, 5] * 2, [2, 4, 6, 8, 10] * 2, clusters=list(range(5)) * 2)
    assert c.p == pytest.approx(2 / math.factorial(5)) and c.p > 0


def test_relative_gain_with_successes_in_one_cluster_has_no_interval():
    """3 of the base successes and 6 of the new ones all in fact f0: the log ratio does not
    vary over clusters, so no interval (not a zero-width one) and no p."""
    ids = ["f0"] * 6 + [f"f{i}" for i in range(1, 9)]
    base = [1, 1, 1, 0, 0, 0] + [0] * 8
    new = [1] * 6 + [0] * 8
    t = relative_test(base, new, ids)
    assert t.estimate.estimate == pytest.approx(1.0)
    assert not t.estimate.defined and t.p is None
    assert "not enough clusters" in t.extra["undefined"]
    assert "not enough clusters" in paired_test(base, new, ids).extra["relative"]["undefined"]


def test_population_permutation_p_is_the_effect_rank():
    """19 draws, 2 of them at least as good as the effect: p = (1 + 2) / 20."""
    rng = np.random.default_rng(1)
    base = rng.integers(0, 2, 40).astype(float)
    ids = [f"f{i // 2}" for i in range(40)]
    draws = np.tile(base, (19, 1))
    for j in range(19):  # draw j changes j of the first items from 0 to 1
        draws[j, :j] = 1.0
    effect = base.copy()
    effect[:12] = 1.0
    gains = draws.mean(1) - base.mean()
    eff = effect.mean() - base.mean()
    above, below = int((gains >= eff - 1e-12).sum()), int((gains <= eff + 1e-12).sum())
    assert 0 < above < 19  # the effect is neither the best nor the worst: a real rank
    t = population_test(effect, draws, ids, base=base)
    assert t.extra["p_rank"] == pytest.approx((1 + above) / 20)
    assert t.extra["p_floor"] == pytest.approx(0.05)
    assert t.extra["p_rank_opposite"] == pytest.approx((1 + below) / 20)
    # the verdict's p: two-sided t of effect - population mean, by hand from its SE and df
    se, df = t.extra["se"], t.extra["df"]
    hand = 2 * sps.t.sf(abs(t.estimate.estimate) / se, df)
    assert t.p == pytest.approx(hand) and not t.extra.get("one_sided")
    assert t.estimate.estimate == pytest.approx(effect.mean() - draws.mean())
    # the between-draw variance widens the interval beyond the cluster part alone
    assert t.extra["se"] > t.extra["se_clusters"] and t.estimate.lo < t.estimate.estimate
    # direction -1: the same ranks counted the other way
    flipped = population_test(effect, draws, ids, base=base, direction=-1)
    assert flipped.extra["p_rank"] == pytest.approx(t.extra["p_rank_opposite"])
    assert flipped.p == pytest.approx(t.p)  # two-sided


def test_one_draw_has_a_permutation_floor_of_one_half():
    t = population_test([1.0] * 10, [[0.0] * 10], list(range(10)))
    assert t.p == 0.5 and t.extra["p_floor"] == 0.5 and t.extra["se_draws"] is None
    with pytest.raises(InputError):
        population_test([1.0, 0.0], [[0.0, 1.0, 1.0]])


def test_population_gain_adds_between_draw_variance():
    base = np.zeros(20)
    draws = np.array([[0.1] * 20, [-0.1] * 20, [0.0] * 20, [0.05] * 20])
    t = population_gain_test(base, draws, list(range(20)), null=0.0)
    assert t.estimate.estimate == pytest.approx(0.0125)
    sd = np.std([0.1, -0.1, 0.0, 0.05], ddof=1)
    assert t.extra["se_draws"] == pytest.approx(sd / 2) and t.extra["se_clusters"] == pytest.approx(
        0, abs=1e-12
    )
    assert t.extra["se"] == pytest.approx(sd / 2) and t.p > 0.5


def test_at_level_widens_t_intervals_by_their_quantiles():
    t = mean_test([0.1, 0.4, 0.2, 0.5, 0.3, 0.6], null=0.2)
    wide = t.at_level(0.99)
    se, q = t.extra["se"], sps.t.ppf(0.995, 5)
    assert (wide.lo, wide.hi) == pytest.approx((0.35 - q * se, 0.35 + q * se))
    assert wide.confidence == 0.99 and wide.lo < t.estimate.lo
    none = paired_test([0] * 24, [0] * 24)  # the exact no-change bound at 99%
    assert none.at_level(0.99).hi == pytest.approx(1 - 0.005 ** (1 / 24))
    back = Test.from_json(t.to_json())
    assert back.at_level(0.99) == wide


def test_adjust_multipliers_and_bh_match_statsmodels():
    from statsmodels.stats.multitest import multipletests

    ps = [0.01, 0.04, None, 0.03, 0.5]
    holm = adjust(ps, "holm")
    ref = multipletests([0.01, 0.04, 0.03, 0.5], method="holm")[1]
    assert [a for a, _ in holm if a is not None] == pytest.approx(list(ref))
    assert holm[0][1] == pytest.approx(4) and holm[2] == (None, 4.0)
    assert holm[4][1] == pytest.approx(1.0)  # 0.5 * 1 ... capped at 1: its own step, 1
    bh = benjamini_hochberg([0.01, 0.04, 0.03, 0.5])
    assert bh == pytest.approx(list(multipletests([0.01, 0.04, 0.03, 0.5], method="fdr_bh")[1]))


def test_bell_mccaffrey_df_closed_form_and_balanced_case():
    from mechlingo.card.clustered import bm_df, bm_df_mean, cr2_ols

    for sizes in ([5] * 8, [1, 3, 4, 6, 9, 11, 14, 19], [40, 20, 10, 5, 2, 1, 1, 1]):
        cnt = np.array(sizes, dtype=float)
        codes = np.repeat(np.arange(len(sizes)), sizes)
        x = np.ones((len(codes), 1))
        y = np.random.default_rng(0).normal(size=len(codes))
        _, _, adj = cr2_ols(y, x, codes, len(sizes))
        general = bm_df(x, codes, adj, np.array([1.0]))
        assert bm_df_mean(cnt) == pytest.approx(general, rel=1e-9)
    assert bm_df_mean(np.full(8, 5.0)) == 7.0
    # one document holding half of 80 sentences among 8: about 2.3 df, not 7
    assert 2.0 < bm_df_mean(np.array([40, 20, 10, 5, 3, 1, 1, 1.0])) < 2.7


def test_cluster_bootstrap_is_scipys_percentile_widened_for_few_clusters():
    """The interval is scipy.stats.bootstrap's percentile interval over the clusters (same seed), widened
    about the estimate by t_df / z * sqrt(G / (G - 1)); for a balanced mean it is close to
    the t interval of the cluster means."""
    from scipy.stats import bootstrap

    rng = np.random.default_rng(3)
    cl = np.repeat(np.arange(8), 6)
    y = rng.normal(size=8)[cl] + rng.normal(0, 0.5, len(cl))
    t = cluster_bootstrap(y[:, None], cl, lambda r: float(r.mean()), seed=5, n_resamples=4000)
    members = [np.flatnonzero(cl == k) for k in range(8)]
    ref = bootstrap((np.arange(8),), lambda i: float(y[np.concatenate([members[k] for k in i])].mean()),
                    vectorized=False, n_resamples=4000, method="percentile", rng=np.random.default_rng(5))  # fmt: skip
    f = sps.t.ppf(0.975, 7) / sps.norm.ppf(0.975) * math.sqrt(8 / 7)
    est = float(y.mean())
    assert t.estimate.lo == pytest.approx(est - f * (est - ref.confidence_interval.low))
    assert t.estimate.hi == pytest.approx(est + f * (ref.confidence_interval.high - est))
    lo, hi = sps.ttest_1samp(y.reshape(8, 6).mean(1), 0).confidence_interval(0.95)
    assert t.estimate.hi - t.estimate.lo == pytest.approx(hi - lo, rel=0.15)
    assert t.extra["df"] == 7 and "percentile" in t.method
