"""Summaries of repeated page loads: median, p90 and a distribution-free interval for the median.

The interval comes from order statistics: for n samples, the k-th smallest and k-th largest bound
the median with probability 1 - 2·P(Binomial(n, 1/2) < k), whatever the distribution. With few
samples the widest such interval (min to max) may fall short of 95%; `Summary.coverage` then says
what it does reach (93.8% for 5 samples, 75% for 3), rather than pretending.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

LEVEL = 0.95


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
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


def median_interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float, float]:
    """(low, high, coverage): the narrowest order-statistic interval for the median whose coverage
    is at least `level`, or (min, max) and its coverage when no interval reaches it."""
    ordered = sorted(values)
    n = len(ordered)
    if n < 2:
        value = ordered[0] if ordered else math.nan
        return value, value, 0.0
    best = (ordered[0], ordered[-1], _coverage(n, 1))
    # k-th smallest to k-th largest; a larger k is a narrower interval with less coverage.
    for k in range(1, n // 2 + 1):
        coverage = _coverage(n, k)
        if coverage < level:
            break
        best = (ordered[k - 1], ordered[n - k], coverage)
    return best


def summarize(values: Sequence[float], level: float = LEVEL) -> Summary:
    if not values:
        raise ValueError("summary of no values")
    low, high, coverage = median_interval(values, level)
    return Summary(len(values), percentile(values, 50), percentile(values, 90), low, high, coverage)


def _coverage(n: int, k: int) -> float:
    """P(X_(k) <= median <= X_(n-k+1)) = 1 - 2·P(Binomial(n, 1/2) <= k - 1)."""
    tail = sum(math.comb(n, i) for i in range(k)) / 2**n
    return 1 - 2 * tail
