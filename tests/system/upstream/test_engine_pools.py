"""Which pool and connection a request gets: a pool per destination and set of limits; a
connection found closed before the request left is no reason to fail it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import socket

import pytest

from reshape.features.telemetry.engine_metrics import EngineMetrics
from reshape.upstream.engine import Engine, QueueRejected, Route
from reshape.upstream.pool import MAX_ATTEMPTS, MAX_FREE_GOES, PoolKey, PoolLimits, Proto
from reshape.upstream.types import UpstreamError, UpstreamRequest
from tests.support.inprocess_engine import (
    HOST,
    DelayingOrigin,
    body,
    fetch,
    get,
    limits,
    running,
)


@pytest.mark.asyncio
async def test_two_arms_with_different_caps_on_one_origin_each_get_their_own_cap() -> None:
    async with running(limits(connections=1)) as (engine, capped, origin):
        wider = dataclasses.replace(capped, limits=limits(connections=3), policy="q")
        assert wider.pool_id != capped.pool_id

        async def load(route: Route, tag: str) -> list[bytes]:
            return await asyncio.gather(*(fetch(engine, route, f"/0.2/{tag}{i}") for i in range(6)))

        await load(capped, "a")
        assert origin.most_open == 1  # the narrow arm alone never has more than its one
        both = await asyncio.gather(load(capped, "a"), load(wider, "b"))
        assert both == [[f"a{i}".encode() for i in range(6)], [f"b{i}".encode() for i in range(6)]]
        # The wide arm used its three, the narrow one its one (each would otherwise follow the
        # other's limits, as they did when pools were keyed by destination alone).
        assert origin.most_open == 4
        assert sorted(p.limits.max_connections for p in engine.pools.values()) == [1, 3]


@pytest.mark.asyncio
async def test_requests_under_equal_limits_share_one_pool_whatever_their_policy() -> None:
    async with running(limits(connections=2)) as (engine, route, origin):
        other = dataclasses.replace(route, policy="other", arm="x:y")
        await asyncio.gather(
            *(fetch(engine, r, f"/0.1/{i}") for i, r in enumerate([route, other] * 4))
        )
        assert len(engine.pools) == 1
        assert origin.connections == 2


@pytest.mark.asyncio
async def test_a_post_whose_connection_turns_out_closed_before_it_left_goes_again() -> None:
    closing = DelayingOrigin(close_after_response=True)
    async with running(limits(), closing) as (engine, route, origin):
        first = await engine.exchange(route, get("/0/first"))
        await asyncio.sleep(0.2)  # the origin's close is in our buffer behind the response
        assert await body(first) == b"first"
        # The connection looked reusable (no Connection: close): the POST is handed it, finds
        # it closed before writing a byte, and goes on a new connection rather than a 502.
        post = UpstreamRequest(b"POST", b"http", HOST.encode(), b"/0/posted", [], body=b"form")
        assert await body(await engine.exchange(route, post)) == b"posted"
        assert origin.requests == ["/0/first", "POST /0/posted"]  # sent once
        assert origin.connections == 2


@pytest.mark.asyncio
async def test_a_client_leaving_while_its_own_connection_still_connects_leaves_nothing_open() -> (
    None
):
    """`share: false`: the client's pools go when it does, a connection still in its TLS
    handshake included (it used to finish connecting and stay open, owned by nobody)."""
    accepted: list[asyncio.StreamReader] = []
    closed = asyncio.Event()

    async def never_answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(reader)
        await reader.read()  # the ClientHello, then nothing until the engine gives up
        closed.set()
        writer.close()

    server = await asyncio.start_server(never_answers, HOST, 0)
    port = server.sockets[0].getsockname()[1]
    engine = Engine(None)
    engine.start()
    route = dataclasses.replace(
        Route(PoolKey("https", HOST, port, "origin.test"), limits(), 30.0, 30.0, "p", "-"),
        owner="client-1",
    )
    try:
        exchange = asyncio.ensure_future(engine.exchange(route, get("/0/x")))
        while not accepted:
            await asyncio.sleep(0.01)
        engine.release("client-1")
        await asyncio.wait_for(closed.wait(), 3)  # at once, not at the 30 s connect timeout
        with pytest.raises((asyncio.CancelledError, UpstreamError)):
            exchange.cancel()
            await exchange
        assert engine.connections == {} and engine.pools == {}
    finally:
        await engine.stop()
        server.close()


@pytest.mark.asyncio
async def test_a_request_the_pool_gives_up_on_says_how_often_it_went_and_why_the_last_failed() -> (
    None
):
    """Each connection the GET is handed turns out closed before it leaves (the origin closed
    it after its one response, without saying so): it goes again, at no cost a few times, then
    at the cost of its attempts. The 502's text said "retries exhausted" and why the last
    attempt went unanswered, not how many there were."""
    goes = MAX_FREE_GOES + MAX_ATTEMPTS
    closing = DelayingOrigin(close_after_response=True)
    async with running(limits(connections=goes), closing) as (engine, route, origin):
        heads = await asyncio.gather(
            *(engine.exchange(route, get(f"/0.05/prime{i}")) for i in range(goes))
        )
        await asyncio.sleep(0.2)  # each close is in our buffer behind its response
        assert [await body(head) for head in heads] == [b"prime%d" % i for i in range(goes)]
        with pytest.raises(UpstreamError) as failed:
            await engine.exchange(route, get("/0/victim"))
        assert str(failed.value) == (
            f"http://{HOST}:{origin.port}: retries exhausted after {goes} attempts"
            " (the last attempt: connection closed before the request was sent)"
        )
        assert origin.connections == goes  # each went to a connection it found closed
        assert "/0/victim" not in origin.requests


async def _read_head(sock: socket.socket) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await asyncio.get_running_loop().sock_recv(sock, 4096)
        assert chunk, "the proxy closed before its request's head"
        data += chunk


@pytest.mark.asyncio
@pytest.mark.parametrize("then", ["refuses", "hangs"])
async def test_a_request_that_went_unanswered_and_cannot_go_again_says_what_became_of_it(
    then: str,
) -> None:
    """A GET sent on a kept connection that the origin closes unanswered goes again; the
    origin then refuses connections (a 502), or its accept queue is full, so the connect hangs
    and the request times out in the queue (a 503). Either answer said only that the origin
    could not be reached, or not in time, though it had had the request once."""
    loop = asyncio.get_running_loop()
    listener = socket.socket()
    listener.bind((HOST, 0))
    listener.listen(0)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    fillers: list[socket.socket] = []

    def stop_taking_connections() -> None:
        if then == "refuses":
            listener.close()
            return
        for _ in range(4):  # Linux queues backlog + 1; the next connects get no SYN-ACK
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect((HOST, port))
            fillers.append(filler)

    async def origin() -> None:
        sock, _ = await loop.sock_accept(listener)
        with sock:
            sock.setblocking(False)
            await _read_head(sock)
            await loop.sock_sendall(sock, b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nprime")
            await _read_head(sock)  # the victim, on the kept connection
            stop_taking_connections()
        # Closed without an answer.

    serving = asyncio.ensure_future(origin())
    engine = Engine(None, EngineMetrics())
    engine.start()
    queue_timeout = 0.5
    route = Route(
        PoolKey("http", HOST, port, None),
        PoolLimits(1, 100, queue_timeout, math.inf, 0, False),
        5.0,
        5.0,
        "p",
        "-",
    )
    try:
        assert await fetch(engine, route, "/0/prime") == b"prime"
        expected = (
            (QueueRejected, "waited too long for a connection to this origin")
            if then == "hangs"
            else (UpstreamError, f"could not connect to http://{HOST}:{port}: ")
        )
        with pytest.raises(expected[0]) as failed:
            await asyncio.wait_for(engine.exchange(route, get("/0/victim")), 3)
        text = str(failed.value)
        assert text.startswith(expected[1]), text
        assert text.endswith(" (the last attempt: connection closed by the origin)"), text
        await serving
    finally:
        await engine.stop()
        serving.cancel()
        listener.close()
        for filler in fillers:
            filler.close()


@pytest.mark.asyncio
async def test_a_reload_closes_the_idle_connections_of_pools_whose_limits_no_policy_has() -> None:
    async with running(limits(connections=2)) as (engine, route, origin):
        await asyncio.gather(fetch(engine, route, "/0.1/a"), fetch(engine, route, "/0.1/b"))
        assert origin.open == 2
        # The limits are still a policy's: the connections stay.
        engine.retire_pools({route.limits})
        await asyncio.sleep(0.1)
        assert origin.open == 2
        # Another cap for that origin now: the old pool's idle connections close at once,
        # rather than at their idle timeout beside the new pool's.
        lowered = dataclasses.replace(route, limits=limits(connections=1))
        engine.retire_pools({lowered.limits})
        await asyncio.sleep(0.1)
        assert origin.open == 0
        assert await fetch(engine, lowered, "/0/c") == b"c"
        assert origin.open == 1 and route.pool_id not in engine.pools


@pytest.mark.asyncio
async def test_a_pool_that_never_offers_http2_teaches_nothing_of_the_origins_protocol() -> None:
    # A pinned client's pool (or a policy's `http2: false`) offers HTTP/1.1 alone: it
    # recorded the origin as HTTP/1.1, and later pools to an HTTP/2 origin then opened a
    # connection per request of a burst instead of one for all (a review's finding).
    async with running(limits()) as (engine, route, _):
        assert not route.limits.http2
        assert await fetch(engine, route, "/0/a") == b"a"
        assert route.key not in engine._protocols
        offering = dataclasses.replace(route, limits=dataclasses.replace(route.limits, http2=True))
        assert await fetch(engine, offering, "/0/b") == b"b"
        assert engine._protocols[route.key] is Proto.H1  # offered h2, answered HTTP/1.1
