"""reshape/mitm/patches/client_tls_contexts.py: one TLS context per host's certificate, the same
handshakes as mitmproxy's own."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from mitmproxy import connection, tls
from mitmproxy.addons import tlsconfig
from mitmproxy.proxy import context
from mitmproxy.test import taddons
from OpenSSL import SSL

from labkit.pki import OriginPKI
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


def handshake(
    server: SSL.Connection, sni: str, cafile: Path, *, rsa_only: bool = False
) -> ssl.SSLObject:
    """A Python TLS client offering h2 against `server`, in memory; its view of the result.
    `rsa_only`: TLS 1.2 with RSA-signed key exchanges only, a client that takes no ECDSA."""
    trust = ssl.create_default_context(cafile=str(cafile))
    trust.set_alpn_protocols(["h2", "http/1.1"])
    if rsa_only:
        trust.maximum_version = ssl.TLSVersion.TLSv1_2
        trust.set_ciphers("ECDHE-RSA-AES128-GCM-SHA256")
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


def served_certificate(
    addon: tuple[tlsconfig.TlsConfig, taddons.context], sni: str, *, rsa_only: bool = False
) -> x509.Certificate:
    cafile = Path(addon[1].options.confdir) / "mitmproxy-ca-cert.pem"
    der = handshake(start(addon, sni), sni, cafile, rsa_only=rsa_only).getpeercert(True)
    return x509.load_der_x509_certificate(der)


def test_a_client_without_ecdsa_gets_the_same_certificate_as_without_the_patch(
    addon: tuple[tlsconfig.TlsConfig, taddons.context],
) -> None:
    served = served_certificate(addon, "c.example", rsa_only=True)
    assert isinstance(served.public_key(), rsa.RSAPublicKey)
    with Patches([ReuseClientTlsContexts()]):
        patched = served_certificate(addon, "c.example", rsa_only=True)
    assert patched == served  # the certificate store's entry for the host, byte for byte


def test_any_other_client_gets_its_ecdsa_twin_signed_by_the_same_ca(
    addon: tuple[tlsconfig.TlsConfig, taddons.context],
) -> None:
    rsa_leaf = served_certificate(addon, "d.example")
    with Patches([ReuseClientTlsContexts()]):
        twin = served_certificate(addon, "d.example")  # verified against the CA, name included
    key = twin.public_key()
    assert isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp256r1"
    assert (twin.subject, twin.issuer) == (rsa_leaf.subject, rsa_leaf.issuer)
    assert (twin.not_valid_before_utc, twin.not_valid_after_utc) == (
        rsa_leaf.not_valid_before_utc,
        rsa_leaf.not_valid_after_utc,
    )
    assert list(twin.extensions) == list(rsa_leaf.extensions)
    assert twin.serial_number != rsa_leaf.serial_number


def test_a_certificate_the_user_supplied_keeps_its_own_key_and_gets_no_twin(
    addon: tuple[tlsconfig.TlsConfig, taddons.context], tmp_path: Path
) -> None:
    pki = OriginPKI(tmp_path / "user-pki")
    issued = pki.issue(["e.example"])
    supplied = tmp_path / "e.example.pem"
    supplied.write_bytes(issued.key_path.read_bytes() + issued.cert_path.read_bytes())
    ta, tctx = addon
    tctx.configure(ta, certs=[f"e.example={supplied}"])
    with Patches([ReuseClientTlsContexts()]):
        conn = start(addon, "e.example")
        served = handshake(conn, "e.example", pki.ca_cert_path).getpeercert(True)
    users = x509.load_pem_x509_certificates(issued.cert_path.read_bytes())[0]
    assert x509.load_der_x509_certificate(served) == users


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
