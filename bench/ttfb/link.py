"""An emulated slow link that delivers the bytes of each write a TCP segment at a time.

labkit/relay.py paces whole reads: whatever the proxy wrote at once (up to 64 KB) reaches the
browser at once, when its last byte has crossed the emulated link. That hides what TLS record sizes
change. Over a real link the bytes of a large write arrive segment by segment, and the browser can
decrypt a record as soon as the segment holding its last byte is in. This relay cuts everything it
relays towards the browser into MSS-sized pieces (1,448 bytes: a 1,500-byte MTU less the IP and TCP
headers with timestamps) and hands each to the browser when it has crossed the link: one after the
other at `down_rate`, each `down_delay` after it was sent. All connections through one relay share
the link (the browser's access link); their pieces take turns, one each, like a fair queue. Bytes
towards the proxy are only delayed.

Not emulated: slow start and the congestion window, ACK clocking, loss, a limit on the queue in
front of the link (each connection's queue is unbounded, like a deep router queue), and the proxy's
own socket buffer, which the relay drains as fast as loopback allows.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

MSS = 1448
_READ_SIZE = 64 * 1024


@dataclass(frozen=True)
class SegmentLink:
    down_rate: float  # bytes/second, towards the browser
    up_delay: float  # seconds, browser → proxy
    down_delay: float  # seconds, proxy → browser


class SegmentRelay:
    """Accepts on `listen_host` (port `port` once started) and relays each connection to `target`
    over `link`."""

    def __init__(self, listen_host: str, target: tuple[str, int], link: SegmentLink) -> None:
        self.listen_host = listen_host
        self.target = target
        self.link = link
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._down = _Link(link.down_rate)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.listen_host, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        pipes: list[asyncio.Task[None]] = []
        target_writer: asyncio.StreamWriter | None = None
        try:
            try:
                target_reader, target_writer = await asyncio.open_connection(*self.target)
            except OSError:
                return
            pipes = [
                asyncio.create_task(_pipe(reader, target_writer, self.link.up_delay, None)),
                asyncio.create_task(_pipe(target_reader, writer, self.link.down_delay, self._down)),
            ]
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
            await asyncio.gather(*pipes, return_exceptions=True)
        finally:
            for pipe in pipes:
                pipe.cancel()
            if target_writer is not None:
                target_writer.close()
            writer.close()
            self._tasks.discard(task)


class _Link:
    """One direction of the emulated link, shared by every connection through the relay."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.free_at = 0.0  # when the link has finished sending what was booked so far

    def book(self, size: int, ready: float) -> float:
        """When `size` bytes, ready to go at `ready`, have been sent; books the link till then."""
        self.free_at = max(ready, self.free_at) + size / self.rate
        return self.free_at


async def _pipe(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    delay: float,
    link: _Link | None,
) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        sent_at = 0.0  # when this connection's previous piece finished crossing the link
        while True:
            read_at, data = await queue.get()
            if not data:
                with contextlib.suppress(OSError):
                    if writer.can_write_eof():
                        writer.write_eof()
                return
            pieces = (
                [data] if link is None else [data[i : i + MSS] for i in range(0, len(data), MSS)]
            )
            for piece in pieces:
                # A piece is booked on the link once this connection's previous one has crossed
                # it (so connections take turns), and arrives `delay` after it has been sent.
                # Arrival times are scheduled, so a late wake-up does not add up.
                ready = max(read_at, sent_at)
                sent_at = ready if link is None else link.book(len(piece), ready)
                wait = sent_at + delay - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(piece)
            await writer.drain()

    deliverer = asyncio.create_task(deliver())
    try:
        while True:
            data = await reader.read(_READ_SIZE)
            queue.put_nowait((loop.time(), data))
            if not data:
                break
        await deliverer
    except (ConnectionError, OSError):
        writer.close()
    finally:
        deliverer.cancel()
