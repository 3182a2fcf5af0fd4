"""The report's statistics against known values and invariants."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reshape.report import stats


def test_wilson_interval_known_value() -> None:
    interval = stats.wilson_interval(10, 100)
    assert interval is not None
    assert interval.low == pytest.approx(0.0552, abs=1e-3)
    assert interval.high == pytest.approx(0.1744, abs=1e-3)
    assert stats.wilson_interval(0, 0) is None


def test_two_proportions_known_value() -> None:
    # 45/100 vs 60/100: pooled z = 2.1243, p = 0.0336 (textbook two-proportion z-test).
    comparison = stats.two_proportions(45, 100, 60, 100)
    assert comparison.difference == pytest.approx(0.15)
    assert comparison.p_value == pytest.approx(0.0336, abs=5e-4)
    assert stats.two_proportions(5, 10, 5, 10).p_value == pytest.approx(1.0)
    assert stats.two_proportions(0, 10, 0, 10).p_value == 1.0


def test_poisson_interval_known_values() -> None:
    # Exact Garwood limits for 10: [4.795, 18.39]; Byar's approximation is within 1%.
    interval = stats.poisson_interval(10)
    assert interval.low == pytest.approx(4.795, rel=0.01)
    assert interval.high == pytest.approx(18.39, rel=0.01)
    assert stats.poisson_interval(0).low == 0.0
    assert stats.poisson_interval(0).high == pytest.approx(3.69, rel=0.02)


def test_mann_whitney_known_value() -> None:
    # Ranks of a: 1, 2, 3, 4, 6 → U = 1; n1 = n2 = 5: z = (1 − 12.5) / √(275/12) = −2.402,
    # p = 0.0163.
    a = [1.0, 2.0, 3.0, 4.0, 6.0]
    b = [5.0, 7.0, 8.0, 9.0, 10.0]
    assert stats.mann_whitney(a, b) == pytest.approx(0.0163, abs=2e-4)
    assert stats.mann_whitney(a, a) == pytest.approx(1.0)
    assert stats.mann_whitney([], a) is None


def test_grouped_mann_whitney_equals_raw_on_grouped_values() -> None:
    rng = random.Random(7)
    a = [float(rng.randint(0, 5)) for _ in range(200)]
    b = [float(rng.randint(1, 6)) for _ in range(150)]
    groups = sorted(set(a) | set(b))
    counts_a = [float(a.count(g)) for g in groups]
    counts_b = [float(b.count(g)) for g in groups]
    assert stats.mann_whitney_grouped(counts_a, counts_b) == pytest.approx(stats.mann_whitney(a, b))


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    histogram = stats.Histogram((0.1, 0.2, 0.4, math.inf), (0.0, 50.0, 100.0, 100.0))
    quantile = stats.histogram_quantile(histogram, 0.5)
    assert quantile is not None and quantile.value == pytest.approx(0.2)
    assert histogram.value_at_rank(75) == pytest.approx(0.3)
    assert histogram.value_at_rank(100) == pytest.approx(0.4)
    overflowing = stats.Histogram((0.1, math.inf), (10.0, 20.0))
    assert overflowing.value_at_rank(15) == 0.1  # the +inf bucket: the highest finite bound
    assert stats.histogram_quantile(stats.Histogram((math.inf,), (0.0,)), 0.5) is None


def test_sample_quantile_interval_covers_the_true_median() -> None:
    rng = random.Random(3)
    covered = 0
    for _ in range(200):
        values = sorted(rng.random() for _ in range(101))
        quantile = stats.sample_quantile(values, 0.5)
        assert quantile is not None
        covered += quantile.interval.low <= 0.5 <= quantile.interval.high
    assert covered >= 180  # nominal 95%


def test_holm() -> None:
    assert stats.holm([0.001, 0.04, 0.03, None], 0.05) == [True, False, False, False]
    assert stats.holm([0.01, 0.02, 0.03], 0.05) == [True, True, True]
    assert stats.holm([None], 0.05) == [False]


@given(st.integers(0, 500), st.integers(1, 500), st.integers(0, 500), st.integers(1, 500))
def test_two_proportions_invariants(x1: int, n1: int, x2: int, n2: int) -> None:
    x1, x2 = min(x1, n1), min(x2, n2)
    comparison = stats.two_proportions(x1, n1, x2, n2)
    assert comparison.p_value is not None and 0.0 <= comparison.p_value <= 1.0
    assert comparison.interval is not None
    assert comparison.interval.low <= comparison.difference <= comparison.interval.high
    # Swapping the arms flips the sign, not the p-value.
    swapped = stats.two_proportions(x2, n2, x1, n1)
    assert swapped.p_value == pytest.approx(comparison.p_value)


@given(st.lists(st.integers(0, 20), min_size=2, max_size=12), st.data())
def test_mann_whitney_p_is_a_probability_and_symmetric(a: list[int], data: st.DataObject) -> None:
    b = data.draw(st.lists(st.integers(0, 20), min_size=len(a), max_size=len(a)))
    p = stats.mann_whitney_grouped([float(x) for x in a], [float(x) for x in b])
    if p is not None:
        assert 0.0 <= p <= 1.0
        assert stats.mann_whitney_grouped(
            [float(x) for x in b], [float(x) for x in a]
        ) == pytest.approx(p)
