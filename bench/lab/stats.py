"""Summaries of repeated page loads: median, p90 and a distribution-free interval for the median.

The statistics are `reshape report`'s own (reshape/report/stats.py), so the lab and the report
mean the same by a percentile: linear interpolation between order statistics. The interval comes
from order statistics: for n samples, the k-th smallest and k-th largest bound the median with
probability 1 - 2·P(Binomial(n, 1/2) < k), whatever the distribution. With few samples the widest
such interval (min to max) may fall short of 95%; `Summary.coverage` then says what it does reach
(93.8% for 5 samples, 75% for 3), rather than pretending.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from reshape.report.stats import LEVEL, quantile, quantile_interval


@dataclass(frozen=True)
class Summary:
    n: int
    median: float
    p90: float
    low: float  # interval for the median
    high: float
    coverage: float  # the interval's probability of holding the median (0 when n < 2)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0–100), interpolating linearly between order statistics."""
    return quantile(values, q / 100)


def median_interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float, float]:
    """(low, high, coverage): the narrowest order-statistic interval for the median whose coverage
    is at least `level`, or (min, max) and its coverage when no interval reaches it."""
    interval = quantile_interval(values, 0.5, level)
    return interval.low, interval.high, interval.coverage


def summarize(values: Sequence[float], level: float = LEVEL) -> Summary:
    if not values:
        raise ValueError("summary of no values")
    low, high, coverage = median_interval(values, level)
    return Summary(len(values), percentile(values, 50), percentile(values, 90), low, high, coverage)
