"""Trailers through `reshape run`, with real clients and an origin that sends them.

Every client gets the form its policy and protocol call for, the body intact and the connection
alive: curl over HTTP/1.1 with and without `TE: trailers` (`--raw` keeps the trailer section), an
HTTP/2 client that reads the trailing HEADERS frame itself, and headless Chromium. Both paths:
mitmproxy's own connections (a policy without `upstream:`) and the shared pool (`upstream: {}`);
origins over HTTP and HTTPS, HTTP/1.1 and HTTP/2.
"""

from __future__ import annotations

import hashlib
import socket
import ssl
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import pytest

from labkit.browser import load_page
from labkit.pki import OriginPKI
from tests.support.memory import RssPeak
from tests.support.reshape_process import RunningProxy, StartProxy
from tests.support.trailer_origin import COOKIE, TrailerOrigin, body_sha256

HOST = "127.0.0.7"
SIZE = 300_000  # above Telemetry's 64 KB: the body streams through the proxy
ORIGIN_FIELDS = {"server-timing": "origin;dur=7"}
PATHS = {"plain": "", "pool": "upstream: {}"}


def write_policy(tmp_path: Path, knobs: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(f"version: 1\ndefault: p\npolicies:\n  p: {{{knobs}}}\n")
    return path


@dataclass
class Origins:
    plain: TrailerOrigin  # http://, HTTP/1.1
    https_h1: TrailerOrigin  # https://, HTTP/1.1 only
    https_h2: TrailerOrigin  # https://, h2 preferred

    @property
    def all(self) -> list[TrailerOrigin]:
        return [self.plain, self.https_h1, self.https_h2]


@pytest.fixture
def origins(origin_pki: OriginPKI) -> Iterator[Origins]:
    tls = origin_pki.issue([HOST])
    with ExitStack() as stack:
        yield Origins(
            stack.enter_context(TrailerOrigin(HOST)),
            stack.enter_context(TrailerOrigin(HOST, tls, ("http/1.1",))),
            stack.enter_context(TrailerOrigin(HOST, tls, ("h2", "http/1.1"))),
        )


@dataclass
class Received:
    status: int
    body_sha256: str
    body_length: int
    trailers: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)


def parse_chunked(raw: bytes) -> tuple[bytes, dict[str, str]]:
    """A chunked body as `curl --raw` leaves it → (body, trailer fields)."""
    body, pos = bytearray(), 0
    while True:
        end = raw.index(b"\r\n", pos)
        size = int(raw[pos:end].split(b";")[0], 16)
        pos = end + 2
        if size == 0:
            break
        body += raw[pos : pos + size]
        assert raw[pos + size : pos + size + 2] == b"\r\n"
        pos += size + 2
    section, _, rest = raw[pos:].partition(b"\r\n\r\n")
    assert rest == b"", "bytes after the trailer section"
    trailers = {}
    for line in filter(None, section.split(b"\r\n")):
        name, _, value = line.decode().partition(":")
        trailers[name.lower()] = value.strip()
    if not section:
        assert raw[pos:] == b"\r\n"
    return bytes(body), trailers


def curl_http1(
    proxy: RunningProxy, url: str, tmp_path: Path, *, te: bool, version: str = "1.1"
) -> Received:
    head, out = tmp_path / "head.txt", tmp_path / "body.raw"
    argv = ["curl", "-sS", f"--http{version}", "--raw", "--proxy", proxy.proxy_url]
    argv += ["--cacert", str(proxy.ca_cert), "-D", str(head), "-o", str(out), "--max-time", "60"]
    if te:
        argv += ["-H", "TE: trailers"]
    result = subprocess.run([*argv, url], capture_output=True, text=True, timeout=90)
    assert result.returncode == 0, result.stderr
    # The last head in the file is the response's (a CONNECT's answer may come first).
    lines = head.read_bytes().decode().strip().split("\r\n\r\n")[-1].split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    raw = out.read_bytes()
    if "chunked" in headers.get("transfer-encoding", ""):
        body, trailers = parse_chunked(raw)
    else:
        body, trailers = raw, {}
    status = int(lines[0].split()[1])
    return Received(status, hashlib.sha256(body).hexdigest(), len(body), trailers, headers)


def h2_get(proxy: RunningProxy, origin: TrailerOrigin, path: str) -> Received:
    """GET over HTTP/2 to reshape (CONNECT, then TLS with ALPN h2), reading frames with h2: the
    trailers must come as a HEADERS frame after the body, ending the stream."""
    host, port = proxy.listen.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as raw:
        target = f"{origin.host}:{origin.port}"
        raw.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        answer = b""
        while b"\r\n\r\n" not in answer:
            data = raw.recv(4096)
            assert data, "proxy closed during CONNECT"
            answer += data
        assert answer.startswith(b"HTTP/1.1 200"), answer
        context = ssl.create_default_context(cafile=str(proxy.ca_cert))
        context.set_alpn_protocols(["h2"])
        with context.wrap_socket(raw, server_hostname=origin.host) as tls:
            assert tls.selected_alpn_protocol() == "h2"
            connection = h2.connection.H2Connection(
                h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
            )
            connection.initiate_connection()
            connection.send_headers(
                1,
                [(":method", "GET"), (":scheme", "https"), (":authority", target), (":path", path)],
                end_stream=True,
            )
            tls.sendall(connection.data_to_send())
            digest, length, status = hashlib.sha256(), 0, 0
            headers: dict[str, str] = {}
            trailers: dict[str, str] = {}
            while True:
                data = tls.recv(65536)
                assert data, "connection closed before the stream ended"
                ended = False
                for event in connection.receive_data(data):
                    if isinstance(event, h2.events.ResponseReceived):
                        headers = {str(n): str(v) for n, v in event.headers}
                        status = int(headers[":status"])
                    elif isinstance(event, h2.events.DataReceived):
                        assert not trailers, "data after the trailers"
                        digest.update(event.data)
                        length += len(event.data)
                        connection.acknowledge_received_data(
                            event.flow_controlled_length, event.stream_id
                        )
                    elif isinstance(event, h2.events.TrailersReceived):
                        assert event.stream_ended is not None, "trailers must end the stream"
                        trailers = {str(n): str(v) for n, v in event.headers}
                    elif isinstance(event, h2.events.StreamEnded):
                        ended = True
                    elif isinstance(event, h2.events.StreamReset):
                        pytest.fail(f"stream reset: {event.error_code}")
                tls.sendall(connection.data_to_send())
                if ended:
                    return Received(status, digest.hexdigest(), length, trailers, headers)


def assert_no_crash(proxy: RunningProxy) -> None:
    log = proxy.log()
    assert "Traceback" not in log and "has crashed" not in log, log[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("path", PATHS)
def test_curl_http11_gets_trailers_only_with_te_trailers(
    path: str, origins: Origins, start_reshape: StartProxy, tmp_path: Path
) -> None:
    proxy = start_reshape(policy=write_policy(tmp_path, PATHS[path]))
    for origin in origins.all:
        url = origin.url(f"/trailers?size={SIZE}")
        with_te = curl_http1(proxy, url, tmp_path, te=True)
        assert (with_te.status, with_te.body_sha256) == (200, body_sha256(SIZE)), origin.url("")
        assert with_te.trailers == {**ORIGIN_FIELDS, "x-checksum": body_sha256(SIZE)}, url
        without = curl_http1(proxy, url, tmp_path, te=False)
        assert (without.status, without.body_sha256) == (200, body_sha256(SIZE))
        assert without.trailers == {}, url
    # Each response also lost its Content-Type trailer, which is never passed on.
    assert proxy.metric("reshape_trailers_total", action="forwarded") == 3
    assert proxy.metric("reshape_trailers_total", action="stripped") == 6
    assert proxy.metric("reshape_clients_total", accepts_trailers="yes", client_family="curl") == 3
    assert proxy.metric("reshape_clients_total", accepts_trailers="no", client_family="curl") == 3
    assert proxy.metric("reshape_requests_total", outcome="ok") == 6
    assert_no_crash(proxy)


@pytest.mark.slow
@pytest.mark.parametrize("path", PATHS)
def test_http2_client_gets_trailers_as_trailing_headers(
    path: str, origins: Origins, start_reshape: StartProxy, tmp_path: Path
) -> None:
    proxy = start_reshape(policy=write_policy(tmp_path, PATHS[path]))
    # A chunked HTTP/1.1 origin, an HTTP/2 origin, and an HTTP/2 origin sending a length too.
    # mitmproxy's own connections mirror the origin's ALPN to the client, so only the pool can
    # put an HTTP/1.1-only origin behind an HTTP/2 client (curl covers that origin otherwise).
    h1_origin = [(origins.https_h1, f"/trailers?size={SIZE}")] if path == "pool" else []
    cases = [
        *h1_origin,
        (origins.https_h2, f"/trailers?size={SIZE}"),
        (origins.https_h2, f"/trailers?size={SIZE}&length=1"),
        (origins.https_h2, "/trailers?size=1000"),  # small: relayed whole, not streamed
    ]
    for origin, target in cases:
        size = int(target.split("size=")[1].split("&")[0])
        received = h2_get(proxy, origin, target)
        assert (received.status, received.body_sha256) == (200, body_sha256(size)), target
        assert received.trailers == {**ORIGIN_FIELDS, "x-checksum": body_sha256(size)}, target
    assert proxy.metric("reshape_trailers_total", action="forwarded") == len(cases)
    assert_no_crash(proxy)


@pytest.mark.slow
@pytest.mark.parametrize("path", PATHS)
def test_strip_mode_sends_no_trailers_even_to_clients_that_take_them(
    path: str, origins: Origins, start_reshape: StartProxy, tmp_path: Path
) -> None:
    knobs = ", ".join(filter(None, [PATHS[path], "trailers: {mode: strip}"]))
    proxy = start_reshape(policy=write_policy(tmp_path, knobs))
    url = origins.plain.url(f"/trailers?size={SIZE}")
    assert curl_http1(proxy, url, tmp_path, te=True).trailers == {}
    received = h2_get(proxy, origins.https_h2, f"/trailers?size={SIZE}")
    assert received.trailers == {} and received.body_sha256 == body_sha256(SIZE)
    assert proxy.metric("reshape_trailers_total", action="stripped") == 2
    assert_no_crash(proxy)


@pytest.mark.slow
@pytest.mark.parametrize("path", PATHS)
def test_a_50_mb_body_gets_its_content_digest_trailer_with_flat_memory(
    path: str, origins: Origins, start_reshape: StartProxy, tmp_path: Path
) -> None:
    import base64

    size = 50 * 1024 * 1024
    knobs = ", ".join(filter(None, [PATHS[path], "trailers: {synthesize: [content-digest]}"]))
    proxy = start_reshape(policy=write_policy(tmp_path, knobs))
    url = origins.plain.url(f"/trailers?size={size}&trailers=0")
    with RssPeak(proxy.process.pid) as rss:
        received = curl_http1(proxy, url, tmp_path, te=True)
    assert received.body_length == size
    assert received.body_sha256 == body_sha256(size)
    digest = base64.b64encode(bytes.fromhex(body_sha256(size))).decode()
    assert received.trailers == {"content-digest": f"sha-256=:{digest}:"}
    assert rss.peak - rss.before < 20 * 1024 * 1024, (rss.before, rss.peak)
    assert proxy.metric("reshape_trailers_total", action="synthesized") == 1
    assert_no_crash(proxy)


@pytest.mark.slow
@pytest.mark.parametrize("path", PATHS)
def test_an_http10_client_gets_the_body_as_sent_and_promoted_fields_in_the_head(
    path: str, origins: Origins, start_reshape: StartProxy, tmp_path: Path
) -> None:
    """HTTP/1.0 has no chunked coding (RFC 9112 §6.1: no Transfer-Encoding in a response to
    it), so no trailer section, `TE: trailers` or not: the body comes as the origin sent it,
    ended by the connection's close, and under `promote` the allowed fields come in its head.
    Before, the pool's responses came chunked, the chunk sizes read as body."""
    knobs = ", ".join(filter(None, [PATHS[path], "trailers: {mode: promote}"]))
    proxy = start_reshape(policy=write_policy(tmp_path, knobs))
    cases = [
        (origins.plain, ""),
        (origins.https_h1, ""),
        (origins.https_h2, ""),
        (origins.https_h2, "&length=1"),  # a length, and the trailers announced
    ]
    for origin, extra in cases:
        url = origin.url(f"/trailers?size={SIZE}{extra}")
        received = curl_http1(proxy, url, tmp_path, te=True, version="1.0")
        assert "transfer-encoding" not in received.headers, url
        assert (received.status, received.body_sha256) == (200, body_sha256(SIZE)), url
        assert received.headers.get("server-timing") == ORIGIN_FIELDS["server-timing"], url
    assert proxy.metric("reshape_trailers_total", action="promoted") == len(cases)
    assert_no_crash(proxy)


@pytest.mark.browser
@pytest.mark.parametrize(
    ("path", "mode", "origin_kind", "cookie_back"),
    [
        ("plain", "promote", "plain", True),
        ("plain", "strip", "plain", False),
        ("pool", "promote", "plain", True),
        # Over HTTPS Chromium speaks HTTP/2 to reshape: it counts as taking trailers, gets the
        # cookie as a trailer, and ignores it.
        ("plain", "promote", "https_h2", False),
    ],
)
def test_chromium_gets_a_trailer_cookie_only_when_it_is_promoted(
    path: str,
    mode: str,
    origin_kind: str,
    cookie_back: bool,
    origins: Origins,
    start_reshape: StartProxy,
    tmp_path: Path,
) -> None:
    """The 2010 test rebuilt: a script's response sets a cookie in a trailer; does the browser
    send it back on its next request?"""
    trailers = f"trailers: {{mode: {mode}, promote_fields: [Set-Cookie]}}"
    proxy = start_reshape(
        policy=write_policy(tmp_path, ", ".join(filter(None, [PATHS[path], trailers])))
    )
    origin: TrailerOrigin = getattr(origins, origin_kind)
    page = load_page(
        origin.url("/page.html"),
        proxy=proxy.listen,
        trusted_cas=[proxy.ca_cert],
        done_global="done",
    )
    assert {resource.status for resource in page.resources} == {200}
    assert origin.cookies_on_next, "the page did not fetch /next"
    assert (COOKIE.decode() in origin.cookies_on_next[-1]) is cookie_back, origin.cookies_on_next
    action = {"promote": "promoted", "strip": "stripped"}[mode]
    if origin_kind == "https_h2":
        action = "forwarded"
    assert proxy.metric("reshape_trailers_total", action=action) >= 1
    assert_no_crash(proxy)


@pytest.mark.parametrize("path", PATHS)
def test_a_request_with_trailers_does_not_break_the_client_connection(
    path: str, origins: Origins, start_reshape: StartProxy, tmp_path: Path
) -> None:
    """mitmproxy 12.2.3 dropped the connection on a chunked request with trailers."""
    proxy = start_reshape(policy=write_policy(tmp_path, PATHS[path]))
    host, port = proxy.listen.rsplit(":", 1)
    url = origins.plain.url("/trailers?size=10&trailers=0")
    request = (
        f"POST {url} HTTP/1.1\r\nHost: {HOST}:{origins.plain.port}\r\n"
        "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-Request-Sum: 1\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=10) as client:
        for _ in range(2):  # the connection carries a second request after the first
            client.sendall(request)
            answer = b""
            while not answer.endswith(b"0\r\n\r\n"):
                data = client.recv(65536)
                assert data, f"connection closed: {answer!r}"
                answer += data
            assert answer.startswith(b"HTTP/1.1 200")
    assert proxy.metric("reshape_requests_total", outcome="ok") == 2
    assert_no_crash(proxy)
