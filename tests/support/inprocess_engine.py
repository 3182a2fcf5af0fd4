"""The engine driven in-process against a real loopback origin that delays its answers."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator

from reshape.features.telemetry.engine_metrics import EngineMetrics
from reshape.upstream.engine import Engine, Route
from reshape.upstream.pool import PoolKey, PoolLimits
from reshape.upstream.types import UpstreamRequest, UpstreamResponse

HOST = "127.0.0.91"


class DelayingOrigin:
    """HTTP/1.1 keep-alive origin answering requests in order: `<METHOD> /<s>/<name>` is
    answered `name` after s seconds. Requests may be pipelined (and have a Content-Length body).
    Counts connections and requests (`METHOD /s/name`, or only the target for a GET). With
    `close_after_response`, it closes each connection after its first response without saying
    so — as an origin whose keep-alive timeout strikes just then."""

    def __init__(self, *, close_after_response: bool = False) -> None:
        self.close_after_response = close_after_response
        self.connections = 0
        self.open = 0
        self.most_open = 0  # the most connections open at once
        self.requests: list[str] = []
        self.port = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                method, target = head.decode().split(" ", 2)[:2]
                self.requests.append(target if method == "GET" else f"{method} {target}")
                for line in head.decode().lower().split("\r\n"):
                    if line.startswith("content-length:"):
                        await reader.readexactly(int(line.split(":")[1]))
                _, delay, name = target.split("/")
                await asyncio.sleep(float(delay))
                body = name.encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
                if self.close_after_response:
                    break
        self.open -= 1
        writer.close()


@contextlib.asynccontextmanager
async def running(
    limits: PoolLimits, origin: DelayingOrigin | None = None
) -> AsyncIterator[tuple[Engine, Route, DelayingOrigin]]:
    """An engine, a route under `limits` to `origin` (a fresh DelayingOrigin), and the origin."""
    origin = origin or DelayingOrigin()
    server = await asyncio.start_server(origin.handle, HOST, 0)
    origin.port = server.sockets[0].getsockname()[1]
    engine = Engine(None, EngineMetrics())
    engine.start()
    route = Route(PoolKey("http", HOST, origin.port, None), limits, 5.0, 5.0, "p", "-")
    try:
        yield engine, route, origin
    finally:
        await engine.stop()
        server.close()


def limits(*, connections: int = 1, pipeline_depth: int = 0) -> PoolLimits:
    """Limits with room in the queue, no idle timeout and HTTP/1.1 only."""
    return PoolLimits(connections, 100, 3.0, math.inf, pipeline_depth, False)


def get(path: str) -> UpstreamRequest:
    return UpstreamRequest(b"GET", b"http", HOST.encode(), path.encode(), [])


async def body(response: UpstreamResponse) -> bytes:
    parts = []
    while chunk := await response.read():
        parts.append(chunk)
    return b"".join(parts)


async def fetch(engine: Engine, route: Route, path: str) -> bytes:
    return await body(await engine.exchange(route, get(path)))


def in_flight(engine: Engine, route: Route) -> int:
    pool = engine.pools.get(route.pool_id)
    return 0 if pool is None else pool.in_flight


async def settled(engine: Engine, route: Route) -> int:
    """Requests the route's pool counts in flight, once they are down to 0 (or after 2 s)."""
    for _ in range(40):
        if in_flight(engine, route) == 0:
            break
        await asyncio.sleep(0.05)
    return in_flight(engine, route)
