"""Clients that leave mid-exchange: the engine driven in-process against a real loopback origin.

Whatever moment a request's client goes away at — its assignment on the way, its request being
sent, its response due, its place in a pipeline — the pool must get its slot back, and nobody
else's response may suffer. (Before this was so, every leaver could wedge a connection for good.)
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from tests.support.inprocess_engine import body, fetch, get, limits, running, settled


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
        assert not engine.pools[route.pool_id].pipelining_broken
