"""reshape/mitm/patches/client_tls_contexts.py: one TLS context per host's certificate, the same
handshakes as mitmproxy's own."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
from mitmproxy import connection, tls
from mitmproxy.addons import tlsconfig
from mitmproxy.proxy import context
from mitmproxy.test import taddons
from OpenSSL import SSL

from reshape.mitm.patches import Patches
from reshape.mitm.patches.client_tls_contexts import ReuseClientTlsContexts


@pytest.fixture
def addon(tmp_path: Path) -> Iterator[tuple[tlsconfig.TlsConfig, taddons.context]]:
    ta = tlsconfig.TlsConfig()
    with taddons.context(ta) as tctx:
        tctx.configure(ta, confdir=str(tmp_path))
        yield ta, tctx


def start(addon: tuple[tlsconfig.TlsConfig, taddons.context], sni: str) -> SSL.Connection:
    ta, tctx = addon
    client = connection.Client(
        peername=("127.0.0.1", 40000), sockname=("127.0.0.1", 8080), timestamp_start=0
    )
    client.sni = sni
    client.alpn_offers = [b"h2", b"http/1.1"]
    ctx = context.Context(client, tctx.options)
    ctx.server.address = (sni, 443)
    data = tls.TlsData(client, context=ctx)
    ta.tls_start_client(data)
    assert data.ssl_conn is not None
    return data.ssl_conn


def handshake(server: SSL.Connection, sni: str, cafile: Path) -> ssl.SSLObject:
    """A Python TLS client offering h2 against `server`, in memory; its view of the result."""
    trust = ssl.create_default_context(cafile=str(cafile))
    trust.set_alpn_protocols(["h2", "http/1.1"])
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = trust.wrap_bio(incoming, outgoing, server_hostname=sni)
    for _ in range(10):
        try:
            client.do_handshake()
            return client
        except ssl.SSLWantReadError:
            pass
        server.bio_write(outgoing.read())
        with contextlib.suppress(SSL.WantReadError):
            server.do_handshake()
        with contextlib.suppress(SSL.WantReadError):
            incoming.write(server.bio_read(1 << 16))
    raise AssertionError("the handshake did not complete")


def test_a_host_keeps_its_context_and_each_handshake_gets_its_certificate(
    addon: tuple[tlsconfig.TlsConfig, taddons.context], tmp_path: Path
) -> None:
    cafile = tmp_path / "mitmproxy-ca-cert.pem"
    with Patches([ReuseClientTlsContexts()]):
        first, again = start(addon, "a.example"), start(addon, "a.example")
        other = start(addon, "b.example")
        assert first is not again
        assert first.get_context() is again.get_context()
        assert other.get_context() is not first.get_context()
        for conn, sni in ((first, "a.example"), (again, "a.example"), (other, "b.example")):
            client = handshake(conn, sni, cafile)  # verified against reshape's CA, name included
            assert client.selected_alpn_protocol() == "h2"
            assert ("DNS", sni) in client.getpeercert()["subjectAltName"]


def test_the_same_certificate_as_without_the_patch(
    addon: tuple[tlsconfig.TlsConfig, taddons.context], tmp_path: Path
) -> None:
    cafile = tmp_path / "mitmproxy-ca-cert.pem"
    served = handshake(start(addon, "c.example"), "c.example", cafile).getpeercert(True)
    with Patches([ReuseClientTlsContexts()]):
        patched = handshake(start(addon, "c.example"), "c.example", cafile).getpeercert(True)
    assert patched == served  # the certificate store's entry for the host, byte for byte


def test_a_connection_another_addon_provided_is_left_alone(
    addon: tuple[tlsconfig.TlsConfig, taddons.context],
) -> None:
    ta, tctx = addon
    client = connection.Client(
        peername=("127.0.0.1", 40000), sockname=("127.0.0.1", 8080), timestamp_start=0
    )
    data = tls.TlsData(client, context=context.Context(client, tctx.options))
    provided = data.ssl_conn = SSL.Connection(SSL.Context(SSL.TLS_SERVER_METHOD))
    with Patches([ReuseClientTlsContexts()]):
        ta.tls_start_client(data)
    assert data.ssl_conn is provided
