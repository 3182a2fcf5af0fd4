"""A raw HTTP/2 client through reshape (CONNECT, TLS with ALPN h2) that misbehaves on purpose:
floods of RST_STREAM (CVE-2023-44487 rapid reset), SETTINGS or PING frames, or a frame that
breaks the protocol. It reports how the proxy ended the connection."""

from __future__ import annotations

import ssl
import time
from dataclasses import dataclass
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import h2.exceptions

from tests.support.clients import h2_tunnel


@dataclass
class Outcome:
    """How the connection ended: the GOAWAY error code (None if none came), frames sent."""

    goaway: int | None
    frames_sent: int
    closed: bool
    seconds: float


def attack(
    proxy: tuple[str, int], origin: tuple[str, int], trust: Path, kind: str, frames: int = 20_000
) -> Outcome:
    """Open an HTTP/2 connection to `origin` through `proxy` and send `frames` frames of `kind`
    (reset, settings, ping, protocol), as fast as the socket takes them."""
    target = f"{origin[0]}:{origin[1]}"
    sock = h2_tunnel(proxy, origin, trust)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    started = time.monotonic()
    sent = 0
    goaway: int | None = None
    closed = False
    sock.setblocking(False)
    try:
        for i in range(frames):
            if kind == "reset":
                stream_id = conn.get_next_available_stream_id()
                conn.send_headers(
                    stream_id,
                    [
                        (":method", "GET"),
                        (":scheme", "https"),
                        (":authority", target),
                        (":path", f"/echo/rapid{i}"),
                    ],
                )
                conn.reset_stream(stream_id)
            elif kind == "settings":
                conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 65535 + i})
            elif kind == "ping":
                conn.ping(i.to_bytes(8, "big"))
            elif kind == "protocol":
                # A DATA frame on stream 0 is a connection error (RFC 9113 section 6.1).
                data = b"\x00\x00\x01\x00\x00\x00\x00\x00\x00x"
                _send(sock, data)
                sent += 1
                break
            else:
                raise ValueError(kind)
            _send(sock, conn.data_to_send())
            sent += 1
            if i % 10 == 0:
                goaway, closed = _read(sock, conn)
                if goaway is not None or closed:
                    break
    except (ssl.SSLError, OSError, h2.exceptions.ProtocolError):
        closed = True
    deadline = time.monotonic() + 10
    while goaway is None and not closed and time.monotonic() < deadline:
        try:
            goaway, closed = _read(sock, conn)
        except (ssl.SSLError, OSError):
            closed = True
        time.sleep(0.01)
    sock.close()
    return Outcome(goaway, sent, closed, time.monotonic() - started)


def _send(sock: ssl.SSLSocket, data: bytes) -> None:
    view = memoryview(data)
    deadline = time.monotonic() + 10
    while view and time.monotonic() < deadline:
        try:
            n = sock.send(view)
        except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
            time.sleep(0.001)
            continue
        view = view[n:]


def _read(sock: ssl.SSLSocket, conn: h2.connection.H2Connection) -> tuple[int | None, bool]:
    """Read what is there: (GOAWAY error code if one came, whether the proxy closed)."""
    goaway = None
    while True:
        try:
            data = sock.recv(65536)
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
            return goaway, False
        if not data:
            return goaway, True
        try:
            events = conn.receive_data(data)
        except h2.exceptions.ProtocolError:
            return goaway, True
        for event in events:
            if isinstance(event, h2.events.ConnectionTerminated):
                goaway = int(event.error_code)
