"""Closing a client or an origin connection from outside mitmproxy's layers.

Why: a hook can refuse a connection before it is opened (`server.error` in `server_connect`) but
not after, and no hook or command closes a client connection on an addon's schedule. mitmproxy
12.2.3 keeps every socket of a client connection in its `ConnectionHandler.transports`, reachable
through the proxyserver addon's `connections` (keyed by client id). Closing the asyncio writer
ends the connection as a peer that hung up would: mitmproxy skips every later write to it
(`SendData` checks `is_closing()`), reads EOF and runs its usual teardown.

At shutdown every client connection is ended the way mitmproxy ends a server connection whose
client left: its reading task is cancelled, and mitmproxy's `ConnectionHandler.handle_client`
runs its teardown and returns. Cancelling the connection's outer task instead (what a blanket
"cancel every task" does) makes Python 3.12.1's `asyncio.start_server` callback call
`task.exception()` on a cancelled task, and the CancelledError it raises is logged as an
"Unhandled error in task" with a traceback, once per connection.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from mitmproxy import connection, ctx


def close_server_connection(client: connection.Client, server: connection.Server) -> None:
    """Close `server`'s socket now (from a `server_connected` hook, before anything is written:
    the request fails as if the server hung up, and the `error` the hook set keeps the
    connection from being reused)."""
    writer = _writer_of(client, server)
    if writer is not None:
        writer.close()


def close_client_connection(client: connection.Client) -> bool:
    """Close `client`'s socket; False if it is not open (any more)."""
    writer = _writer_of(client, client)
    if writer is None or writer.is_closing():
        return False
    writer.close()
    return True


def _writer_of(client: connection.Client, conn: connection.Connection) -> Any:
    """The asyncio writer of `conn` (the client itself or one of its server connections); None
    if there is none (any more), or outside a running master (unit tests)."""
    master = getattr(ctx, "master", None)
    proxyserver: Any = master.addons.get("proxyserver") if master else None
    handler = proxyserver.connections.get(client.id) if proxyserver else None
    io = handler.transports.get(conn) if handler else None
    return io.writer if io is not None else None


async def end_client_connections(proxyserver: Any, timeout: float) -> int:
    """End every client connection of `proxyserver` (mitmproxy's Proxyserver addon) and wait,
    at most `timeout` seconds, until mitmproxy has finished with each; returns how many were
    still open then."""
    for handler in list(proxyserver.connections.values()):
        io = handler.transports.get(handler.client)
        if io is not None and io.handler is not None:
            io.handler.cancel("reshape is shutting down")
    deadline = time.monotonic() + timeout
    while proxyserver.connections and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return len(proxyserver.connections)
