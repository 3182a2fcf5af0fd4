"""A request body that streams (past mitmproxy's `stream_large_bodies`, 1 MiB) reaches an HTTP/2
origin as it arrives, not when the next piece comes or the flow-control window fills: an upload
that pauses must not leave its last bytes sitting in the proxy."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from labkit.pki import OriginPKI
from tests.support.faulty_origins import FaultyOrigin
from tests.support.reshape_process import StartProxy
from tests.support.scripted_origins import ScriptedOrigin
from tests.system.upstream.test_engine_full_duplex import SHORT_READ_TIMEOUT

POLICIES = {
    "plain": "version: 1\ndefault: p\npolicies:\n  p: {}\n",
    "pooled": "version: 1\ndefault: p\npolicies:\n  p: {upstream: {max_connections_per_host: 2}}\n",
}
FIRST = 1_500_000  # over stream_large_bodies: mitmproxy streams it on
REST = 1_000


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_a_paused_upload_reaches_an_h2_origin_up_to_its_last_byte(
    start_reshape: StartProxy, tmp_path: Path, origin_pki: OriginPKI, policy: str
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICIES[policy])
    proxy = start_reshape(policy=path)
    with FaultyOrigin("127.0.0.123", tls=origin_pki.issue(["127.0.0.123"])) as origin:
        arrived_during_pauses: list[int] = []

        def pause_until(size: int) -> None:
            deadline = time.monotonic() + 2
            while origin.received.get("/upload/done", 0) < size and time.monotonic() < deadline:
                time.sleep(0.02)
            arrived_during_pauses.append(origin.received.get("/upload/done", 0))

        def upload() -> Iterator[bytes]:
            yield b"a" * FIRST
            pause_until(FIRST)
            # A small piece, well within the window, after the origin has gone quiet.
            yield b"b" * REST
            pause_until(FIRST + REST)
            yield b"c" * REST

        trust = ssl.create_default_context(cafile=str(proxy.ca_cert))
        with httpx.Client(http2=True, proxy=proxy.proxy_url, verify=trust, timeout=30) as http:
            # The origin answers 5 s after the head: nothing comes back while the body streams.
            response = http.post(origin.url("/upload/done?delay=5"), content=upload())
        assert (response.status_code, response.text) == (200, "done")
        assert arrived_during_pauses == [FIRST, FIRST + REST]
        assert origin.received["/upload/done"] == FIRST + 2 * REST


class TakesNothing(ScriptedOrigin):
    """Reads a request's head, then neither reads its body nor answers."""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await asyncio.sleep(60)


UPLOAD = 64_000_000  # far more than the sockets between proxy and origin hold


@pytest.mark.slow
@pytest.mark.parametrize("policy", SHORT_READ_TIMEOUT)
def test_an_origin_that_stops_taking_an_upload_and_never_answers_is_timed(
    start_reshape: StartProxy, tmp_path: Path, policy: str
) -> None:
    # The client sends as fast as it can: every wait of the proxy's is for the origin, none
    # for the client, so the read timeout (1 s) counts and the client gets a 504, not a
    # request that hangs for as long as the client keeps its connection.
    path = tmp_path / "policy.yaml"
    path.write_text(SHORT_READ_TIMEOUT[policy])
    proxy = start_reshape("--origin-read-timeout", "1", policy=path)
    host, port = proxy.listen.split(":")
    with TakesNothing("127.0.0.125") as origin, socket.create_connection((host, int(port))) as sock:
        head = (
            f"POST {origin.url('/upload')} HTTP/1.1\r\nHost: {origin.host}:{origin.port}\r\n"
            f"Content-Length: {UPLOAD}\r\n\r\n"
        )
        sock.sendall(head.encode())

        def upload() -> None:
            piece = b"u" * 65_536
            with contextlib.suppress(OSError):
                for _ in range(UPLOAD // len(piece)):
                    sock.sendall(piece)

        threading.Thread(target=upload, daemon=True).start()
        sock.settimeout(20)
        started = time.monotonic()
        answer = sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 504"), answer[:200]
        assert time.monotonic() - started < 15


class LengthRequired(ScriptedOrigin):
    """Answers a chunked request body 411 Length Required, as S3's PUT does; a body with a
    Content-Length 200 with its size, once it has all of it."""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).lower()
        if b"\r\ntransfer-encoding:" in head:
            writer.write(b"HTTP/1.1 411 Length Required\r\nContent-Length: 0\r\n\r\n")
        else:
            length = int(head.split(b"\r\ncontent-length:")[1].split(b"\r\n")[0])
            size = len(await reader.readexactly(length))
            body = str(size).encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()


@pytest.mark.parametrize("policy", POLICIES)
def test_an_upload_over_a_mebibyte_reaches_an_http1_origin_with_its_length(
    start_reshape: StartProxy, tmp_path: Path, policy: str
) -> None:
    # Past `stream_large_bodies` the body streams; it went chunked with its Content-Length
    # dropped, so such an origin answered 411 to every upload over 1 MiB.
    path = tmp_path / "policy.yaml"
    path.write_text(POLICIES[policy])
    proxy = start_reshape(policy=path)
    size = FIRST + REST
    with (
        LengthRequired("127.0.0.123") as origin,
        httpx.Client(proxy=proxy.proxy_url, timeout=30) as http,
    ):
        response = http.put(origin.url("/object"), content=b"x" * size)
    assert (response.status_code, response.text) == (200, str(size))
