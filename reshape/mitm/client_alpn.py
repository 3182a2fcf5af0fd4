"""Which protocol reshape speaks to TLS clients: HTTP/2 whenever they offer it."""

from __future__ import annotations

from typing import Any

from mitmproxy import ctx


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
        if ctx.options.connection_strategy != "lazy":
            # Eager: mitmproxy has the origin's ALPN and mirrors it, which is right without the
            # pool: an HTTP/2 client of an HTTP/1.1-only origin would make mitmproxy open an
            # origin connection (TCP and TLS handshakes) per request (bench/lab plt, h1 origins).
            return
        offers = data.context.client.alpn_offers or ()
        if ctx.options.http2 and b"h2" in offers and data.ssl_conn is not None:
            app_data = data.ssl_conn.get_app_data()
            if isinstance(app_data, dict) and app_data.get("client_alpn") is None:
                app_data["client_alpn"] = b"h2"
