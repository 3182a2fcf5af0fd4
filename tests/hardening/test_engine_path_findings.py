"""Issue 15's findings on the path every request now takes (the engine, joined in process), for
each kind of policy: plain (`{}`: the pool with a browser's limits), pooled (explicit
`upstream:`), and unshared (`share: false`: connections per client connection).

1. An HTTP/2 request body without a length reaches an HTTP/1.1 origin whole, framed.
2. A request hidden in such a body stays a body (no request smuggling).
3. Data an HTTP/1.1 origin sends while no request is outstanding closes that connection, is
   counted, and reaches nobody.
6. An absolute-form request inside a tunnel reaches the origin with the target's authority; no
   internal address of reshape's appears anywhere on the wire.
7. An invalid response is an answer: the client gets 502, and the request is not sent again.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from pathlib import Path

import httpx
import pytest

from labkit.pki import OriginPKI
from tests.support.reshape_process import RunningProxy, StartProxy
from tests.support.scripted_origins import ScriptedOrigin

POLICIES = {
    "plain": "version: 1\ndefault: p\npolicies:\n  p: {}\n",
    "pooled": "version: 1\ndefault: p\npolicies:\n  p: {upstream: {max_connections_per_host: 2}}\n",
    "unshared": "version: 1\ndefault: p\npolicies:\n  p: {upstream: {share: false}}\n",
}


class RecordingOrigin(ScriptedOrigin):
    """HTTP/1.1 (in clear, or over TLS): keeps every request it parses, raw, and answers each
    with its body's length — or, for `/garbage`, with bytes that are no HTTP response, and for
    `/stray`, with a response followed 150 ms later by one nobody asked for."""

    def __init__(self, host: str, tls=None) -> None:  # type: ignore[no-untyped-def]
        super().__init__(host, tls)
        self.requests: list[tuple[bytes, bytes]] = []  # (head, body)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            fields = {
                name.strip().lower(): value.strip()
                for name, _, value in (line.partition(b":") for line in lines[1:] if line)
            }
            body = b""
            if b"content-length" in fields:
                body = await reader.readexactly(int(fields[b"content-length"]))
            elif fields.get(b"transfer-encoding", b"").lower() == b"chunked":
                while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
                    body += (await reader.readexactly(size + 2))[:-2]
                while await reader.readuntil(b"\r\n") != b"\r\n":
                    pass  # trailer fields, up to the blank line that ends the message
            self.requests.append((head, body))
            target = lines[0].split(b" ")[1]
            if target.endswith(b"/garbage"):
                writer.write(b"HTTP/1.1 2OO OK\r\nthis is no response\r\n\r\n")
                await writer.drain()
                return
            answer = str(len(body)).encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(answer), answer))
            await writer.drain()
            if target.endswith(b"/stray"):
                await asyncio.sleep(0.15)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nSTRAY")
                await writer.drain()

    def targets(self) -> list[bytes]:
        return [head.split(b" ")[1] for head, _ in self.requests]


def proxy_with(start_reshape: StartProxy, tmp_path: Path, policy: str) -> RunningProxy:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICIES[policy])
    return start_reshape(policy=path)


def body_without_length(data: bytes):  # type: ignore[no-untyped-def]
    """A request body httpx sends without a length (HTTP/2: DATA frames, no content-length)."""

    def pieces():  # type: ignore[no-untyped-def]
        yield data[: len(data) // 2]
        yield data[len(data) // 2 :]

    return pieces()


@pytest.mark.parametrize("policy", POLICIES)
def test_an_h2_body_without_length_arrives_whole_and_nothing_is_smuggled(
    start_reshape: StartProxy, tmp_path: Path, origin_pki: OriginPKI, policy: str
) -> None:
    proxy = proxy_with(start_reshape, tmp_path, policy)
    smuggled = b"GET /p/SMUGGLED HTTP/1.1\r\nHost: victim\r\n\r\n"
    tls = origin_pki.issue(["127.0.0.121"])
    with RecordingOrigin("127.0.0.121", tls=tls) as origin:
        trust = ssl.create_default_context(cafile=str(proxy.ca_cert))
        with httpx.Client(http2=True, proxy=proxy.proxy_url, verify=trust, timeout=20) as http:
            plain = http.post(origin.url("/upload"), content=body_without_length(b"x" * 5000))
            hidden = http.post(origin.url("/upload"), content=body_without_length(smuggled))
        assert plain.http_version == "HTTP/2"
        assert (plain.status_code, plain.text) == (200, "5000")
        assert (hidden.status_code, hidden.text) == (200, str(len(smuggled)))
    assert [body for _, body in origin.requests] == [b"x" * 5000, smuggled]
    assert origin.targets() == [b"/upload", b"/upload"]  # two requests: nothing smuggled


@pytest.mark.parametrize("policy", POLICIES)
def test_an_invalid_response_is_a_502_and_the_request_is_not_sent_again(
    start_reshape: StartProxy, tmp_path: Path, policy: str
) -> None:
    proxy = proxy_with(start_reshape, tmp_path, policy)
    with RecordingOrigin("127.0.0.122") as origin:
        with httpx.Client(proxy=proxy.proxy_url, timeout=20) as http:
            response = http.get(origin.url("/garbage"))
        assert response.status_code == 502, response.text
        time.sleep(0.3)
    assert origin.targets() == [b"/garbage"]


@pytest.mark.parametrize("policy", POLICIES)
def test_an_unsolicited_response_reaches_nobody_and_closes_its_connection(
    start_reshape: StartProxy, tmp_path: Path, policy: str
) -> None:
    proxy = proxy_with(start_reshape, tmp_path, policy)
    with (
        RecordingOrigin("127.0.0.123") as origin,
        httpx.Client(proxy=proxy.proxy_url, timeout=20) as http,
    ):
        for n in range(4):
            assert http.get(origin.url(f"/{n}/stray")).text == "0"
            time.sleep(0.4)  # the stray answer comes while the connection is idle
            answer = http.get(origin.url(f"/{n}/after"))
            assert (answer.status_code, answer.text) == (200, "0")
    assert proxy.metric("reshape_upstream_out_of_turn_total") == 4
    # Every request reached the origin once: none was lost to the stray answers.
    assert sorted(origin.targets()) == sorted(
        [f"/{n}/stray".encode() for n in range(4)] + [f"/{n}/after".encode() for n in range(4)]
    )


@pytest.mark.parametrize("policy", POLICIES)
def test_an_absolute_form_request_in_a_tunnel_reaches_the_origin_with_its_authority(
    start_reshape: StartProxy, tmp_path: Path, origin_pki: OriginPKI, policy: str
) -> None:
    import socket

    proxy = proxy_with(start_reshape, tmp_path, policy)
    tls = origin_pki.issue(["127.0.0.124"])
    with RecordingOrigin("127.0.0.124", tls=tls) as origin:
        authority = f"127.0.0.124:{origin.port}"
        host, port = proxy.listen.split(":")
        with socket.create_connection((host, int(port)), timeout=10) as raw:
            raw.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
            assert b" 200 " in raw.recv(4096)
            context = ssl.create_default_context(cafile=str(proxy.ca_cert))
            with context.wrap_socket(raw, server_hostname="127.0.0.124") as tunnel:
                tunnel.sendall(
                    f"GET https://{authority}/absolute HTTP/1.1\r\nHost: {authority}\r\n"
                    "Connection: close\r\n\r\n".encode()
                )
                answer = b""
                while chunk := tunnel.recv(65536):
                    answer += chunk
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    [(head, _)] = origin.requests
    request_line, *field_lines = head.decode().split("\r\n")
    assert request_line == "GET /absolute HTTP/1.1"
    hosts = [
        line.split(":", 1)[1].strip() for line in field_lines if line.lower().startswith("host:")
    ]
    assert hosts == [authority]
    assert f":{port}" not in head.decode()  # nothing of the proxy's own addresses
