"""Clients for the tests: urllib and curl for whole requests, raw bytes on a socket, a burst of
HTTP/2 requests in one write, one HTTP/2 request whose 1xx heads are kept, and a well-behaved
client that keeps asking (in a thread) while a test misbehaves, to show everyone else is still
served."""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, Self

import h2.config
import h2.connection
import h2.events

if TYPE_CHECKING:
    from tests.support.reshape_process import RunningProxy


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


def h2_tunnel(proxy: tuple[str, int], origin: tuple[str, int], trust: Path) -> ssl.SSLSocket:
    """A TLS connection to `origin` through `proxy`'s CONNECT tunnel, HTTP/2 agreed by ALPN
    (`trust`: the proxy's CA)."""
    target = f"{origin[0]}:{origin[1]}"
    raw = socket.create_connection(proxy, timeout=10)
    try:
        raw.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            piece = raw.recv(4096)
            assert piece, head
            head += piece
        assert head.startswith(b"HTTP/1.1 200"), head
        context = ssl.create_default_context(cafile=str(trust))
        context.set_alpn_protocols(["h2"])
        sock = context.wrap_socket(raw, server_hostname=origin[0])
    except BaseException:
        raw.close()
        raise
    agreed = sock.selected_alpn_protocol()
    if agreed != "h2":
        sock.close()
        raise AssertionError(f"ALPN {agreed!r}, not h2")
    return sock


def h2_burst(
    proxy: tuple[str, int], origin: tuple[str, int], trust: Path, paths: list[str]
) -> dict[str, tuple[int, bytes]]:
    """GET every path of `origin` through `proxy` (CONNECT, TLS with ALPN h2, `trust` the proxy's
    CA) on one HTTP/2 connection, all requests in one write, as a browser sends a burst: status
    and body per path."""
    target = f"{origin[0]}:{origin[1]}"
    with h2_tunnel(proxy, origin, trust) as sock:
        conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        conn.initiate_connection()
        sock.sendall(conn.data_to_send())
        path_of: dict[int, str] = {}
        for path in paths:
            stream_id = conn.get_next_available_stream_id()
            path_of[stream_id] = path
            conn.send_headers(
                stream_id,
                [
                    (b":method", b"GET"),
                    (b":scheme", b"https"),
                    (b":authority", target.encode()),
                    (b":path", path.encode()),
                ],
                end_stream=True,
            )
        sock.sendall(conn.data_to_send())
        statuses: dict[int, int] = {}
        bodies: dict[int, bytes] = {stream_id: b"" for stream_id in path_of}
        ended: set[int] = set()
        while len(ended) < len(paths):
            data = sock.recv(65536)
            assert data, f"the proxy closed with {len(paths) - len(ended)} responses to come"
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived):
                    statuses[event.stream_id] = int(dict(event.headers or [])[b":status"])
                elif isinstance(event, h2.events.DataReceived):
                    bodies[event.stream_id] += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded):
                    ended.add(event.stream_id)
            sock.sendall(conn.data_to_send())
    return {path_of[i]: (statuses.get(i, 0), bodies[i]) for i in path_of}


class Endpoint(Protocol):
    """Where a test's origin listens (labkit's Origin, a scripted origin)."""

    @property
    def host(self) -> str: ...

    @property
    def port(self) -> int: ...


@dataclass
class H2Answer:
    """A response read by `h2_get`."""

    informational: list[dict[bytes, bytes]]  # the 1xx heads before the response, in order
    status: int
    body: bytes


def h2_get(proxy: RunningProxy, origin: Endpoint, path: str, headers: dict[str, str]) -> H2Answer:
    """GET `path` of `origin` on a new h2 connection through `proxy`, every 1xx kept."""
    host, port = proxy.listen.rsplit(":", 1)
    with h2_tunnel((host, int(port)), (origin.host, origin.port), proxy.ca_cert) as sock:
        conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        conn.initiate_connection()
        conn.send_headers(
            1,
            [
                (b":method", b"GET"),
                (b":scheme", b"https"),
                (b":authority", f"{origin.host}:{origin.port}".encode()),
                (b":path", path.encode()),
                *((k.encode(), v.encode()) for k, v in headers.items()),
            ],
            end_stream=True,
        )
        sock.sendall(conn.data_to_send())
        answer = H2Answer([], 0, b"")
        while True:
            data = sock.recv(65536)
            assert data, "the proxy closed before the response ended"
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.InformationalResponseReceived):
                    answer.informational.append(dict(event.headers))
                elif isinstance(event, h2.events.ResponseReceived):
                    answer.status = int(dict(event.headers)[b":status"])
                elif isinstance(event, h2.events.DataReceived):
                    answer.body += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, 1)
                elif isinstance(event, h2.events.StreamEnded):
                    return answer
            sock.sendall(conn.data_to_send())


def curl_heads(proxy: RunningProxy, url: str, version: str) -> str:
    """Every response head curl reads for a document request to `url` through `proxy`."""
    return subprocess.run(
        [
            "curl",
            "--silent",
            "--show-error",
            "--max-time",
            "20",
            version,
            "--proxy",
            proxy.proxy_url,
            "--cacert",
            str(proxy.ca_cert),
            "--dump-header",
            "-",
            "--output",
            "/dev/null",
            "--header",
            "sec-fetch-dest: document",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout


def statuses_in(heads: str) -> list[str]:
    """The status lines curl dumped, but the proxy's answer to its CONNECT."""
    lines = [line.strip() for line in heads.splitlines() if line.startswith("HTTP/")]
    return [line for line in lines if "Connection established" not in line]
