"""An origin that authenticates connections (NTLM, Negotiate: as IIS does) through reshape's
pool: what one client's handshake authenticated serves that client alone, and every step of a
handshake reaches the connection its first step went on."""

from __future__ import annotations

import asyncio
import itertools
import socket
import threading
from pathlib import Path

import pytest

from tests.support.reshape_process import RunningProxy, StartProxy
from tests.support.scripted_origins import ScriptedOrigin

POLICIES = {
    "pooled": "{upstream: {max_connections_per_host: 6, pipeline_depth: 8, http2: true}}",
    "default": "{}",
}


class ConnectionAuthOrigin(ScriptedOrigin):
    """HTTP/1.1 keep-alive; on each connection `Authorization: NTLM 1` gets a 401 with a
    challenge, then `NTLM 3 <user>` authenticates the connection as <user>, and every later
    request on it, with or without credentials, is served as <user> (RFC 4559 §4, MS-NTHT).
    A first step on a connection never challenged is refused. `/slow` answers after 1 s."""

    def __init__(self, host: str) -> None:
        super().__init__(host)
        self._ids = itertools.count(1)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = next(self._ids)
        challenged, user = False, b""
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            target = head.split(b" ", 2)[1]
            auth = b""
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"authorization":
                    auth = value.strip()
            if target.endswith(b"/slow"):
                await asyncio.sleep(1.0)
            if auth == b"NTLM 1":
                challenged = True
                status, body = b"401 Unauthorized", b"challenge on %d" % conn
            elif auth.startswith(b"NTLM 3 ") and challenged:
                user = auth.removeprefix(b"NTLM 3 ")
                status, body = b"200 OK", b"hello " + user
            elif auth.startswith(b"NTLM 3 "):
                status, body = b"401 Unauthorized", b"answer on a connection never challenged"
            elif user:
                status, body = b"200 OK", b"data of " + user
            else:
                status, body = b"401 Unauthorized", b"who are you"
            writer.write(
                b"HTTP/1.1 %s\r\nWWW-Authenticate: NTLM\r\nContent-Length: %d\r\n\r\n%s"
                % (status, len(body), body)
            )
            await writer.drain()


class Client:
    """One client connection to the proxy, sending one request at a time (absolute form)."""

    def __init__(self, proxy: RunningProxy, origin: ConnectionAuthOrigin) -> None:
        host, port = proxy.proxy_url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.origin = origin

    def get(self, path: str, authorization: str | None = None) -> tuple[int, bytes]:
        auth = f"Authorization: {authorization}\r\n" if authorization else ""
        self.sock.sendall(
            f"GET {self.origin.url(path)} HTTP/1.1\r\n"
            f"Host: {self.origin.host}:{self.origin.port}\r\n{auth}\r\n".encode()
        )
        data = b""
        while b"\r\n\r\n" not in data:
            data += self.sock.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        while len(body) < length:
            body += self.sock.recv(65536)
        return int(head.split(b" ")[1]), body

    def close(self) -> None:
        self.sock.close()


@pytest.mark.parametrize("policy", POLICIES)
def test_a_connection_one_client_authenticated_serves_no_other(
    start_reshape: StartProxy, tmp_path: Path, policy: str
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(f"version: 1\ndefault: p\npolicies:\n  p: {POLICIES[policy]}\n")
    proxy = start_reshape(policy=path)
    with ConnectionAuthOrigin("127.0.0.124") as origin:
        alice = Client(proxy, origin)
        assert alice.get("/a0")[0] == 401  # no credentials yet: the origin asks
        assert alice.get("/a1", "NTLM 1")[0] == 401  # the challenge
        assert alice.get("/a2", "NTLM 3 alice") == (200, b"hello alice")
        assert alice.get("/a3") == (200, b"data of alice")  # the connection is alice's now
        alice.close()
        # Another client connection, with no credentials, got "data of alice" from the
        # shared pool's connection that alice's handshake had authenticated.
        bob = Client(proxy, origin)
        assert bob.get("/b1") == (401, b"who are you")
        # A handshake's second step went on whichever connection was free, while another
        # client's request held the one its first step had gone on: "never challenged".
        carol = Client(proxy, origin)
        assert carol.get("/c1", "NTLM 1")[0] == 401
        slow: dict[str, tuple[int, bytes]] = {}
        others = threading.Thread(target=lambda: slow.setdefault("bob", bob.get("/slow")))
        others.start()
        assert carol.get("/c2", "NTLM 3 carol") == (200, b"hello carol")
        others.join(10)
        assert slow["bob"] == (401, b"who are you")
        assert carol.get("/c3") == (200, b"data of carol")
        assert bob.get("/b2") == (401, b"who are you")
        bob.close()
        carol.close()
