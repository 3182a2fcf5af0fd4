"""A slow client slows the origin: the engine reads an origin's response only as fast as the
client takes it, over HTTP/1.1 (the client socket's drain) and HTTP/2 (the stream's flow-control
window: mitmproxy buffers what the window does not admit, and the engine stops reading while
that buffer is full). Without it a client that stops reading would pile the whole response up in
the proxy's memory."""

from __future__ import annotations

import asyncio
import socket
import ssl
import time

import h2.config
import h2.connection
import h2.events
import pytest

from labkit.pki import IssuedCert, OriginPKI
from tests.conftest import StartProxy
from tests.support.scripted_origins import ScriptedOrigin

BODY = 64 << 20  # 64 MB: far more than every buffer between origin and client together
PIECE = 64 << 10


class FireHose(ScriptedOrigin):
    """Answers one GET with a 64 MB body, written as fast as its socket takes it; `written` is
    how much the socket has taken so far."""

    def __init__(self, host: str, tls: IssuedCert | None = None) -> None:
        super().__init__(host, tls)
        self.written = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % BODY)
        piece = b"x" * PIECE
        while self.written < BODY:
            writer.write(piece)
            await writer.drain()
            self.written += PIECE


def stalled_h1_client(proxy_host: str, proxy_port: int, url: str) -> socket.socket:
    """Sends the GET, reads a few bytes, then reads nothing more."""
    sock = socket.create_connection((proxy_host, proxy_port), timeout=10)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    sock.sendall(f"GET {url} HTTP/1.1\r\nHost: origin\r\n\r\n".encode())
    assert sock.recv(100).startswith(b"HTTP/1.1 200")
    return sock


def stalled_h2_client(proxy_host: str, proxy_port: int, ca: str, origin: FireHose):  # type: ignore[no-untyped-def]
    """Through a CONNECT tunnel, HTTP/2 with the default 64 KB windows and never a
    WINDOW_UPDATE: after 64 KB of body, the proxy may send nothing more."""
    authority = f"{origin.host}:{origin.port}"
    raw = socket.create_connection((proxy_host, proxy_port), timeout=10)
    raw.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
    assert b" 200 " in raw.recv(4096)
    context = ssl.create_default_context(cafile=ca)
    context.set_alpn_protocols(["h2"])
    tunnel = context.wrap_socket(raw, server_hostname=origin.host)
    assert tunnel.selected_alpn_protocol() == "h2"
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.send_headers(
        1,
        [(":method", "GET"), (":scheme", "https"), (":authority", authority), (":path", "/big")],
        end_stream=True,
    )
    tunnel.sendall(conn.data_to_send())
    deadline = time.monotonic() + 10
    status = None
    while status is None and time.monotonic() < deadline:
        for event in conn.receive_data(tunnel.recv(65536)):
            if isinstance(event, h2.events.ResponseReceived):
                status = dict(event.headers)[b":status"]
        tunnel.sendall(conn.data_to_send())  # SETTINGS ACKs only: no WINDOW_UPDATE
    assert status == b"200", status
    return tunnel


@pytest.mark.parametrize("client", ["h1", "h2"])
def test_a_client_that_stops_reading_stops_the_origin(
    start_reshape: StartProxy, origin_pki: OriginPKI, client: str
) -> None:
    proxy = start_reshape()
    host, port = proxy.listen.split(":")
    tls = origin_pki.issue(["127.0.0.125"]) if client == "h2" else None
    with FireHose("127.0.0.125", tls) as origin:
        if client == "h1":
            # A plain-HTTP tunnel would do too; in clear the origin is reached by absolute URL.
            held = stalled_h1_client(host, int(port), origin.url("/big"))
        else:
            held = stalled_h2_client(host, int(port), str(proxy.ca_cert), origin)
        time.sleep(3)
        written = origin.written
        assert written > 0  # the request reached the origin, which sent what it could
        time.sleep(1)
        try:
            # The origin is held back: far less than the body left it, and it has stopped.
            assert written < 24 << 20, written
            assert origin.written - written <= 2 * PIECE, (written, origin.written)
        finally:
            held.close()
