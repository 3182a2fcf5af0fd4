"""HostPool.preconnect: warm connections, as pure bookkeeping."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reshape.upstream.pool import (
    Action,
    Assign,
    AssignKind,
    Close,
    CloseReason,
    HostPool,
    Open,
    PoolKey,
    Proto,
    Reject,
    RejectReason,
)
from tests.unit.upstream.test_pool import HTTPS_KEY, KEY, limits

H1, H2 = Proto.H1, Proto.H2
WARM_IDLE = 2.0


def make(key: PoolKey = KEY, **overrides: object) -> HostPool:
    return HostPool(key, limits(**{"max_connections": 6, **overrides}))


def opens(actions: list[Action]) -> list[Open]:
    return [a for a in actions if isinstance(a, Open)]


def test_opens_warm_connections_up_to_the_count() -> None:
    pool = make()
    actions = pool.preconnect(3, 0.0, idle_timeout=WARM_IDLE)
    assert actions == [Open(1, warm=True), Open(2, warm=True), Open(3, warm=True)]
    assert pool.active_connections == 3
    # Asked again: the connections under way already count.
    assert pool.preconnect(3, 0.1, idle_timeout=WARM_IDLE) == []
    assert opens(pool.preconnect(4, 0.1, idle_timeout=WARM_IDLE)) == [Open(4, warm=True)]


def test_warm_connections_count_against_the_per_host_cap() -> None:
    pool = make(max_connections=2)
    assert len(pool.preconnect(5, 0.0, idle_timeout=WARM_IDLE)) == 2
    pool.request(1, 0.0, idempotent=True)
    pool.request(2, 0.0, idempotent=True)
    assert pool.request(3, 0.0, idempotent=True) == []  # waits: no room for another connect
    assert pool.active_connections == 2


def test_one_connection_for_an_h2_origin() -> None:
    pool = make(HTTPS_KEY)  # ALPN not known yet: one connection, as for requests
    assert pool.preconnect(4, 0.0, idle_timeout=WARM_IDLE) == [Open(1, warm=True)]
    pool.connection_ready(1, H2, 0.1, max_streams=100)
    assert pool.preconnect(4, 0.2, idle_timeout=WARM_IDLE) == []


def test_an_https_origin_known_to_speak_http1_gets_several() -> None:
    pool = make(HTTPS_KEY)
    pool.learned_proto, pool.known_h2 = True, False
    assert len(pool.preconnect(3, 0.0, idle_timeout=WARM_IDLE)) == 3


def test_the_first_request_on_a_warm_connection_is_preconnected_the_next_reused() -> None:
    pool = make()
    pool.preconnect(1, 0.0, idle_timeout=WARM_IDLE)
    pool.connection_ready(1, H1, 0.1)
    assert pool.request(7, 0.5, idempotent=True) == [Assign(7, 1, AssignKind.PRECONNECTED, 0.0)]
    pool.request_done(1, 7, 0.6, reusable=True)
    assert pool.request(8, 0.7, idempotent=True) == [Assign(8, 1, AssignKind.REUSED, 0.0)]


def test_a_request_arriving_while_the_warm_connect_is_under_way_waits_for_it() -> None:
    pool = make()
    pool.preconnect(1, 0.0, idle_timeout=WARM_IDLE)
    assert pool.request(7, 0.01, idempotent=True) == []  # no second connect
    assert pool.connection_ready(1, H1, 0.05) == [
        Assign(7, 1, AssignKind.PRECONNECTED, pytest.approx(0.04))
    ]


def test_a_request_takes_a_warm_connection_before_an_idle_one() -> None:
    pool = make()
    pool.request(1, 0.0, idempotent=True)
    pool.connection_ready(1, H1, 0.0)
    pool.request_done(1, 1, 0.5, reusable=True)  # conn 1: idle, most recently used
    pool.preconnect(2, 0.6, idle_timeout=WARM_IDLE)  # conn 1 counts: one more
    pool.connection_ready(2, H1, 0.65)
    assert pool.request(2, 0.7, idempotent=True) == [Assign(2, 2, AssignKind.PRECONNECTED, 0.0)]


def test_spare_capacity_is_what_waiting_requests_leave() -> None:
    pool = make()
    pool.request(1, 0.0, idempotent=True)  # opens conn 1, for request 1
    assert opens(pool.preconnect(1, 0.0, idle_timeout=WARM_IDLE)) == [Open(2, warm=True)]


def test_an_unused_warm_connection_closes_after_its_own_idle_timeout() -> None:
    pool = make(idle_timeout=30.0)
    pool.preconnect(1, 0.0, idle_timeout=WARM_IDLE)
    pool.connection_ready(1, H1, 1.0)
    assert pool.next_deadline() == 1.0 + WARM_IDLE
    assert pool.tick(2.9) == []
    assert pool.tick(3.0) == [Close(1, CloseReason.IDLE_TIMEOUT)]


def test_a_used_warm_connection_keeps_the_pool_idle_timeout() -> None:
    pool = make(idle_timeout=30.0)
    pool.preconnect(1, 0.0, idle_timeout=WARM_IDLE)
    pool.connection_ready(1, H1, 0.0)
    pool.request(1, 0.5, idempotent=True)
    pool.request_done(1, 1, 1.0, reusable=True)
    assert pool.tick(1.0 + WARM_IDLE + 1) == []
    assert pool.tick(31.0) == [Close(1, CloseReason.IDLE_TIMEOUT)]


def test_a_warm_connect_that_fails_rejects_nobody_another_connect_serves() -> None:
    # A warm connection was opened for no request: its failure rejected the oldest waiter all
    # the same, though the connect opened for that request (and another warm one) was still
    # under way. A waiter is rejected once no connect under way is left to serve it.
    pool = make()
    assert pool.request(1, 0.0, idempotent=True) == [Open(1)]
    assert pool.preconnect(2, 0.0, idle_timeout=WARM_IDLE) == [
        Open(2, warm=True),
        Open(3, warm=True),
    ]
    assert pool.connection_failed(2, 0.5) == []
    assert pool.connection_ready(1, H1, 0.6) == [Assign(1, 1, AssignKind.NEW, 0.6)]
    # Waiting on warm connects alone: it fails with the last of them.
    pool = make()
    pool.preconnect(2, 0.0, idle_timeout=WARM_IDLE)
    assert pool.request(1, 0.1, idempotent=True) == []  # they cover it
    assert pool.connection_failed(1, 0.5) == []
    assert pool.connection_failed(2, 0.6) == [Reject(1, RejectReason.CONNECT_FAILED)]
    assert pool.active_connections == 0 and pool.queued == 0


def test_bad_arguments_are_refused() -> None:
    pool = make()
    with pytest.raises(ValueError, match="count"):
        pool.preconnect(-1, 0.0, idle_timeout=WARM_IDLE)
    with pytest.raises(ValueError, match="idle_timeout"):
        pool.preconnect(1, 0.0, idle_timeout=0)


def test_nothing_after_close_all() -> None:
    pool = make()
    pool.close_all(0.0)
    assert pool.preconnect(2, 0.0, idle_timeout=WARM_IDLE) == []


EVENTS = st.lists(
    st.one_of(
        st.tuples(st.just("preconnect"), st.integers(0, 4)),
        st.tuples(st.just("request"), st.booleans()),
        st.tuples(st.just("ready"), st.sampled_from(Proto)),
        st.tuples(st.just("failed"), st.integers(0, 3)),
        st.tuples(st.just("done"), st.booleans()),
        st.tuples(st.just("tick"), st.floats(0.1, 5.0)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(
    key=st.sampled_from([KEY, HTTPS_KEY]),
    cap=st.integers(1, 4),
    http2=st.booleans(),
    events=EVENTS,
)
def test_preconnect_keeps_the_pool_invariants(
    key: PoolKey, cap: int, http2: bool, events: list[tuple[str, object]]
) -> None:
    """Random mixes of preconnects and traffic: never above the cap, PRECONNECTED only for
    the first request on a connection preconnect opened, warm ones expire on their timeout;
    connects that fail leave no request waiting for nothing."""
    pool = HostPool(key, limits(max_connections=cap, http2=http2, idle_timeout=30.0))
    now = 0.0
    warm: set[int] = set()
    connecting: list[int] = []
    ready_at: dict[int, float] = {}
    served: dict[int, int] = {}
    in_flight: list[tuple[int, int]] = []
    queued: list[int] = []
    waiter = 0

    def play(actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Open):
                connecting.append(action.conn_id)
                if action.warm:
                    warm.add(action.conn_id)
            elif isinstance(action, Assign):
                queued.remove(action.waiter_id)
                first = served.get(action.conn_id, 0) == 0
                expected = action.conn_id in warm and first
                assert (action.kind is AssignKind.PRECONNECTED) == expected
                served[action.conn_id] = served.get(action.conn_id, 0) + 1
                in_flight.append((action.conn_id, action.waiter_id))
            elif isinstance(action, Close) and action.reason is CloseReason.IDLE_TIMEOUT:
                unused_warm = action.conn_id in warm and not served.get(action.conn_id)
                timeout = WARM_IDLE if unused_warm else 30.0
                assert now - ready_at[action.conn_id] >= timeout or served.get(action.conn_id)
            elif isinstance(action, Reject):
                queued.remove(action.waiter_id)
        assert pool.active_connections <= cap

    for event, arg in events:
        if event == "preconnect":
            assert isinstance(arg, int)
            play(pool.preconnect(arg, now, idle_timeout=WARM_IDLE))
        elif event == "request":
            waiter += 1
            queued.append(waiter)
            play(pool.request(waiter, now, idempotent=bool(arg)))
        elif event == "ready" and connecting:
            conn_id = connecting.pop(0)
            ready_at[conn_id] = now
            assert isinstance(arg, Proto)
            proto = arg if http2 or arg is H1 else H1
            play(pool.connection_ready(conn_id, proto, now, max_streams=10))
        elif event == "failed" and connecting:
            assert isinstance(arg, int)
            play(pool.connection_failed(connecting.pop(arg % len(connecting)), now))
        elif event == "done" and in_flight:
            conn_id, waiter_id = in_flight.pop(0)
            play(pool.request_done(conn_id, waiter_id, now, reusable=bool(arg)))
        elif event == "tick":
            assert isinstance(arg, float)
            now += arg
            play(pool.tick(now))
    # Every connect fails from now on, and every response ends: each request is served or
    # rejected, none left waiting for a connect that will never come.
    for _ in range(200):
        if connecting:
            play(pool.connection_failed(connecting.pop(0), now))
        elif in_flight:
            conn_id, waiter_id = in_flight.pop(0)
            play(pool.request_done(conn_id, waiter_id, now, reusable=False))
        else:
            break
    assert queued == [] and pool.queued == 0
