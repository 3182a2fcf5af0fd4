"""A TLS client's handshake uses a context that already holds the host's certificate and key."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from mitmproxy import certs, connection, ctx, tls
from mitmproxy.addons import tlsconfig
from mitmproxy.net import tls as net_tls
from mitmproxy.proxy.layers import modes
from OpenSSL import SSL

from reshape.mitm.patches.base import Patch, Replacement

# Contexts kept, one per certificate (and set of TLS options): mitmproxy's certificate store keeps
# 100 generated certificates; a context holds a reference to its certificate and key.
CONTEXTS = 256


class ReuseClientTlsContexts(Patch):
    """Replace `TlsConfig.tls_start_client` with one that puts the certificate and key on a
    cached `SSL.Context` per certificate, not on each connection.

    Why: mitmproxy 12.2.3's `tls_start_client` (addons/tlsconfig.py) takes one shared context
    and then calls `use_certificate(cert.to_cryptography())` and `use_privatekey(key)` on every
    new client connection. pyOpenSSL turns each into OpenSSL's form anew (DER out, DER in), and
    an RSA key loaded anew has lost what OpenSSL precomputes on first use (its Montgomery
    values), which the handshake's signature then computes again. For one CONNECT tunnel with
    TLS and HTTP/2 (a browser opens 11-21 per page load of the lab's app page, most of them
    spares it races) that was ~0.5 ms of the ~3 ms the proxy spent (py-spy; the server side of a
    handshake with an RSA-2048 key loaded per connection 0.78 ms, with one loaded once 0.48 ms).
    With the certificate and key on the context, OpenSSL copies references into each
    connection. No hook can do this: an addon that provides `ssl_conn` itself before TlsConfig
    would need TlsConfig's certificate store and ALPN callback, which are its internals.

    Everything else is mitmproxy's code of 12.2.3 as it was: the same options, the same
    certificate (`get_cert`), the same chain, the same ALPN handling. The context comes from
    the function mitmproxy caches contexts with (`net_tls.create_client_proxy_context`),
    unwrapped, so that each certificate gets its own. A user addon that provided `ssl_conn`
    before TlsConfig is still left alone.
    """

    def replacements(self) -> Iterable[Replacement]:
        create = net_tls.create_client_proxy_context.__wrapped__

        @functools.lru_cache(maxsize=CONTEXTS)
        def context_for(cert: certs.Cert, key: Any, **options: Any) -> SSL.Context:
            context: SSL.Context = create(**options)
            context.use_certificate(cert.to_cryptography())
            context.use_privatekey(key)
            return context

        def tls_start_client(self: tlsconfig.TlsConfig, tls_start: tls.TlsData) -> None:
            if tls_start.ssl_conn is not None:
                return  # a user addon has already provided the pyOpenSSL context.
            assert isinstance(tls_start.conn, connection.Client)
            client: connection.Client = tls_start.conn
            server: connection.Server = tls_start.context.server
            entry = self.get_cert(tls_start.context)
            if not client.cipher_list and ctx.options.ciphers_client:
                client.cipher_list = ctx.options.ciphers_client.split(":")
            cipher_list = client.cipher_list or tlsconfig._default_ciphers(
                net_tls.Version[ctx.options.tls_version_client_min]
            )
            if ctx.options.add_upstream_certs_to_client_chain:
                extra_chain_certs = server.certificate_list
            else:
                extra_chain_certs = []
            ssl_ctx = context_for(
                entry.cert,
                entry.privatekey,
                method=net_tls.Method.DTLS_SERVER_METHOD
                if tls_start.is_dtls
                else net_tls.Method.TLS_SERVER_METHOD,
                min_version=net_tls.Version[ctx.options.tls_version_client_min],
                max_version=net_tls.Version[ctx.options.tls_version_client_max],
                cipher_list=tuple(cipher_list),
                ecdh_curve=net_tls.get_curve(ctx.options.tls_ecdh_curve_client),
                chain_file=entry.chain_file,
                request_client_cert=ctx.options.request_client_cert,
                alpn_select_callback=tlsconfig.alpn_select_callback,
                extra_chain_certs=tuple(extra_chain_certs),
                dhparams=self.certstore.dhparams,
            )
            tls_start.ssl_conn = SSL.Connection(ssl_ctx)
            # mitmproxy forces HTTP/1 for secure web proxies (no CONNECT over HTTP/2).
            if len(tls_start.context.layers) == 2 and isinstance(
                tls_start.context.layers[0], modes.HttpProxy
            ):
                client_alpn: bytes | None = b"http/1.1"
            else:
                client_alpn = client.alpn
            tls_start.ssl_conn.set_app_data(
                tlsconfig.AppData(
                    client_alpn=client_alpn,
                    server_alpn=server.alpn,
                    http2=ctx.options.http2,
                )
            )
            tls_start.ssl_conn.set_accept_state()

        yield tlsconfig.TlsConfig, "tls_start_client", tls_start_client
