"""TlsClient against a real TLS server in memory: verification, ALPN, session resumption."""

from __future__ import annotations

import contextlib
import ssl
from pathlib import Path

import pytest

from labkit.pki import OriginPKI
from reshape.upstream.tls import (
    ALPN_H1,
    ALPN_H2,
    SessionCache,
    TlsClient,
    TlsError,
    client_context,
)


def server_context(pki: OriginPKI, alpn: list[str]) -> ssl.SSLContext:
    issued = pki.issue(["127.0.0.2", "origin.test"])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(issued.cert_path, issued.key_path)
    context.set_alpn_protocols(alpn)
    return context


def handshake(client: TlsClient, server_ctx: ssl.SSLContext) -> ssl.SSLObject:
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    server = server_ctx.wrap_bio(incoming, outgoing, server_side=True)
    to_server = client.start()
    for _ in range(10):
        incoming.write(to_server)
        with contextlib.suppress(ssl.SSLWantReadError):
            server.do_handshake()
        _, to_server = client.receive(outgoing.read())
        if client.handshake_done and not to_server:
            break
    # TLS 1.3 tickets come after the handshake; let the client read them.
    server.write(b"ping")
    plaintext, _ = client.receive(outgoing.read())
    assert plaintext == b"ping"
    return server


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> OriginPKI:
    return OriginPKI(tmp_path_factory.mktemp("pki"))


def test_verifies_negotiates_alpn_and_resumes(pki: OriginPKI) -> None:
    server_ctx = server_context(pki, [ALPN_H2, ALPN_H1])
    context = client_context(pki.ca_cert_path, [ALPN_H2, ALPN_H1])
    first = TlsClient(context, "origin.test")
    handshake(first, server_ctx)
    assert first.alpn == ALPN_H2
    assert not first.session_reused
    second = TlsClient(context, "origin.test", session=first.session)
    handshake(second, server_ctx)
    assert second.session_reused


def test_the_session_cache_lets_the_least_recently_used_go(pki: OriginPKI) -> None:
    client = TlsClient(client_context(pki.ca_cert_path, [ALPN_H1]), "origin.test")
    handshake(client, server_context(pki, [ALPN_H1]))
    session = client.session
    assert session is not None
    cache = SessionCache(limit=2)
    cache.put("busy", session)  # stored first, and used on
    cache.put("once", session)
    assert cache.get("busy") is session
    cache.put("new", session)
    assert list(cache.sessions) == ["busy", "new"]
    cache.put("busy", session)  # stored again: the most recent
    cache.put("newer", session)
    assert list(cache.sessions) == ["busy", "newer"]


def test_ip_address_names_verify_against_ip_sans(pki: OriginPKI) -> None:
    client = TlsClient(client_context(pki.ca_cert_path, [ALPN_H1]), "127.0.0.2")
    handshake(client, server_context(pki, [ALPN_H1]))
    assert client.alpn == ALPN_H1


def test_unknown_ca_is_refused(pki: OriginPKI, tmp_path: Path) -> None:
    stranger = OriginPKI(tmp_path / "stranger")
    client = TlsClient(client_context(stranger.ca_cert_path, [ALPN_H1]), "origin.test")
    with pytest.raises(TlsError, match="certificate verify failed"):
        handshake(client, server_context(pki, [ALPN_H1]))


def test_wrong_name_is_refused(pki: OriginPKI) -> None:
    client = TlsClient(client_context(pki.ca_cert_path, [ALPN_H1]), "other.test")
    with pytest.raises(TlsError, match="certificate verify failed"):
        handshake(client, server_context(pki, [ALPN_H1]))


def test_sizes_slice_writes_into_records(pki: OriginPKI) -> None:
    client = TlsClient(client_context(pki.ca_cert_path, [ALPN_H1]), "origin.test")
    handshake(client, server_context(pki, [ALPN_H1]))
    sliced = client.send(b"x" * 10_000, sizes=[1000] * 9 + [1000])
    uneven = client.send(b"x" * 10_000, sizes=[1400, 8600])
    whole = client.send(b"x" * 10_000)
    assert _records(sliced) == 10
    assert _records(uneven) == 2
    assert _records(whole) == 1
    with pytest.raises(ValueError, match="add up"):
        client.send(b"x" * 100, sizes=[10, 10])


def _records(data: bytes) -> int:
    count, offset = 0, 0
    while offset < len(data):
        length = int.from_bytes(data[offset + 3 : offset + 5], "big")
        offset += 5 + length
        count += 1
    return count
