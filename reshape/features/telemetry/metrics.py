"""Every metric reshape exports, defined in one place (Prometheus naming: reshape_<thing>_<unit>).

Labels come only from bounded sets: policy and arm names from the policy file, protocol and
outcome from the fixed tuples below; never a host or a URL.

With several workers each process writes its values to PROMETHEUS_MULTIPROC_DIR and the supervisor
merges them; gauges therefore declare how they merge (`multiprocess_mode`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import prometheus_client
from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from reshape.base.client_family import CLIENT_FAMILIES
from reshape.features.client_errors.rules import CLIENT_ERROR_KINDS
from reshape.upstream.budget.ledger import LedgerStats
from reshape.upstream.engine import LOST
from reshape.upstream.pool import CloseReason

prometheus_client.disable_created_metrics()

CLIENT_PROTOS = ("h1", "h2")
OUTCOMES = ("ok", "upstream_error", "client_aborted", "client_error", "rejected")
UPSTREAM_PROTOS = ("h1", "h2")
CONNECTION_KINDS = ("new", "reused", "pipelined", "multiplexed", "preconnected")
REJECT_REASONS = ("queue_full", "queue_timeout")
CLOSE_REASONS = (*(reason.value for reason in CloseReason), LOST)
TLS_RECORD_SIDES = ("client", "origin")
TLS_RECORD_SIZES = ("small", "large")
TRAILER_ACTIONS = ("forwarded", "stripped", "promoted", "synthesized")

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
client_split_requests_total = Counter(
    "reshape_client_split_requests",
    "Requests with a body whose body arrived in a later read from the client than their head, "
    "by the client's family (from its User-Agent).",
    ["client_family"],
)
client_refused_total = Counter(
    "reshape_client_refused",
    "Client connections refused because their address is not in --allow-clients.",
)
upstream_connections_opened_total = Counter(
    "reshape_upstream_connections_opened",
    "Connections opened to origin servers, by the protocol negotiated.",
    ["proto"],
)
upstream_connections_closed_total = Counter(
    "reshape_upstream_connections_closed",
    "Connections to origin servers that ended, by why: the pool closed them (idle_timeout, "
    "origin_idle_timeout: before the origin's stated keep-alive timeout, request_limit: as many "
    "requests as it takes, not_reusable, goaway, over_limit, needed_elsewhere, room_for_retry, "
    "server_closed, shutdown), or lost: the origin closed them first, or they broke.",
    ["reason"],
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
# The upstream engine (reshape/upstream/): the measures of Firefox's pipelining study.
requests_queued_total = Counter(
    "reshape_requests_queued",
    "Requests that had to wait for an upstream connection (none was free on arrival).",
    ["policy", "arm"],
)
request_queue_seconds = Histogram(
    "reshape_request_queue_seconds",
    "Time from a request being ready to its first byte on the upstream wire.",
    ["policy", "arm"],
    buckets=(
        0.0005,
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
    ),
)
upstream_requests_total = Counter(
    "reshape_upstream_requests",
    "Requests sent to origins by the shared pool, by the kind of connection that carried them.",
    ["policy", "arm", "connection"],
)
upstream_connections_active = Gauge(
    "reshape_upstream_connections_active",
    "Connections to origins open now, connecting ones included (not those waiting for "
    "another worker's slot: reshape_upstream_budget_waiting).",
    multiprocess_mode="livesum",
)
upstream_connections_per_host_max = Gauge(
    "reshape_upstream_connections_per_host_max",
    "The most connections open to any one origin now, in one worker (a host label would be "
    "unbounded; with several workers, the highest of theirs).",
    multiprocess_mode="livemax",
)
upstream_queue_rejected_total = Counter(
    "reshape_upstream_queue_rejected",
    "Requests answered 503 because the per-host queue was full or waited too long.",
    ["policy", "arm", "reason"],
)
upstream_retries_total = Counter(
    "reshape_upstream_retries",
    "Requests sent again because their connection ended before any response byte.",
    ["policy", "arm"],
)
post_coalesced_total = Counter(
    "reshape_post_coalesced",
    "Requests with a body whose head and body left for the origin in a single write.",
    ["policy", "arm"],
)
upstream_tls_handshakes_total = Counter(
    "reshape_upstream_tls_handshakes",
    "TLS handshakes with origins, by whether an earlier session was resumed.",
    ["resumed"],
)
upstream_out_of_turn_total = Counter(
    "reshape_upstream_out_of_turn",
    "HTTP/1.1 origin connections closed because the origin sent data while no request was "
    "outstanding (an unsolicited response); nothing of it was delivered.",
)
pipelining_disabled_total = Counter(
    "reshape_upstream_pipelining_disabled",
    "Origins found to break HTTP/1.1 pipelining (no longer pipelined to).",
)

# TLS record sizing (reshape/features/tls_records/rules.py): only records reshape sized itself are
# counted.
tls_records_total = Counter(
    "reshape_tls_records",
    "TLS records reshape sized, by where they went and whether their plaintext was at most the "
    "policy's small_bytes.",
    ["side", "size"],
)
tls_record_bytes = Histogram(
    "reshape_tls_record_bytes",
    "Plaintext bytes per TLS record reshape sized.",
    ["side"],
    # A record in one TCP segment (~1,400), Cloudflare's middle step (~4 KB), the TLS maximum.
    buckets=(512, 1024, 1400, 2048, 4096, 8192, 16384),
)

# Trailers (reshape/features/trailers/addon.py): what happened to responses' trailer fields, and
# which clients
# take them at all.
trailers_total = Counter(
    "reshape_trailers",
    "Responses by what reshape did with their trailer fields: forwarded (origin fields sent as "
    "trailers), stripped (origin fields dropped), promoted (moved into the header section), "
    "synthesized (a Content-Digest trailer added). A response counts once per action it had.",
    ["policy", "arm", "action"],
)
# Early hints (reshape/features/early_hints/addon.py): 103s sent ahead of a page's response.
early_hints_total = Counter(
    "reshape_early_hints",
    "103 Early Hints responses sent to clients ahead of a document's response (learned "
    "preloads and preconnects), by the policy and arm of the document request.",
    ["policy", "arm"],
)
# Origins' own informational responses (reshape/mitm/patches/early_hints.py), 100 and 101 aside.
INTERIM_STATUSES = ("102", "103", "other")
INTERIM_OUTCOMES = ("forwarded", "dropped")
origin_interim_responses_total = Counter(
    "reshape_origin_interim_responses",
    "Informational (1xx) responses from origins, 100 Continue and 101 aside, by the policy and "
    "arm of the request, the status (102, 103, other) and what reshape did: forwarded (to an "
    "HTTP/2 client, before the final response) or dropped (an HTTP/1.1 client, or the response "
    "or an error came first).",
    ["policy", "arm", "status", "outcome"],
)
clients_total = Counter(
    "reshape_clients",
    "Client connections, counted at their first request, by whether they take trailers (HTTP/2, "
    "or HTTP/1.1 with TE: trailers) and their family (from the User-Agent).",
    ["accepts_trailers", "client_family"],
)

# Policy reloads (reshape/policy/reload.py) and requests on mitmproxy's own origin connections
# (reshape/features/request_log/addon.py), the counterpart of reshape_upstream_requests_total for
# policies
# without `upstream:`, so connections per request compare across every arm.
RELOAD_OUTCOMES = ("ok", "invalid")
DIRECT_CONNECTION_KINDS = ("new", "reused", "multiplexed")
policy_reloads_total = Counter(
    "reshape_policy_reloads",
    "Policy file reloads (SIGHUP or file change), per process: ok, or invalid (refused; the "
    "previous policy stays).",
    ["outcome"],
)
direct_requests_total = Counter(
    "reshape_direct_requests",
    "Requests carried by mitmproxy's own origin connections (policies without upstream:), by "
    "whether the connection was new, reused or multiplexed (HTTP/2).",
    ["policy", "arm", "connection"],
)

# Bad input from clients (reshape/features/client_errors/rules.py,
# reshape/features/client_errors/addon.py): each refused or
# closed, by kind (CLIENT_ERROR_KINDS). Per connection or per head, not per policy: most happen
# before a request, and so a policy, exists.
client_errors_total = Counter(
    "reshape_client_errors",
    "Client requests or connections refused or closed for bad input, by kind: malformed, "
    "header_too_large, header_timeout, smuggling, bad_chunked, incomplete_body, h2_flood, "
    "h2_protocol.",
    ["kind"],
)

# Access (reshape/features/proxy_auth/addon.py, reshape/features/destinations/addon.py).
# Authentication failures carry no user
# name and no policy: they are decided before a request has either.
PROXY_AUTH_FAILURES = ("missing", "malformed", "rejected")
DESTINATION_REFUSALS = ("own_address", "link_local", "private", "loopback")
proxy_auth_failures_total = Counter(
    "reshape_proxy_auth_failures",
    "Requests and CONNECTs answered 407: credentials missing, malformed, or rejected (unknown "
    "user or wrong password).",
    ["reason"],
)
destinations_refused_total = Counter(
    "reshape_destinations_refused",
    "Requests refused because of where they were going: the proxy's own address, or a "
    "link-local, private or loopback address the policy denies.",
    ["policy", "arm", "reason"],
)

# Preconnect (reshape/features/preconnect/addon.py): warm connections opened before requests need
# them.
PRECONNECT_OUTCOMES = ("used", "unused")
preconnects_total = Counter(
    "reshape_preconnects",
    "Warm origin connections opened by preconnect, counted once known: used (a request took "
    "it) or unused (it closed, failed or timed out first).",
    ["policy", "arm", "outcome"],
)

build_info = Gauge(
    "reshape_build_info",
    "Always 1; labels say which version runs.",
    ["version", "mitmproxy"],
    multiprocess_mode="max",
)


def observe_tls_records(side: str, sizes: Sequence[int], small_bytes: int) -> None:
    """Count records of `sizes` written towards `side` (client or origin)."""
    histogram = tls_record_bytes.labels(side)
    small = 0
    for size in sizes:
        histogram.observe(size)
        small += size <= small_bytes
    if small:
        tls_records_total.labels(side, "small").inc(small)
    if len(sizes) > small:
        tls_records_total.labels(side, "large").inc(len(sizes) - small)


@functools.cache
def labelled(metric: Counter | Gauge | Histogram, *values: str) -> Any:
    """`metric.labels(*values)`, remembered: on the per-request path a dict lookup instead of
    prometheus_client's label validation. Label values are bounded, so is this cache."""
    return metric.labels(*values)


def precreate(label_pairs: Iterable[tuple[str, str]]) -> None:
    """Create every known label combination at 0, so queries see series before traffic does."""
    label_pairs = list(label_pairs)
    for policy, arm in label_pairs:
        transaction_seconds.labels(policy, arm)
        response_bytes_total.labels(policy, arm)
        for proto in CLIENT_PROTOS:
            for outcome in OUTCOMES:
                requests_total.labels(policy, arm, proto, outcome)
    for policy, arm in label_pairs:
        requests_queued_total.labels(policy, arm)
        request_queue_seconds.labels(policy, arm)
        upstream_retries_total.labels(policy, arm)
        post_coalesced_total.labels(policy, arm)
        for kind in CONNECTION_KINDS:
            upstream_requests_total.labels(policy, arm, kind)
        for reason in REJECT_REASONS:
            upstream_queue_rejected_total.labels(policy, arm, reason)
    for proto in UPSTREAM_PROTOS:
        upstream_connections_opened_total.labels(proto)
    for reason in CLOSE_REASONS:
        upstream_connections_closed_total.labels(reason)
    for resumed in ("yes", "no"):
        upstream_tls_handshakes_total.labels(resumed)
    for family in CLIENT_FAMILIES:
        client_split_requests_total.labels(family)
        for accepts in ("yes", "no"):
            clients_total.labels(accepts, family)
    for policy, arm in label_pairs:
        for action in TRAILER_ACTIONS:
            trailers_total.labels(policy, arm, action)
        early_hints_total.labels(policy, arm)
        for status in INTERIM_STATUSES:
            for outcome in INTERIM_OUTCOMES:
                origin_interim_responses_total.labels(policy, arm, status, outcome)
    for outcome in RELOAD_OUTCOMES:
        policy_reloads_total.labels(outcome)
    for policy, arm in label_pairs:
        for kind in DIRECT_CONNECTION_KINDS:
            direct_requests_total.labels(policy, arm, kind)
    for kind in CLIENT_ERROR_KINDS:
        client_errors_total.labels(kind)
    for failure in PROXY_AUTH_FAILURES:
        proxy_auth_failures_total.labels(failure)
    for policy, arm in label_pairs:
        for refused in DESTINATION_REFUSALS:
            destinations_refused_total.labels(policy, arm, refused)
    for policy, arm in label_pairs:
        for outcome in PRECONNECT_OUTCOMES:
            preconnects_total.labels(policy, arm, outcome)
    for side in TLS_RECORD_SIDES:
        tls_record_bytes.labels(side)
        for size in TLS_RECORD_SIZES:
            tls_records_total.labels(side, size)


class BudgetCollector(Collector):
    """The per-host connection budget the workers of `reshape run --workers N` share, as the
    supervisor's broker counts it (reshape/upstream/budget/); collected in the supervisor."""

    def __init__(self, stats: Callable[[], LedgerStats]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self.stats()
        yield CounterMetricFamily(
            "reshape_upstream_budget_waits",
            "Origin connections that waited for a slot of a per-host cap other workers held.",
            value=stats.waited,
        )
        yield CounterMetricFamily(
            "reshape_upstream_budget_reclaims",
            "Requests to a worker to give slots back for another (a lower cap for a while, or "
            "connections that stay idle).",
            value=stats.reclaims,
        )
        yield CounterMetricFamily(
            "reshape_upstream_budget_denied",
            "Warm connections not opened: every slot of the cap was held.",
            value=stats.denied,
        )
        yield GaugeMetricFamily(
            "reshape_upstream_budget_waiting",
            "Origin connections waiting for a slot now.",
            value=stats.waiting,
        )
