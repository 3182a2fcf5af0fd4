"""The one place where reshape changes mitmproxy's internals (mitmproxy 12.2.3).

Each patch says why hooks are not enough. Re-check every one when the mitmproxy pin moves.
"""

from __future__ import annotations

import asyncio
from typing import Any

from mitmproxy.proxy import mode_servers

_reuse_port_installed = False


def listen_with_reuse_port() -> None:
    """Make the regular proxy listener bind with SO_REUSEPORT.

    Why: `reshape run --workers N` runs N processes on one port and lets the kernel spread
    connections among them. mitmproxy 12.2.3 binds in `AsyncioServerInstance.listen` with a bare
    `asyncio.start_server(handler, host, port)` and offers no option or hook for socket flags.
    Only the TCP listener of the regular (forward proxy) mode is changed.
    """
    global _reuse_port_installed
    if _reuse_port_installed:
        return
    original = mode_servers.RegularInstance.listen

    async def listen(self: mode_servers.RegularInstance, host: str, port: int) -> list[Any]:
        if self.mode.transport_protocol != "tcp":
            return await original(self, host, port)
        return [await asyncio.start_server(self.handle_stream, host, port, reuse_port=True)]

    mode_servers.RegularInstance.listen = listen  # type: ignore[method-assign,assignment]
    _reuse_port_installed = True


_connection_limits: dict[tuple[str, int], int] = {}


def allow_connections(address: tuple[str, int], limit: int) -> None:
    """Let each client connection open up to `limit` server connections to `address`.

    Why: mitmproxy 12.2.3 caps every client connection at 5 concurrent server connections per
    address (`ConnectionHandler.max_conns`, a hard-coded `Semaphore(5)` held for a connection's
    whole life, no option). Towards reshape's internal gateway that would let an HTTP/2 browser
    connection have only 5 requests in flight, however many it multiplexes; the real per-origin
    limits are enforced by the upstream pool instead.
    """
    from mitmproxy.proxy import server

    if not _connection_limits:
        original_init = server.ConnectionHandler.__init__

        def __init__(self: server.ConnectionHandler, *args: Any, **kwargs: Any) -> None:
            original_init(self, *args, **kwargs)
            for limited, count in _connection_limits.items():
                self.max_conns[limited] = asyncio.Semaphore(count)

        server.ConnectionHandler.__init__ = __init__  # type: ignore[method-assign]
    _connection_limits[address] = limit


class PreferH2ToClients:
    """An addon: negotiate HTTP/2 with every client that offers it, whatever its preference order.

    Why: with `connection_strategy=lazy` (which the shared upstream pool needs) mitmproxy 12.2.3
    cannot mirror the origin's ALPN, so `tlsconfig.alpn_select_callback` takes the client's first
    offer — `http/1.1` for clients that list it first (httpx does). HTTP/2 towards the client costs
    nothing here: mitmproxy converts to whatever the origin speaks, and multiplexing on the client
    connection is what reshape wants. The callback reads a `client_alpn` override from the
    connection's app data, which is set here, after tlsconfig's own `tls_start_client`.
    """

    def tls_start_client(self, data: Any) -> None:
        from mitmproxy import ctx

        offers = data.context.client.alpn_offers or ()
        if ctx.options.http2 and b"h2" in offers and data.ssl_conn is not None:
            app_data = data.ssl_conn.get_app_data()
            if isinstance(app_data, dict) and app_data.get("client_alpn") is None:
                app_data["client_alpn"] = b"h2"
