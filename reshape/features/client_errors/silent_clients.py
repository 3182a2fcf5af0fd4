"""Closes client connections that send nothing at all within the header timeout.

The header timeout (reshape/mitm/patches/http1_head_guard.py) starts with a request head's
first byte: mitmproxy creates its HTTP layer only once bytes arrive. A client that connects and
stays
silent — a slowloris that never starts, or thousands of them holding file descriptors — would
otherwise keep its connection until mitmproxy's idle `tcp_timeout` (600 s). Like nginx's
`client_header_timeout`, which runs from the accept, this closes it after the same timeout,
counted as `reshape_client_errors_total{kind="silent_connection"}`.

"Sent something" is mitmproxy's `next_layer` hook: its first call for a client connection comes
with the connection's first bytes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from mitmproxy import connection

log = logging.getLogger("reshape.client_errors")


class SilentClients:
    def __init__(
        self,
        timeout: float,
        report: Callable[[str], None],
        close_client: Callable[[connection.Client], bool],
    ) -> None:
        self.timeout = timeout
        self.report = report
        # Closes a client connection's socket; False if it is closed already.
        self.close_client = close_client
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def client_connected(self, client: connection.Client) -> None:
        if client.error:  # refused by an addon before this one (ClientAccess)
            return
        loop = asyncio.get_running_loop()
        self._timers[client.id] = loop.call_later(self.timeout, self._expire, client)

    def next_layer(self, nextlayer: Any) -> None:
        timer = self._timers.pop(nextlayer.context.client.id, None)
        if timer is not None:
            timer.cancel()

    def client_disconnected(self, client: connection.Client) -> None:
        timer = self._timers.pop(client.id, None)
        if timer is not None:
            timer.cancel()

    def done(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    def _expire(self, client: connection.Client) -> None:
        if self._timers.pop(client.id, None) is None:
            return
        if self.close_client(client):
            log.info("client %s sent nothing in %g s: closed", _peer(client), self.timeout)
            self.report("silent_connection")


def _peer(client: connection.Client) -> str:
    host, port = client.peername[:2] if client.peername else ("?", 0)
    return f"{host}:{port}"
