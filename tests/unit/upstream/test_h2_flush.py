"""When the engine's HTTP/2 connection writes the requests it is handed (reshape/upstream/h2.py).

Requests handed over close together share a write; a burst that the proxy turns into requests
one by one (a browser's 48 image requests, read from the client in one piece) starts leaving
before the proxy is through it; and nothing ever waits for a timer. The connection's clock is
the test's, and its socket a transport that keeps what is written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import h2.config
import h2.connection
import h2.events
import pytest

import reshape.upstream.h2 as upstream_h2
from reshape.upstream.h2 import COALESCE_SECONDS, H2Upstream
from reshape.upstream.types import UpstreamRequest
from reshape.upstream.wire import Wire
from tests.support.kept_writes import KeptWrites


class Books:
    """The pool's side of the connection; nothing here is expected to happen."""

    def request_done(self, waiter_id: int, reusable: bool) -> None:
        pass

    def unanswered(self, waiter_ids: list[int], *, never_sent: bool = False) -> None:
        raise AssertionError("no request goes unanswered here")

    def max_streams_changed(self, max_streams: int) -> None:
        pass

    def out_of_turn(self, *, pipelined: bool) -> None:
        pass

    def goaway(self) -> None:
        pass

    def lost(self, answered: list[int], **kwargs: object) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    clock = Clock()
    monkeypatch.setattr(upstream_h2.time, "monotonic", clock)
    yield clock


def request(i: int) -> UpstreamRequest:
    return UpstreamRequest(b"GET", b"https", b"origin.test", f"/tile-{i}.png".encode(), [])


def requests_in(writes: list[bytes]) -> list[int]:
    """How many requests each write carried, as an origin reads them."""
    server = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=False, header_encoding=None)
    )
    server.initiate_connection()
    counts = []
    for data in writes:
        events = server.receive_data(data)
        counts.append(sum(isinstance(e, h2.events.RequestReceived) for e in events))
    return counts


async def connection() -> tuple[H2Upstream, KeptWrites]:
    transport = KeptWrites()
    wire = Wire(tls=None)
    wire.connection_made(transport)  # type: ignore[arg-type]
    upstream = H2Upstream(wire, Books())
    upstream.start()  # the preface: the first write
    return upstream, transport


def hand_over(upstream: H2Upstream, i: int) -> asyncio.Task[object]:
    """As the proxy hands a request over: run at once, up to waiting for the response."""
    return asyncio.Task(
        upstream.exchange(i, request(i)), loop=asyncio.get_running_loop(), eager_start=True
    )


async def finish(upstream: H2Upstream, tasks: list[asyncio.Task[object]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    upstream.close()


def burst(clock: Clock, count: int, step: float) -> tuple[list[int], list[int]]:
    """Hand `count` requests over in one turn of the event loop, the clock moving `step` after
    each (the proxy's work on the next): the requests each write carried before the turn ended,
    and after it."""

    async def scenario() -> tuple[list[int], list[int]]:
        upstream, transport = await connection()
        tasks = []
        for i in range(count):
            tasks.append(hand_over(upstream, i))
            clock.now += step
        during_the_turn = requests_in(transport.writes)
        await asyncio.sleep(0)
        after_it = requests_in(transport.writes)
        await finish(upstream, tasks)
        return during_the_turn, after_it

    return asyncio.run(scenario())


def test_requests_handed_over_together_leave_in_one_write(clock: Clock) -> None:
    during_the_turn, after_it = burst(clock, 5, COALESCE_SECONDS / 10)
    assert during_the_turn == [0], "nothing leaves before the turn ends"
    assert after_it == [0, 5]


def test_a_long_burst_starts_leaving_before_the_proxy_is_through_it(clock: Clock) -> None:
    # 12 requests, each taking the proxy 0.4 of the window to make: all within one turn of
    # the event loop, yet the first ones do not wait for the last.
    during_the_turn, counts = burst(clock, 12, COALESCE_SECONDS * 0.4)
    assert sum(during_the_turn) >= 9, during_the_turn
    assert sum(counts) == 12
    # Never one write per request: each write waited for what the window brought.
    assert all(count >= 3 for count in counts[1:-1]), counts


def test_a_lone_request_leaves_when_the_turn_ends(clock: Clock) -> None:
    _, after_it = burst(clock, 1, 0.0)  # no time passes: no timer holds it
    assert after_it == [0, 1]


class Recorded(Books):
    """The pool's side, keeping what the connection told it."""

    def __init__(self) -> None:
        self.told: list[object] = []

    def unanswered(self, waiter_ids: list[int], *, never_sent: bool = False) -> None:
        self.told.append(("unanswered", waiter_ids, never_sent))

    def goaway(self) -> None:
        self.told.append("goaway")


def test_a_connection_out_of_stream_ids_sends_the_request_elsewhere() -> None:
    from reshape.upstream.types import Unanswered

    async def scenario() -> tuple[list[object], bool]:
        transport = KeptWrites()
        wire = Wire(tls=None)
        wire.connection_made(transport)  # type: ignore[arg-type]
        books = Recorded()
        upstream = H2Upstream(wire, books)
        upstream.start()
        upstream.h2._next_stream_id = 2**31 + 1  # every id used
        with pytest.raises(Unanswered, match="no stream ids left"):
            await upstream.exchange(7, request(7))
        upstream.close()
        return books.told, upstream.goaway_received

    told, draining = asyncio.run(scenario())
    assert told == ["goaway", ("unanswered", [7], True)]  # never sent: may go anywhere
    assert draining
