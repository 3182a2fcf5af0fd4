"""A pipeline whose front response stalls does not hold the requests behind it (issue 15,
finding 5): after the route's `pipeline_stall_timeout` they go again on another connection, and
the stalled connection closes once its front response ends."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from tests.support.inprocess_engine import body, fetch, get, limits, running


@pytest.mark.asyncio
async def test_requests_behind_a_stalled_response_go_elsewhere_within_the_deadline() -> None:
    async with running(limits(connections=2, pipeline_depth=2)) as (engine, route, origin):
        route = dataclasses.replace(route, pipeline_stall_timeout=0.3, read_timeout=30.0)
        started = time.monotonic()
        finished: dict[str, float] = {}

        async def timed(path: str) -> bytes:
            data = await fetch(engine, route, path)
            finished[path] = time.monotonic() - started
            return data

        # Two connections: the first two requests open them; the next two are pipelined, one
        # behind the slow response, one behind a quick one.
        results = await asyncio.gather(
            timed("/8/slow"), timed("/0/a"), timed("/0/b"), timed("/0/c")
        )
        assert results == [b"slow", b"a", b"b", b"c"]
        assert finished["/8/slow"] >= 8
        # Whichever request sat behind the slow one left it after the stall timeout.
        assert max(finished[p] for p in ("/0/a", "/0/b", "/0/c")) < 4, finished
        # The origin answered the moved request twice (it is idempotent: a GET), never more.
        assert all(origin.requests.count(p) <= 2 for p in ("/0/a", "/0/b", "/0/c"))
        assert engine.connections == {} or all(
            record.upstream is not None for record in engine.connections.values()
        )


@pytest.mark.asyncio
async def test_a_response_that_keeps_coming_is_no_stall() -> None:
    """A front response the origin has sent whole but its client has not read yet is no stall:
    the request behind it waits its turn and is sent once."""
    async with running(limits(connections=1, pipeline_depth=2)) as (engine, route, origin):
        route = dataclasses.replace(route, pipeline_stall_timeout=0.3)
        first = await engine.exchange(route, get("/0/first"))
        second = asyncio.ensure_future(fetch(engine, route, "/0/second"))
        await asyncio.sleep(0.6)  # past the stall timeout, but the front response is complete
        assert await body(first) == b"first"
        assert await second == b"second"
        assert origin.requests.count("/0/second") == 1


@pytest.mark.asyncio
async def test_the_wait_behind_a_response_its_client_reads_slowly_is_not_the_origins() -> None:
    """The front response's client reads it 0.7 s late; the origin answers the request behind
    1.2 s after it came, within the 1 s read timeout of its turn. The read timeout counted the
    wait in line too: a 504 for a healthy origin's answer (in a shared pool, for another
    client's slowness). The wait in line is still bounded, by the same timeout."""
    async with running(limits(connections=1, pipeline_depth=2)) as (engine, route, origin):
        route = dataclasses.replace(route, pipeline_stall_timeout=0.3, read_timeout=1.0)
        first = await engine.exchange(route, get("/0/first"))
        second = asyncio.ensure_future(fetch(engine, route, "/1.2/second"))
        await asyncio.sleep(0.7)  # the front response's client, slow
        assert await body(first) == b"first"
        assert await second == b"second"
        assert origin.requests.count("/1.2/second") == 1
