"""A client that stalls mid-exchange gives its origin connection back after
`--client-idle-timeout` (reshape/mitm/engine_channel.py): one that stops sending a streamed
upload gets a 400 and its connection closed, one that stops reading a download has it cut off.

Found by a black-box review (2026-12-04): such a client held its connection of the shared pool
for as long as it stalled (an upload still held at 120 s), and everyone else's requests to that
origin, capped at one connection, got `503 waited too long for a connection`; mitmdump, with a
connection per client, served them. Here the origin is capped at one connection and the timeout
is 1 s: the other client's GET, sent while the stalled one holds the connection, is answered 200."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import h11
import httpx
import pytest

from tests.support.reshape_process import RunningProxy, StartProxy
from tests.support.scripted_origins import ScriptedOrigin, h11_event

HOST = "127.0.0.144"
IDLE = 1.0
POLICY = """version: 1
default: capped
policies:
  capped:
    upstream: {max_connections_per_host: 1, queue_timeout: 20}
"""


class LargeAnswers(ScriptedOrigin):
    """`/big`: 256 MB, written as fast as the socket takes it; anything else (a POST's body
    read whole first) `ok`."""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER)
        while True:
            event = await h11_event(conn, reader)
            if not isinstance(event, h11.Request):
                return
            while not isinstance(part := await h11_event(conn, reader), h11.EndOfMessage):
                if part is None:
                    return  # the proxy gave the exchange up: the connection closed
            if event.target == b"/big":
                size = 256 << 20
                writer.write(
                    conn.send(
                        h11.Response(status_code=200, headers=[("Content-Length", str(size))])
                    )
                )
                piece = b"x" * (256 << 10)
                for _ in range(size // len(piece)):
                    writer.write(conn.send(h11.Data(data=piece)))
                    await writer.drain()
            else:
                writer.write(
                    conn.send(h11.Response(status_code=200, headers=[("Content-Length", "2")]))
                )
                writer.write(conn.send(h11.Data(data=b"ok")))
            writer.write(conn.send(h11.EndOfMessage()))
            await writer.drain()
            conn.start_next_cycle()


@pytest.fixture
def capped(
    start_reshape: StartProxy, tmp_path: Path
) -> Iterator[tuple[RunningProxy, LargeAnswers]]:
    """reshape with a 1 s client idle timeout, and its origin capped at one connection."""
    policy = tmp_path / "capped.yaml"
    policy.write_text(POLICY)
    with LargeAnswers(HOST) as origin:
        yield start_reshape("--client-idle-timeout", str(IDLE), policy=policy), origin


def connect(proxy: RunningProxy) -> socket.socket:
    host, port = proxy.listen.split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def other_client_gets(proxy: RunningProxy, url: str) -> int:
    with httpx.Client(proxy=proxy.proxy_url, timeout=15) as client:
        return client.get(url).status_code


@pytest.mark.slow
def test_a_stalled_upload_ends_and_frees_its_connection(
    capped: tuple[RunningProxy, LargeAnswers],
) -> None:
    proxy, origin = capped
    with connect(proxy) as sock:
        sock.sendall(
            f"POST {origin.url('/upload')} HTTP/1.1\r\nHost: {HOST}:{origin.port}\r\n"
            f"Content-Length: {5 << 20}\r\n\r\n".encode()
        )
        sock.sendall(b"u" * (2 << 20))  # over 1 MiB: it streams; then nothing more
        started = time.monotonic()
        assert other_client_gets(proxy, origin.url("/other")) == 200
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        waited = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b"client idle for 1 s: none of the rest of its request body came" in answer
    assert waited < 10
    assert proxy.metric("reshape_requests_total", outcome="client_error") == 1
    assert "Traceback" not in proxy.log()


@pytest.mark.slow
def test_a_stalled_download_is_cut_off_and_frees_its_connection(
    capped: tuple[RunningProxy, LargeAnswers],
) -> None:
    proxy, origin = capped
    with connect(proxy) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        sock.sendall(f"GET {origin.url('/big')} HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode())
        assert sock.recv(100).startswith(b"HTTP/1.1 200")
        # Reads nothing more: the other client's request waits for the one connection.
        assert other_client_gets(proxy, origin.url("/other")) == 200
        sock.settimeout(10)
        received = 0
        while chunk := sock.recv(1 << 20):  # cut off: the connection ends short
            received += len(chunk)
    assert received < 256 << 20
    assert "took none of its response" in proxy.log()
    assert proxy.metric("reshape_requests_total", outcome="client_error") == 1
    assert "Traceback" not in proxy.log()
