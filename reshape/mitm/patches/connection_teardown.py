"""A connection's teardown finishes even when its task is cancelled a second time."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any

from mitmproxy.connection import Connection, ConnectionState
from mitmproxy.proxy import events, server

from reshape.mitm.patches.base import Patch, Replacement


class FinishConnectionTeardown(Patch):
    """Close a connection's socket and tell the layers it is gone, whatever cancels its task.

    Why: in mitmproxy 12.2.3 `ConnectionHandler.handle_connection` (proxy/server.py) ends a
    connection by being cancelled (`close_connection` cancels its task) and then, in the same
    task, hands `ConnectionClosed` to the layers (`await self.server_event(...)`, which waits
    for a lock), closes the writer and forgets the transport. It catches the cancellation only
    at its two reads; one that lands elsewhere — a layer closing its own connection while the
    task is inside `server_event`, delivered at the lock while hook tasks hold it, or a second
    cancellation during the teardown — escapes, and the teardown never runs: the socket stays
    open (CLOSE-WAIT, its data unread), the layers never learn the connection closed, and flows
    on it never end. An HTTP/2 rapid-reset flood answered with GOAWAY did exactly that (the
    answer to the flood is a close from inside `server_event`, with hundreds of hooks queued).
    Here, when the cancellation escapes with the connection still known: the writer is closed,
    `ConnectionClosed` is delivered (shielded: the layers must learn it, or their flows never
    end), the transport forgotten, and the cancellation re-raised.
    """

    def replacements(self) -> Iterable[Replacement]:
        original = server.ConnectionHandler.handle_connection

        async def handle_connection(self: server.ConnectionHandler, connection: Connection) -> None:
            try:
                await original(self, connection)
            except asyncio.CancelledError:
                if connection in self.transports:
                    await _finish(self, connection)
                raise

        yield server.ConnectionHandler, "handle_connection", handle_connection


async def _finish(handler: Any, connection: Connection) -> None:
    connection.state = ConnectionState.CLOSED
    writer = handler.transports[connection].writer
    if writer is not None:
        with contextlib.suppress(OSError):
            writer.close()
    delivery = asyncio.ensure_future(handler.server_event(events.ConnectionClosed(connection)))
    while not delivery.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(delivery)
    handler.transports.pop(connection, None)
