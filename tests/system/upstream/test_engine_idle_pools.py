"""A pool goes once it is idle and its connections have closed, whatever it learned: a gateway
meets millions of hosts, and a pool kept for each would grow without bound. What must outlive
it (the origin breaks pipelines, the protocol it speaks) is kept in bounded tables."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from reshape.upstream.engine import REMEMBERED_ORIGINS, Engine, Route
from reshape.upstream.pool import PoolKey, PoolLimits
from tests.support.inprocess_engine import body, get

HOST = "127.0.0.96"
ORIGINS = 12
IDLE_TIMEOUT = 0.2
# What the engine holds per pool, or per connection or request of one (Engine.holdings).
PER_POOL = ("pools", "routes", "timers", "slot_waits", "connections", "hosts", "waiters", "tasks")


class PipelineBreakingOrigin:
    """HTTP/1.1 origin whose first connection reads three pipelined requests, answers the first
    (keep-alive, nothing said of a close) and closes: it breaks a pipeline. Later connections
    answer each request in turn. Keeps (connection number, target) of every request."""

    def __init__(self) -> None:
        self.connections = 0
        self.requests: list[tuple[int, str]] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            if number == 1:
                first = await self.read_request(number, reader)
                await self.read_request(number, reader)
                await self.read_request(number, reader)
                writer.write(answer(first))
                await writer.drain()
            else:
                for _ in range(10):
                    writer.write(answer(await self.read_request(number, reader)))
                    await writer.drain()
        writer.close()

    async def read_request(self, number: int, reader: asyncio.StreamReader) -> str:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        target = head.split(" ", 2)[1]
        self.requests.append((number, target))
        return target


def answer(target: str) -> bytes:
    name = target.strip("/").encode()
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(name), name)


@contextlib.asynccontextmanager
async def origins(count: int) -> AsyncIterator[list[tuple[PipelineBreakingOrigin, int]]]:
    """`count` origins, each on a port of its own: each is another destination to the engine."""
    started = []
    try:
        for _ in range(count):
            origin = PipelineBreakingOrigin()
            server = await asyncio.start_server(origin.handle, HOST, 0)
            started.append((origin, server))
        yield [(o, s.sockets[0].getsockname()[1]) for o, s in started]
    finally:
        for _, server in started:
            server.close()


def route_to(port: int) -> Route:
    limits = PoolLimits(1, 100, 3.0, IDLE_TIMEOUT, 3, False)
    return Route(PoolKey("http", HOST, port, None), limits, 5.0, 5.0, "p", "-")


async def three_at_once(engine: Engine, route: Route) -> list[str]:
    """Three GETs at once (one connection: the second and third are pipelined if they may be);
    how each was served the last time it went."""
    requests = [get("/a"), get("/b"), get("/c")]
    exchanges = [asyncio.ensure_future(engine.exchange(route, r)) for r in requests]
    answers = [await body(await exchange) for exchange in exchanges]
    assert answers == [b"a", b"b", b"c"]
    return [r.assignment.kind for r in requests if r.assignment is not None]


async def nothing_left(engine: Engine) -> bool:
    """Whether the engine holds no pool and nothing keyed by one, within 3 s."""
    for _ in range(60):
        if all(engine.holdings()[kind] == 0 for kind in PER_POOL):
            return True
        await asyncio.sleep(0.05)
    return False


@pytest.mark.asyncio
async def test_the_pools_of_origins_that_broke_pipelines_go_and_the_lesson_stays() -> None:
    engine = Engine(None)
    engine.start()
    try:
        async with origins(ORIGINS) as servers:
            for _, port in servers:
                # The second and third were pipelined, lost, and went again on a new
                # connection, one after the other.
                assert await three_at_once(engine, route_to(port)) == ["new", "new", "reused"]
                assert engine.pools[route_to(port).pool_id].pipelining_broken
            # Idle, their connections closed: the pools were kept for good (they were the
            # one record of the broken pipelines), a pool per destination met.
            assert await nothing_left(engine), engine
            # What they learned stays: no pipelining to them, a new pool or not.
            origin, port = servers[0]
            assert await three_at_once(engine, route_to(port)) == ["new", "reused", "reused"]
            assert origin.requests == [
                *[(1, target) for target in ("/a", "/b", "/c")],
                *[(2, target) for target in ("/b", "/c")],  # each went again once
                *[(3, target) for target in ("/a", "/b", "/c")],
            ]
    finally:
        await engine.stop()


def test_what_the_engine_remembers_of_origins_is_bounded() -> None:
    engine = Engine(None)
    for port in range(REMEMBERED_ORIGINS + 10):
        engine.pipelining_broken_elsewhere(PoolKey("http", HOST, port, None))
    assert engine.holdings()["pipelining_broken"] == REMEMBERED_ORIGINS
