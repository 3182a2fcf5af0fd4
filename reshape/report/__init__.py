"""`reshape report`: per-arm numbers of one experiment, and whether the arms differ.

Needs the `report` extra (`pip install 'reshape[report]'`: scipy, statsmodels, matplotlib), too
heavy for a gateway; without it `reshape report` says so in one line.

Data: `--prometheus URL` reads reshape's metrics from a Prometheus server (instant queries on its
HTTP API; without `--since` the counters' values now, i.e. since each proxy process started,
summed over processes; with `--since D` — any duration Prometheus accepts — `increase(...[D])`,
which Prometheus extrapolates to the window's edges, so counts are approximate). Credentials go in
the URL (`https://USER:PASSWORD@host`, sent as Basic authentication), as a bearer token
(`--prometheus-token-file`) or as headers (`--prometheus-header`); they are never printed.
`--log FILE` reads the proxy's own request log (reshape/features/request_log/addon.py), one record
per request.

Per arm, with 95% intervals (reshape/report/stats.py; scipy and statsmodels):

- requests: the count, with the exact (Garwood) Poisson interval. Not compared between arms:
  how many requests an arm gets is set by the weights.
- transaction latency p50 / p95: from the log, the sample quantile (linear interpolation, numpy's
  default, the lab's definition too) with the distribution-free order-statistic interval
  (binomial). From Prometheus, the quantile is interpolated linearly inside the histogram bucket
  (as `histogram_quantile`) and the same order-statistic ranks are mapped through that
  interpolation, so it can be no finer than the buckets.
- queue share, upstream connections per request, error share: shares x/n with Wilson intervals.
  Connections per request is the share of requests that opened a new upstream connection, among
  requests whose connection kind is known (pooled: `reshape_upstream_requests_total`; mitmproxy's
  own connections: `reshape_direct_requests_total`; in the log, `upstream_connection`). The log
  does not know queueing or the connection kind of pooled requests yet: n/a there.
- response bytes per request: from the log, the mean with Student's t interval; from Prometheus
  only the total over the count (a counter has no per-request variance): no interval, no test.

Between each arm and the reference (`control`, else the first arm by name): the difference with a
95% interval and a two-sided p-value; the report names the test behind each p-value.

- latency: the Mann-Whitney U test of the whole distributions. On the raw values from the log:
  exact where that is cheap (scipy's exact distribution without ties, every distinct permutation
  with ties), else the normal approximation with tie and continuity corrections. On the bucket
  counts from Prometheus: the normal approximation, observations in one bucket being ties (which
  makes the test conservative). The quantile difference's interval combines the two per-arm
  intervals as if normal and independent: an approximation, not a bootstrap.
- shares: the pooled two-proportion z-test; the interval of the difference is Newcombe's hybrid
  score interval. Requests are treated as independent; requests of one client (the experiment's
  unit) are not, so with few units and many requests each the p-values are too small. Plan
  experiments with many units.
- bytes per request (log): Welch's unequal-variance t-test and its interval.

"Significant" means rejected by Holm's step-down procedure at a 5% family-wise level over the
five tests of one arm against the reference (latency, queue share, connections, bytes, errors),
so an A/A experiment shows a significant difference in at most 5% of runs.

Output: the text table on stdout; `--json [FILE]` and `--csv [FILE]` for programs (export.py;
`-` or no FILE: stdout, instead of the table); `--html FILE`, one self-contained page with the
tables and the charts (html.py); `--plot DIR`, the charts as PNG files (charts.py, matplotlib).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from reshape.base.errors import ReshapeError

if TYPE_CHECKING:  # the modules below import the extra
    from reshape.report.analysis import Report

REPORT_EXTRA = ("scipy", "statsmodels", "matplotlib", "numpy")


def require_report_extra() -> None:
    """A one-line ReshapeError, naming the extra, if its packages are not installed."""
    for name in REPORT_EXTRA:
        try:
            __import__(name)
        except ImportError:
            raise ReshapeError(
                f"reshape report needs the report extra, which is not installed ({name} is "
                "missing): pip install 'reshape[report]' (in a checkout: make report-deps)"
            ) from None


def build_report(
    experiment: str,
    *,
    prometheus: str | None = None,
    log: Path | None = None,
    since: str | None = None,
    bearer_token: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> Report:
    require_report_extra()
    from reshape.report.analysis import analyse
    from reshape.report.sources import (
        PrometheusClient,
        load_log,
        load_prometheus,
        parse_duration,
    )

    seconds = parse_duration(since) if since is not None else None
    if prometheus is not None:
        client = PrometheusClient(prometheus, bearer_token=bearer_token, headers=headers)
        data = load_prometheus(client, experiment, seconds)
    else:
        assert log is not None
        data = load_log(log, experiment, seconds)
    return analyse(data)
