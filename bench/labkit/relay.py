"""A TCP relay that emulates a network link and counts connections, all in user space.

`tc netem` is not available in this kernel, so links are emulated here, between an accepting
address and a target. What it emulates:

- latency per direction: every chunk read is delivered `delay` seconds after it was read, in
  order (so RTT = up + down delay, and a TCP handshake through the relay costs one connect delay);
- bandwidth per direction: delivery is paced at `rate` bytes/second per connection (a token
  bucket with no burst beyond one read);
- connection set-up delay: the upstream connect happens `connect_delay` seconds after accept.

What it does not emulate: packet loss, reordering, jitter, a bottleneck shared by connections
(each connection gets the full rate), TCP slow start of the emulated path (the real loopback TCP
underneath has its own), or MTU effects; TLS records and TCP segments are not rewritten. The
relay also counts the connections it makes to its target — in total, open now, and the most open
at once — which is how tests see what an origin sees.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

_READ_SIZE = 64 * 1024


@dataclass(frozen=True)
class Link:
    """One direction-pair of emulated network between two points."""

    up_delay: float = 0.0  # seconds, accepting side → target
    down_delay: float = 0.0  # seconds, target → accepting side
    up_rate: float | None = None  # bytes/second, None = unlimited
    down_rate: float | None = None
    connect_delay: float = 0.0

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

    def opened(self) -> None:
        with self._lock:
            self.accepted += 1
            self.open += 1
            self.max_open = max(self.max_open, self.open)

    def closed(self) -> None:
        with self._lock:
            self.open -= 1


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

    async def start(self, port: int = 0) -> None:
        self._server = await asyncio.start_server(self._accept, self.listen_host, port)
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
        counted = False
        try:
            if self.link.connect_delay:
                await asyncio.sleep(self.link.connect_delay)
            try:
                target_reader, target_writer = await asyncio.open_connection(*self.target)
            except OSError:
                return
            self.stats.opened()
            counted = True
            up = asyncio.create_task(
                self._pipe(reader, target_writer, self.link.up_delay, self.link.up_rate, True)
            )
            down = asyncio.create_task(
                self._pipe(target_reader, writer, self.link.down_delay, self.link.down_rate, False)
            )
            # HTTP peers never half-close a live connection: once either side has closed, the
            # connection no longer counts as open (the other side's FIN is still relayed).
            await asyncio.wait([up, down], return_when=asyncio.FIRST_COMPLETED)
            self.stats.closed()
            counted = False
            await asyncio.gather(up, down, return_exceptions=True)
            target_writer.close()
        finally:
            if counted:
                self.stats.closed()
            writer.close()
            self._tasks.discard(task)

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        delay: float,
        rate: float | None,
        upward: bool,
    ) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            next_free = 0.0
            while True:
                due, data = await queue.get()
                if not data:
                    with contextlib.suppress(OSError):
                        if writer.can_write_eof():
                            writer.write_eof()
                    return
                now = time.monotonic()
                start = max(due, next_free)
                if start > now:
                    await asyncio.sleep(start - now)
                if rate:
                    # Pace the bytes: this chunk occupies the link for len/rate seconds.
                    transmit = len(data) / rate
                    await asyncio.sleep(transmit)
                    next_free = time.monotonic()
                writer.write(data)
                await writer.drain()

        deliverer = asyncio.create_task(deliver())
        try:
            while True:
                data = await reader.read(_READ_SIZE)
                if upward:
                    self.stats.bytes_up += len(data)
                else:
                    self.stats.bytes_down += len(data)
                queue.put_nowait((time.monotonic() + delay, data))
                if not data:
                    break
            await deliverer
        except (ConnectionError, OSError):
            deliverer.cancel()
            writer.close()


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
        relay = Relay(listen_host, target, link)
        asyncio.run_coroutine_threadsafe(relay.start(port), self.loop).result(10)
        self.relays.append(relay)
        return relay

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
