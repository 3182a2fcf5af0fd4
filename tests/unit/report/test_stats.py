"""Done-when: the report's p-values match scipy's own on fixed samples; intervals against known
values and scipy/statsmodels; invariants over generated data."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as scipy_stats
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportions_ztest

from reshape.report import stats

# Fixed samples: latencies in seconds, with and without ties.
SMALL_A = [0.012, 0.015, 0.011, 0.019, 0.013, 0.021, 0.017]
SMALL_B = [0.022, 0.018, 0.025, 0.031, 0.016, 0.027]
TIED_A = [0.01, 0.02, 0.02, 0.03, 0.05, 0.05, 0.08]
TIED_B = [0.02, 0.03, 0.05, 0.05, 0.07, 0.09, 0.09, 0.11]
RNG = np.random.default_rng(20261123)
LARGE_A = list(RNG.lognormal(-4.0, 0.5, 400))
LARGE_B = list(RNG.lognormal(-3.9, 0.5, 350))


def test_mann_whitney_textbook_exact_value() -> None:
    # Ranks of a: 1, 2, 3, 4, 6 → U = 1; exact two-sided P = 2 · 2/C(10, 5) = 4/252.
    result = stats.mann_whitney([1.0, 2.0, 3.0, 4.0, 6.0], [5.0, 7.0, 8.0, 9.0, 10.0])
    assert result.p_value == pytest.approx(4 / 252, rel=1e-12)
    assert result.test == "Mann-Whitney U, exact"


@pytest.mark.parametrize(
    ("a", "b", "method", "test"),
    [
        (SMALL_A, SMALL_B, "exact", "Mann-Whitney U, exact"),
        (
            TIED_A,
            TIED_B,
            scipy_stats.PermutationMethod(n_resamples=math.inf),
            "Mann-Whitney U, exact with ties",
        ),
        (LARGE_A, LARGE_B, "asymptotic", "Mann-Whitney U, normal approx."),
    ],
    ids=["exact", "exact-ties", "asymptotic"],
)
def test_mann_whitney_matches_scipy(
    a: list[float], b: list[float], method: object, test: str
) -> None:
    expected = scipy_stats.mannwhitneyu(a, b, alternative="two-sided", method=method).pvalue
    result = stats.mann_whitney(a, b)
    assert result.p_value == pytest.approx(expected, rel=1e-12) and result.test == test
    assert stats.mann_whitney(b, a).p_value == pytest.approx(expected, rel=1e-12)


def test_mann_whitney_with_ties_is_exact_not_approximate() -> None:
    exact = stats.mann_whitney(TIED_A, TIED_B).p_value
    approximate = scipy_stats.mannwhitneyu(TIED_A, TIED_B, method="asymptotic").pvalue
    assert exact is not None and exact != pytest.approx(approximate, rel=1e-3)


def test_mann_whitney_with_ties_and_a_sample_of_one() -> None:
    """A low-weight arm's first request, the other arm's latencies tied: scipy's permutation
    test refuses a sample of one ("internal error" from `reshape report`); the normal
    approximation answers."""
    result = stats.mann_whitney([0.001, 0.002, 0.002, 0.003, 0.004], [0.005])
    assert result.test == "Mann-Whitney U, normal approx."
    expected = scipy_stats.mannwhitneyu([0.001, 0.002, 0.002, 0.003, 0.004], [0.005]).pvalue
    assert result.p_value == pytest.approx(min(1.0, expected))


def test_mann_whitney_degenerate_samples() -> None:
    assert stats.mann_whitney([], [1.0]).p_value is None
    assert stats.mann_whitney([2.0, 2.0], [2.0, 2.0, 2.0]).p_value == 1.0


def test_grouped_mann_whitney_equals_scipy_on_the_samples_it_stands_for() -> None:
    # Histogram buckets: every observation of a bucket is a tie.
    counts_a = [5.0, 40.0, 120.0, 30.0, 3.0, 0.0, 2.0]
    counts_b = [1.0, 22.0, 90.0, 60.0, 14.0, 6.0, 0.0]
    a = np.repeat(np.arange(len(counts_a)), np.asarray(counts_a, dtype=int))
    b = np.repeat(np.arange(len(counts_b)), np.asarray(counts_b, dtype=int))
    expected = scipy_stats.mannwhitneyu(a, b, method="asymptotic").pvalue
    result = stats.mann_whitney_grouped(counts_a, counts_b)
    assert result.p_value == pytest.approx(expected, rel=1e-12)
    assert stats.mann_whitney_grouped(counts_b, counts_a).p_value == pytest.approx(expected)


def test_welch_matches_scipy_and_gives_its_interval() -> None:
    expected = scipy_stats.ttest_ind(LARGE_B, LARGE_A, equal_var=False)
    comparison = stats.welch(LARGE_A, LARGE_B)
    assert comparison.p_value == pytest.approx(expected.pvalue, rel=1e-12)
    interval = expected.confidence_interval(0.95)
    assert comparison.interval == stats.Interval(interval.low, interval.high)
    assert comparison.difference == pytest.approx(np.mean(LARGE_B) - np.mean(LARGE_A))
    # t, not z: with 4 + 4 values the interval is much wider than a normal one.
    small = stats.welch([1.0, 2.0, 3.0, 4.0], [2.0, 3.0, 4.0, 5.5])
    assert small.p_value == pytest.approx(
        scipy_stats.ttest_ind([2.0, 3.0, 4.0, 5.5], [1.0, 2.0, 3.0, 4.0], equal_var=False).pvalue
    )
    assert stats.welch([1.0, 1.0], [1.0, 1.0]).p_value == 1.0  # no variance at all
    assert stats.welch([1.0, 1.0], [2.0, 2.0]).p_value == 0.0


def test_two_proportions_matches_statsmodels_and_the_textbook() -> None:
    # 45/100 vs 60/100: pooled z = 2.1243, p = 0.0336.
    comparison = stats.two_proportions(45, 100, 60, 100)
    assert comparison.difference == pytest.approx(0.15)
    assert comparison.p_value == pytest.approx(0.0336, abs=5e-4)
    assert comparison.p_value == pytest.approx(proportions_ztest([60, 45], [100, 100])[1])
    # Newcombe's hybrid score interval (Newcombe 1998, example (b): 9/10 vs 3/10 → 0.1705–0.8090).
    newcombe = stats.two_proportions(3, 10, 9, 10)
    assert newcombe.interval is not None
    assert newcombe.interval.low == pytest.approx(0.1705, abs=5e-4)
    assert newcombe.interval.high == pytest.approx(0.8090, abs=5e-4)
    assert stats.two_proportions(5, 10, 5, 10).p_value == pytest.approx(1.0)
    assert stats.two_proportions(0, 10, 0, 10).p_value == 1.0
    assert stats.two_proportions(10, 10, 10, 10).p_value == 1.0


def test_wilson_interval_known_value() -> None:
    interval = stats.wilson_interval(10, 100)
    assert interval is not None
    assert interval.low == pytest.approx(0.0552, abs=1e-3)
    assert interval.high == pytest.approx(0.1744, abs=1e-3)
    assert stats.wilson_interval(0, 0) is None
    assert stats.wilson_interval(0, 5) == stats.Interval(0.0, pytest.approx(0.4345, abs=1e-3))


def test_poisson_interval_is_garwoods_exact_one() -> None:
    interval = stats.poisson_interval(10)
    assert interval.low == pytest.approx(4.7954, abs=1e-3)
    assert interval.high == pytest.approx(18.3904, abs=1e-3)
    assert stats.poisson_interval(0) == stats.Interval(0.0, pytest.approx(3.6889, abs=1e-3))


def test_holm_matches_statsmodels() -> None:
    p_values = [0.001, 0.04, 0.03, 0.012, 0.2]
    expected = multipletests(p_values, alpha=0.05, method="holm")[0]
    assert stats.holm(p_values) == list(expected) == [True, False, False, True, False]
    assert stats.holm([0.001, 0.04, 0.03, None], 0.05) == [True, False, False, False]
    assert stats.holm([0.01, 0.02, 0.03], 0.05) == [True, True, True]
    assert stats.holm([None], 0.05) == [False]


def test_quantile_is_numpys_linear_definition() -> None:
    values = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0]
    for q in (0.1, 0.5, 0.9, 0.95):
        assert stats.quantile(values, q) == pytest.approx(float(np.quantile(values, q)))
    with pytest.raises(ValueError):
        stats.quantile([], 0.5)


@pytest.mark.parametrize(("n", "q"), [(25, 0.5), (101, 0.5), (400, 0.95), (60, 0.9)])
def test_quantile_interval_is_an_order_statistic_interval_with_its_coverage(
    n: int, q: float
) -> None:
    values = sorted(RNG.exponential(size=n))
    interval = stats.quantile_interval(values, q)
    r, s = values.index(interval.low) + 1, values.index(interval.high) + 1
    binomial = scipy_stats.binom(n, q)
    assert interval.coverage == pytest.approx(binomial.cdf(s - 1) - binomial.cdf(r - 1))
    assert interval.coverage >= 0.95
    # The narrowest equal-tailed one: moving either end in loses the level on that side.
    assert binomial.cdf(r) > 0.025 or r == 1
    assert 1 - binomial.cdf(s - 2) > 0.025 or s == n


def test_quantile_interval_with_too_few_samples_says_what_it_covers() -> None:
    # Five samples: min to max holds the median with 1 - 2/32 = 93.75%.
    interval = stats.quantile_interval([5.0, 1.0, 4.0, 2.0, 3.0], 0.5)
    assert (interval.low, interval.high) == (1.0, 5.0)
    assert interval.coverage == pytest.approx(0.9375)
    assert stats.quantile_interval([7.0], 0.5).coverage == 0.0


def test_sample_quantile_interval_covers_the_true_median() -> None:
    rng = random.Random(3)
    covered = 0
    for _ in range(200):
        values = [rng.random() for _ in range(101)]
        quantile = stats.sample_quantile(values, 0.5)
        assert quantile is not None
        covered += quantile.interval.low <= 0.5 <= quantile.interval.high
    assert covered >= 180  # nominal 95%


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    histogram = stats.Histogram((0.1, 0.2, 0.4, math.inf), (0.0, 50.0, 100.0, 100.0))
    quantile = stats.histogram_quantile(histogram, 0.5)
    assert quantile is not None and quantile.value == pytest.approx(0.2)
    assert histogram.value_at_rank(75) == pytest.approx(0.3)
    assert histogram.value_at_rank(100) == pytest.approx(0.4)
    overflowing = stats.Histogram((0.1, math.inf), (10.0, 20.0))
    assert overflowing.value_at_rank(15) == 0.1  # the +inf bucket: the highest finite bound
    assert stats.histogram_quantile(stats.Histogram((math.inf,), (0.0,)), 0.5) is None


def test_mean_interval_is_students_t() -> None:
    values = [1.0, 2.0, 4.0, 7.0]
    low, high = scipy_stats.t.interval(0.95, 3, loc=np.mean(values), scale=scipy_stats.sem(values))
    assert stats.mean_interval(values) == stats.Interval(pytest.approx(low), pytest.approx(high))
    assert stats.mean_interval([1.0]) is None
    assert stats.mean_interval([2.0, 2.0]) == stats.Interval(2.0, 2.0)


@given(st.integers(0, 500), st.integers(1, 500), st.integers(0, 500), st.integers(1, 500))
def test_two_proportions_invariants(x1: int, n1: int, x2: int, n2: int) -> None:
    x1, x2 = min(x1, n1), min(x2, n2)
    comparison = stats.two_proportions(x1, n1, x2, n2)
    assert comparison.p_value is not None and 0.0 <= comparison.p_value <= 1.0
    assert comparison.interval is not None and comparison.difference is not None
    assert comparison.interval.low - 1e-12 <= comparison.difference
    assert comparison.difference <= comparison.interval.high + 1e-12
    # Swapping the arms flips the sign, not the p-value.
    swapped = stats.two_proportions(x2, n2, x1, n1)
    assert swapped.p_value == pytest.approx(comparison.p_value)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 20), min_size=2, max_size=12), st.data())
def test_grouped_mann_whitney_is_a_symmetric_probability(a: list[int], data: st.DataObject) -> None:
    b = data.draw(st.lists(st.integers(0, 20), min_size=len(a), max_size=len(a)))
    p = stats.mann_whitney_grouped([float(x) for x in a], [float(x) for x in b]).p_value
    if p is not None:
        assert 0.0 <= p <= 1.0
        swapped = stats.mann_whitney_grouped([float(x) for x in b], [float(x) for x in a])
        assert swapped.p_value == pytest.approx(p)
