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
import time
from dataclasses import dataclass

from labkit.relay import Link, Relay, chunks

MSS = 1448


@dataclass(frozen=True)
class SegmentLink:
    down_rate: float  # bytes/second, towards the browser
    up_delay: float  # seconds, browser → proxy
    down_delay: float  # seconds, proxy → browser


class SegmentRelay(Relay):
    """A labkit relay (accepts on `listen_host`, relays each connection to `target`) whose
    deliveries towards the browser go a segment at a time over the shared `link`."""

    def __init__(self, listen_host: str, target: tuple[str, int], link: SegmentLink) -> None:
        super().__init__(
            listen_host, target, Link(up_delay=link.up_delay, down_delay=link.down_delay)
        )
        self._down = _Link(link.down_rate)

    async def _deliver(
        self,
        queue: asyncio.Queue[tuple[float, bytes]],
        writer: asyncio.StreamWriter,
        rate: float | None,
        upward: bool,
        link: Link,
    ) -> None:
        if upward:  # only delayed
            await super()._deliver(queue, writer, rate, upward, link)
            return
        sent_at = 0.0  # when this connection's previous piece finished crossing the link
        async for due, data in chunks(queue, writer):
            read_at = due - link.down_delay
            for piece in (data[i : i + MSS] for i in range(0, len(data), MSS)):
                # A piece is booked on the link once this connection's previous one has crossed
                # it (so connections take turns), and arrives `down_delay` after it has been
                # sent. Arrival times are scheduled, so a late wake-up does not add up.
                sent_at = self._down.book(len(piece), max(read_at, sent_at))
                wait = sent_at + link.down_delay - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(piece)
            await writer.drain()


class _Link:
    """The direction towards the browser, shared by every connection through the relay."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.free_at = 0.0  # when the link has finished sending what was booked so far

    def book(self, size: int, ready: float) -> float:
        """When `size` bytes, ready to go at `ready`, have been sent; books the link till then."""
        self.free_at = max(ready, self.free_at) + size / self.rate
        return self.free_at
