"""Engines sharing one connection budget through a real broker on a unix socket, in one process
(as the workers of `reshape run --workers N` do across processes:
tests/system/app/test_workers_budget.py), against real loopback origins that count their
connections."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from labkit.origins import Origin, nginx_origin
from labkit.pki import OriginPKI
from reshape.upstream.budget.broker import BudgetBroker
from reshape.upstream.budget.client import BudgetClient
from reshape.upstream.budget.messages import Takes
from reshape.upstream.engine import Engine, QueueRejected, Route
from reshape.upstream.observer import EngineObserver
from reshape.upstream.pool import PoolKey, PoolLimits, Proto
from tests.support.inprocess_engine import HOST, DelayingOrigin, fetch, limits
from tests.support.node_origin import node_origin

SHARED_ORIGIN_HOST = "127.0.0.92"


@contextlib.asynccontextmanager
async def workers(
    count: int, trust: Path | None = None, *, budget: bool = True
) -> AsyncIterator[tuple[BudgetBroker, list[Engine]]]:
    """`count` engines, each with a budget client of one broker (none with `budget=False`)."""
    # A short path: a unix socket's name has room for 107 bytes.
    directory = Path(tempfile.mkdtemp(prefix="reshape-budget-"))
    broker = BudgetBroker(directory / "budget.sock")
    await broker.start()
    engines: list[Engine] = []
    clients: list[BudgetClient] = []
    try:
        for _ in range(count):
            engine = Engine(trust)
            engine.start()
            engines.append(engine)
            if budget:
                client = await BudgetClient.connect(broker.path, engine)
                engine.budget = client
                clients.append(client)
        yield broker, engines
    finally:
        for engine in engines:
            await engine.stop()
        for client in clients:
            await client.close()
        await broker.stop()
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.asynccontextmanager
async def delaying_origin(
    origin: DelayingOrigin | None = None,
) -> AsyncIterator[DelayingOrigin]:
    origin = origin or DelayingOrigin()
    server = await asyncio.start_server(origin.handle, HOST, 0)
    origin.port = server.sockets[0].getsockname()[1]
    try:
        yield origin
    finally:
        server.close()


class OpenConnections(EngineObserver):
    """Keeps the count of connections open each time the engine reports it."""

    def __init__(self, counts: list[int]) -> None:
        self.counts = counts

    def connections_changed(self, active: int, most_per_host: int) -> None:
        self.counts.append(active)


def route_to(origin: DelayingOrigin, pool_limits: PoolLimits) -> Route:
    return Route(PoolKey("http", HOST, origin.port, None), pool_limits, 5.0, 5.0, "p", "-")


async def wait_for(condition: object, what: str) -> None:
    """Until `condition()` holds (2 s at most)."""
    assert callable(condition)
    for _ in range(100):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"never: {what}")


@pytest.mark.parametrize(("budget", "most_open"), [(True, 2), (False, 4)])
@pytest.mark.asyncio
async def test_two_workers_together_never_open_more_than_the_cap(
    budget: bool, most_open: int
) -> None:
    async with delaying_origin() as origin, workers(2, budget=budget) as (_, engines):
        route = route_to(origin, limits(connections=2))
        loads = [
            fetch(engine, route, f"/0.05/{name}{i}")
            for i in range(10)
            for engine, name in zip(engines, "ab", strict=True)
        ]
        bodies = await asyncio.gather(*loads)
        assert sorted(bodies) == sorted(f"{n}{i}".encode() for i in range(10) for n in "ab")
        # Without the budget, each worker keeps its own cap of 2: the control shows the test
        # would see it.
        assert origin.most_open == most_open


@pytest.mark.asyncio
async def test_a_worker_gets_a_slot_that_another_holds_idle() -> None:
    async with delaying_origin() as origin, workers(2) as (broker, (a, b)):
        route = route_to(origin, limits(connections=2))  # no idle timeout: kept for ever
        await asyncio.gather(fetch(a, route, "/0.05/1"), fetch(a, route, "/0.05/2"))
        assert a.pools[route.pool_id].active_connections == 2
        # B holds none; A holds both, idle: A is asked to keep one and closes the other. (B's
        # request would be rejected after its queue timeout, 3 s, otherwise.)
        assert await fetch(b, route, "/0/3") == b"3"
        assert a.pools[route.pool_id].active_connections == 1
        assert origin.most_open == 2
        assert broker.stats.reclaims >= 1


@pytest.mark.asyncio
async def test_a_worker_lends_a_connection_once_it_has_stayed_idle() -> None:
    async with delaying_origin() as origin, workers(2) as (_, (a, b)):
        route = route_to(origin, limits(connections=2))
        await fetch(a, route, "/0/1")
        await fetch(b, route, "/0/2")
        # B wants a second while it has one and A has one, idle: not an unfair split, so A
        # gives its connection only once it has stayed idle a moment (it would keep it for a
        # request that came in time).
        assert await asyncio.gather(fetch(b, route, "/0.3/3"), fetch(b, route, "/0.3/4")) == [
            b"3",
            b"4",
        ]
        assert route.pool_id not in a.pools or a.pools[route.pool_id].active_connections == 0
        assert b.pools[route.pool_id].active_connections == 2
        assert origin.most_open == 2


@pytest.mark.asyncio
async def test_a_busy_worker_gives_a_slot_to_one_that_has_none() -> None:
    async with delaying_origin() as origin, workers(2) as (_, (a, b)):
        route = route_to(origin, limits(connections=2))
        done: list[str] = []

        async def load(engine: Engine, name: str, delay: float) -> None:
            await fetch(engine, route, f"/{delay}/{name}")
            done.append(name)

        busy = [asyncio.create_task(load(a, f"a{i}", 0.2)) for i in range(8)]
        await wait_for(
            lambda: route.pool_id in a.pools and a.pools[route.pool_id].in_flight == 2,
            "A busy on both",
        )
        await load(b, "b", 0)
        # B was served after one of A's responses, not after A's whole queue (4 rounds).
        assert done.index("b") <= 2, done
        await asyncio.gather(*busy)
        assert origin.most_open == 2


@pytest.mark.asyncio
async def test_the_slots_of_a_worker_that_dies_come_back() -> None:
    async with delaying_origin() as origin, workers(2) as (broker, (a, b)):
        route = route_to(origin, limits(connections=2))
        await asyncio.gather(fetch(a, route, "/0/1"), fetch(a, route, "/0/2"))
        (name,) = broker.ledger.pools()
        assert broker.ledger.held(name) == {1: 2}
        # A worker's death, as the broker sees it: its socket closes with nothing said (and
        # the kernel closes its origin connections).
        assert isinstance(a.budget, BudgetClient)
        a.budget._writer.transport.abort()
        a.budget = None
        await a.stop()
        await wait_for(lambda: broker.workers == 1, "the broker saw the worker go")
        assert broker.ledger.pools() == []
        # Both slots are free at once: no reclaim, nobody to ask.
        reclaims = broker.stats.reclaims
        assert await asyncio.gather(fetch(b, route, "/0.05/3"), fetch(b, route, "/0.05/4")) == [
            b"3",
            b"4",
        ]
        assert broker.stats.reclaims == reclaims
        assert b.pools[route.pool_id].active_connections == 2


@pytest.mark.asyncio
async def test_a_request_waits_for_a_slot_no_longer_than_its_queue_timeout() -> None:
    async with delaying_origin() as origin, workers(2) as (_, (a, b)):
        quick = PoolLimits(1, 100, 0.3, float("inf"), 0, False)
        route = route_to(origin, quick)
        b_open: list[int] = []  # B's connections open now, each time it said
        b.observer = OpenConnections(b_open)
        held = asyncio.create_task(fetch(a, route, "/2/long"))
        await wait_for(
            lambda: route.pool_id in a.pools and a.pools[route.pool_id].in_flight == 1,
            "A's request sent",
        )
        with pytest.raises(QueueRejected, match="waited too long"):
            await fetch(b, route, "/0/never")
        # B's connect, which waited for the slot, did not outlive its request: it no longer
        # asks A for the slot, and A keeps its connection after its response.
        await wait_for(lambda: not b.connections, "B's connect dropped")
        # Nor did it count as open while it waited (reshape_upstream_connections_active).
        assert b_open == []
        assert await held == b"long"
        await asyncio.sleep(0.1)
        assert a.pools[route.pool_id].active_connections == 1
        assert origin.connections == 1


@pytest.mark.asyncio
async def test_a_broken_pipeline_is_known_to_every_worker_and_to_later_ones() -> None:
    closing = DelayingOrigin(close_after_response=True)
    async with delaying_origin(closing) as origin, workers(2) as (broker, (a, b)):
        route = route_to(origin, limits(connections=2, pipeline_depth=4))
        # B's pool exists (a slow request in flight on one slot) before A learns anything.
        slow = asyncio.create_task(fetch(b, route, "/1.5/slow"))
        await wait_for(lambda: route.pool_id in b.pools, "B's pool")
        # A has the other slot: its requests are pipelined behind its first response, and the
        # origin closes after that one without saying so.
        await asyncio.gather(*(fetch(a, route, f"/0.05/{i}") for i in range(5)))
        assert a.breaks_pipelining(route.key)  # its pool may have gone: its connections did
        await wait_for(lambda: b.pools[route.pool_id].pipelining_broken, "B knows it")
        assert await slow == b"slow"
        # A worker started later (one that replaces a dead one) hears it on connecting.
        late = Engine(None)
        client = await BudgetClient.connect(broker.path, late)
        late.budget = client
        try:
            await wait_for(lambda: client.breaks_pipelining(route.key), "a late one knows")
            assert late._pool(route).pipelining_broken
        finally:
            await late.stop()
            await client.close()


@pytest.fixture
def site(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    root.mkdir()
    (root / "x.txt").write_text("x")
    return root


@pytest.fixture
def h1_over_tls(site: Path, origin_pki: OriginPKI) -> Iterator[Origin]:
    cert = origin_pki.issue([SHARED_ORIGIN_HOST])
    with nginx_origin(site, SHARED_ORIGIN_HOST, tls=cert) as origin:
        yield origin


@pytest.mark.asyncio
async def test_workers_share_which_protocol_an_origin_speaks(
    h1_over_tls: Origin, origin_pki: OriginPKI
) -> None:
    async with workers(2, origin_pki.ca_cert_path) as (_, (a, b)):
        key = PoolKey("https", SHARED_ORIGIN_HOST, h1_over_tls.port, SHARED_ORIGIN_HOST)
        route = Route(key, PoolLimits(4, 100, 5.0, 60.0, 0, True), 5.0, 5.0, "p", "-")
        assert await fetch(a, route, "/x.txt") == b"x"
        assert isinstance(b.budget, BudgetClient)
        client = b.budget
        await wait_for(lambda: client.protocol(key) is Proto.H1, "B heard it")
        # An https origin B has never reached: without what A learned, B's pool would probe it
        # with one connection (it might speak h2); knowing it speaks HTTP/1.1, three requests
        # open three connections at once.
        pending = [asyncio.create_task(fetch(b, route, "/x.txt")) for _ in range(3)]
        await asyncio.sleep(0)
        pool = b.pools[route.pool_id]
        assert pool.learned_proto and not pool.known_h2
        assert pool.active_connections == 3
        assert await asyncio.gather(*pending) == [b"x"] * 3


@pytest.mark.asyncio
async def test_workers_share_how_many_requests_an_origin_takes_on_a_connection(
    tmp_path: Path,
) -> None:
    """Node says `Keep-Alive: max=3` (its total): once A has heard it, B's pools, and those of
    a worker started later, pipeline no more than 3 onto a new connection from the start."""
    with node_origin(tmp_path / "node", HOST, max_requests_per_socket=3) as origin:
        async with workers(2) as (broker, (a, b)):
            key = PoolKey("http", origin.host, origin.port, None)
            route = Route(key, limits(connections=1, pipeline_depth=8), 5.0, 5.0, "p", "-")
            assert await fetch(a, route, "/x") == b"GET /x 0\n"
            assert isinstance(b.budget, BudgetClient)
            client = b.budget
            await wait_for(lambda: client.requests_per_connection(key) == 3, "B heard it")
            assert b._pool(route).requests_per_connection == 3
            late = Engine(None)
            late_client = await BudgetClient.connect(broker.path, late)
            late.budget = late_client
            try:
                await wait_for(
                    lambda: late_client.requests_per_connection(key) == 3, "a late one heard it"
                )
                assert late._pool(route).requests_per_connection == 3
            finally:
                await late.stop()
                await late_client.close()


@pytest.mark.asyncio
async def test_an_origin_whose_counts_disagree_is_told_of_twice_a_connection_at_most(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Backends behind one name set apart (one takes 500 requests a connection, the other
    900): each answer says another count. The other workers hear of it twice per connection
    at most, not once per answer."""

    async def alternating(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        answered = 0
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                await reader.readuntil(b"\r\n\r\n")
                answered += 1
                most = 500 if answered % 2 else 900
                writer.write(
                    b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=60, max=%d\r\n"
                    b"Content-Length: 1\r\n\r\nx" % most
                )
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(alternating, HOST, 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with workers(2) as (_, (a, _b)):
            assert isinstance(a.budget, BudgetClient)
            told: list[object] = []
            send = a.budget._send
            monkeypatch.setattr(a.budget, "_send", lambda m: (told.append(m), send(m))[1])
            route = Route(PoolKey("http", HOST, port, None), limits(), 5.0, 5.0, "p", "-")
            for n in range(20):
                assert await fetch(a, route, f"/{n}") == b"x"
            assert a.pools[route.pool_id].active_connections == 1
            assert len([m for m in told if isinstance(m, Takes)]) == 2
    finally:
        server.close()


def test_a_pool_has_one_name_in_every_worker_and_each_pool_its_own() -> None:
    """The broker knows a pool by its name: each worker builds its routes with its own objects
    (its own address book), and the same knobs must still name the same pool."""
    from reshape.base.addresses import ListenAddress
    from reshape.features.destinations.rules import OwnAddressBook, OwnAddresses
    from reshape.features.pool.routes import Destination, route
    from reshape.policy.schema import DestinationKnobs, Policy, TlsRecordKnobs, UpstreamKnobs
    from reshape.upstream.budget.client import pool_name

    def worker_route(policy: Policy) -> Route:
        own = OwnAddressBook(OwnAddresses.of([ListenAddress("127.0.0.1", 8080)]))
        destination = Destination.of("https", "origin.test", 443)
        return route(destination, policy, "p", "-", client="client-1", own=own)

    policy = Policy(
        upstream=UpstreamKnobs(max_connections_per_host=2),
        tls_records=TlsRecordKnobs(side="both"),
        destinations=DestinationKnobs(private="deny"),
    )
    names = {pool_name(worker_route(policy).pool_id) for _ in range(2)}
    assert len(names) == 1
    (name,) = names
    assert name.startswith("https://origin.test:443#") and " at 0x" not in name
    others = [
        Policy(upstream=UpstreamKnobs(max_connections_per_host=3)),
        Policy(upstream=UpstreamKnobs(max_connections_per_host=2), tls_records=policy.tls_records),
        Policy(
            upstream=UpstreamKnobs(max_connections_per_host=2),
            tls_records=policy.tls_records,
            destinations=DestinationKnobs(private="deny", loopback="deny"),
        ),
    ]
    assert len({name, *(pool_name(worker_route(p).pool_id) for p in others)}) == 4
