"""TLS record sizing on the pool's own connections (`tls_records` with `side: both`): what the
origin receives, parsed off the wire between the engine and a real TLS origin."""

from __future__ import annotations

import asyncio
import contextlib
import math
import ssl
from pathlib import Path

import pytest

from labkit.pki import OriginPKI
from reshape.features.telemetry.engine_metrics import EngineMetrics
from reshape.features.tls_records.rules import SizedRecords
from reshape.policy.schema import TlsRecordKnobs
from reshape.upstream.engine import Engine, Route
from reshape.upstream.pool import PoolKey, PoolLimits
from reshape.upstream.types import UpstreamRequest
from tests.support.inprocess_engine import body

ORIGIN = "127.0.0.93"
TAP = "127.0.0.94"
APPLICATION_DATA = 23
AEAD_OVERHEAD = 17  # TLS 1.3: the inner content type byte and a 16-byte tag


def records(data: bytes) -> list[tuple[int, int]]:
    """(content type, length) of each TLS record in `data`."""
    found, offset = [], 0
    while offset + 5 <= len(data):
        length = int.from_bytes(data[offset + 3 : offset + 5], "big")
        found.append((data[offset], length))
        offset += 5 + length
    return found


async def origin_handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.lower().split(b"\r\n")
                if line.startswith(b"content-length:")
            )
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()


async def run(knobs: TlsRecordKnobs | None, tmp_path: Path, bodies: list[int]) -> list[int]:
    """Send POSTs of `bodies` bytes one after another on one pooled TLS connection; the lengths
    of the application-data records the origin received."""
    pki = OriginPKI(tmp_path / "pki")
    issued = pki.issue([ORIGIN])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(issued.cert_path, issued.key_path)
    origin = await asyncio.start_server(origin_handler, ORIGIN, 0, ssl=context)
    origin_port = origin.sockets[0].getsockname()[1]
    to_origin = bytearray()

    async def tap(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Relays to the origin, keeping what the engine sends."""
        up_reader, up_writer = await asyncio.open_connection(ORIGIN, origin_port)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, keep: bool) -> None:
            with contextlib.suppress(ConnectionError):
                while data := await src.read(65536):
                    if keep:
                        to_origin.extend(data)
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pump(reader, up_writer, True), pump(up_reader, writer, False))

    relay = await asyncio.start_server(tap, TAP, 0)
    engine = Engine(pki.ca_cert_path, EngineMetrics())
    engine.start()
    limits = PoolLimits(1, 10, 5.0, math.inf, 0, False)
    key = PoolKey("https", TAP, relay.sockets[0].getsockname()[1], ORIGIN)
    route = Route(key, limits, 5.0, 5.0, "p", "-", records=SizedRecords(knobs) if knobs else None)
    try:
        for size in bodies:
            request = UpstreamRequest(
                b"POST", b"https", ORIGIN.encode(), b"/", [], body=b"x" * size
            )
            assert await body(await engine.exchange(route, request)) == b"ok"
        await asyncio.sleep(0.1)
    finally:
        await engine.stop()
        relay.close()
        origin.close()
    # Skip the handshake's own records: TLS 1.3 encrypts them as application data too, the
    # client's Finished being the first; what follows are the requests.
    data = [length for kind, length in records(bytes(to_origin)) if kind == APPLICATION_DATA]
    return [length - AEAD_OVERHEAD for length in data[1:]]


@pytest.mark.asyncio
async def test_the_pools_connections_warm_up_with_small_records(tmp_path: Path) -> None:
    knobs = TlsRecordKnobs(small_bytes=1000, warmup_bytes=3000, side="both")
    sizes = await run(knobs, tmp_path, [10_000, 10_000])
    first, second = sizes[:4], sizes[4:]
    assert first[:3] == [1000, 1000, 1000]  # warming up
    assert sum(first) > 10_000 and len(first) == 4  # the rest in one full record
    assert len(second) == 1 and second[0] > 10_000  # warm: one record per request


@pytest.mark.asyncio
async def test_without_side_both_openssl_writes_full_records(tmp_path: Path) -> None:
    sizes = await run(None, tmp_path, [10_000])
    assert len(sizes) == 1 and sizes[0] > 10_000
