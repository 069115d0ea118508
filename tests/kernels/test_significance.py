"""Statistics (mechlingo.kernels.significance) against hand formulas and direct scipy calls."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats as sps

from mechlingo.card.clustered_tests import (
    Test,
    correlation_test,
    mde,
    mean_test,
    paired_test,
    ratio_test,
    relative_test,
)
from mechlingo.card.multiplicity import holm
from mechlingo.card.population import pool_controls
from mechlingo.core.errors import InputError
from mechlingo.kernels.significance import (
    Interval,
    bootstrap_mean,
    bootstrap_perplexity,
    bootstrap_ratio,
    mcnemar,
    paired_bootstrap,
    paired_gain,
    perplexity_ratio,
    wilson,
    wilson_table,
)


def _wilson_by_hand(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


@pytest.mark.parametrize("k,n", [(0, 10), (3, 10), (10, 10), (7, 21), (50, 100), (1, 300)])
def test_wilson_matches_hand_formula(k, n):
    w = wilson(k, n)
    lo, hi = _wilson_by_hand(k, n)
    assert isinstance(w, Interval) and w.extra["k"] == k and w.n == n
    assert w.estimate == pytest.approx(k / n)
    assert w.lo == pytest.approx(max(lo, 0.0), abs=1e-12)
    assert w.hi == pytest.approx(min(hi, 1.0), abs=1e-12)


def test_wilson_known_value_and_empty():
    # 3 of 10: Wilson 95% interval (0.1078, 0.6032), the textbook value
    w = wilson(3, 10)
    assert (round(w.lo, 4), round(w.hi, 4)) == (0.1078, 0.6032)
    assert w.to_json() == {"estimate": 0.3, "lo": w.lo, "hi": w.hi, "n": 10,
                           "confidence": 0.95, "k": 3}  # fmt: skip
    assert Interval.from_json(w.to_json()) == w
    assert wilson(0, 0) == Interval(None, None, None, 0, extra={"k": 0})
    t = wilson_table({"orig": {"es": [True, False, False], "fr": [1, 1]}})
    assert t["orig"]["es"].extra["k"] == 1 and t["orig"]["es"].n == 3
    assert t["orig"]["fr"].estimate == 1.0


def _mcnemar_by_hand(fixed: int, broken: int) -> float:
    n = fixed + broken
    if n == 0:
        return 1.0
    m = min(fixed, broken)
    tail = sum(math.comb(n, i) for i in range(m + 1)) / 2**n
    return min(1.0, 2 * tail)


@pytest.mark.parametrize("fixed,broken", [(0, 0), (5, 0), (0, 7), (8, 2), (3, 3), (10, 4)])
def test_mcnemar_exact_p_matches_hand_binomial(fixed, broken):
    same_right, same_wrong = 4, 6
    base = [False] * fixed + [True] * broken + [True] * same_right + [False] * same_wrong
    new = [True] * fixed + [False] * broken + [True] * same_right + [False] * same_wrong
    m = mcnemar(base, new)
    assert (m["fixed"], m["broken"], m["n"]) == (fixed, broken, len(base))
    assert m["p"] == pytest.approx(_mcnemar_by_hand(fixed, broken), rel=1e-12)


def test_mcnemar_known_values_and_errors():
    # 8 fixed, 2 broken: p = 2 * (1 + 10 + 45) / 1024 = 0.109375
    m = mcnemar([0] * 8 + [1] * 2, [1] * 8 + [0] * 2)
    assert m["p"] == pytest.approx(0.109375)
    assert mcnemar([0] * 5, [1] * 5)["p"] == pytest.approx(2 / 32)
    with pytest.raises(ValueError, match="different lengths"):
        mcnemar([True], [True, False])


def test_paired_gain_hand_examples():
    g = paired_gain([0, 0, 1, 1], [1, 1, 1, 0])
    assert isinstance(g, Interval)
    assert g.n == 4 and g.extra["base"] == 0.5 and g.extra["new"] == 0.75
    assert g.estimate == pytest.approx(0.25) and g.extra["relative"].estimate == pytest.approx(0.5)
    assert g.lo <= 0.25 <= g.hi and -1 <= g.lo and g.hi <= 1
    big = paired_gain([0, 0, 1, 1] * 10, [1, 1, 1, 0] * 10)  # same rates, 40 pairs
    rel = big.extra["relative"]
    assert rel.estimate == pytest.approx(0.5) and rel.n == 40
    assert rel.lo <= 0.5 <= rel.hi
    assert big.lo <= 0.25 <= big.hi and big.hi - big.lo < g.hi - g.lo
    same = paired_gain([1, 0, 1], [1, 0, 1])  # no discordant pairs: exact 0
    assert (same.estimate, same.lo, same.hi) == (0.0, 0.0, 0.0)
    assert (same.extra["relative"].lo, same.extra["relative"].hi) == (0.0, 0.0)
    shift = paired_gain([0.25, 0.5, 0.75], [0.75, 1.0, 1.25])  # every difference 0.5
    assert shift.lo == shift.hi == pytest.approx(0.5)
    zero = paired_gain([0, 0, 0, 0], [1, 0, 1, 0])  # base 0: no relative gain
    assert zero.extra["relative"] is None and zero.estimate == 0.5
    empty = paired_gain([], [])
    assert empty.estimate is None and empty.n == 0 and empty.extra["base"] is None
    # all 10 items fixed over a 0 baseline: every resample has gain 1
    assert paired_gain([0] * 10, [1] * 10).lo == 1.0
    # JSON: the relative gain nests as its own interval, and reads back
    js = big.to_json()
    assert js["estimate"] == big.estimate and js["relative"]["estimate"] == rel.estimate
    assert Interval.from_json(js).extra["relative"] == rel.to_json()


def test_paired_gain_equals_scipy_bootstrap_of_differences():
    rng = np.random.default_rng(3)
    a = rng.integers(0, 2, 40)
    b = rng.integers(0, 2, 40)
    g = paired_gain(a, b, seed=7)
    gen = np.random.default_rng(7)
    res = sps.bootstrap((b - a,), np.mean, n_resamples=2000, method="BCa", random_state=gen)
    assert g.lo == pytest.approx(res.confidence_interval.low)
    assert g.hi == pytest.approx(res.confidence_interval.high)


def test_bootstrap_mean_equals_scipy_and_edge_cases():
    x = np.array([0.1, 0.5, 0.2, 0.9, 0.4, 0.3, 0.7])
    b = bootstrap_mean(x, seed=1)
    res = sps.bootstrap((x,), np.mean, n_resamples=2000, method="BCa",
                        random_state=np.random.default_rng(1))  # fmt: skip
    assert b.n == 7 and b.estimate == pytest.approx(x.mean())
    assert b.lo == pytest.approx(res.confidence_interval.low)
    assert b.hi == pytest.approx(res.confidence_interval.high)
    assert x.min() <= b.lo < b.estimate < b.hi <= x.max()
    assert bootstrap_mean([2.0, 2.0]) == Interval(2.0, 2.0, 2.0, 2)
    assert bootstrap_mean([]) == Interval(None, None, None, 0)


def test_bootstrap_ratio_is_the_ratio_of_sums_with_paired_resamples():
    num, den = [1.0, 0.0, 2.0, 1.0, 3.0], [2.0, 1.0, 2.0, 2.0, 4.0]
    r = bootstrap_ratio(num, den, seed=2)
    assert isinstance(r, Interval) and r.n == 5 and r.estimate == pytest.approx(7 / 11)
    # every item's own ratio bounds any resample's ratio of sums
    assert 0.0 <= r.lo <= r.estimate <= r.hi <= 1.0
    assert bootstrap_ratio([1.0], [2.0]) == Interval(0.5, None, None, 1)
    assert bootstrap_ratio([], []) == Interval(None, None, None, 0)


def test_bootstrap_perplexity_and_ratio():
    nll = np.array([10.0, 20.0, 15.0, 12.0, 30.0])
    cnt = np.array([5, 8, 6, 5, 10])
    p = bootstrap_perplexity(nll, cnt)
    assert p.estimate == pytest.approx(math.exp(87 / 34))
    assert p.n == 5 and p.extra == {"n_tokens": 34}
    # every line's own perplexity bounds any resample's
    per_line = np.exp(nll / cnt)
    assert per_line.min() <= p.lo <= p.estimate <= p.hi <= per_line.max()
    assert bootstrap_perplexity([3.0], [2]).lo is None
    r = perplexity_ratio(nll, nll * 1.5, cnt)  # NLL 1.5x: ppl ratio exp(0.5 * 87 / 34)
    assert r.estimate == pytest.approx(math.exp(0.5 * 87 / 34)) and r.n == 5
    assert r.lo <= r.estimate <= r.hi
    same = perplexity_ratio(nll, nll, cnt)
    assert same.estimate == pytest.approx(1.0)
    assert same.lo == pytest.approx(1.0) and same.hi == pytest.approx(1.0)
    with pytest.raises(ValueError):
        bootstrap_perplexity([1.0, 2.0], [1])


def _diff(a, b, axis=-1):
    return np.mean(b, axis=axis) - np.mean(a, axis=axis)


def test_paired_bootstrap_equals_direct_scipy_call():
    rng = np.random.default_rng(5)
    a, b = rng.random(30), rng.random(30) + 0.2
    got = paired_bootstrap((a, b), _diff, n_resamples=700, confidence=0.9, seed=4)
    ref = sps.bootstrap((a, b), _diff, paired=True, vectorized=True, n_resamples=700,
                        confidence_level=0.9, method="percentile",
                        rng=np.random.default_rng(4))  # fmt: skip
    assert isinstance(got, Interval) and got.n == 30 and got.confidence == 0.9
    assert got.estimate == pytest.approx(b.mean() - a.mean(), abs=1e-15)
    assert got.lo == ref.confidence_interval.low and got.hi == ref.confidence_interval.high
    # pairs are resampled together: a constant shift has no spread at all
    shift = paired_bootstrap((a, a + 0.5), _diff)
    assert shift.lo == pytest.approx(0.5) and shift.hi == pytest.approx(0.5)


def test_paired_bootstrap_small_and_degenerate_samples():
    assert paired_bootstrap(([], []), _diff) == Interval(None, None, None, 0)
    one = paired_bootstrap(([1.0], [0.0]), _diff)
    assert one.estimate == -1.0 and one.lo is None and one.hi is None and one.n == 1
    const = paired_bootstrap(([1.0, 1.0, 1.0], [0.0, 0.0, 0.0]), _diff)
    assert (const.estimate, const.lo, const.hi) == (-1.0, -1.0, -1.0)
    with pytest.raises(ValueError, match="1-D samples of one length"):
        paired_bootstrap(([1.0, 2.0], [1.0]), _diff)


def test_interval_rules_and_round_trip():
    i = Interval(0.10, 0.02, 0.20, 40)
    assert i.above(0.0) and not i.above(0.05) and not i.below(0.2) and i.below(0.25)
    assert i.excludes(0.0) and not i.excludes(0.1)
    assert Interval.from_json(i.to_json()) == i
    assert i.format(2, signed=True) == "+0.10 [+0.02, +0.20] (n=40)"
    empty = Interval(None, None, None, 0)
    assert not empty.defined and not empty.above(-1) and not empty.excludes(5)
    assert str(empty) == "n/a (n=0)"


# --------------------------------------------------------------------------------------
# The card's statistics: Test, paired_test, mean_test, correlation_test, holm, mde
# --------------------------------------------------------------------------------------


def test_three_fixed_none_broken_of_24_is_p_025():
    """The issue's hand case: 3 fixed, 0 broken of 24 is the exact McNemar p = 2 / 2^3."""
    base, new = [0] * 24, [1] * 3 + [0] * 21
    t = paired_test(base, new)
    assert t.p == pytest.approx(0.25) and t.extra["p_mcnemar"] == pytest.approx(0.25)
    assert (t.extra["fixed"], t.extra["broken"]) == (3, 0)
    assert t.estimate.estimate == pytest.approx(3 / 24) and t.n_clusters == 24
    assert t.extra["relative"] is None  # the baseline is 0: no relative gain


@pytest.mark.parametrize("fixed,broken,same", [(8, 2, 30), (30, 12, 400), (0, 5, 3), (4, 4, 1)])
def test_paired_test_p_is_the_exact_mcnemar_p(fixed, broken, same):
    base = [0] * fixed + [1] * broken + [1] * same
    new = [1] * fixed + [0] * broken + [1] * same
    from statsmodels.stats.contingency_tables import mcnemar as sm_mcnemar

    table = [[same, broken], [fixed, 0]]
    ref = sm_mcnemar(table, exact=True).pvalue
    assert paired_test(base, new).p == pytest.approx(ref, rel=1e-12)


def test_sign_flip_p_against_scipy_permutation_test():
    rng = np.random.default_rng(3)
    d = rng.normal(0.3, 1.0, 13)  # 13 unequal clusters: exact enumeration (8192 flips)
    ref = sps.permutation_test((d,), lambda x, axis=-1: x.sum(axis=axis),
                               permutation_type="samples", n_resamples=np.inf).pvalue  # fmt: skip
    assert mean_test(d).p == pytest.approx(ref, rel=1e-9)
    big = rng.normal(0.2, 1.0, 60)  # Monte Carlo: within 0.02 of scipy's own Monte Carlo
    ref = sps.permutation_test((big,), lambda x, axis=-1: x.sum(axis=axis),
                               permutation_type="samples", n_resamples=99999,
                               rng=np.random.default_rng(0)).pvalue  # fmt: skip
    assert mean_test(big).p == pytest.approx(ref, abs=0.02)


def test_mean_test_share_is_the_exact_binomial_test():
    x = [1] * 16 + [0] * 8
    t = mean_test(x, null=0.5)
    assert t.p == pytest.approx(sps.binomtest(16, 24).pvalue)
    assert t.estimate.estimate == pytest.approx(2 / 3)


def test_cluster_robust_se_matches_statsmodels():
    import statsmodels.api as sm

    rng = np.random.default_rng(5)
    cl = np.repeat(np.arange(30), 4)
    d = rng.normal(size=120) + np.repeat(rng.normal(size=30), 4)
    fit = sm.OLS(d, np.ones((120, 1))).fit(cov_type="cluster", cov_kwds={"groups": cl})
    t = mean_test(d, cl)
    assert t.extra["se"] == pytest.approx(float(fit.bse[0]), rel=1e-9)
    assert t.mde == pytest.approx(mde(t.extra["se"], df=29)) and mde(1.0) == pytest.approx(
        2.8015852
    )
    assert mde(1.0, df=7) == pytest.approx(sps.t.ppf(0.975, 7) + sps.t.ppf(0.8, 7))


def test_clustered_interval_is_wider_than_the_naive_one():
    """A fact repeated in 11 languages is one unit: the clustered interval is wider."""
    rng = np.random.default_rng(1)
    base = np.repeat(rng.random(40) < 0.3, 11).astype(float)
    new = np.repeat(rng.random(40) < 0.5, 11).astype(float)
    cl = np.repeat([f"fact{i}" for i in range(40)], 11)
    naive, clustered = paired_test(base, new), paired_test(base, new, cl)
    assert clustered.estimate.estimate == pytest.approx(naive.estimate.estimate)
    width = lambda t: t.estimate.hi - t.estimate.lo  # noqa: E731
    assert width(clustered) > 2 * width(naive)
    assert clustered.n_clusters == 40 and naive.n_clusters == 440
    assert clustered.p > naive.p and clustered.mde > naive.mde


def test_relative_gain_defined_for_any_positive_baseline():
    tiny = paired_test([1] + [0] * 39, [1] * 10 + [0] * 30)  # 1 of 40 -> 10 of 40
    rel = tiny.extra["relative"]
    assert rel["estimate"] == pytest.approx(9.0)
    assert all(math.isfinite(rel[k]) for k in ("lo", "hi")) and rel["lo"] < 9 < rel["hi"]
    # the delta-method interval of the log ratio of two means, unclustered, by hand: CR2 of
    # single items is the leverage factor 1 / (1 - 1/40), and t on 39 df
    a, b = np.array([1] + [0] * 39, float), np.array([1] * 10 + [0] * 30, float)
    u = (b - b.mean()) / (40 * b.mean()) - (a - a.mean()) / (40 * a.mean())
    se, q = math.sqrt(40 / 39 * float((u**2).sum())), sps.t.ppf(0.975, 39)
    assert rel["lo"] == pytest.approx(math.exp(math.log(10) - q * se) - 1, rel=1e-5)
    assert rel["hi"] == pytest.approx(math.exp(math.log(10) + q * se) - 1, rel=1e-5)
    gone = paired_test([1] * 4 + [0] * 36, [0] * 40).extra["relative"]
    assert gone["estimate"] == -1.0 and gone["lo"] == -1.0 and math.isfinite(gone["hi"])


def test_no_change_is_not_a_proof_of_zero():
    t = paired_test([1] * 12 + [0] * 12, [1] * 12 + [0] * 12)
    assert t.p == 1.0 and t.estimate.lo < 0 < t.estimate.hi
    assert t.estimate.hi == pytest.approx(1 - 0.025 ** (1 / 24))  # the exact 0-of-24 bound


def test_holm_matches_statsmodels():
    from statsmodels.stats.multitest import multipletests

    ps = [0.01, 0.04, 0.03, 0.2, 0.001, 0.04]
    ref = multipletests(ps, method="holm")[1]
    assert holm(ps) == pytest.approx(list(ref))
    got = holm([0.01, None, 0.04, 0.03])
    assert got[1] is None and got == pytest.approx([0.03, None, 0.06, 0.06])  # type: ignore[arg-type]
    assert holm([]) == []


def test_pool_controls_one_outcome_per_item():
    assert pool_controls([[1, 0, 0], [1, 1, 0], [0, 1, 0]]) == pytest.approx([2 / 3, 2 / 3, 0])
    with pytest.raises(InputError):
        pool_controls([[1, 0], [1]])
    with pytest.raises(InputError):
        paired_test([1, 0], [1, 0], clusters=["a"])


def test_correlation_test_and_json_round_trip():
    x = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    y = [2, 1, 4, 3, 6, 5, 8, 7, 10, 9]
    t = correlation_test(x, y)
    ref = sps.spearmanr(x, y)
    assert t.estimate.estimate == pytest.approx(ref.statistic) and t.p == pytest.approx(ref.pvalue)
    assert t.estimate.lo <= t.estimate.estimate <= t.estimate.hi
    for test in (t, paired_test([0, 1, 1, 0], [1, 1, 1, 0])):
        assert Test.from_json(json.loads(json.dumps(test.to_json()))) == test


def test_relative_test_p_agrees_with_its_interval():
    base = [1] * 4 + [0] * 36
    new = [1] * 12 + [0] * 28  # 4 -> 12 of 40: +200%
    for null in (0.35, 1.0, 2.0, 5.0):
        t = relative_test(base, new, null=null)
        assert t.estimate.estimate == pytest.approx(2.0)
        inside = t.estimate.lo < null < t.estimate.hi
        assert (t.p >= 0.05) == inside, (null, t.p, t.estimate)
    assert relative_test([0] * 10, [1] * 10).estimate.estimate is None  # a zero baseline


def test_ratio_test_by_hand():
    num = [1, 0, 1, 0, 0, 1, 0, 0]
    den = [1, 1, 1, 0, 1, 1, 0, 1]
    t = ratio_test(num, den, null=1.0)
    r = 3 / 6
    u = (np.array(num) - r * np.array(den)) / 6
    se = math.sqrt(8 / 7 * float((u**2).sum()))
    assert t.estimate.estimate == pytest.approx(r) and t.extra["se"] == pytest.approx(se)
    assert t.estimate.lo == pytest.approx(r - sps.t.ppf(0.975, 7) * se)
    assert t.p == pytest.approx(2 * sps.t.sf(abs(r - 1) / se, 7))
    assert ratio_test([1, 0], [0, 0]).estimate.estimate is None  # no gain to share


def test_nonzero_null_uses_the_cluster_robust_t_test():
    rng = np.random.default_rng(2)
    d = rng.normal(0.4, 1.0, 50)
    t = paired_test(np.zeros(50), d, null=0.35)
    ref = sps.ttest_1samp(d, 0.35)
    assert t.p == pytest.approx(ref.pvalue, rel=1e-6)  # CR1 with singleton clusters = t test
