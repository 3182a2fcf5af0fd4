"""A TLS client's handshake uses a context that already holds the host's certificate and key."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, rsa
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

    Each context also holds an ECDSA (P-256) twin of a certificate the store generated: the same
    names, validity and extensions, another key, signed by the same CA. OpenSSL serves it to
    every client that accepts ECDSA signatures (any browser; it picks by the client's signature
    algorithms) and mitmproxy's RSA certificate to the others. The handshake's signature is then
    ~0.02 ms instead of RSA-2048's ~0.26 (cryptography's OpenSSL here), about a tenth of what
    a tunnel costs the proxy, and a browser races 7-13 tunnels per burst of a new page's
    requests. A certificate the user supplied (`--certs`) keeps its own key, and no twin.
    """

    def replacements(self) -> Iterable[Replacement]:
        create = net_tls.create_client_proxy_context.__wrapped__

        twin_key = ec.generate_private_key(ec.SECP256R1())

        @functools.lru_cache(maxsize=CONTEXTS)
        def context_for(
            cert: certs.Cert, key: Any, ca: certs.Cert, ca_key: Any, **options: Any
        ) -> SSL.Context:
            context: SSL.Context = create(**options)
            leaf = cert.to_cryptography()
            context.use_certificate(leaf)
            context.use_privatekey(key)
            if key is ca_key and leaf.issuer == ca.to_cryptography().subject:  # generated
                context.use_certificate(ecdsa_twin(leaf, ca_key, twin_key))
                context.use_privatekey(twin_key)
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
                self.certstore.default_ca,
                self.certstore.default_privatekey,
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


def ecdsa_twin(
    leaf: x509.Certificate, ca_key: rsa.RSAPrivateKey, key: ec.EllipticCurvePrivateKey
) -> x509.Certificate:
    """`leaf` again with `key`'s public key and a serial of its own, signed by `ca_key` (its
    issuer's key). mitmproxy's leaves have no SubjectKeyIdentifier; one would be recomputed."""
    builder = (
        x509.CertificateBuilder()
        .subject_name(leaf.subject)
        .issuer_name(leaf.issuer)
        .not_valid_before(leaf.not_valid_before_utc)
        .not_valid_after(leaf.not_valid_after_utc)
        .serial_number(x509.random_serial_number())
        .public_key(key.public_key())
    )
    for extension in leaf.extensions:
        value = extension.value
        if isinstance(value, x509.SubjectKeyIdentifier):
            value = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
        builder = builder.add_extension(value, extension.critical)
    return builder.sign(ca_key, hashes.SHA256())
