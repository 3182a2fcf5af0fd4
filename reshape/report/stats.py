"""The statistics of `reshape report`: sans-IO, standard library only.

Every interval is a 95% interval; every p-value two-sided. See reshape/report/__init__.py for what
each measure uses and why.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

Z95 = 1.959963984540054


def normal_two_sided_p(z: float) -> float:
    return math.erfc(abs(z) / math.sqrt(2.0))


@dataclass(frozen=True)
class Interval:
    low: float
    high: float


@dataclass(frozen=True)
class Comparison:
    """Treatment minus reference, with its interval and p-value (None: not computable)."""

    difference: float | None
    interval: Interval | None
    p_value: float | None


NOT_COMPARABLE = Comparison(None, None, None)


# shares: x of n requests


def wilson_interval(x: int, n: int) -> Interval | None:
    """Wilson score interval for a share x/n (behaves at 0 and 1, unlike the Wald interval)."""
    if n <= 0:
        return None
    p = x / n
    denominator = 1 + Z95**2 / n
    centre = (p + Z95**2 / (2 * n)) / denominator
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95**2 / (4 * n * n)) / denominator
    # At x = 0 or x = n the bound is exactly 0 or 1; floating point would miss it by 1e-16.
    low = 0.0 if x == 0 else max(0.0, centre - half)
    high = 1.0 if x == n else min(1.0, centre + half)
    return Interval(low, high)


def two_proportions(x1: int, n1: int, x2: int, n2: int) -> Comparison:
    """p2 - p1: Wald interval for the difference; p-value of the pooled two-proportion z-test."""
    if n1 <= 0 or n2 <= 0:
        return NOT_COMPARABLE
    p1, p2 = x1 / n1, x2 / n2
    difference = p2 - p1
    se = math.sqrt(p1 * (1 - p1) / n1 + p2 * (1 - p2) / n2)
    pooled = (x1 + x2) / (n1 + n2)
    se_pooled = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
    p_value = 1.0 if se_pooled == 0 else normal_two_sided_p(difference / se_pooled)
    return Comparison(
        difference, Interval(difference - Z95 * se, difference + Z95 * se), min(1.0, p_value)
    )


# counts


def poisson_interval(count: float) -> Interval:
    """Approximate 95% interval for a Poisson mean from one count (Byar's approximation)."""
    x = max(0.0, count)
    low = 0.0 if x == 0 else x * (1 - 1 / (9 * x) - Z95 / (3 * math.sqrt(x))) ** 3
    high = (x + 1) * (1 - 1 / (9 * (x + 1)) + Z95 / (3 * math.sqrt(x + 1))) ** 3
    return Interval(max(0.0, low), high)


# means (bytes per request, from the log)


def mean_interval(values: Sequence[float]) -> Interval | None:
    n = len(values)
    if n < 2:
        return None
    mean = sum(values) / n
    variance = sum((v - mean) ** 2 for v in values) / (n - 1)
    half = Z95 * math.sqrt(variance / n)
    return Interval(mean - half, mean + half)


def welch(a: Sequence[float], b: Sequence[float]) -> Comparison:
    """mean(b) - mean(a); Welch's unequal-variance z (normal approximation, large samples)."""
    if len(a) < 2 or len(b) < 2:
        return NOT_COMPARABLE
    mean_a, mean_b = sum(a) / len(a), sum(b) / len(b)
    var_a = sum((v - mean_a) ** 2 for v in a) / (len(a) - 1)
    var_b = sum((v - mean_b) ** 2 for v in b) / (len(b) - 1)
    se = math.sqrt(var_a / len(a) + var_b / len(b))
    difference = mean_b - mean_a
    p_value = (1.0 if difference == 0 else 0.0) if se == 0 else normal_two_sided_p(difference / se)
    return Comparison(difference, Interval(difference - Z95 * se, difference + Z95 * se), p_value)


# distributions: raw samples (the log) or Prometheus histograms


@dataclass(frozen=True)
class Histogram:
    """Cumulative bucket counts as Prometheus keeps them: `counts[i]` observations ≤ `bounds[i]`;
    the last bound is +inf."""

    bounds: tuple[float, ...]
    counts: tuple[float, ...]

    @property
    def total(self) -> float:
        return self.counts[-1] if self.counts else 0.0

    def value_at_rank(self, rank: float) -> float:
        """The value below which `rank` observations lie, interpolated linearly inside a bucket
        (as Prometheus' histogram_quantile); the first bucket starts at 0, and a rank in the +inf
        bucket gets the highest finite bound."""
        rank = min(max(rank, 0.0), self.total)
        i = bisect.bisect_left(self.counts, rank)
        i = min(i, len(self.counts) - 1)
        if math.isinf(self.bounds[i]):
            return self.bounds[i - 1] if i > 0 else 0.0
        lower_bound = self.bounds[i - 1] if i > 0 else 0.0
        lower_count = self.counts[i - 1] if i > 0 else 0.0
        in_bucket = self.counts[i] - lower_count
        if in_bucket <= 0:
            return self.bounds[i]
        return lower_bound + (self.bounds[i] - lower_bound) * (rank - lower_count) / in_bucket


def _rank_interval(n: float, q: float) -> tuple[float, float]:
    """Ranks bounding the q-quantile with ~95% coverage (binomial order-statistic interval,
    normal approximation)."""
    half = Z95 * math.sqrt(n * q * (1 - q))
    return max(0.0, n * q - half), min(n, n * q + half + 1)


@dataclass(frozen=True)
class Quantile:
    value: float
    interval: Interval


def sample_quantile(values: Sequence[float], q: float) -> Quantile | None:
    """The q-quantile of sorted `values` with a distribution-free order-statistic interval."""
    n = len(values)
    if n == 0:
        return None

    def at(rank: float) -> float:
        return values[min(n - 1, max(0, math.ceil(rank) - 1))]

    low, high = _rank_interval(n, q)
    return Quantile(at(n * q), Interval(at(low), at(high)))


def histogram_quantile(histogram: Histogram, q: float) -> Quantile | None:
    """The q-quantile by bucket interpolation, with the order-statistic interval mapped through
    the same interpolation (so it is only as fine as the buckets)."""
    n = histogram.total
    if n <= 0:
        return None
    low, high = _rank_interval(n, q)
    return Quantile(
        histogram.value_at_rank(n * q),
        Interval(histogram.value_at_rank(low), histogram.value_at_rank(high)),
    )


def quantile_difference(a: Quantile | None, b: Quantile | None) -> tuple[float, Interval] | None:
    """b - a, its interval from each quantile's half-width as if normal and independent."""
    if a is None or b is None:
        return None
    se_a = (a.interval.high - a.interval.low) / (2 * Z95)
    se_b = (b.interval.high - b.interval.low) / (2 * Z95)
    difference = b.value - a.value
    half = Z95 * math.hypot(se_a, se_b)
    return difference, Interval(difference - half, difference + half)


def mann_whitney_grouped(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Two-sided p-value of the Mann-Whitney U test from counts per ordered group (`a[i]`,
    `b[i]`: observations of each sample in group i; a group is one value, or one histogram
    bucket). Equal values are ties (midranks, tie-corrected variance, normal approximation)."""
    n1, n2 = sum(a), sum(b)
    if n1 <= 0 or n2 <= 0:
        return None
    n = n1 + n2
    rank_sum_a = 0.0
    below = 0.0
    tie_term = 0.0
    for count_a, count_b in zip(a, b, strict=True):
        t = count_a + count_b
        if t <= 0:
            continue
        midrank = below + (t + 1) / 2
        rank_sum_a += count_a * midrank
        tie_term += t**3 - t
        below += t
    u = rank_sum_a - n1 * (n1 + 1) / 2
    mean = n1 * n2 / 2
    variance = n1 * n2 / 12 * ((n + 1) - tie_term / (n * (n - 1))) if n > 1 else 0.0
    if variance <= 0:
        return 1.0
    z = (u - mean) / math.sqrt(variance)
    return normal_two_sided_p(z)


def mann_whitney(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Mann-Whitney U on raw samples (grouped by equal values)."""
    values = sorted(set(a) | set(b))
    index = {v: i for i, v in enumerate(values)}
    counts_a = [0.0] * len(values)
    counts_b = [0.0] * len(values)
    for v in a:
        counts_a[index[v]] += 1
    for v in b:
        counts_b[index[v]] += 1
    return mann_whitney_grouped(counts_a, counts_b)


def bucket_counts(histogram: Histogram) -> list[float]:
    """Per-bucket (not cumulative) counts."""
    previous = 0.0
    counts = []
    for cumulative in histogram.counts:
        counts.append(max(0.0, cumulative - previous))
        previous = cumulative
    return counts


def holm(p_values: Sequence[float | None], alpha: float) -> list[bool]:
    """Which hypotheses Holm's step-down procedure rejects at family-wise level `alpha`."""
    indexed = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    rejected = [False] * len(p_values)
    m = len(indexed)
    for step, (p, i) in enumerate(indexed):
        if p > alpha / (m - step):
            break
        rejected[i] = True
    return rejected
