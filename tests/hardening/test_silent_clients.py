"""Client connections that send nothing at all are closed after the header timeout
(reshape/features/client_errors/silent_clients.py); clients that speak, even slowly or after a
pause, are not."""

from __future__ import annotations

import socket
import time

import pytest

from tests.support.clients import WellBehavedClient, read_response, status_of
from tests.support.faulty_origins import FaultyOrigin
from tests.support.reshape_process import REPO, StartProxy

HEADER_TIMEOUT = 1.0


def closed_after(sock: socket.socket, limit: float) -> float | None:
    """Seconds until the proxy closed `sock` (None if still open after `limit`)."""
    started = time.monotonic()
    sock.settimeout(limit)
    try:
        data = sock.recv(4096)
    except TimeoutError:
        return None
    assert data == b"", data
    return time.monotonic() - started


@pytest.mark.slow
def test_silent_connections_are_closed_and_counted(start_reshape: StartProxy) -> None:
    with FaultyOrigin("127.0.0.74") as origin:
        proxy = start_reshape("--client-header-timeout", str(HEADER_TIMEOUT))
        host, port = proxy.listen.split(":")
        with WellBehavedClient(proxy.listen, origin.url("/echo/good")) as good:
            silent = [socket.create_connection((host, int(port)), timeout=5) for _ in range(20)]
            # One that pauses, then speaks before the timeout: served.
            late = socket.create_connection((host, int(port)), timeout=5)
            time.sleep(HEADER_TIMEOUT / 2)
            late.sendall(
                f"GET {origin.url('/echo/late')} HTTP/1.1\r\nHost: {origin.host}\r\n\r\n".encode()
            )
            answer = read_response(late)
            assert status_of(answer) == 200, answer[:200]
            waits = [closed_after(sock, HEADER_TIMEOUT + 5) for sock in silent]
            for sock in silent:
                sock.close()
            # The late speaker's keep-alive connection, idle now, is not silent: left open.
            assert closed_after(late, HEADER_TIMEOUT * 2) is None
            late.close()
        good.assert_served()
    assert all(wait is not None for wait in waits), waits
    assert proxy.metric("reshape_client_errors_total", kind="silent_connection") == 20
    assert "Traceback" not in proxy.log()


def open_tunnel(listen: str, target: str) -> socket.socket:
    """A CONNECT to `target` through the proxy at `listen`, its 200 read; nothing more said."""
    host, port = listen.split(":")
    sock = socket.create_connection((host, int(port)), timeout=5)
    sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    answer = read_response(sock)
    assert status_of(answer) == 200, answer
    return sock


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["reshape/policy/default.yaml", "policies/pooled.yaml"])
def test_silent_tunnels_are_closed_and_counted(start_reshape: StartProxy, policy: str) -> None:
    """A CONNECT and then nothing, to a web port (no origin connection is made for it) and to an
    origin that says nothing either (connected after a second of the client's silence, in case
    it speaks first): both closed, where they used to stay for mitmproxy's 600 s."""
    with FaultyOrigin("127.0.0.75") as origin:
        proxy = start_reshape("--client-header-timeout", str(HEADER_TIMEOUT), policy=REPO / policy)
        web = open_tunnel(proxy.listen, "127.0.0.75:443")  # nothing listens there
        other = open_tunnel(proxy.listen, f"127.0.0.75:{origin.port}")
        # One that speaks, after a pause shorter than the timeout: served through its tunnel.
        late = open_tunnel(proxy.listen, f"127.0.0.75:{origin.port}")
        time.sleep(HEADER_TIMEOUT / 2)
        late.sendall(f"GET /echo/late HTTP/1.1\r\nHost: 127.0.0.75:{origin.port}\r\n\r\n".encode())
        assert status_of(read_response(late)) == 200
        waits = [closed_after(sock, HEADER_TIMEOUT * 2 + 5) for sock in (web, other)]
        assert closed_after(late, HEADER_TIMEOUT * 3) is None
        for sock in (web, other, late):
            sock.close()
    assert all(wait is not None for wait in waits), waits
    assert proxy.metric("reshape_client_errors_total", kind="silent_connection") == 2
    assert "Traceback" not in proxy.log()
