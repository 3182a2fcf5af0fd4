"""mitmproxy's own origin connections time out (the OriginConnectTimeout and OriginFirstByteTimeout
patches): a connect that hangs gets 502, an origin that never sends a response head gets 504.

A mitmproxy master in this process, with only the patches and short timeouts, behind real
loopback sockets: plain HTTP/1.1 clients, an HTTP/2 client in a CONNECT tunnel, and a CONNECT that
cannot connect. The timer's life, sans-IO:
tests/unit/mitm/patches/test_origin_first_byte_timeout.py. Through `reshape run`, with the pool's
default timeouts:
tests/hardening/test_failing_origins.py::test_mitmproxys_own_connections_time_out."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import h2.config
import h2.connection
import h2.errors
import h2.events
import httpx
import pytest
from mitmproxy import options
from mitmproxy.master import Master
from mitmproxy.utils import asyncio_utils

from labkit.pki import OriginPKI
from reshape.mitm.addons import proxy_addons
from reshape.mitm.patches import Patches
from reshape.mitm.patches.origin_connect_timeout import OriginConnectTimeout
from reshape.mitm.patches.origin_first_byte_timeout import OriginFirstByteTimeout
from tests.support.faulty_origins import Backlog, FaultyOrigin
from tests.support.scripted_origins import ScriptedOrigin
from tests.unit.mitm.patches.test_origin_first_byte_timeout import (
    CONNECT_TIMEOUT,
    READ_TIMEOUT,
    H2Peer,
    Timeouts,
)


@pytest.fixture
def timeouts() -> Iterator[Timeouts]:
    """The patches installed with short timeouts; mitmproxy's own behaviour again afterwards."""
    patches = (OriginConnectTimeout(CONNECT_TIMEOUT), OriginFirstByteTimeout(READ_TIMEOUT))
    with Patches(patches):
        yield patches


# --- a mitmproxy master in this process, real sockets ----------------------------------------


class SilentOrigin(ScriptedOrigin):
    """Reads requests and never answers. HTTP/1.1 in clear: `closed` is set once mitmproxy
    closes the connection. HTTP/2 over TLS: `resets` collects the RST_STREAM codes it gets."""

    def __init__(self, host: str, pki: OriginPKI | None = None) -> None:
        super().__init__(host, pki.issue([host]) if pki else None, alpn=("h2",))
        self.requests = 0
        self.closed = threading.Event()
        self.resets: list[int] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.tls is None:
            await reader.readuntil(b"\r\n\r\n")
            self.requests += 1
            while await reader.read(65536):
                pass
            self.closed.set()
            return
        peer = H2Peer(client_side=False)
        writer.write(peer.conn.data_to_send())
        while data := await reader.read(65536):
            for event in peer.read(data):
                if isinstance(event, h2.events.RequestReceived):
                    self.requests += 1
                elif isinstance(event, h2.events.StreamReset):
                    self.resets.append(event.error_code)
            writer.write(peer.conn.data_to_send())


@contextlib.asynccontextmanager
async def mitmproxy_with_timeouts(confdir: Path, origin_ca: Path) -> AsyncIterator[str]:
    """mitmproxy with reshape's choice of its addons, listening on loopback: its proxy URL."""
    master = Master(options.Options(), with_termlog=False)
    master.addons.add(*proxy_addons())
    master.options.update(
        listen_host="127.0.0.1",
        listen_port=0,
        confdir=str(confdir),
        ssl_verify_upstream_trusted_ca=str(origin_ca),
    )
    proxyserver = master.addons.get("proxyserver")
    with (
        asyncio_utils.install_exception_handler(master._asyncio_exception_handler),
        asyncio_utils.set_eager_task_factory(),
    ):
        assert await proxyserver.setup_servers()
        await master.running()
        host, port = proxyserver.listen_addrs()[0][:2]
        try:
            yield f"http://{host}:{port}"
        finally:
            for instance in list(proxyserver.servers):
                await instance.stop()
            await master.done()


@pytest.fixture
async def proxy_url(
    timeouts: Timeouts, tmp_path: Path, origin_pki: OriginPKI
) -> AsyncIterator[str]:
    async with mitmproxy_with_timeouts(tmp_path / "confdir", origin_pki.ca_cert_path) as url:
        yield url


async def test_a_connect_that_hangs_gets_502(proxy_url: str) -> None:
    with Backlog("127.0.0.85") as backlog:
        async with httpx.AsyncClient(proxy=proxy_url, timeout=10) as http:
            response = await http.get(f"http://{backlog.host}:{backlog.port}/")
    assert response.status_code == 502, response.text
    expected = f"no connection to {backlog.host}:{backlog.port} within 0.5 s (connect timeout)"
    assert expected in response.text


async def test_a_connect_request_that_cannot_connect_gets_502(proxy_url: str) -> None:
    host, port = proxy_url.removeprefix("http://").split(":")
    with Backlog("127.0.0.85") as backlog:
        reader, writer = await asyncio.open_connection(host, int(port))
        target = f"{backlog.host}:{backlog.port}".encode()
        writer.write(b"CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target))
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        body = await asyncio.wait_for(reader.read(65536), 10)
        writer.close()
    assert head.startswith(b"HTTP/1.1 502 "), head
    assert b"(connect timeout)" in body


async def test_a_silent_origin_gets_504_and_its_connection_closed(proxy_url: str) -> None:
    with SilentOrigin("127.0.0.86") as origin, FaultyOrigin("127.0.0.87") as echo:
        async with httpx.AsyncClient(proxy=proxy_url, timeout=10) as http:
            response = await http.get(origin.url("/silent"))
            after = await http.get(echo.url("/echo/after"))  # the same client connection
        assert await asyncio.to_thread(origin.closed.wait, 10)
    assert response.status_code == 504, response.text
    assert f"127.0.0.86:{origin.port} sent no response within 1 s (read timeout)" in response.text
    assert origin.requests == 1
    assert (after.status_code, after.text) == (200, "after")


async def test_an_http2_client_in_a_tunnel_gets_504_and_the_origin_a_reset(
    proxy_url: str, tmp_path: Path, origin_pki: OriginPKI
) -> None:
    trust = ssl.create_default_context(cafile=str(tmp_path / "confdir" / "mitmproxy-ca-cert.pem"))
    with SilentOrigin("127.0.0.88", origin_pki) as origin:
        async with httpx.AsyncClient(proxy=proxy_url, verify=trust, http2=True, timeout=10) as http:
            response = await http.get(origin.url("/silent"))
        deadline = time.monotonic() + 10
        while not origin.resets and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    assert response.http_version == "HTTP/2"
    assert response.status_code == 504, response.text
    assert "sent no response within 1 s (read timeout)" in response.text
    assert origin.requests == 1
    assert origin.resets == [h2.errors.ErrorCodes.CANCEL]
