"""Per-arm summaries and arm-vs-reference comparisons, from `ExperimentData` (sans-IO)."""

from __future__ import annotations

from dataclasses import dataclass

from reshape.report import stats
from reshape.report.sources import ArmData, ExperimentData
from reshape.report.stats import Comparison, Interval

# Family-wise significance level of the comparisons of one arm with the reference (Holm).
ALPHA = stats.ALPHA


@dataclass(frozen=True)
class Estimate:
    value: float | None
    interval: Interval | None = None


@dataclass(frozen=True)
class Measure:
    key: str
    title: str
    unit: str  # for display: "", "ms", "%", "B"
    axis: str  # what a chart's value axis says
    base_unit: str  # what values are in (JSON and CSV carry them so)


MEASURES = (
    Measure("requests", "requests", "", "requests", "requests"),
    Measure("latency_p50", "transaction latency p50", "ms", "latency p50 (ms)", "seconds"),
    Measure("latency_p95", "transaction latency p95", "ms", "latency p95 (ms)", "seconds"),
    Measure("queue_share", "queue share", "%", "requests that waited (%)", "ratio"),
    Measure(
        "connections",
        "upstream connections per request",
        "",
        "new connections / request",
        "ratio",
    ),
    Measure("bytes", "response bytes per request", "B", "bytes per request", "bytes"),
    Measure("error_share", "error share", "%", "requests not ok (%)", "ratio"),
)


@dataclass(frozen=True)
class ArmComparison:
    arm: str
    reference: str
    comparisons: dict[str, Comparison]
    significant: dict[str, bool]


@dataclass(frozen=True)
class Report:
    data: ExperimentData
    reference: str
    estimates: dict[str, dict[str, Estimate]]  # arm → measure key → estimate
    comparisons: list[ArmComparison]


def _share(x: int | None, n: int | None) -> Estimate:
    if x is None or not n:
        return Estimate(None)
    x = min(x, n)
    return Estimate(x / n, stats.wilson_interval(x, n))


def _quantile(data: ArmData, q: float) -> stats.Quantile | None:
    if data.latencies is not None:
        return stats.sample_quantile(data.latencies, q)
    if data.histogram is not None:
        return stats.histogram_quantile(data.histogram, q)
    return None


def estimates(data: ArmData) -> dict[str, Estimate]:
    result: dict[str, Estimate] = {}
    result["requests"] = Estimate(data.requests, stats.poisson_interval(data.requests))
    for key, q in (("latency_p50", 0.5), ("latency_p95", 0.95)):
        quantile = _quantile(data, q)
        result[key] = Estimate(quantile.value, quantile.interval) if quantile else Estimate(None)
    result["queue_share"] = _share(data.queued, data.requests)
    result["connections"] = _share(data.new_connections, data.connection_known)
    if data.bytes_values is not None:
        values = data.bytes_values
        result["bytes"] = Estimate(
            sum(values) / len(values) if values else None, stats.mean_interval(values)
        )
    else:
        result["bytes"] = Estimate(data.bytes_total / data.requests if data.requests else None)
    result["error_share"] = _share(data.errors, data.requests)
    return result


def _latency_test(a: ArmData, b: ArmData) -> Comparison:
    if a.latencies is not None and b.latencies is not None:
        return stats.mann_whitney(a.latencies, b.latencies)
    if (
        a.histogram is not None
        and b.histogram is not None
        and a.histogram.bounds == b.histogram.bounds
    ):
        return stats.mann_whitney_grouped(
            stats.bucket_counts(a.histogram), stats.bucket_counts(b.histogram)
        )
    return stats.NOT_COMPARABLE


def _proportions(x1: int | None, n1: int | None, x2: int | None, n2: int | None) -> Comparison:
    if x1 is None or x2 is None or not n1 or not n2:
        return stats.NOT_COMPARABLE
    return stats.two_proportions(min(x1, n1), n1, min(x2, n2), n2)


def compare(reference: ArmData, arm: ArmData) -> dict[str, Comparison]:
    result: dict[str, Comparison] = {"requests": stats.NOT_COMPARABLE}
    latency = _latency_test(reference, arm)  # one test of the whole distributions
    for key, q in (("latency_p50", 0.5), ("latency_p95", 0.95)):
        difference = stats.quantile_difference(_quantile(reference, q), _quantile(arm, q))
        result[key] = Comparison(
            difference[0] if difference else None,
            difference[1] if difference else None,
            latency.p_value,
            latency.test,
        )
    result["queue_share"] = _proportions(
        reference.queued, reference.requests, arm.queued, arm.requests
    )
    result["connections"] = _proportions(
        reference.new_connections,
        reference.connection_known,
        arm.new_connections,
        arm.connection_known,
    )
    if reference.bytes_values is not None and arm.bytes_values is not None:
        result["bytes"] = stats.welch(reference.bytes_values, arm.bytes_values)
    else:
        result["bytes"] = stats.NOT_COMPARABLE
    result["error_share"] = _proportions(
        reference.errors, reference.requests, arm.errors, arm.requests
    )
    return result


def reference_arm(names: list[str]) -> str:
    """The arm others are compared with: one named `control`, else the first by name."""
    return "control" if "control" in names else sorted(names)[0]


def analyse(data: ExperimentData) -> Report:
    names = list(data.arms)
    reference = reference_arm(names)
    comparisons = []
    for name in names:
        if name == reference:
            continue
        compared = compare(data.arms[reference], data.arms[name])
        # One test per distinct question: the two latency rows share the rank test's p-value.
        keys = [m.key for m in MEASURES if m.key != "latency_p95"]
        rejected = stats.holm([compared[k].p_value for k in keys], ALPHA)
        significant = dict(zip(keys, rejected, strict=True))
        significant["latency_p95"] = significant["latency_p50"]
        comparisons.append(ArmComparison(name, reference, compared, significant))
    return Report(
        data,
        reference,
        {name: estimates(arm) for name, arm in data.arms.items()},
        comparisons,
    )
