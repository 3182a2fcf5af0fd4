"""A mitmproxy addon that records the base metrics and logs each failed request in one line.

It also counts requests in flight, which the graceful shutdown waits on.
"""

from __future__ import annotations

import logging

from mitmproxy import connection, http, tls
from mitmproxy.proxy import server_hooks

from reshape.base.flowstate import state_of
from reshape.features.client_errors.rules import classify_flow_error, outcome_by_client
from reshape.features.telemetry import metrics
from reshape.features.telemetry.metrics import labelled
from reshape.policy.chooser import selection_of

log = logging.getLogger("reshape.traffic")


def client_proto(flow: http.HTTPFlow) -> str:
    return "h2" if flow.request.http_version.startswith("HTTP/2") else "h1"


def upstream_proto(server: connection.Server) -> str:
    return "h2" if server.alpn == b"h2" else "h1"


class ByteCounter:
    """A `response.stream` callable: passes chunks through unchanged, counting their bytes."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, chunk: bytes) -> bytes:
        self.count += len(chunk)
        return chunk


# Bodies up to this size, with a Content-Length, are relayed whole rather than streamed.
SMALL_BODY = 64 * 1024


def error_outcome(flow: http.HTTPFlow) -> str:
    """How a request that ended in an error ended: `client_error` (bad input, refused: counted by
    kind in reshape_client_errors_total), `client_aborted` (its client left) or
    `upstream_error`."""
    request_complete = flow.request.timestamp_end is not None
    if flow.error is not None:
        if classify_flow_error(flow.error.msg, request_complete):
            return "client_error"
        by_client = outcome_by_client(flow.error.msg)  # a reset stream, a flood
        if by_client is not None:
            return by_client
    # The client's connection has closed, or its side of it (a FIN: mitmproxy takes it for a
    # client that wants nothing more). Its end time comes only after the flow's error hooks:
    # every client that left mid-response was counted as the origin's error.
    client = flow.client_conn
    gone = (
        client.timestamp_end is not None or not client.state & connection.ConnectionState.CAN_READ
    )
    return "client_aborted" if gone else "upstream_error"


class Telemetry:
    def __init__(self) -> None:
        self.in_flight = 0
        # Ids of origin connections opened without TLS, not counted yet (see server_connected).
        self._plain_pending: set[str] = set()

    def client_connected(self, client: connection.Client) -> None:
        metrics.client_connections_total.inc()
        metrics.client_connections_active.inc()

    def client_disconnected(self, client: connection.Client) -> None:
        metrics.client_connections_active.dec()

    def server_connected(self, data: server_hooks.ServerConnectionHookData) -> None:
        # A TLS connection's protocol is known only once ALPN is done: counted when TLS is up.
        # Whether a connection will be TLS is not always known yet: connecting eagerly for a
        # CONNECT, mitmproxy opens it before the client's TLS hello arrives. So a connection
        # without TLS so far is counted (as h1) only once it carries a response or closes
        # without TLS having started.
        if not data.server.tls:
            self._plain_pending.add(data.server.id)

    def tls_start_server(self, data: tls.TlsData) -> None:
        self._plain_pending.discard(data.conn.id)

    def server_disconnected(self, data: server_hooks.ServerConnectionHookData) -> None:
        self._count_plain(data.server)

    def _count_plain(self, server: connection.Server) -> None:
        if server.id in self._plain_pending:
            self._plain_pending.discard(server.id)
            metrics.upstream_connections_opened_total.labels("h1").inc()

    def tls_established_server(self, data: tls.TlsData) -> None:
        assert isinstance(data.conn, connection.Server)
        metrics.upstream_connections_opened_total.labels(upstream_proto(data.conn)).inc()

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        self.in_flight += 1
        state_of(flow).in_flight = True

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        response = flow.response
        assert response is not None
        self._count_plain(flow.server_conn)
        selection = selection_of(flow)
        # Only the origin's responses: one reshape made itself (a 502, 503, 504 or 403, whose
        # outcome it set) would count its own wait as the origin's.
        if flow.request.timestamp_end and response.timestamp_start and not state_of(flow).outcome:
            labelled(metrics.transaction_seconds, selection.policy_name, selection.arm).observe(
                max(0.0, response.timestamp_start - flow.request.timestamp_end)
            )
        # The proxy never holds a large or unbounded body: stream it. mitmproxy streams bodies
        # above stream_large_bodies by itself (`stream = True`, replaced by a callable that
        # counts); a body without a length could be of any size, so it streams too. A small
        # body with a length is relayed whole: one write to the client instead of two.
        if callable(response.stream):
            return
        length = response.headers.get("content-length", "")
        if response.stream or not length.isdigit() or int(length) > SMALL_BODY:
            # Kept in the flow's state too: later addons may wrap the stream callable.
            response.stream = state_of(flow).byte_counter = ByteCounter()

    def response(self, flow: http.HTTPFlow) -> None:
        response = flow.response
        assert response is not None
        selection = selection_of(flow)
        state = state_of(flow)
        counter = state.byte_counter
        if callable(response.stream) and counter is not None:
            body_bytes = counter.count
        else:
            body_bytes = len(response.raw_content or b"")
        labelled(metrics.response_bytes_total, selection.policy_name, selection.arm).inc(body_bytes)
        self._finish(flow, state.outcome or "ok")

    def error(self, flow: http.HTTPFlow) -> None:
        state = state_of(flow)
        counter = state.byte_counter
        if state.in_flight and counter is not None and counter.count:
            # Relayed before the end came (a client that left mid-body, an origin that broke
            # off): bytes the client got, as the request log counts them.
            selection = selection_of(flow)
            labelled(metrics.response_bytes_total, selection.policy_name, selection.arm).inc(
                counter.count
            )
        outcome = error_outcome(flow)
        if outcome == "upstream_error":
            log.warning(
                "%s %s failed: %s", flow.request.method, flow.request.pretty_url, flow.error
            )
        self._finish(flow, outcome)

    def _finish(self, flow: http.HTTPFlow, outcome: str) -> None:
        state = state_of(flow)
        if not state.in_flight:
            return  # a response after an error, or a flow we never saw begin
        state.in_flight = False
        self.in_flight -= 1
        selection = selection_of(flow)
        labelled(
            metrics.requests_total,
            selection.policy_name,
            selection.arm,
            client_proto(flow),
            outcome,
        ).inc()
