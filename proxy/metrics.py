"""Every metric reshape exports, defined in one place (Prometheus naming: reshape_<thing>_<unit>).

Labels come only from bounded sets: policy and arm names from the policy file, protocol and
outcome from the fixed tuples below; never a host or a URL.

With several workers each process writes its values to PROMETHEUS_MULTIPROC_DIR and the supervisor
merges them; gauges therefore declare how they merge (`multiprocess_mode`).
"""

from __future__ import annotations

from collections.abc import Iterable

import prometheus_client
from prometheus_client import Counter, Gauge, Histogram

prometheus_client.disable_created_metrics()

CLIENT_PROTOS = ("h1", "h2")
OUTCOMES = ("ok", "upstream_error", "client_aborted", "rejected")
UPSTREAM_PROTOS = ("h1", "h2")

# Request ready → first response byte. Bucket edges sit on the latency marks we report.
TRANSACTION_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)

client_connections_total = Counter(
    "reshape_client_connections", "Client (browser) connections accepted."
)
client_connections_active = Gauge(
    "reshape_client_connections_active",
    "Client connections open now.",
    multiprocess_mode="livesum",
)
requests_total = Counter(
    "reshape_requests",
    "Requests from clients, by the policy and arm they ran under and how they ended.",
    ["policy", "arm", "client_proto", "outcome"],
)
upstream_connections_opened_total = Counter(
    "reshape_upstream_connections_opened",
    "Connections opened to origin servers, by the protocol negotiated.",
    ["proto"],
)
transaction_seconds = Histogram(
    "reshape_transaction_seconds",
    "Time from a request being ready to its first response byte from the origin.",
    ["policy", "arm"],
    buckets=TRANSACTION_BUCKETS,
)
response_bytes_total = Counter(
    "reshape_response_bytes",
    "Response body bytes relayed to clients.",
    ["policy", "arm"],
)
build_info = Gauge(
    "reshape_build_info",
    "Always 1; labels say which version runs.",
    ["version", "mitmproxy"],
    multiprocess_mode="max",
)


def precreate(label_pairs: Iterable[tuple[str, str]]) -> None:
    """Create every known label combination at 0, so queries see series before traffic does."""
    for policy, arm in label_pairs:
        transaction_seconds.labels(policy, arm)
        response_bytes_total.labels(policy, arm)
        for proto in CLIENT_PROTOS:
            for outcome in OUTCOMES:
                requests_total.labels(policy, arm, proto, outcome)
    for proto in UPSTREAM_PROTOS:
        upstream_connections_opened_total.labels(proto)
