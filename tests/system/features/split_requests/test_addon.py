"""Raw clients that write a POST's head and body apart (or together) through reshape."""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Iterator

import h2.config
import h2.connection
import h2.events
import pytest

from labkit.origins import Origin, nginx_origin
from labkit.pki import OriginPKI
from tests.support.reshape_process import RunningProxy, StartProxy
from tests.unit.features.split_requests.test_addon import CHROME, CURL, METRIC

GAP = 0.05
BODY = b"x" * 1000


@pytest.fixture(scope="module")
def origins(
    tmp_path_factory: pytest.TempPathFactory, origin_pki: OriginPKI
) -> Iterator[tuple[Origin, Origin]]:
    """nginx over http and over https with h2; POSTs to static files are answered 405."""
    root = tmp_path_factory.mktemp("split-www")
    (root / "form").write_text("a static file\n")
    tls = origin_pki.issue(["127.0.0.2"])
    with (
        nginx_origin(root, "127.0.0.2") as plain,
        nginx_origin(root, "127.0.0.2", tls=tls, http2=True) as secure,
    ):
        yield plain, secure


def connect(proxy: RunningProxy) -> socket.socket:
    host, port = proxy.listen.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def read_http1_response(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(
        next(
            line.split(b":")[1]
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head


def http1_request(
    proxy: RunningProxy, origin: Origin, method: str, body: bytes, gap: float | None
) -> bytes:
    """One HTTP/1.1 request in absolute form; with `gap`, its body is written that much later."""
    head = (
        f"{method} {origin.url('/form')} HTTP/1.1\r\nHost: {origin.host}:{origin.port}\r\n"
        f"User-Agent: {CURL}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with connect(proxy) as sock:
        if gap is None:
            sock.sendall(head + body)
        else:
            sock.sendall(head)
            time.sleep(gap)
            sock.sendall(body)
        return read_http1_response(sock)


def test_http1_post_whose_body_comes_later_is_counted(
    start_reshape: StartProxy, origins: tuple[Origin, Origin]
) -> None:
    plain, _ = origins
    proxy = start_reshape()
    assert proxy.metric(METRIC, client_family="curl") == 0

    head = http1_request(proxy, plain, "POST", BODY, gap=GAP)
    assert head.startswith(b"HTTP/1.1 405"), head
    assert proxy.metric(METRIC, client_family="curl") == 1

    http1_request(proxy, plain, "POST", BODY, gap=None)
    http1_request(proxy, plain, "GET", b"", gap=GAP)  # no body: nothing to split
    assert proxy.metric(METRIC, client_family="curl") == 1
    assert proxy.metric(METRIC) == 1


class Http2Client:
    """HTTP/2 over TLS through reshape's CONNECT tunnel, written with the h2 library."""

    def __init__(self, proxy: RunningProxy, origin: Origin) -> None:
        self.authority = f"{origin.host}:{origin.port}"
        raw = connect(proxy)
        raw.sendall(f"CONNECT {self.authority} HTTP/1.1\r\nHost: {self.authority}\r\n\r\n".encode())
        reply = b""
        while not reply.endswith(b"\r\n\r\n"):
            reply += raw.recv(1)
        assert reply.startswith(b"HTTP/1.1 200"), reply
        context = ssl.create_default_context(cafile=str(proxy.ca_cert))
        context.set_alpn_protocols(["h2"])
        self.sock = context.wrap_socket(raw, server_hostname=origin.host)
        assert self.sock.selected_alpn_protocol() == "h2"
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.h2.initiate_connection()
        self.sock.sendall(self.h2.data_to_send())

    def post(self, body: bytes, user_agent: str, gap: float | None) -> int:
        """Sends a POST (the body `gap` seconds after the head, or with it); its status."""
        stream = self.h2.get_next_available_stream_id()
        headers = [
            (":method", "POST"),
            (":scheme", "https"),
            (":authority", self.authority),
            (":path", "/form"),
            ("user-agent", user_agent),
            ("content-length", str(len(body))),
        ]
        self.h2.send_headers(stream, headers)
        if gap is not None:
            self.sock.sendall(self.h2.data_to_send())
            time.sleep(gap)
        self.h2.send_data(stream, body, end_stream=True)
        self.sock.sendall(self.h2.data_to_send())
        status = 0
        while True:
            data = self.sock.recv(65536)
            assert data, "proxy closed the connection"
            for event in self.h2.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived) and event.stream_id == stream:
                    status = int(dict(event.headers)[b":status"])
                if isinstance(event, h2.events.StreamEnded) and event.stream_id == stream:
                    return status
                assert not isinstance(event, h2.events.StreamReset), event
            self.sock.sendall(self.h2.data_to_send())

    def close(self) -> None:
        self.sock.close()


def test_http2_post_whose_data_frame_comes_later_is_counted(
    start_reshape: StartProxy, origins: tuple[Origin, Origin]
) -> None:
    _, secure = origins
    proxy = start_reshape()
    client = Http2Client(proxy, secure)
    try:
        assert client.post(BODY, CHROME, gap=GAP) == 405
        assert proxy.metric(METRIC, client_family="chromium") == 1
        assert client.post(BODY, CHROME, gap=None) == 405
        assert client.post(BODY, CURL, gap=None) == 405
        assert proxy.metric(METRIC, client_family="chromium") == 1
        assert client.post(BODY, CURL, gap=GAP) == 405
    finally:
        client.close()
    assert proxy.metric(METRIC, client_family="curl") == 1
    assert proxy.metric(METRIC) == 2


def test_every_family_is_exported_before_any_traffic(start_reshape: StartProxy) -> None:
    exported = start_reshape().metrics()
    for family in ("chromium", "firefox", "safari", "curl", "other"):
        assert f'{METRIC}{{client_family="{family}"}} 0.0' in exported
