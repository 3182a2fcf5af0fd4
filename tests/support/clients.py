"""Clients for the tests: urllib and curl for whole requests, raw bytes on a socket, and a
well-behaved client that keeps asking (in a thread) while a test misbehaves, to show everyone else
is still served."""

from __future__ import annotations

import contextlib
import http.client
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from typing import Self


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def curl_via_proxy(proxy: str, url: str, *extra: str) -> tuple[str, str]:
    """(status, body): the response's status, or for https:// the CONNECT's status if not 200."""
    result = subprocess.run(
        [
            "curl",
            "--silent",
            "--max-time",
            "20",
            "--proxy",
            proxy,
            "--write-out",
            "|||%{http_code} %{http_connect}",
            *extra,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    body, _, codes = result.stdout.rpartition("|||")
    status, connect = codes.split()
    return (connect if connect not in ("000", "200") else status), body


def exchange(host: str, port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send `data` on a fresh connection and return everything the peer sent until it closed
    (or `timeout` passed: then b"<timeout>" is appended, so a hang shows)."""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        # The proxy may close while a large head is still being sent.
        with contextlib.suppress(OSError):
            sock.sendall(data)
        received = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                piece = sock.recv(65536)
            except TimeoutError:
                return received + b"<timeout>"
            except ConnectionResetError:
                return received + b"<reset>"
            if not piece:
                return received
            received += piece
        return received + b"<timeout>"


def status_of(response: bytes) -> int | None:
    if not response.startswith(b"HTTP/1.1 "):
        return None
    return int(response[9:12])


class WellBehavedClient:
    """GETs `url` through the proxy in a loop, one keep-alive connection, until stopped;
    `statuses` holds every status it got (or the exception name when a request failed)."""

    def __init__(self, proxy: str, url: str) -> None:
        self.proxy_host, port = proxy.split(":")
        self.proxy_port = int(port)
        self.url = url
        self.statuses: list[int | str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        connection = http.client.HTTPConnection(self.proxy_host, self.proxy_port, timeout=10)
        while not self._stop.is_set() and len(self.statuses) < 100_000:
            try:
                connection.request("GET", self.url)
                response = connection.getresponse()
                response.read()
                self.statuses.append(response.status)
            except (OSError, http.client.HTTPException) as e:
                self.statuses.append(type(e).__name__)
                connection.close()
                connection = http.client.HTTPConnection(
                    self.proxy_host, self.proxy_port, timeout=10
                )
            time.sleep(0.01)
        connection.close()

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(15)

    def assert_served(self, at_least: int = 5) -> None:
        assert len(self.statuses) >= at_least, self.statuses
        assert set(self.statuses) == {200}, [s for s in self.statuses if s != 200][:10]


def read_response(sock: socket.socket) -> bytes:
    """One response with a Content-Length (or a close) from `sock`, head and body."""
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(65536)
        if not piece:
            return data
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        0,
    )
    while len(body) < length:
        piece = sock.recv(65536)
        if not piece:
            break
        body += piece
    return head + b"\r\n\r\n" + body
