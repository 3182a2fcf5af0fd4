"""Sizes the TLS records reshape writes, per connection, as the connection's policy says
(`tls_records:`; the sizes themselves come from reshape/features/tls_records/rules.py).

Records belong to a connection, policies to requests. A client connection takes the sizing of the
first request that arrives on it over TLS — the request whose response is the first to be sent on
it, before any record could have been sized otherwise. Later requests on the connection, under
whatever policy, do not change it. Under `side: both`, each TLS connection mitmproxy opens to an
origin for that client connection is sized the same way, with a warm-up of its own (mitmproxy's
origin connections belong to one client connection). Requests sent through the shared pool
(`upstream:`) leave on the pool's connections, which this addon does not write: the engine sizes
those itself under `side: both` (reshape/upstream/wire.py, same sizer, same metrics).

The SizeTlsRecords patch (reshape/mitm/patches/tls_record_sizes.py) calls `record_sizes` for every
TLS write.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from mitmproxy import connection, http
from mitmproxy.proxy import server_hooks

from reshape.features.telemetry import metrics
from reshape.features.tls_records.rules import RecordSizer, sizer_for
from reshape.policy.chooser import selection_of
from reshape.policy.schema import TlsRecordKnobs


@dataclass
class ConnectionSizing:
    """The record sizing of one client connection and of the origin connections it opened."""

    knobs: TlsRecordKnobs
    client: RecordSizer
    origins: dict[str, RecordSizer] = field(default_factory=dict)  # by server connection id

    def origin(self, server_id: str) -> RecordSizer:
        sizer = self.origins.get(server_id)
        if sizer is None:
            sizer = self.origins[server_id] = self.client.fresh()
        return sizer


class TlsRecords:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        # By client connection id; None: decided, records left to OpenSSL.
        self.connections: dict[str, ConnectionSizing | None] = {}

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        client = flow.client_conn
        if not client.tls or flow.request.method == "CONNECT" or client.id in self.connections:
            return
        knobs = selection_of(flow).policy.tls_records
        sizer = sizer_for(knobs)
        if knobs is None or sizer is None:
            self.connections[client.id] = None
            return
        self.connections[client.id] = ConnectionSizing(knobs, sizer)

    def server_disconnected(self, data: server_hooks.ServerConnectionHookData) -> None:
        sizing = self.connections.get(data.client.id)
        if sizing is not None:
            sizing.origins.pop(data.server.id, None)

    def client_disconnected(self, client: connection.Client) -> None:
        self.connections.pop(client.id, None)

    def record_sizes(
        self, conn: connection.Connection, client: connection.Client, n_bytes: int
    ) -> list[int] | None:
        """Sizes of the records for `n_bytes` of plaintext about to be written on `conn`."""
        sizing = self.connections.get(client.id)
        if sizing is None:
            return None
        if conn.id == client.id:
            side, sizer = "client", sizing.client
        elif sizing.knobs.side == "both":
            side, sizer = "origin", sizing.origin(conn.id)
        else:
            return None
        sizes = sizer.next_sizes(n_bytes, self.clock())
        metrics.observe_tls_records(side, sizes, sizing.knobs.small_bytes)
        return sizes
