"""The statistics of `reshape report` (and of the lab's page-load summaries), sans-IO.

Every test and interval comes from scipy or statsmodels; this module chooses which one, handles
the degenerate cases (no data, no variance) the libraries answer with NaN, and says in each
result which method gave it. Every interval is a 95% interval, every p-value two-sided. See
reshape/report/__init__.py for which measure uses what and why.

Two computations are written out here, because no library takes their input:
- Mann-Whitney U on histograms (Prometheus buckets): scipy takes raw samples, and a histogram's
  counts may be millions. The statistic, its tie correction and continuity correction are those
  of `scipy.stats.mannwhitneyu(method="asymptotic")` applied to the bucket counts; the tests
  check both give the same p-value on the same data.
- the order-statistic interval of a quantile, with its coverage when too few samples reach the
  level (the lab reports it): the coverage is scipy's binomial distribution.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as scipy_stats
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import (
    confint_proportions_2indep,
    proportion_confint,
    proportions_ztest,
)

LEVEL = 0.95
ALPHA = 1 - LEVEL
# Mann-Whitney: the exact null distribution when it is cheap (no ties: scipy's recursion, about
# 20 ms at 100 x 100 here; ties: every distinct split of the pooled sample), else the normal
# approximation with tie and continuity corrections.
EXACT_MAX_PRODUCT = 10_000  # n1·n2
PERMUTATION_MAX_SPLITS = 20_000  # C(n1 + n2, n1)


@dataclass(frozen=True)
class Interval:
    low: float
    high: float


@dataclass(frozen=True)
class Comparison:
    """Treatment minus reference, with its interval and p-value (None: not computable), and the
    test that gave the p-value."""

    difference: float | None
    interval: Interval | None
    p_value: float | None
    test: str | None = None


NOT_COMPARABLE = Comparison(None, None, None)


# shares: x of n requests


def wilson_interval(x: int, n: int) -> Interval | None:
    """Wilson score interval for a share x/n (behaves at 0 and 1, unlike Wald's)."""
    if n <= 0:
        return None
    low, high = proportion_confint(x, n, alpha=ALPHA, method="wilson")
    # At x = 0 or x = n the bound is exactly 0 or 1; floating point would miss it by 1e-16.
    return Interval(0.0 if x == 0 else float(low), 1.0 if x == n else float(high))


def two_proportions(x1: int, n1: int, x2: int, n2: int) -> Comparison:
    """p2 - p1: Newcombe's hybrid score interval for the difference; p-value of the pooled
    two-proportion z-test."""
    if n1 <= 0 or n2 <= 0:
        return NOT_COMPARABLE
    difference = x2 / n2 - x1 / n1
    low, high = confint_proportions_2indep(
        x2, n2, x1, n1, method="newcomb", compare="diff", alpha=ALPHA
    )
    # Both shares 0, or both 1: no variance, and statsmodels would divide by zero.
    no_variance = (x1 + x2) in (0, n1 + n2)
    p_value = 1.0 if no_variance else float(proportions_ztest([x2, x1], [n2, n1])[1])
    return Comparison(difference, Interval(float(low), float(high)), p_value, "two-proportion z")


# counts


def poisson_interval(count: float) -> Interval:
    """Exact (Garwood) interval for a Poisson mean from one count, via the chi-square quantiles."""
    x = max(0.0, count)
    low = 0.0 if x == 0 else scipy_stats.chi2.ppf(ALPHA / 2, 2 * x) / 2
    high = scipy_stats.chi2.ppf(1 - ALPHA / 2, 2 * x + 2) / 2
    return Interval(float(low), float(high))


# means (bytes per request, from the log)


def mean_interval(values: Sequence[float]) -> Interval | None:
    """Student's t interval for the mean."""
    n = len(values)
    if n < 2:
        return None
    data = np.asarray(values, dtype=float)
    mean, sem = float(data.mean()), float(scipy_stats.sem(data))
    if sem == 0:
        return Interval(mean, mean)
    low, high = scipy_stats.t.interval(LEVEL, n - 1, loc=mean, scale=sem)
    return Interval(float(low), float(high))


def welch(a: Sequence[float], b: Sequence[float]) -> Comparison:
    """mean(b) - mean(a): Welch's unequal-variance t-test and its interval."""
    if len(a) < 2 or len(b) < 2:
        return NOT_COMPARABLE
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    difference = float(xb.mean() - xa.mean())
    if xa.var() == 0 and xb.var() == 0:  # t is 0/0 or ±inf: scipy says NaN
        p_value = 1.0 if difference == 0 else 0.0
        return Comparison(difference, Interval(difference, difference), p_value, "Welch t")
    result = scipy_stats.ttest_ind(xb, xa, equal_var=False)
    interval = result.confidence_interval(LEVEL)
    return Comparison(
        difference,
        Interval(float(interval.low), float(interval.high)),
        float(result.pvalue),
        "Welch t",
    )


# quantiles: one definition, for the report and the lab


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0-1), interpolated linearly between order statistics (numpy's default,
    Hyndman and Fan's type 7)."""
    if len(values) == 0:
        raise ValueError("quantile of no values")
    return float(np.quantile(np.asarray(values, dtype=float), q))


@dataclass(frozen=True)
class QuantileInterval:
    """Order statistics bounding the q-quantile with probability `coverage`, whatever the
    distribution; the widest (min to max) with its lower coverage when no pair reaches the level.
    """

    low: float
    high: float
    coverage: float


def quantile_interval(values: Sequence[float], q: float, level: float = LEVEL) -> QuantileInterval:
    """The equal-tailed order-statistic interval for the q-quantile (0 < q < 1)."""
    ordered = np.sort(np.asarray(values, dtype=float))
    n = len(ordered)
    if n < 2:
        value = float(ordered[0]) if n else math.nan
        return QuantileInterval(value, value, 0.0)
    binomial = scipy_stats.binom(n, q)
    tail = (1 - level) / 2
    # Ranks (1-based) r and s with P(X_(r) <= quantile <= X_(s)) = F(s - 1) - F(r - 1) >= level.
    r = int(binomial.ppf(tail))  # F(r - 1) <= tail
    s = int(binomial.ppf(1 - tail)) + 1  # F(s - 1) >= 1 - tail
    r, s = max(r, 1), min(s, n)
    while r > 1 and binomial.cdf(s - 1) - binomial.cdf(r - 1) < level:
        r -= 1
    coverage = float(binomial.cdf(s - 1) - binomial.cdf(r - 1))
    return QuantileInterval(float(ordered[r - 1]), float(ordered[s - 1]), coverage)


@dataclass(frozen=True)
class Quantile:
    value: float
    interval: Interval


def sample_quantile(values: Sequence[float], q: float) -> Quantile | None:
    """The q-quantile of `values` with its order-statistic interval."""
    if len(values) == 0:
        return None
    interval = quantile_interval(values, q)
    return Quantile(quantile(values, q), Interval(interval.low, interval.high))


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
        i = int(np.searchsorted(self.counts, rank, side="left"))
        i = min(i, len(self.counts) - 1)
        if math.isinf(self.bounds[i]):
            return self.bounds[i - 1] if i > 0 else 0.0
        lower_bound = self.bounds[i - 1] if i > 0 else 0.0
        lower_count = self.counts[i - 1] if i > 0 else 0.0
        in_bucket = self.counts[i] - lower_count
        if in_bucket <= 0:
            return self.bounds[i]
        return lower_bound + (self.bounds[i] - lower_bound) * (rank - lower_count) / in_bucket


def histogram_quantile(histogram: Histogram, q: float) -> Quantile | None:
    """The q-quantile by bucket interpolation, with the order-statistic ranks (binomial, as for
    samples) mapped through the same interpolation, so it is only as fine as the buckets."""
    n = histogram.total
    if n <= 0:
        return None
    binomial = scipy_stats.binom(round(n), q)
    low, high = binomial.ppf(ALPHA / 2), binomial.ppf(1 - ALPHA / 2) + 1
    return Quantile(
        histogram.value_at_rank(n * q),
        Interval(histogram.value_at_rank(float(low)), histogram.value_at_rank(float(high))),
    )


def quantile_difference(a: Quantile | None, b: Quantile | None) -> tuple[float, Interval] | None:
    """b - a, its interval from each quantile's half-width as if normal and independent (an
    approximation, not a bootstrap: the report's latencies may be millions of samples)."""
    if a is None or b is None:
        return None
    z = scipy_stats.norm.ppf(1 - ALPHA / 2)
    se_a = (a.interval.high - a.interval.low) / (2 * z)
    se_b = (b.interval.high - b.interval.low) / (2 * z)
    difference = b.value - a.value
    half = z * math.hypot(se_a, se_b)
    return difference, Interval(difference - half, difference + half)


# distributions: Mann-Whitney U


def mann_whitney(a: Sequence[float], b: Sequence[float]) -> Comparison:
    """Two-sided Mann-Whitney U test of raw samples (scipy): exact when cheap — scipy's exact
    distribution without ties, every distinct permutation with ties — else the normal
    approximation with tie and continuity corrections. Only `p_value` and `test` are set."""
    n1, n2 = len(a), len(b)
    if n1 == 0 or n2 == 0:
        return NOT_COMPARABLE
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    pooled = np.concatenate([xa, xb])
    if np.all(pooled == pooled[0]):
        return Comparison(None, None, 1.0, "Mann-Whitney U, all values equal")
    ties = len(np.unique(pooled)) < n1 + n2
    method: str | scipy_stats.PermutationMethod
    if not ties and n1 * n2 <= EXACT_MAX_PRODUCT:
        method, name = "exact", "Mann-Whitney U, exact"
    elif ties and min(n1, n2) >= 2 and math.comb(n1 + n2, n1) <= PERMUTATION_MAX_SPLITS:
        # (scipy's permutation test refuses a sample of one observation)
        method = scipy_stats.PermutationMethod(n_resamples=math.inf)
        name = "Mann-Whitney U, exact with ties"
    else:
        method, name = "asymptotic", "Mann-Whitney U, normal approx."
    result = scipy_stats.mannwhitneyu(xa, xb, alternative="two-sided", method=method)
    return Comparison(None, None, min(1.0, float(result.pvalue)), name)


def bucket_counts(histogram: Histogram) -> list[float]:
    """Per-bucket (not cumulative) counts."""
    return [max(0.0, c) for c in np.diff(histogram.counts, prepend=0.0)]


def mann_whitney_grouped(a: Sequence[float], b: Sequence[float]) -> Comparison:
    """Mann-Whitney U from counts per ordered group (`a[i]`, `b[i]`: observations of each sample
    in group i, e.g. one histogram bucket; within a group all are ties): the statistic and
    p-value of scipy's asymptotic method on the samples the counts stand for."""
    counts_a, counts_b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    n1, n2 = counts_a.sum(), counts_b.sum()
    if n1 <= 0 or n2 <= 0:
        return NOT_COMPARABLE
    n = n1 + n2
    groups = counts_a + counts_b
    below = np.cumsum(groups) - groups
    midranks = below + (groups + 1) / 2
    u1 = float((counts_a * midranks).sum() - n1 * (n1 + 1) / 2)
    mean = n1 * n2 / 2
    tie_term = float((groups**3 - groups).sum())
    variance = n1 * n2 / 12 * ((n + 1) - tie_term / (n * (n - 1))) if n > 1 else 0.0
    name = "Mann-Whitney U, normal approx. on buckets"
    if variance <= 0:
        return Comparison(None, None, 1.0, name)
    # scipy: U = max(U1, U2), z = (U - mean - 0.5) / sd, p = 2·sf(z).
    u = max(u1, n1 * n2 - u1)
    z = (u - mean - 0.5) / math.sqrt(variance)
    return Comparison(None, None, min(1.0, float(2 * scipy_stats.norm.sf(z))), name)


def holm(p_values: Sequence[float | None], alpha: float = ALPHA) -> list[bool]:
    """Which hypotheses Holm's step-down procedure rejects at family-wise level `alpha`."""
    present = [(i, p) for i, p in enumerate(p_values) if p is not None]
    rejected = [False] * len(p_values)
    if present:
        decisions = multipletests([p for _, p in present], alpha=alpha, method="holm")[0]
        for (i, _), decision in zip(present, decisions, strict=True):
            rejected[i] = bool(decision)
    return rejected
