"""Bad input from HTTP/1 clients, through `reshape run`: each case gets a clean answer or close,
is counted in reshape_client_errors_total{kind}, never reaches the origin, and a well-behaved
client on its own connection gets its 200s all along. Both paths: mitmproxy's own origin
connections (policy {}) and the shared pool (upstream: {})."""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
from pathlib import Path

import pytest

from labkit.origins import nginx_origin
from labkit.pki import OriginPKI
from tests.support.clients import WellBehavedClient, exchange, read_response, status_of
from tests.support.faulty_origins import FaultyOrigin
from tests.support.reshape_process import StartProxy

HEADER_TIMEOUT = 1.0
MAX_HEAD = 64 * 1024

POLICIES = {
    "direct": "version: 1\ndefault: p\npolicies:\n  p: {}\n",
    "pooled": "version: 1\ndefault: p\npolicies:\n  p:\n    upstream: {}\n",
}


def cases(origin: str) -> list[tuple[str, bytes, int | None, str]]:
    """(name, bytes sent, status expected or None for a close without answer, kind)."""

    def request(name: str, head: str, body: bytes = b"", method: str = "GET") -> bytes:
        line = f"{method} http://{origin}/bad/{name} HTTP/1.1\r\nHost: {origin}\r\n"
        return (line + head + "\r\n").encode() + body

    return [
        ("request_line", b"GARBAGE\r\n\r\n", 400, "malformed"),
        ("version", f"GET http://{origin}/bad/version HTTP/9\r\n\r\n".encode(), 400, "malformed"),
        ("no_colon", request("no_colon", "NoColonHere\r\n"), 400, "malformed"),
        ("header_name", request("header_name", "Bad Header: 1\r\n"), 400, "malformed"),
        ("nul_in_value", request("nul_in_value", "X-A: a\x00b\r\n"), 400, "malformed"),
        ("cr_in_value", request("cr_in_value", "X-A: a\rb\r\n"), 400, "malformed"),
        (
            "cl_and_te",
            request(
                "cl_and_te",
                "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n",
                b"0\r\n\r\nGET http://" + origin.encode() + b"/bad/smuggled HTTP/1.1\r\n\r\n",
                "POST",
            ),
            400,
            "smuggling",
        ),
        (
            "two_lengths",
            request("two_lengths", "Content-Length: 4\r\nContent-Length: 5\r\n", b"abcde", "POST"),
            400,
            "smuggling",
        ),
        (
            "length_list",
            request("length_list", "Content-Length: 4, 5\r\n", b"abcde", "POST"),
            400,
            "smuggling",
        ),
        (
            "te_not_chunked",
            request("te_not_chunked", "Transfer-Encoding: xchunked\r\n", b"", "POST"),
            400,
            "smuggling",
        ),
        (
            "bad_chunk_size",
            request(
                "bad_chunk_size",
                "Transfer-Encoding: chunked\r\n",
                b"zz\r\nabc\r\n0\r\n\r\n",
                "POST",
            ),
            None,
            "bad_chunked",
        ),
        (
            "chunk_too_short",
            request(
                "chunk_too_short",
                "Transfer-Encoding: chunked\r\n",
                b"3\r\nabcdef\r\n0\r\n\r\n",
                "POST",
            ),
            None,
            "bad_chunked",
        ),
        (
            "head_too_large",
            request("head_too_large", "X-Big: " + "a" * (MAX_HEAD + 10) + "\r\n"),
            431,
            "header_too_large",
        ),
        (
            "head_without_end",
            f"GET http://{origin}/bad/head_without_end HTTP/1.1\r\n".encode()
            + b"X-Many: "
            + b"b" * 1000
            + b"\r\n",
            431,  # sent in pieces: see _trickle
            "header_too_large",
        ),
    ]


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_bad_requests_are_refused_counted_and_never_forwarded(
    start_reshape: StartProxy, tmp_path: Path, policy: str
) -> None:
    policy_path = tmp_path / "policy.yaml"
    policy_path.write_text(POLICIES[policy])
    with FaultyOrigin("127.0.0.61") as origin:
        proxy = start_reshape("--client-header-timeout", str(HEADER_TIMEOUT), policy=policy_path)
        host, port = proxy.listen.split(":")
        address = f"{origin.host}:{origin.port}"
        expected: dict[str, int] = {}
        with WellBehavedClient(proxy.listen, origin.url("/echo/good")) as good:
            for name, data, status, kind in cases(address):
                if name == "head_without_end":
                    answer = _trickle(host, int(port), data)
                else:
                    answer = exchange(host, int(port), data)
                assert not answer.endswith(b"<timeout>"), (name, answer[:200])
                assert status_of(answer) == status, (name, answer[:300])
                if status is not None:
                    assert b"Connection: close" in answer, name
                    assert b"Traceback" not in answer, name
                expected[kind] = expected.get(kind, 0) + 1

            # Slow heads: complete too late, or never.
            started = time.monotonic()
            slow = exchange(host, int(port), f"GET {origin.url('/bad/slow')} HTTP/1.1\r\n".encode())
            assert status_of(slow) == 408, slow[:300]
            assert HEADER_TIMEOUT <= time.monotonic() - started < HEADER_TIMEOUT + 5
            expected["header_timeout"] = 1

            # A body shorter than announced, then the client leaves.
            with socket.create_connection((host, int(port)), timeout=10) as sock:
                sock.sendall(
                    f"POST {origin.url('/bad/short_body')} HTTP/1.1\r\nHost: {address}\r\n"
                    "Content-Length: 10\r\n\r\nabc".encode()
                )
                sock.shutdown(socket.SHUT_WR)
                assert sock.recv(4096) == b""
            expected["incomplete_body"] = 1
            time.sleep(0.5)  # the well-behaved client goes on after the last bad one
        good.assert_served()

    forwarded = [path for _, path in origin.seen if path.startswith("/bad/")]
    assert forwarded == [], forwarded
    # The error hook of the last flows may still be running.
    assert proxy.settled_metrics("reshape_client_errors_total", "kind", expected) == expected
    # Refused bad requests are the client's fault, not the origin's: request outcomes agree.
    assert proxy.metric("reshape_requests_total", outcome="upstream_error") == 0
    assert proxy.metric("reshape_requests_total", outcome="client_error") >= expected["smuggling"]
    assert "Traceback" not in proxy.log()
    assert "mitmproxy has crashed" not in proxy.log()


def _trickle(host: str, port: int, first: bytes) -> bytes:
    """A head that never ends: header lines sent one at a time until the proxy answers."""
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(first)
        with contextlib.suppress(OSError):
            for _ in range(200):  # 200 KB at most, well past the 64 KB limit
                sock.sendall(b"X-More: " + b"c" * 1000 + b"\r\n")
        received = b""
        try:
            while piece := sock.recv(65536):
                received += piece
        except ConnectionResetError:
            pass
        return received


@pytest.mark.slow
def test_header_timeout_inside_a_tls_tunnel(
    start_reshape: StartProxy, tmp_path: Path, origin_pki: OriginPKI
) -> None:
    """Inside CONNECT + TLS: a slow head gets 408; a keep-alive connection idle past the timeout
    (its first head's timer fires after that head completed) goes on serving."""
    root = tmp_path / "www"
    root.mkdir()
    (root / "page.txt").write_bytes(b"page")
    with nginx_origin(root, "127.0.0.72", tls=origin_pki.issue(["127.0.0.72"])) as origin:
        proxy = start_reshape("--client-header-timeout", str(HEADER_TIMEOUT))
        host, port = proxy.listen.split(":")
        context = ssl.create_default_context(cafile=str(proxy.ca_cert))
        context.set_alpn_protocols(["http/1.1"])
        target = f"{origin.host}:{origin.port}"
        head = f"GET /page.txt HTTP/1.1\r\nHost: {target}\r\n\r\n".encode()

        def tunnel() -> ssl.SSLSocket:
            raw = socket.create_connection((host, int(port)), timeout=10)
            raw.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
            assert raw.recv(4096).startswith(b"HTTP/1.1 200")
            return context.wrap_socket(raw, server_hostname=origin.host)

        with tunnel() as idle:
            idle.sendall(head)
            assert status_of(read_response(idle)) == 200
            time.sleep(HEADER_TIMEOUT * 2)
            idle.sendall(head)
            assert status_of(read_response(idle)) == 200
        with tunnel() as slow:
            slow.sendall(head[:20])
            answer = read_response(slow)
            assert status_of(answer) == 408, answer
    assert proxy.metric("reshape_client_errors_total", kind="header_timeout") == 1
    assert "mitmproxy has crashed" not in proxy.log()
