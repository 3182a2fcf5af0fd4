"""More than five server connections per client connection to one address (the gateway)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from mitmproxy.proxy import server

from reshape.mitm.patches.base import Patch, Replacement


class AllowConnections(Patch):
    """Let each client connection open up to `limit` server connections to `address`.

    Why: mitmproxy 12.2.3 caps every client connection at 5 concurrent server connections per
    address (`ConnectionHandler.max_conns`, a hard-coded `Semaphore(5)` held for a connection's
    whole life, no option). Towards reshape's internal gateway that would let an HTTP/2 browser
    connection have only 5 requests in flight, however many it multiplexes; the real per-origin
    limits are enforced by the upstream pool instead. The address may be set after install
    (the gateway listens on a port chosen at start).
    """

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.addresses: set[tuple[str, int]] = set()

    def replacements(self) -> Iterable[Replacement]:
        original_init = server.ConnectionHandler.__init__
        patch = self

        def __init__(self: server.ConnectionHandler, *args: Any, **kwargs: Any) -> None:
            original_init(self, *args, **kwargs)
            for address in patch.addresses:
                self.max_conns[address] = asyncio.Semaphore(patch.limit)

        yield server.ConnectionHandler, "__init__", __init__
