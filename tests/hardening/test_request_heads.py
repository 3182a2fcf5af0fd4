"""The Host and hop-by-hop fields a request leaves with (issue 15, finding 9; RFC 9112 §3.2,
§3.2.2, RFC 9110 §7.6.1), on both paths (policy {} and a pooled policy), seen by an origin that
records each head as it arrived:

- an absolute-form request reaches the origin with the target's authority as Host, whatever
  Host the client sent (or none);
- inside a CONNECT tunnel, an origin-form request keeps its Host; an HTTP/1.0 one without Host
  gets the tunnel's; an HTTP/1.1 one without Host is refused;
- Connection, the fields it names, Keep-Alive, Proxy-Connection, Upgrade and TE codings other
  than trailers never reach the origin;
- two Host fields, a Content-Length of 10^26, a Connection option naming Content-Length: 400
  (HTTP/1: and a close; HTTP/2: on that stream only), never forwarded, counted once each; a
  transfer coding before chunked: 501, never forwarded, not counted.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from pathlib import Path

import h2.config
import h2.connection
import h2.errors
import h2.events
import pytest
import wsproto.connection
import wsproto.events

from labkit.pki import OriginPKI
from tests.support.clients import exchange, read_response, status_of
from tests.support.faulty_origins import FaultyOrigin
from tests.support.recording_origin import RecordingOrigin
from tests.support.reshape_process import RunningProxy, StartProxy

POLICIES = {
    "direct": "version: 1\ndefault: p\npolicies:\n  p: {}\n",
    "pooled": "version: 1\ndefault: p\npolicies:\n  p:\n    upstream: {}\n",
}
HUGE = str(10**26)


def start(start_reshape: StartProxy, tmp_path: Path, policy: str) -> RunningProxy:
    policy_path = tmp_path / "policy.yaml"
    policy_path.write_text(POLICIES[policy])
    return start_reshape(policy=policy_path)


def tokens(values: list[str]) -> set[str]:
    return {t.strip().lower() for v in values for t in v.split(",") if t.strip()}


def wait_for_counts(proxy: RunningProxy, expected: dict[str, float]) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        counted = {k: proxy.metric("reshape_client_errors_total", kind=k) for k in expected}
        if counted == expected:
            return
        time.sleep(0.05)
    assert counted == expected


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_absolute_form_requests(start_reshape: StartProxy, tmp_path: Path, policy: str) -> None:
    proxy = start(start_reshape, tmp_path, policy)
    host, port = proxy.listen.split(":")
    with RecordingOrigin("127.0.0.64") as origin:
        target = f"{origin.host}:{origin.port}"

        def send(head: str, body: bytes = b"") -> bytes:
            return exchange(host, int(port), head.replace("{T}", target).encode() + body)

        for request in (
            "GET http://{T}/a HTTP/1.1\r\nHost: other.example\r\nConnection: close\r\n\r\n",
            "GET http://{T}/b HTTP/1.1\r\nConnection: close\r\n\r\n",
            "GET http://{T}/c HTTP/1.0\r\n\r\n",
            "GET http://{T}/d HTTP/1.1\r\nHost: other.example:8080\r\nConnection: close\r\n\r\n",
        ):
            seen = len(origin.heads)
            assert status_of(send(request)) == 200, request
            assert len(origin.heads) == seen + 1
            assert origin.values("host") == [target], origin.heads[-1]

        answer = send(
            "GET http://{T}/hop HTTP/1.1\r\nHost: {T}\r\n"
            "Connection: close, X-Secret, Keep-Alive\r\nX-Secret: s\r\nKeep-Alive: timeout=5\r\n"
            "Proxy-Connection: keep-alive\r\n"
            "TE: trailers, gzip\r\nUpgrade: h3\r\nX-Kept: yes\r\n\r\n"
        )
        assert status_of(answer) == 200
        names = {name for name, _ in origin.fields()}
        assert not names & {"x-secret", "keep-alive", "proxy-connection", "upgrade"}, names
        assert origin.values("x-kept") == ["yes"]
        assert tokens(origin.values("te")) <= {"trailers"}
        # None of the client's options pass; the proxy states its own (keep-alive, as browsers
        # do: reshape/upstream/h1.py).
        assert tokens(origin.values("connection")) <= {"close", "te", "keep-alive"}
        assert origin.values("host") == [target]

        before = len(origin.heads)
        refused = {
            "two_hosts": send(
                "GET http://{T}/bad HTTP/1.1\r\nHost: {T}\r\nHost: evil.example\r\n\r\n"
            ),
            "huge_length": send(
                f"POST http://{{T}}/bad HTTP/1.1\r\nHost: {{T}}\r\nContent-Length: {HUGE}\r\n\r\n",
                b"abc",
            ),
            "connection_names_length": send(
                "POST http://{T}/bad HTTP/1.1\r\nHost: {T}\r\nConnection: Content-Length\r\n"
                "Content-Length: 3\r\n\r\n",
                b"abc",
            ),
        }
        # A coding before chunked: the engine frames bodies itself and would have sent the
        # gzip bytes on as the body. Not the client's error: 501, not counted.
        coded = send(
            "POST http://{T}/bad HTTP/1.1\r\nHost: {T}\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            b"3\r\nabc\r\n0\r\n\r\n",
        )
        refused["gzip_chunked"] = coded
        for name, answer in refused.items():
            status = 501 if name == "gzip_chunked" else 400
            assert status_of(answer) == status, (name, answer[:300])
            assert answer.count(b"HTTP/1.1 ") == 1, name
            assert b"Connection: close" in answer, name
        assert b"Transfer coding gzip is not implemented." in coded
        time.sleep(0.3)
        assert len(origin.heads) == before, origin.heads[before:]
    wait_for_counts(proxy, {"malformed": 1, "smuggling": 2})
    assert "Traceback" not in proxy.log()


def tunnel(proxy: RunningProxy, target: str, alpn: str) -> ssl.SSLSocket:
    host, port = proxy.listen.split(":")
    raw = socket.create_connection((host, int(port)), timeout=10)
    raw.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    assert raw.recv(4096).startswith(b"HTTP/1.1 200")
    context = ssl.create_default_context(cafile=str(proxy.ca_cert))
    context.set_alpn_protocols([alpn])
    sock = context.wrap_socket(raw, server_hostname=target.rsplit(":", 1)[0])
    assert sock.selected_alpn_protocol() == alpn
    return sock


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_origin_form_requests_in_a_tunnel(
    start_reshape: StartProxy, tmp_path: Path, origin_pki: OriginPKI, policy: str
) -> None:
    proxy = start(start_reshape, tmp_path, policy)
    with RecordingOrigin("127.0.0.65", tls=origin_pki.issue(["127.0.0.65"])) as origin:
        target = f"{origin.host}:{origin.port}"

        def send(head: str) -> bytes:
            with tunnel(proxy, target, "http/1.1") as sock:
                sock.sendall(head.replace("{T}", target).encode())
                return read_response(sock)

        assert status_of(send("GET /a HTTP/1.1\r\nHost: {T}\r\nConnection: close\r\n\r\n")) == 200
        assert origin.values("host") == [target]
        assert status_of(send("GET /b HTTP/1.0\r\n\r\n")) == 200
        assert origin.values("host") == [target]
        before = len(origin.heads)
        for head in (
            "GET /c HTTP/1.1\r\nConnection: close\r\n\r\n",
            "GET /d HTTP/1.1\r\nHost: {T}\r\nHost: {T}\r\n\r\n",
            "GET /e HTTP/1.1\r\nHost: a b\r\n\r\n",
        ):
            answer = send(head)
            assert status_of(answer) == 400, (head, answer[:300])
        time.sleep(0.3)
        assert len(origin.heads) == before, origin.heads[before:]
    wait_for_counts(proxy, {"malformed": 3, "smuggling": 0})


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_malformed_http2_requests_get_400_on_their_stream_only(
    start_reshape: StartProxy, tmp_path: Path, origin_pki: OriginPKI, policy: str
) -> None:
    proxy = start(start_reshape, tmp_path, policy)
    # An HTTP/2 origin: mitmproxy's own connections (eager) mirror its ALPN to the client.
    with FaultyOrigin("127.0.0.66", tls=origin_pki.issue(["127.0.0.66"])) as origin:
        target = f"{origin.host}:{origin.port}"
        sock = tunnel(proxy, target, "h2")
        config = h2.config.H2Configuration(
            client_side=True, validate_outbound_headers=False, normalize_outbound_headers=False
        )
        conn = h2.connection.H2Connection(config)
        conn.initiate_connection()
        base = [(":scheme", "https"), (":authority", target)]
        two_hosts = [
            (":method", "GET"),
            *base,
            (":path", "/two"),
            ("host", target),
            ("host", target),
        ]
        huge = [(":method", "POST"), *base, (":path", "/huge"), ("content-length", HUGE)]
        good = [(":method", "GET"), *base, (":path", "/echo/good")]
        conn.send_headers(1, two_hosts, end_stream=True)
        conn.send_headers(3, huge)
        conn.send_data(3, b"abc")
        conn.send_headers(5, good, end_stream=True)
        sock.sendall(conn.data_to_send())

        statuses: dict[int, str] = {}
        resets: dict[int, int] = {}
        ended: set[int] = set()
        deadline = time.monotonic() + 10
        while len(ended | set(resets)) < 3 and time.monotonic() < deadline:
            data = sock.recv(65536)
            assert data, (statuses, resets)
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived):
                    statuses[event.stream_id] = dict(event.headers)[b":status"].decode()
                elif isinstance(event, h2.events.StreamEnded):
                    ended.add(event.stream_id)
                elif isinstance(event, h2.events.StreamReset):
                    resets[event.stream_id] = event.error_code
            sock.sendall(conn.data_to_send())
        sock.close()
    assert statuses == {1: "400", 3: "400", 5: "200"}
    assert resets.get(3) == h2.errors.ErrorCodes.PROTOCOL_ERROR
    assert origin.seen == [("GET", "/echo/good")]
    wait_for_counts(proxy, {"malformed": 1, "smuggling": 1})


class WebSocketOrigin(RecordingOrigin):
    """Answers a WebSocket upgrade with 101 when asked for one (Connection: upgrade and an
    Upgrade field) and echoes each text message; anything else gets 426."""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        self.heads.append(head[:-4])
        if "upgrade" not in tokens(self.values("connection")) or not self.values("upgrade"):
            writer.write(b"HTTP/1.1 426 Upgrade Required\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            writer.close()
            return
        writer.write(
            b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
            b"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n"
        )
        frames = wsproto.connection.Connection(wsproto.connection.ConnectionType.SERVER)
        while data := await reader.read(65536):
            frames.receive_data(data)
            for event in frames.events():
                if isinstance(event, wsproto.events.TextMessage):
                    writer.write(frames.send(wsproto.events.TextMessage(event.data)))
            await writer.drain()
        writer.close()


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_a_websocket_upgrade_is_still_relayed(
    start_reshape: StartProxy, tmp_path: Path, policy: str
) -> None:
    """Connection and Upgrade are hop-by-hop, but an upgrade the proxy relays keeps them: the
    origin is asked for it, and messages go both ways afterwards."""
    proxy = start(start_reshape, tmp_path, policy)
    host, port = proxy.listen.split(":")
    with WebSocketOrigin("127.0.0.74") as origin:
        target = f"{origin.host}:{origin.port}"
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(
                f"GET http://{target}/ws HTTP/1.1\r\nHost: {target}\r\n"
                "Connection: keep-alive, Upgrade\r\nUpgrade: websocket\r\n"
                "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                "X-Hop: 1\r\n\r\n".encode()
            )
            head = b""
            while b"\r\n\r\n" not in head:
                head += sock.recv(1)
            assert head.startswith(b"HTTP/1.1 101"), head
            frames = wsproto.connection.Connection(wsproto.connection.ConnectionType.CLIENT)
            sock.sendall(frames.send(wsproto.events.TextMessage("ping")))
            echoed: list[str] = []
            while not echoed:
                frames.receive_data(sock.recv(65536))
                echoed += [
                    e.data for e in frames.events() if isinstance(e, wsproto.events.TextMessage)
                ]
            assert echoed == ["ping"]
    assert tokens(origin.values("connection")) == {"upgrade"}
    assert origin.values("upgrade") == ["websocket"]
    assert origin.values("sec-websocket-key") == ["dGhlIHNhbXBsZSBub25jZQ=="]
