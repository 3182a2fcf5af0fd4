"""A TCP relay that emulates a network link and counts connections, all in user space.

`tc netem` is not available in this kernel, so links are emulated here, between an accepting
address and a target. What it emulates:

- latency per direction: every chunk read is delivered `delay` seconds after it was read, in
  order (so RTT = up + down delay, and a TCP handshake through the relay costs one connect delay);
- bandwidth per direction: delivery is paced at `rate` bytes/second per connection (a token
  bucket with no burst beyond one read) — like a TCP flow limited by its window, each connection
  gets the whole rate;
- optionally a bottleneck shared by all connections through one relay: `shared_*_rate`
  bytes/second per direction, chunks served in the order they became ready;
- connection set-up delay: the upstream connect happens `connect_delay` seconds after accept
  (set it to the RTT to charge a TCP handshake: the client's first bytes then reach the target
  `connect_delay + up_delay` after it connected).

What it does not emulate: packet loss, reordering, jitter, queueing delay or drops in a buffer
(a shared bottleneck only serialises), TCP slow start or congestion control of the emulated path
(the real loopback TCP underneath has its own), or MTU effects; TLS records and TCP segments are
not rewritten. The client's own TCP handshake completes at once, against the relay's listener.
The relay also counts the connections it makes to its target — in total, open now, the most
open at once, and those that carried bytes towards the target since the counters were reset
(new or kept open from before: how a pool's reused connections are seen) — and the bytes each
way, which is how tests see what an origin sees;
`close_connections` ends every relayed connection, as an origin closing idle keep-alive
connections would.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from reshape.base.unread_bytes import unread_bytes

_READ_SIZE = 64 * 1024
# What a broken connection may still deliver (a socket's receive buffer is smaller).
_UNREAD_LIMIT = 64 * 1024 * 1024


@dataclass(frozen=True)
class Link:
    """One direction-pair of emulated network between two points."""

    up_delay: float = 0.0  # seconds, accepting side → target
    down_delay: float = 0.0  # seconds, target → accepting side
    up_rate: float | None = None  # bytes/second per connection, None = unlimited
    down_rate: float | None = None
    connect_delay: float = 0.0
    # bytes/second for all connections through one relay together, None = unlimited
    shared_up_rate: float | None = None
    shared_down_rate: float | None = None

    @classmethod
    def rtt(cls, seconds: float, **kwargs: float | None) -> Link:
        return cls(up_delay=seconds / 2, down_delay=seconds / 2, **kwargs)  # type: ignore[arg-type]


@dataclass
class RelayStats:
    accepted: int = 0
    open: int = 0
    max_open: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # Connections (by the relay's own number) that carried bytes towards the target since reset.
    _carried: set[int] = field(default_factory=set, repr=False)

    @property
    def used(self) -> int:
        """Connections that carried bytes towards the target since the last reset, whether
        accepted since or kept open from before."""
        return len(self._carried)

    def carried(self, connection: int) -> None:
        with self._lock:
            self._carried.add(connection)

    def opened(self) -> None:
        with self._lock:
            self.accepted += 1
            self.open += 1
            self.max_open = max(self.max_open, self.open)

    def closed(self) -> None:
        with self._lock:
            self.open -= 1

    def reset(self) -> None:
        """Zero the counters (connections open now stay counted as open)."""
        with self._lock:
            self.accepted = 0
            self.max_open = self.open
            self.bytes_up = 0
            self.bytes_down = 0
            self._carried.clear()


class _SharedLink:
    """One direction of a bottleneck that all of a relay's connections take turns on."""

    def __init__(self) -> None:
        self.next_free = 0.0

    def reserve(self, size: int, ready: float, rate: float) -> float:
        """When `size` bytes ready at `ready` have crossed the link; books the link till then."""
        self.next_free = max(ready, self.next_free) + size / rate
        return self.next_free


class Relay:
    """Accepts on (listen_host, port) and relays each connection to (target_host, target_port)."""

    def __init__(self, listen_host: str, target: tuple[str, int], link: Link = Link()) -> None:
        self.listen_host = listen_host
        self.target = target
        self.link = link
        self.stats = RelayStats()
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._shared = {True: _SharedLink(), False: _SharedLink()}  # by direction: upward?
        self._numbers = itertools.count()

    async def start(self, port: int = 0) -> None:
        self._server = await asyncio.start_server(self._accept, self.listen_host, port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        await self.close_connections()

    async def close_connections(self) -> None:
        """Ends every connection being relayed now (and any still waiting to connect)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        link = self.link  # a connection keeps the link it was accepted under
        number = next(self._numbers)
        counted = False
        pipes: list[asyncio.Task[None]] = []
        target_writer: asyncio.StreamWriter | None = None
        try:
            if link.connect_delay:
                await asyncio.sleep(link.connect_delay)
            try:
                target_reader, target_writer = await open_connection(*self.target)
            except OSError:
                return
            self.stats.opened()
            counted = True
            pipes = [
                asyncio.create_task(
                    self._pipe(
                        reader, target_writer, link.up_delay, link.up_rate, True, link, number
                    )
                ),
                asyncio.create_task(
                    self._pipe(
                        target_reader, writer, link.down_delay, link.down_rate, False, link, number
                    )
                ),
            ]
            # HTTP peers never half-close a live connection: once either side has closed, the
            # connection no longer counts as open (the other side's FIN is still relayed).
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
            self.stats.closed()
            counted = False
            await asyncio.gather(*pipes, return_exceptions=True)
        except asyncio.CancelledError:
            # Ended by close_connections() or stop(). Ending quietly: asyncio 3.12.1's
            # start_server logs a cancelled connection handler as an error.
            pass
        finally:
            for pipe in pipes:
                pipe.cancel()
            if counted:
                self.stats.closed()
            if target_writer is not None:
                target_writer.close()
            writer.close()
            self._tasks.discard(task)

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        delay: float,
        rate: float | None,
        upward: bool,
        link: Link,
        number: int,
    ) -> None:
        """One direction of connection `number`: every chunk read is queued with the time it is due
        at the far end (`delay` later) and handed to `_deliver`; b"" (the reader's EOF) ends it."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        deliverer = asyncio.create_task(self._deliver(queue, writer, rate, upward, link))
        try:
            while True:
                data = await reader.read(_READ_SIZE)
                if upward:
                    self.stats.bytes_up += len(data)
                    if data:
                        self.stats.carried(number)
                else:
                    self.stats.bytes_down += len(data)
                queue.put_nowait((time.monotonic() + delay, data))
                if not data:
                    break
            await deliverer
        except (ConnectionError, OSError):
            writer.close()
        finally:
            deliverer.cancel()

    async def _deliver(
        self,
        queue: asyncio.Queue[tuple[float, bytes]],
        writer: asyncio.StreamWriter,
        rate: float | None,
        upward: bool,
        link: Link,
    ) -> None:
        """Writes each queued chunk once it is due and has crossed the link at `rate` (and the
        shared bottleneck, if any); the empty chunk ends the direction with a FIN."""
        shared_rate = link.shared_up_rate if upward else link.shared_down_rate
        shared = self._shared[upward]
        next_free = 0.0
        async for due, data in chunks(queue, writer):
            # The chunk may go once it has crossed the link's delay and the previous chunk
            # has left; it then occupies the link for len/rate seconds.
            ready = max(due, next_free)
            arrival = ready + (len(data) / rate if rate else 0.0)
            if shared_rate:
                arrival = max(arrival, shared.reserve(len(data), ready, shared_rate))
            wait = arrival - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if rate or shared_rate:
                next_free = time.monotonic()
            writer.write(data)
            await writer.drain()


class _ReadsToTheEnd(asyncio.StreamReaderProtocol):
    """A stream that delivers everything its peer sent before a reset, as a real link would:
    what the stream had read but not handed out yet (asyncio's StreamReader raises the error
    before it), and what was still in the kernel when a write met the reset first
    (reshape/base/unread_bytes.py). Without this, an origin that answers pipelined requests and
    then resets the connection as the next ones arrive lost its answers in the relay. The
    stream then ends as if closed: the relay ends every connection with a FIN, whatever the
    cause."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        super().__init__(reader)
        self._reader = reader
        self._transport_seen: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport_seen = transport
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            for data in unread_bytes(self._transport_seen, _UNREAD_LIMIT):
                self._reader.feed_data(data)
        super().connection_lost(None)


async def open_connection(
    host: str, port: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """asyncio.open_connection, with a stream that reads to the end (`_ReadsToTheEnd`)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    protocol = _ReadsToTheEnd(reader)
    transport, _ = await loop.create_connection(lambda: protocol, host, port)
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


async def chunks(
    queue: asyncio.Queue[tuple[float, bytes]], writer: asyncio.StreamWriter
) -> AsyncIterator[tuple[float, bytes]]:
    """Each (due time, bytes) that `Relay._pipe` queued, until the empty one: that ends the
    direction with a FIN towards `writer`'s peer, where the transport can half-close."""
    while True:
        due, data = await queue.get()
        if not data:
            with contextlib.suppress(OSError):
                if writer.can_write_eof():
                    writer.write_eof()
            return
        yield due, data


class RelayThread:
    """Relays run on their own event loop in a thread, so synchronous tests can use them."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="relay")
        self._thread.start()
        self.relays: list[Relay] = []

    def add(
        self, listen_host: str, target: tuple[str, int], link: Link = Link(), port: int = 0
    ) -> Relay:
        return self.run(Relay(listen_host, target, link), port)

    def run[R: Relay](self, relay: R, port: int = 0) -> R:
        """Starts `relay` (a Relay of any kind) on this thread's loop; stopped by `close`."""
        asyncio.run_coroutine_threadsafe(relay.start(port), self.loop).result(10)
        self.relays.append(relay)
        return relay

    def close_connections(self) -> None:
        """Ends every connection all relays are relaying now."""
        for relay in self.relays:
            asyncio.run_coroutine_threadsafe(relay.close_connections(), self.loop).result(10)

    def close(self) -> None:
        for relay in self.relays:
            asyncio.run_coroutine_threadsafe(relay.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


@contextmanager
def relays() -> Iterator[RelayThread]:
    thread = RelayThread()
    try:
        yield thread
    finally:
        thread.close()
