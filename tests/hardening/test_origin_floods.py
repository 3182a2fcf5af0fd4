"""An HTTP/2 origin that floods the proxy's connection to it (the limits of
reshape/upstream/http2.py): PING frames, up to 17 MB of them, while it reads nothing of what the
proxy answers. The proxy cuts the connection off once it owes more acknowledgements than the
limit (GOAWAY ENHANCE_YOUR_CALM), answers the request 502, and goes on serving; without
the limit it would acknowledge every PING into its own memory, and the request would wait for its
first-byte timeout. The codec's limits, sans-IO: tests/unit/upstream/test_http2.py."""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
import struct
from pathlib import Path

import httpx

from labkit.pki import IssuedCert, OriginPKI
from tests.support.reshape_process import StartProxy
from tests.support.scripted_origins import ScriptedOrigin, h2_server

PING = struct.pack(">I B I", 8 << 8 | 6, 0, 0) + b"12345678"
# What the origin sends at most on one connection (17 MB): far more than the loopback's socket
# buffers hold (a few MB), so what ends the flood is the proxy's limit.
FLOOD_FRAMES = 1_000_000


class PingFloodOrigin(ScriptedOrigin):
    """HTTP/2 over TLS: takes the proxy's first bytes, then writes PING frames (up to
    FLOOD_FRAMES) and never reads again. Counts its connections."""

    def __init__(self, host: str, tls: IssuedCert) -> None:
        super().__init__(host, tls, alpn=("h2",))
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        connection = h2_server(writer)
        connection.receive_data(await reader.read(65536))
        writer.write(connection.data_to_send())
        # Reading nothing from now on: a small receive buffer fills sooner.
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        batch = PING * 1000
        # Once the proxy has closed, asyncio may go on taking writes for a while (it drops them):
        # how much got out says nothing, hence the test's checks on the proxy's side.
        for _ in range(FLOOD_FRAMES // 1000):
            if writer.is_closing():
                break
            writer.write(batch)
            await writer.drain()


def test_an_origin_flooding_pings_it_does_not_read_is_cut_off(
    start_reshape: StartProxy, tmp_path: Path, origin_pki: OriginPKI
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\ndefault: p\npolicies:\n  p: {}\n")
    proxy = start_reshape(policy=policy)
    with PingFloodOrigin("127.0.0.131", tls=origin_pki.issue(["127.0.0.131"])) as origin:
        trust = ssl.create_default_context(cafile=str(proxy.ca_cert))
        with httpx.Client(proxy=proxy.proxy_url, verify=trust, timeout=90) as http:
            response = http.get(origin.url("/flooded"))
    # Without the limit the proxy acknowledges every PING and the request waits for its
    # first-byte timeout (60 s): a 504.
    assert response.status_code == 502, response.text
    # The answer says why: the pool gave up, and what became of the last attempt.
    assert re.search(r"retries exhausted after \d+ attempts \(the last attempt: ", response.text), (
        response.text
    )
    assert proxy.healthy()
    # Each connection was cut off for the flood: the GET went again on a new connection (the
    # pool's rule for an unanswered idempotent request), cut off alike, and the pool gave up.
    flood = "PING, SETTINGS or RST_STREAM frames to answer while the origin reads nothing"
    assert proxy.log().count(flood) == origin.connections >= 1
