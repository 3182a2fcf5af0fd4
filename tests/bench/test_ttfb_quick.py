from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path

import pytest

from bench.ttfb.browser import PageTiming
from bench.ttfb.link import MSS, SegmentLink, SegmentRelay
from bench.ttfb.report import HEADING, Row, table
from tests.support.quick_bench import run_quick


def _timing(first_bytes: float, fcp: float) -> PageTiming:
    return PageTiming(first_bytes, first_bytes - 10, fcp, fcp, fcp + 100)


def test_table_gives_medians_and_differences_to_16k_records_over_the_same_link() -> None:
    rows = [
        Row("segments", "reshape-dynamic", (_timing(500, 2000), _timing(520, 2100)), 0),
        Row("segments", "reshape-16k", (_timing(600, 2000), _timing(590, 2050), _timing(2, 3)), 1),
        Row("relay", "reshape-dynamic", (), 2),
    ]
    lines = table(rows).splitlines()
    assert lines[2].split(" | ")[1:8] == ["reshape-dynamic", "2/2", "510", "-80", "500", "10", "+0"]
    assert lines[3].split(" | ")[1:8] == ["reshape-16k", "3/4", "590", "-", "580", "10", "-"]
    assert lines[4].split(" | ")[1:5] == ["reshape-dynamic", "0/2", "-", "-"]


RATE = 200_000
DELAY = 0.05


async def _relay_writes(connections: int, size: int) -> list[list[tuple[float, int]]]:
    """Writes `size` bytes at once into each of `connections` connections through one segment
    relay; per connection, when (seconds after the writes) how many bytes reached the client."""
    sink = socket.create_server(("127.0.0.1", 0))
    sink.setblocking(False)
    relay = SegmentRelay(
        "127.0.0.1", sink.getsockname(), SegmentLink(down_rate=RATE, up_delay=0.0, down_delay=DELAY)
    )
    await relay.start()
    loop = asyncio.get_running_loop()
    pairs = []
    for _ in range(connections):
        reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
        server_side, _ = await loop.sock_accept(sink)
        pairs.append((reader, writer, server_side))

    async def receive(reader: asyncio.StreamReader, start: float) -> list[tuple[float, int]]:
        arrivals, received = [], 0
        while received < size:
            data = await reader.read(65536)
            received += len(data)
            arrivals.append((loop.time() - start, len(data)))
        return arrivals

    start = loop.time()
    for _, _, server_side in pairs:
        await loop.sock_sendall(server_side, b"x" * size)
    arrivals = await asyncio.gather(*(receive(reader, start) for reader, _, _ in pairs))
    for _, writer, server_side in pairs:
        writer.close()
        server_side.close()
    sink.close()
    await relay.stop()
    return list(arrivals)


def test_segment_link_delivers_a_write_piece_by_piece_at_its_rate() -> None:
    started = time.monotonic()
    [arrivals] = asyncio.run(_relay_writes(1, 20 * MSS))  # one write of 28,960 bytes
    assert time.monotonic() - started < 5
    # The first segment arrives after the delay plus its own transmission (7 ms), not after the
    # whole write's (145 ms); the last after all of it.
    first_at, first_size = arrivals[0]
    assert first_size <= 2 * MSS
    assert DELAY <= first_at < DELAY + 0.05
    assert arrivals[-1][0] >= DELAY + 20 * MSS / RATE - 0.005
    assert len(arrivals) >= 10


def test_connections_through_one_segment_link_share_its_rate_in_turns() -> None:
    one, other = asyncio.run(_relay_writes(2, 10 * MSS))
    both_sent = DELAY + 20 * MSS / RATE
    # Neither waits for the other's whole write: both begin at once and end near the end.
    assert one[0][0] < DELAY + 0.05 and other[0][0] < DELAY + 0.05
    assert one[-1][0] >= both_sent - 0.02 and other[-1][0] >= both_sent - 0.02


@pytest.mark.slow
@pytest.mark.browser
def test_quick_run_loads_the_page_through_every_configuration(tmp_path: Path) -> None:
    quick = run_quick("ttfb", tmp_path, timeout=90)
    rows = {
        tuple(cell.strip() for cell in line.strip("|").split("|")[:3])
        for line in quick.stdout.splitlines()
        if line.startswith("| ") and not line.startswith("| link")
    }
    for link in ("relay", "segments"):
        for config in ("reshape-dynamic", "reshape-16k", "mitmdump"):
            assert (link, config, "1/1") in rows, quick.stdout
    loads = json.loads(quick.figures.read_text())
    assert len(loads) == 6
    for load in loads:
        assert 0 < load["first_bytes_ms"] <= load["load_ms"], load
        assert 0 < load["fcp_ms"] <= load["load_ms"], load
    recorded = quick.results.read_text()
    assert recorded.startswith(HEADING)
    assert "| segments | reshape-dynamic | 1/1 |" in recorded
