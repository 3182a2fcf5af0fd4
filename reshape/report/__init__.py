"""`reshape report`: per-arm numbers of one experiment, and whether the arms differ.

Data: `--prometheus URL` reads reshape's metrics from a Prometheus server (instant queries on its
HTTP API; without `--since` the counters' values now, i.e. since each proxy process started,
summed over processes; with `--since D`, `increase(...[D])`, which Prometheus extrapolates to the
window's edges, so counts are approximate). `--log FILE` reads the proxy's own request log
(reshape/features/request_log/addon.py), one record per request.

Per arm, with 95% intervals:

- requests: the count, with a Poisson interval (Byar's approximation). Not compared between arms:
  how many requests an arm gets is set by the weights.
- transaction latency p50 / p95: from the log, the sample quantile with the distribution-free
  order-statistic interval (ranks n·q ± 1.96·√(n·q·(1−q))). From Prometheus, the quantile is
  interpolated linearly inside the histogram bucket (as `histogram_quantile`) and the same rank
  interval is mapped through that interpolation, so it can be no finer than the buckets.
- queue share, upstream connections per request, error share: shares x/n with Wilson intervals.
  Connections per request is the share of requests that opened a new upstream connection, among
  requests whose connection kind is known (pooled: `reshape_upstream_requests_total`; mitmproxy's
  own connections: `reshape_direct_requests_total`; in the log, `upstream_connection`). The log
  does not know queueing or the connection kind of pooled requests yet: n/a there.
- response bytes per request: from the log, the mean with a normal interval; from Prometheus only
  the total over the count (a counter has no per-request variance): no interval, no test.

Between each arm and the reference (`control`, else the first arm by name): the difference with a
95% interval and a two-sided p-value.

- latency: the p-value is the Mann-Whitney U test (normal approximation, tie-corrected) of the
  whole distributions — on the raw values from the log, on the bucket counts from Prometheus
  (observations in one bucket are ties, which makes the test conservative). The quantile
  difference's interval combines the two per-arm intervals as if normal and independent: an
  approximation, not a bootstrap.
- shares: the pooled two-proportion z-test; the interval of the difference is Wald's. Requests are
  treated as independent; requests of one client (the experiment's unit) are not, so with few
  units and many requests each the p-values are too small. Plan experiments with many units.
- bytes per request (log): Welch's unequal-variance z (normal approximation, large samples).

"Significant" means rejected by Holm's step-down procedure at a 5% family-wise level over the
five tests of one arm against the reference (latency, queue share, connections, bytes, errors),
so an A/A experiment shows a significant difference in at most 5% of runs.

`--plot DIR` writes one PNG bar chart per measure (reshape/report/png.py, standard library only).
"""

from __future__ import annotations

from pathlib import Path

from reshape.report.analysis import Report, analyse
from reshape.report.render import text_report, write_plots
from reshape.report.sources import PrometheusClient, load_log, load_prometheus, parse_duration


def build_report(
    experiment: str,
    *,
    prometheus: str | None = None,
    log: Path | None = None,
    since: str | None = None,
) -> Report:
    seconds = parse_duration(since) if since is not None else None
    if prometheus is not None:
        data = load_prometheus(PrometheusClient(prometheus), experiment, seconds)
    else:
        assert log is not None
        data = load_log(log, experiment, seconds)
    return analyse(data)


__all__ = ["Report", "build_report", "text_report", "write_plots"]
