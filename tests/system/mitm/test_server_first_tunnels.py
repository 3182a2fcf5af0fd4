"""A CONNECT tunnel to a service that speaks first (reshape/mitm/patches/server_first_tunnels.py)
with real sockets: `reshape run`, an SMTP-like origin that greets, a client that waits for the
greeting as an SMTP client does. Sans-IO: tests/unit/mitm/patches/test_server_first_tunnels.py."""

from __future__ import annotations

import re
import socket

import pytest

from tests.support.reshape_process import REPO, StartProxy
from tests.support.scripted_origins import GreetingOrigin

POLICIES = ["reshape/policy/default.yaml", "policies/pooled.yaml"]


def open_tunnel(listen: str, target: str) -> tuple[socket.socket, bytes]:
    """A CONNECT to `target` through the proxy at `listen`: the socket and the answer's head."""
    host, port = listen.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            break
        head += chunk
    return sock, head


def body_of(sock: socket.socket, head: bytes) -> bytes:
    """The rest of the answer whose head (and maybe some of its body) is `head`."""
    fields, _, body = head.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?im)^content-length:\s*(\d+)", fields).group(1))  # type: ignore[union-attr]
    while len(body) < length and (chunk := sock.recv(length - len(body))):
        body += chunk
    return body


def read_line(sock: socket.socket) -> bytes:
    line = b""
    while not line.endswith(b"\n"):
        chunk = sock.recv(1)
        if not chunk:
            break
        line += chunk
    return line


def converse(sock: socket.socket) -> list[bytes]:
    """The greeting, then a command and QUIT, as an SMTP client has them."""
    said = [read_line(sock)]
    sock.sendall(b"HELO client.test\r\n")
    said.append(read_line(sock))
    sock.sendall(b"QUIT\r\n")
    said.append(read_line(sock))
    said.append(sock.recv(100))  # the origin's close
    return said


EXPECTED = [GreetingOrigin.GREETING, b"250 HELO client.test\r\n", b"221 bye\r\n", b""]


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_a_silent_client_gets_the_greeting(start_reshape: StartProxy, policy: str) -> None:
    proxy = start_reshape(policy=REPO / policy)
    with GreetingOrigin("127.0.0.141") as origin:
        sock, head = open_tunnel(proxy.listen, f"127.0.0.141:{origin.port}")
        with sock:
            assert head.startswith(b"HTTP/1.1 200")
            assert converse(sock) == EXPECTED


@pytest.mark.slow
def test_a_server_first_port_is_connected_before_the_answer(start_reshape: StartProxy) -> None:
    proxy = start_reshape(policy=REPO / "policies/pooled.yaml")
    with GreetingOrigin("127.0.0.142", port=25):
        sock, head = open_tunnel(proxy.listen, "127.0.0.142:25")
        with sock:
            assert head.startswith(b"HTTP/1.1 200")
            assert converse(sock) == EXPECTED
    # Nothing listens there now: the CONNECT itself is refused, as mitmdump refuses it.
    sock, head = open_tunnel(proxy.listen, "127.0.0.142:25")
    with sock:
        assert head.startswith(b"HTTP/1.1 502"), head
        assert b"Cannot connect to 127.0.0.142:25" in head + body_of(sock, head)
