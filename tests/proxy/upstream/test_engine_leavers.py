"""Clients that leave mid-exchange: the engine driven in-process against a real loopback origin.

Whatever moment a request's client goes away at — its assignment on the way, its request being
sent, its response due, its place in a pipeline — the pool must get its slot back, and nobody
else's response may suffer. (Before this was so, every leaver could wedge a connection for good.)
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator

import pytest

from proxy.upstream.engine import Engine, Route
from proxy.upstream.exchange import UpstreamRequest, UpstreamResponse
from proxy.upstream.pool import PoolKey, PoolLimits

HOST = "127.0.0.91"


class DelayingOrigin:
    """HTTP/1.1 keep-alive origin answering requests in order: `GET /<s>/<name>` is answered
    `name` after s seconds. Requests may be pipelined. Counts connections and requests."""

    def __init__(self) -> None:
        self.connections = 0
        self.requests: list[str] = []
        self.port = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                target = head.split(b" ", 2)[1].decode()
                self.requests.append(target)
                _, delay, name = target.split("/")
                await asyncio.sleep(float(delay))
                body = name.encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
        writer.close()


@contextlib.asynccontextmanager
async def running(limits: PoolLimits) -> AsyncIterator[tuple[Engine, Route, DelayingOrigin]]:
    origin = DelayingOrigin()
    server = await asyncio.start_server(origin.handle, HOST, 0)
    origin.port = server.sockets[0].getsockname()[1]
    engine = Engine(None)
    engine.start()
    route = Route(PoolKey("http", HOST, origin.port, None), limits, 5.0, 5.0, "p", "-")
    try:
        yield engine, route, origin
    finally:
        await engine.stop()
        server.close()


def limits(*, connections: int = 1, pipeline_depth: int = 0) -> PoolLimits:
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
    pool = engine.pools.get(route.key)
    return 0 if pool is None else pool.in_flight


async def settled(engine: Engine, route: Route) -> int:
    for _ in range(40):
        if in_flight(engine, route) == 0:
            break
        await asyncio.sleep(0.05)
    return in_flight(engine, route)


@pytest.mark.asyncio
async def test_a_request_whose_client_leaves_as_its_connection_is_assigned_gives_it_back() -> None:
    async with running(limits()) as (engine, route, origin):
        first = await engine.exchange(route, get("/0.1/first"))
        second = asyncio.create_task(fetch(engine, route, "/0/second"))
        await asyncio.sleep(0.05)  # queued behind the first
        # Reading the first to its end assigns the connection to the second, whose client
        # leaves before its task sees the decision.
        assert await body(first) == b"first"
        second.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await second
        assert await asyncio.wait_for(fetch(engine, route, "/0/third"), 2) == b"third"
        assert await settled(engine, route) == 0
        # Nothing was sent for the second: the connection carried on.
        assert origin.connections == 1
        assert origin.requests == ["/0.1/first", "/0/third"]


@pytest.mark.asyncio
async def test_a_client_that_leaves_while_its_response_is_due_frees_the_connection() -> None:
    async with running(limits()) as (engine, route, origin):
        leaver = asyncio.create_task(fetch(engine, route, "/0.5/gone"))
        await asyncio.sleep(0.1)  # sent; the origin is taking its time
        leaver.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await leaver
        assert await settled(engine, route) == 0
        assert await asyncio.wait_for(fetch(engine, route, "/0/next"), 2) == b"next"
        # The half-done exchange closed its connection; the next request had a new one.
        assert origin.connections == 2


@pytest.mark.asyncio
async def test_many_clients_leaving_at_random_moments_never_wedge_the_pool() -> None:
    async with running(limits(connections=2)) as (engine, route, _):
        tasks = [
            asyncio.create_task(fetch(engine, route, f"/{(i % 4) * 0.01}/r{i}")) for i in range(60)
        ]
        for i, task in enumerate(tasks):
            if i % 2:
                await asyncio.sleep(0.003)
                task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        kept = [r for r in results if not isinstance(r, BaseException)]
        assert all(r == f"r{i}".encode() for i, r in enumerate(results) if r in kept)
        assert await settled(engine, route) == 0
        assert await asyncio.wait_for(fetch(engine, route, "/0/after"), 2) == b"after"


@pytest.mark.asyncio
async def test_a_client_leaving_mid_pipeline_lets_the_responses_ahead_finish() -> None:
    async with running(limits(pipeline_depth=4)) as (engine, route, origin):
        await fetch(engine, route, "/0/warm")  # the pool now knows it is HTTP/1.1
        ahead = await engine.exchange(route, get("/0.3/ahead"))
        behind = asyncio.create_task(fetch(engine, route, "/0/behind"))
        last = asyncio.create_task(fetch(engine, route, "/0/last"))
        await asyncio.sleep(0.1)
        assert origin.requests[-3:] == ["/0.3/ahead", "/0/behind", "/0/last"]  # pipelined
        behind.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await behind
        assert await body(ahead) == b"ahead"
        # The pipeline closed at the abandoned response; the request behind it went again.
        assert await asyncio.wait_for(last, 2) == b"last"
        assert await settled(engine, route) == 0
        assert not engine.pools[route.key].pipelining_broken
