from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from reshape.upstream.pool import (
    MAX_ATTEMPTS,
    MAX_FREE_GOES,
    Action,
    Assign,
    AssignKind,
    Close,
    CloseReason,
    Fail,
    FailReason,
    HostPool,
    Open,
    PoolKey,
    PoolLimits,
    Proto,
    Reject,
    RejectReason,
    Retry,
)

KEY = PoolKey("http", "origin.test", 80, None)
HTTPS_KEY = PoolKey("https", "origin.test", 443, "origin.test")
NEW, REUSED, PIPELINED, MULTIPLEXED, PRECONNECTED = (
    AssignKind.NEW,
    AssignKind.REUSED,
    AssignKind.PIPELINED,
    AssignKind.MULTIPLEXED,
    AssignKind.PRECONNECTED,
)
H1, H2 = Proto.H1, Proto.H2


def limits(**overrides: object) -> PoolLimits:
    base: dict[str, object] = {
        "max_connections": 1,
        "max_queue": 10,
        "queue_timeout": 5.0,
        "idle_timeout": 30.0,
        "pipeline_depth": 0,
        "http2": True,
    }
    return PoolLimits(**{**base, **overrides})  # type: ignore[arg-type]


def make(**overrides: object) -> HostPool:
    return HostPool(KEY, limits(**overrides))


def busy_h1(pool: HostPool, conns: int, *, idempotent: bool = True) -> None:
    """Open `conns` HTTP/1.1 connections, each carrying one request (waiters 101, 102, ...)."""
    for n in range(conns):
        pool.request(101 + n, 0.0, idempotent=idempotent)
    for n in range(conns):
        pool.connection_ready(n + 1, H1, 0.0)
    assert pool.in_flight == conns and pool.queued == 0


# -- rule 1: HTTP/2 streams


def test_h2_multiplexes_up_to_max_streams() -> None:
    pool = make()
    assert pool.request(1, 0.0, idempotent=True) == [Open(1)]
    assert pool.request(2, 0.0, idempotent=False) == []
    assert pool.request(3, 0.0, idempotent=True) == []
    assert pool.connection_ready(1, H2, 0.5, max_streams=2) == [
        Assign(1, 1, NEW, 0.5),
        Assign(2, 1, MULTIPLEXED, 0.5),
    ]
    assert pool.request_done(1, 1, 1.0, reusable=True) == [Assign(3, 1, MULTIPLEXED, 1.0)]
    assert pool.request_done(1, 2, 1.0, reusable=True) == []
    assert pool.request_done(1, 3, 1.0, reusable=True) == []
    assert pool.request(4, 2.0, idempotent=True) == [Assign(4, 1, REUSED, 0.0)]


def test_h2_stream_is_preferred_to_an_idle_h1_connection() -> None:
    pool = make(max_connections=2)
    pool.request(1, 0.0, idempotent=True)
    pool.request(2, 0.0, idempotent=True)
    assert pool.connection_ready(1, H1, 0.0) == [Assign(1, 1, NEW, 0.0)]
    assert pool.connection_ready(2, H2, 0.0, max_streams=5) == [Assign(2, 2, NEW, 0.0)]
    pool.request_done(1, 1, 1.0, reusable=True)
    assert pool.request(3, 1.0, idempotent=True) == [Assign(3, 2, MULTIPLEXED, 0.0)]


def test_max_streams_changed_raises_and_lowers_capacity() -> None:
    pool = make()
    for w in (1, 2, 3):
        pool.request(w, 0.0, idempotent=True)
    assert pool.connection_ready(1, H2, 0.0, max_streams=1) == [Assign(1, 1, NEW, 0.0)]
    assert pool.max_streams_changed(1, 3, 1.0) == [
        Assign(2, 1, MULTIPLEXED, 1.0),
        Assign(3, 1, MULTIPLEXED, 1.0),
    ]
    assert pool.max_streams_changed(1, 1, 2.0) == []
    pool.request_done(1, 1, 2.0, reusable=True)
    # Two streams still in flight above the new limit of one: nothing new on it.
    assert pool.request(4, 2.0, idempotent=True) == []
    pool.request_done(1, 2, 3.0, reusable=True)
    assert pool.request_done(1, 3, 3.0, reusable=True) == [Assign(4, 1, REUSED, 1.0)]


def test_goaway_takes_no_new_streams_and_closes_when_drained() -> None:
    pool = make()
    pool.request(1, 0.0, idempotent=True)
    pool.connection_ready(1, H2, 0.0, max_streams=100)
    assert pool.goaway(1, 1.0) == []
    assert pool.request(2, 1.0, idempotent=True) == []  # the draining connection holds the cap
    assert pool.request_done(1, 1, 2.0, reusable=True) == [Close(1, CloseReason.GOAWAY), Open(2)]
    assert pool.connection_ready(2, H2, 2.5) == [Assign(2, 2, NEW, 1.5)]


def test_goaway_on_an_idle_connection_closes_it_at_once() -> None:
    pool = make()
    pool.request(1, 0.0, idempotent=True)
    pool.connection_ready(1, H2, 0.0, max_streams=100)
    pool.request_done(1, 1, 0.0, reusable=True)
    assert pool.goaway(1, 1.0) == [Close(1, CloseReason.GOAWAY)]
    assert pool.active_connections == 0


# -- rule 2: idle HTTP/1.1 connections


def test_idle_h1_connection_is_reused() -> None:
    pool = make()
    assert pool.request(1, 0.0, idempotent=True) == [Open(1)]
    assert pool.connection_ready(1, H1, 0.25) == [Assign(1, 1, NEW, 0.25)]
    assert pool.request_done(1, 1, 1.0, reusable=True) == []
    assert pool.request(2, 2.0, idempotent=False) == [Assign(2, 1, REUSED, 0.0)]


def test_the_most_recently_used_idle_connection_is_preferred() -> None:
    pool = make(max_connections=3)
    busy_h1(pool, 3)
    pool.request_done(2, 102, 1.0, reusable=True)
    pool.request_done(3, 103, 3.0, reusable=True)
    pool.request_done(1, 101, 2.0, reusable=True)
    assert pool.request(1, 4.0, idempotent=True) == [Assign(1, 3, REUSED, 0.0)]
    assert pool.request(2, 4.0, idempotent=True) == [Assign(2, 1, REUSED, 0.0)]


def test_not_reusable_connection_closes_when_nothing_is_in_flight() -> None:
    pool = make(pipeline_depth=3)
    busy_h1(pool, 1)
    assert pool.request(1, 0.0, idempotent=True) == [Assign(1, 1, PIPELINED, 0.0)]
    assert pool.request(2, 0.0, idempotent=True) == [Assign(2, 1, PIPELINED, 0.0)]
    # The first response says "Connection: close": the two behind it still finish.
    assert pool.request_done(1, 101, 1.0, reusable=False) == []
    assert pool.request(3, 1.0, idempotent=True) == []  # no more on the closing connection
    assert pool.request_done(1, 1, 1.5, reusable=True) == []
    assert pool.request_done(1, 2, 2.0, reusable=True) == [
        Close(1, CloseReason.NOT_REUSABLE),
        Open(2),
    ]


# -- rule 3: opening connections


@pytest.mark.parametrize(
    ("max_connections", "waiters", "opens"),
    [(1, 1, 1), (1, 3, 1), (4, 3, 3), (4, 6, 4)],
)
def test_one_open_per_waiter_up_to_the_cap(max_connections: int, waiters: int, opens: int) -> None:
    pool = make(max_connections=max_connections)
    actions = [a for w in range(waiters) for a in pool.request(w, 0.0, idempotent=True)]
    assert actions == [Open(n + 1) for n in range(opens)]
    assert pool.active_connections == opens and pool.queued == waiters


def test_a_connect_under_way_is_capacity_for_the_next_waiter() -> None:
    pool = make(max_connections=4)
    assert pool.request(1, 0.0, idempotent=True) == [Open(1)]
    assert pool.cancel(1, 0.1) == []
    assert pool.request(2, 0.5, idempotent=True) == []  # connection 1 is coming for it
    assert pool.connection_ready(1, H1, 1.0) == [Assign(2, 1, NEW, 0.5)]


def test_a_full_h2_connection_is_waited_for_not_added_to() -> None:
    pool = make(max_connections=4)
    pool.request(1, 0.0, idempotent=True)
    pool.connection_ready(1, H2, 0.0, max_streams=1)
    assert pool.request(2, 0.0, idempotent=True) == []
    assert pool.request(3, 0.0, idempotent=True) == []
    assert pool.request_done(1, 1, 1.0, reusable=True) == [Assign(2, 1, REUSED, 1.0)]


@pytest.mark.parametrize(("http2", "opens"), [(True, 1), (False, 3)])
def test_a_known_h2_origin_gets_one_connect_at_a_time(http2: bool, opens: int) -> None:
    pool = make(max_connections=4, http2=http2)
    pool.request(1, 0.0, idempotent=True)
    pool.connection_ready(1, H2, 0.0, max_streams=1)  # busy with waiter 1
    pool.goaway(1, 0.0)  # ... and going away: a replacement is needed
    actions = [a for w in (2, 3, 4) for a in pool.request(w, 0.0, idempotent=True)]
    assert actions == [Open(n) for n in range(2, 2 + opens)]
    if http2:
        assert pool.connection_ready(2, H2, 0.5, max_streams=10) == [
            Assign(2, 2, NEW, 0.5),
            Assign(3, 2, MULTIPLEXED, 0.5),
            Assign(4, 2, MULTIPLEXED, 0.5),
        ]


def test_an_h1_answer_forgets_that_the_origin_spoke_h2() -> None:
    pool = make(max_connections=4)
    pool.request(1, 0.0, idempotent=True)
    pool.connection_ready(1, H2, 0.0, max_streams=1)
    pool.goaway(1, 0.0)
    assert pool.known_h2
    assert pool.request(2, 0.0, idempotent=True) == [Open(2)]
    pool.connection_ready(2, H1, 0.0)
    assert not pool.known_h2
    assert pool.request(3, 0.0, idempotent=True) == [Open(3)]
    assert pool.request(4, 0.0, idempotent=True) == [Open(4)]


def test_connect_failure_rejects_the_oldest_waiter_and_tries_again_for_the_rest() -> None:
    pool = make()
    for w in (1, 2, 3):
        pool.request(w, 0.0, idempotent=True)
    assert pool.connection_failed(1, 1.0) == [Reject(1, RejectReason.CONNECT_FAILED), Open(2)]
    assert pool.connection_ready(2, H1, 1.5) == [Assign(2, 2, NEW, 1.5)]


def test_connect_failure_with_nobody_waiting_only_frees_the_slot() -> None:
    pool = make()
    pool.request(1, 0.0, idempotent=True)
    pool.cancel(1, 0.0)
    assert pool.connection_failed(1, 1.0) == []
    assert pool.active_connections == 0
    assert pool.request(2, 1.0, idempotent=True) == [Open(2)]


def test_losing_a_connection_that_was_still_connecting_is_a_failed_connect() -> None:
    pool = make()
    pool.request(1, 0.0, idempotent=True)
    assert pool.connection_lost(1, 1.0, unanswered=[]) == [Reject(1, RejectReason.CONNECT_FAILED)]


# -- rule 4: pipelining


def test_pipelines_idempotent_requests_at_the_cap_on_the_least_loaded_connection() -> None:
    pool = make(max_connections=2, pipeline_depth=3)
    busy_h1(pool, 2)
    assert pool.request(1, 0.0, idempotent=True) == [Assign(1, 1, PIPELINED, 0.0)]
    assert pool.request(2, 0.0, idempotent=True) == [Assign(2, 2, PIPELINED, 0.0)]
    pool.request_done(1, 101, 0.5, reusable=True)
    assert pool.request(3, 1.0, idempotent=True) == [Assign(3, 1, PIPELINED, 0.0)]
    assert pool.request(4, 1.0, idempotent=True) == [Assign(4, 1, PIPELINED, 0.0)]  # a tie
    assert pool.request(5, 1.0, idempotent=True) == [Assign(5, 2, PIPELINED, 0.0)]
    assert pool.request(6, 1.0, idempotent=True) == []  # both at depth 3
    assert pool.request_done(2, 102, 2.0, reusable=True) == [Assign(6, 2, PIPELINED, 1.0)]


def test_never_pipelines_a_non_idempotent_request() -> None:
    pool = make(pipeline_depth=3)
    busy_h1(pool, 1)
    assert pool.request(1, 0.0, idempotent=False) == []
    assert pool.request_done(1, 101, 1.0, reusable=True) == [Assign(1, 1, REUSED, 1.0)]


def test_never_pipelines_behind_a_non_idempotent_request() -> None:
    pool = make(pipeline_depth=3)
    busy_h1(pool, 1, idempotent=False)
    assert pool.request(1, 0.0, idempotent=True) == []


def test_opens_a_connection_rather_than_pipelining() -> None:
    pool = make(max_connections=2, pipeline_depth=3)
    busy_h1(pool, 1)
    assert pool.request(1, 0.0, idempotent=True) == [Open(2)]


def test_pipelines_only_what_connects_under_way_cannot_cover_oldest_first() -> None:
    pool = make(max_connections=2, pipeline_depth=3)
    busy_h1(pool, 1)
    assert pool.request(1, 0.0, idempotent=True) == [Open(2)]
    # Connection 2 covers one waiter; the older one is pipelined, the newer one takes 2.
    assert pool.request(2, 0.5, idempotent=True) == [Assign(1, 1, PIPELINED, 0.5)]
    assert pool.connection_ready(2, H1, 1.0) == [Assign(2, 2, NEW, 0.5)]


@pytest.mark.parametrize("pipeline_depth", [0, 1])
def test_depth_below_two_means_no_pipelining(pipeline_depth: int) -> None:
    pool = make(pipeline_depth=pipeline_depth)
    busy_h1(pool, 1)
    assert pool.request(1, 0.0, idempotent=True) == []


def test_a_non_idempotent_waiter_holds_back_a_connection_so_it_cannot_starve() -> None:
    pool = make(max_connections=2, pipeline_depth=3)
    busy_h1(pool, 2)
    assert pool.request(1, 0.0, idempotent=False) == []  # holds back connection 1
    # Idempotent requests behind it may pass it, but only on connection 2.
    assert pool.request(2, 0.0, idempotent=True) == [Assign(2, 2, PIPELINED, 0.0)]
    assert pool.request(3, 0.0, idempotent=True) == [Assign(3, 2, PIPELINED, 0.0)]
    assert pool.request(4, 0.0, idempotent=True) == []
    assert pool.request_done(1, 101, 1.0, reusable=True) == [Assign(1, 1, REUSED, 1.0)]


@settings(max_examples=100, deadline=None)
@given(
    connections=st.integers(1, 3),
    pipeline_depth=st.integers(2, 4),
    ahead=st.integers(0, 8),
    arrivals=st.integers(1, 3),
)
def test_a_non_idempotent_waiter_is_served_under_steady_pipelined_load(
    connections: int, pipeline_depth: int, ahead: int, arrivals: int
) -> None:
    """New idempotent requests keep arriving as responses end (oldest first); they must not
    keep every connection busy forever while a non-idempotent request waits for an idle one."""
    pool = make(max_connections=connections, pipeline_depth=pipeline_depth, max_queue=10**6)
    busy_h1(pool, connections)
    in_flight = [(n + 1, 101 + n) for n in range(connections)]  # (conn, waiter), oldest first
    waiters = iter(range(1000, 10**6))

    def play(actions: list[Action]) -> None:
        in_flight.extend((a.conn_id, a.waiter_id) for a in actions if isinstance(a, Assign))

    for _ in range(ahead):
        play(pool.request(next(waiters), 0.0, idempotent=True))
    play(pool.request(1, 0.0, idempotent=False))
    for _ in range(200):
        if any(waiter == 1 for _, waiter in in_flight):
            return
        for _ in range(arrivals):
            play(pool.request(next(waiters), 0.0, idempotent=True))
        conn_id, waiter_id = in_flight.pop(0)
        play(pool.request_done(conn_id, waiter_id, 0.0, reusable=True))
    raise AssertionError(f"starved: {pool!r}")


def test_with_one_connection_a_non_idempotent_waiter_blocks_pipelining_behind_it() -> None:
    pool = make(pipeline_depth=3)
    busy_h1(pool, 1)
    assert pool.request(1, 0.0, idempotent=False) == []
    assert pool.request(2, 0.0, idempotent=True) == []
    assert pool.request_done(1, 101, 1.0, reusable=True) == [Assign(1, 1, REUSED, 1.0)]
    # Connection 1 now carries a non-idempotent request: still nothing behind it.
    assert pool.request_done(1, 1, 2.0, reusable=True) == [Assign(2, 1, REUSED, 2.0)]


def test_losing_a_pipeline_marks_the_origin_broken_for_good() -> None:
    pool = make(pipeline_depth=3)
    busy_h1(pool, 1)
    pool.request(1, 0.0, idempotent=True)
    assert pool.connection_lost(1, 1.0, unanswered=[1]) == [Retry(1), Open(2)]
    assert pool.pipelining_broken
    pool.connection_ready(2, H1, 1.0)
    assert pool.request(2, 1.0, idempotent=True) == []
    assert pool.request_done(2, 1, 2.0, reusable=True) == [Assign(2, 2, REUSED, 1.0)]
    pool.request_done(2, 2, 2.0, reusable=True)
    assert pool.pipelining_broken


def test_losing_a_single_request_does_not_mark_pipelining_broken() -> None:
    pool = make(pipeline_depth=3)
    busy_h1(pool, 1)
    pool.connection_lost(1, 1.0, unanswered=[101])
    assert not pool.pipelining_broken


def test_pipelining_failed_stops_pipelining() -> None:
    pool = make(pipeline_depth=3)
    busy_h1(pool, 1)
    assert pool.pipelining_failed(0.0) == []
    assert pool.request(1, 0.0, idempotent=True) == []


# -- rule 5: the queue


@pytest.mark.parametrize(
    ("max_queue", "admitted"),
    [
        (0, 1),  # max_queue 0 still opens a connection for a request
        (1, 2),
        (3, 4),
    ],
)
def test_queue_full_rejects_at_once(max_queue: int, admitted: int) -> None:
    pool = make(max_queue=max_queue)
    for w in range(admitted):
        assert Reject(w, RejectReason.QUEUE_FULL) not in pool.request(w, 0.0, idempotent=True)
    assert pool.request(99, 0.0, idempotent=True) == [Reject(99, RejectReason.QUEUE_FULL)]
    assert pool.queued == admitted


def test_queue_timeout_rejects_at_the_deadline() -> None:
    pool = make(queue_timeout=5.0)
    pool.request(1, 0.0, idempotent=True)
    pool.request(2, 1.0, idempotent=True)
    assert pool.next_deadline() == 5.0
    assert pool.tick(4.9) == []
    assert pool.tick(5.0) == [Reject(1, RejectReason.QUEUE_TIMEOUT)]
    assert pool.next_deadline() == 6.0
    assert pool.tick(6.0) == [Reject(2, RejectReason.QUEUE_TIMEOUT)]
    assert pool.next_deadline() is None  # the connect under way has no deadline here


def test_cancel_leaves_the_queue_and_later_cancels_are_ignored() -> None:
    pool = make()
    pool.request(1, 0.0, idempotent=True)
    pool.request(2, 0.0, idempotent=True)
    assert pool.cancel(1, 0.1) == []
    assert pool.cancel(1, 0.1) == []
    assert pool.connection_ready(1, H1, 0.5) == [Assign(2, 1, NEW, 0.5)]
    assert pool.cancel(2, 0.6) == []  # assigned: request_done gives it back
    assert pool.in_flight == 1


def test_a_waiter_id_in_use_is_refused() -> None:
    pool = make()
    pool.request(1, 0.0, idempotent=True)
    with pytest.raises(ValueError, match="already waiting"):
        pool.request(1, 0.0, idempotent=True)


# -- idle connections


def test_idle_connection_expires() -> None:
    pool = make(idle_timeout=30.0)
    pool.request(1, 0.0, idempotent=True)
    pool.connection_ready(1, H1, 0.0)
    pool.request_done(1, 1, 1.0, reusable=True)
    assert pool.next_deadline() == 31.0
    assert pool.tick(30.9) == []
    assert pool.tick(31.0) == [Close(1, CloseReason.IDLE_TIMEOUT)]
    assert pool.next_deadline() is None


def test_an_expired_connection_is_never_handed_out() -> None:
    pool = make(idle_timeout=30.0)
    pool.request(1, 0.0, idempotent=True)
    pool.connection_ready(1, H1, 0.0)
    pool.request_done(1, 1, 1.0, reusable=True)
    assert pool.request(2, 40.0, idempotent=True) == [Close(1, CloseReason.IDLE_TIMEOUT), Open(2)]


def test_an_origins_keep_alive_timeout_closes_the_idle_connection_first() -> None:
    # Apache's `Keep-Alive: timeout=5`: the pool's side closes at 4 s (keep_alive.py's
    # margin), before the origin's close could race a request; a request at 4 s opens anew.
    pool = make(idle_timeout=30.0)
    pool.request(1, 0.0, idempotent=False)
    pool.connection_ready(1, H1, 0.0)
    assert pool.request_done(1, 1, 1.0, reusable=True, idle_timeout=4.0) == []
    assert pool.next_deadline() == 5.0
    assert pool.request(2, 5.0, idempotent=False) == [
        Close(1, CloseReason.ORIGIN_IDLE_TIMEOUT),
        Open(2),
    ]
    # Never later than the policy's own idle timeout.
    pool.connection_ready(2, H1, 5.0)
    pool.request_done(2, 2, 6.0, reusable=True, idle_timeout=3600.0)
    assert pool.next_deadline() == 36.0
    assert pool.tick(36.0) == [Close(2, CloseReason.IDLE_TIMEOUT)]  # the policy's


def test_an_origin_that_keeps_idle_connections_under_a_second_gets_only_waiting_requests() -> None:
    # Apache's `KeepAliveTimeout 500ms` says `timeout=0` (keep_alive.SUBSECOND_IDLE): a request
    # already waiting takes the connection at once; nothing waits, it closes.
    pool = make(pipeline_depth=0)
    pool.request(1, 0.0, idempotent=True)
    pool.connection_ready(1, H1, 0.0)
    pool.request(2, 0.5, idempotent=True)
    assert pool.request_done(1, 1, 1.0, reusable=True, idle_timeout=0.001) == [
        Assign(2, 1, REUSED, 0.5)
    ]
    pool.request_done(1, 2, 2.0, reusable=True, idle_timeout=0.001)
    assert pool.tick(2.002) == [Close(1, CloseReason.ORIGIN_IDLE_TIMEOUT)]


def test_a_connection_carries_no_more_requests_than_its_origin_takes() -> None:
    pool = make(max_connections=2, pipeline_depth=4)
    busy_h1(pool, 2)
    assert pool.request(1, 0.0, idempotent=True) == [Assign(1, 1, PIPELINED, 0.0)]
    # The origin takes two more after 101 on connection 1: request 1 and one other.
    assert pool.request_done(1, 101, 1.0, reusable=True, takes=2) == []
    assert pool.request(2, 1.0, idempotent=True) == [Assign(2, 1, PIPELINED, 0.0)]
    # Connection 1 takes nothing more: 3 is pipelined on connection 2, though 1 has room.
    assert pool.request(3, 1.0, idempotent=True) == [Assign(3, 2, PIPELINED, 0.0)]
    pool.request_done(1, 1, 2.0, reusable=True, takes=1)
    assert pool.request_done(1, 2, 2.0, reusable=True, takes=0) == [
        Close(1, CloseReason.REQUEST_LIMIT)
    ]
    # Its slot of the cap is free for a new connection, not a request the origin would drop.
    assert pool.request(4, 2.0, idempotent=False) == [Open(3)]


def test_an_idle_connection_its_origin_takes_nothing_more_on_closes() -> None:
    pool = make()
    pool.request(1, 0.0, idempotent=True)
    pool.connection_ready(1, H1, 0.0)
    assert pool.request_done(1, 1, 1.0, reusable=True, takes=0) == [
        Close(1, CloseReason.REQUEST_LIMIT)
    ]
    assert pool.request(2, 1.0, idempotent=True) == [Open(2)]


def test_a_low_first_statement_does_not_bound_the_origin_for_good() -> None:
    # A connection bounded to one request never hears a second answer; a later connection's
    # first statement of more raises the bound (it stayed at 1: a connection per request).
    pool = make()
    pool.request(1, 0.0, idempotent=True)
    pool.connection_ready(1, H1, 0.0)
    assert pool.request_done(1, 1, 1.0, reusable=True, takes=0) == [
        Close(1, CloseReason.REQUEST_LIMIT)
    ]
    assert pool.requests_per_connection == 1
    pool.request(2, 1.0, idempotent=True)
    pool.connection_ready(2, H1, 1.0)
    pool.request_done(2, 2, 2.0, reusable=True, takes=99)  # Node's max=100
    assert pool.requests_per_connection == 100
    assert pool.request(3, 2.0, idempotent=True) == [Assign(3, 2, REUSED, 0.0)]


def test_an_assignment_given_back_unsent_costs_the_connection_nothing() -> None:
    # Node takes 3: after the first answer, 2 more. An assignment whose client left before it
    # was sent is given back; the connection still takes 2, and the count stays 3.
    pool = make(pipeline_depth=4)
    pool.request(1, 0.0, idempotent=True)
    pool.connection_ready(1, H1, 0.0)
    pool.request_done(1, 1, 1.0, reusable=True, takes=2)
    assert pool.request(2, 1.0, idempotent=True) == [Assign(2, 1, REUSED, 0.0)]
    assert pool.unassign(1, 2, 1.0) == []
    assert pool.request(3, 1.0, idempotent=True) == [Assign(3, 1, REUSED, 0.0)]
    assert pool.request(4, 1.0, idempotent=True) == [Assign(4, 1, PIPELINED, 0.0)]
    assert pool.request(5, 1.0, idempotent=True) == []  # the origin's third
    pool.request_done(1, 3, 2.0, reusable=True, takes=1)
    assert pool.requests_per_connection == 3


def test_a_connection_answered_without_a_statement_is_not_bound_by_anothers() -> None:
    # Behind a balancer, backends set apart: connection 2's answered without a word of its
    # count, connection 1's says 3 (Node's max=3). Connection 2 is not cut short by it.
    pool = make(max_connections=2, pipeline_depth=4)
    busy_h1(pool, 2)
    pool.request(1, 0.5, idempotent=True)  # pipelined behind 101 or 102
    pool.request_done(2, 102, 1.0, reusable=True)
    pool.request_done(1, 101, 1.0, reusable=True, takes=2)
    for waiter in range(2, 9):
        pool.request(waiter, 1.0, idempotent=True)
    assert len(pool.in_flight_on(1)) <= 2 and len(pool.in_flight_on(2)) == 4


def test_an_assignment_given_back_leaves_the_idle_clock_as_it_was() -> None:
    # A warm connection idle 9 s, taken and given back in one turn: still proven (its lost
    # first request goes again, as on any warm connection that idled), and timed from then.
    pool = make()
    pool.preconnect(1, 0.0, idle_timeout=20.0)
    pool.connection_ready(1, H1, 0.0)
    assert pool.request(1, 9.0, idempotent=True) == [Assign(1, 1, PRECONNECTED, 0.0)]
    pool.request(2, 9.0, idempotent=True)
    assert pool.unassign(1, 1, 9.0) == [Assign(2, 1, PRECONNECTED, 0.0)]
    assert pool.connection_lost(1, 9.5, unanswered=[2], first_sent=2)[0] == Retry(2)
    pool = make(idle_timeout=30.0)
    pool.request(1, 0.0, idempotent=True)
    pool.connection_ready(1, H1, 0.0)
    pool.request_done(1, 1, 1.0, reusable=True, idle_timeout=4.0)
    assert pool.request(2, 4.9, idempotent=True) == [Assign(2, 1, REUSED, 0.0)]
    assert pool.unassign(1, 2, 4.9) == []
    assert pool.next_deadline() == 5.0  # the origin's timeout, from its answer


def test_a_connection_up_before_the_origin_said_its_count_gets_that_bound() -> None:
    pool = make(max_connections=2, pipeline_depth=4)
    busy_h1(pool, 2)
    pool.request_done(1, 101, 1.0, reusable=True, takes=2)  # Node's max=3
    # Connection 2 has carried one: it takes two more, however deep the pipeline may go (it
    # took four before).
    for waiter in range(1, 7):
        pool.request(waiter, 1.0, idempotent=True)
    assert len(pool.in_flight_on(1)) == 2 and len(pool.in_flight_on(2)) == 3
    assert pool.queued == 2


def test_an_idle_connection_closed_by_the_server_is_dropped() -> None:
    pool = make()
    pool.request(1, 0.0, idempotent=True)
    pool.connection_ready(1, H1, 0.0)
    pool.request_done(1, 1, 1.0, reusable=True)
    assert pool.idle_connection_closed_by_server(1, 2.0) == []
    assert pool.active_connections == 0
    assert pool.request(2, 2.0, idempotent=True) == [Open(2)]


def test_a_busy_connection_reported_closed_takes_nothing_more() -> None:
    pool = make(pipeline_depth=3)
    busy_h1(pool, 1)
    assert pool.idle_connection_closed_by_server(1, 1.0) == []
    assert pool.request(1, 1.0, idempotent=True) == []
    assert pool.request_done(1, 101, 2.0, reusable=True) == [
        Close(1, CloseReason.SERVER_CLOSED),
        Open(2),
    ]


# -- lost connections and retries


def test_unanswered_idempotent_requests_go_again_first_in_their_order() -> None:
    pool = make(pipeline_depth=4)
    busy_h1(pool, 1)
    pool.request(1, 0.0, idempotent=True)
    pool.request(2, 0.0, idempotent=True)
    pool.request(3, 0.0, idempotent=True)
    assert pool.request(4, 0.0, idempotent=True) == []  # depth 4 reached: waits
    assert pool.connection_lost(1, 1.0, unanswered=[2, 1]) == [Retry(1), Retry(2), Open(2)]
    assert pool.in_flight == 0  # 101 and 3 had begun their responses: the driver ends them
    assert pool.connection_ready(2, H1, 2.0) == [Assign(1, 2, NEW, 1.0)]
    assert pool.request_done(2, 1, 3.0, reusable=True) == [Assign(2, 2, REUSED, 2.0)]
    assert pool.request_done(2, 2, 3.0, reusable=True) == [Assign(4, 2, REUSED, 3.0)]


def test_an_unanswered_non_idempotent_request_fails_and_is_never_sent_again() -> None:
    pool = make()
    busy_h1(pool, 1, idempotent=False)
    assert pool.connection_lost(1, 1.0, unanswered=[101]) == [Fail(101, FailReason.CONNECTION_LOST)]
    assert pool.active_connections == 0 and pool.queued == 0


def test_a_non_idempotent_request_that_never_left_goes_again() -> None:
    pool = make(max_connections=2)
    busy_h1(pool, 1)
    assert pool.request(1, 0.0, idempotent=False) == [Open(2)]
    assert pool.connection_ready(2, H1, 0.0) == [Assign(1, 2, NEW, 0.0)]
    # Connection 2 was found closed before a byte of the POST left: it goes again.
    assert pool.requests_unanswered(2, [1], 1.0, never_sent=True) == [
        Retry(1),
        Close(2, CloseReason.SERVER_CLOSED),
        Open(3),
    ]
    # Sent, but unanswered: it fails (it may have been processed).
    assert pool.connection_ready(3, H1, 1.0) == [Assign(1, 3, NEW, 0.0)]
    assert pool.requests_unanswered(3, [1], 2.0) == [
        Fail(1, FailReason.CONNECTION_LOST),
        Close(3, CloseReason.SERVER_CLOSED),
    ]


def test_a_request_fails_after_max_attempts() -> None:
    # HTTP/2 connections on which another request went out first: each loss proves nothing
    # against this request, so it goes again, until it has been sent MAX_ATTEMPTS times.
    pool = make()
    pool.request(101, 0.0, idempotent=True)
    assert pool.connection_ready(1, H2, 0.0, max_streams=10) == [Assign(101, 1, NEW, 0.0)]
    assert pool.request(1, 0.0, idempotent=True) == [Assign(1, 1, MULTIPLEXED, 0.0)]
    for conn_id in range(1, MAX_ATTEMPTS):
        first = 100 + conn_id
        assert pool.connection_lost(conn_id, 1.0, unanswered=[1], first_sent=first) == [
            Retry(1),
            Open(conn_id + 1),
        ]
        assert pool.request(first + 1, 1.0, idempotent=True) == []  # the h2 connect covers it
        assert pool.connection_ready(conn_id + 1, H2, 1.0, max_streams=10) == [
            Assign(1, conn_id + 1, NEW, 0.0),  # the request going again first
            Assign(first + 1, conn_id + 1, MULTIPLEXED, 0.0),
        ]
    assert pool.connection_lost(
        MAX_ATTEMPTS, 2.0, unanswered=[1], first_sent=100 + MAX_ATTEMPTS
    ) == [Fail(1, FailReason.RETRIES_EXHAUSTED)]


def test_a_warm_connection_taken_as_it_comes_up_is_not_proven() -> None:
    # As Chromium: only a socket that sat idle in the pool counts as reused.
    pool = make(max_connections=2)
    assert pool.preconnect(1, 0.0, idle_timeout=5.0) == [Open(1, warm=True)]
    assert pool.request(1, 0.5, idempotent=True) == []  # the warm one, connecting, covers it
    assert pool.connection_ready(1, H1, 1.0) == [Assign(1, 1, PRECONNECTED, 0.5)]
    assert pool.connection_lost(1, 2.0, unanswered=[1], first_sent=1) == [
        Fail(1, FailReason.CONNECTION_LOST)
    ]


def test_the_first_request_on_a_new_connection_lost_unanswered_is_not_sent_again() -> None:
    # Chromium's rule: it most likely reached the origin (and perhaps broke the connection);
    # the requests pipelined behind it were not yet the origin's to process, and go again.
    pool = make(max_connections=1, pipeline_depth=3)
    assert pool.request(1, 0.0, idempotent=True) == [Open(1)]
    assert pool.connection_ready(1, H1, 0.0) == [Assign(1, 1, NEW, 0.0)]
    assert pool.request(2, 0.0, idempotent=True) == [Assign(2, 1, PIPELINED, 0.0)]
    assert pool.connection_lost(1, 1.0, unanswered=[1, 2], first_sent=1) == [
        Fail(1, FailReason.CONNECTION_LOST),
        Retry(2),
        Open(2),
    ]
    # On a reused connection the same loss sends it again (RFC 9112 §9.3.1).
    pool = make(max_connections=1, pipeline_depth=3)
    pool.request(1, 0.0, idempotent=True)
    assert pool.connection_ready(1, H1, 0.0) == [Assign(1, 1, NEW, 0.0)]
    assert pool.request_done(1, 1, 1.0, reusable=True) == []
    assert pool.request(2, 1.0, idempotent=True) == [Assign(2, 1, REUSED, 0.0)]
    assert pool.request(3, 1.0, idempotent=True) == [Assign(3, 1, PIPELINED, 0.0)]
    assert pool.connection_lost(1, 2.0, unanswered=[2, 3], first_sent=1) == [
        Retry(2),
        Retry(3),
        Open(2),
    ]
    # The driver names the first request on the wire, which need not be the first assigned.
    pool = make(max_connections=1, pipeline_depth=3)
    pool.request(1, 0.0, idempotent=True)
    assert pool.connection_ready(1, H1, 0.0) == [Assign(1, 1, NEW, 0.0)]
    assert pool.request(2, 0.0, idempotent=True) == [Assign(2, 1, PIPELINED, 0.0)]
    assert pool.connection_lost(1, 1.0, unanswered=[1, 2], first_sent=2) == [
        Retry(1),
        Fail(2, FailReason.CONNECTION_LOST),
        Open(2),
    ]


@pytest.mark.parametrize(
    ("idempotent", "replayable", "again"),
    [
        (True, False, True),
        # A POST whose body the engine holds whole: the origin said it did not process it.
        (False, True, True),
        # A POST whose body streamed from the client: what left cannot be sent again.
        (False, False, False),
    ],
)
def test_refused_streams_go_again_on_the_same_connection(
    idempotent: bool, replayable: bool, again: bool
) -> None:
    pool = make()
    pool.request(1, 0.0, idempotent=idempotent, replayable=replayable)
    pool.connection_ready(1, H2, 0.0, max_streams=10)
    expected: list[Action] = (
        [Retry(1), Assign(1, 1, REUSED, 0.0)] if again else [Fail(1, FailReason.CONNECTION_LOST)]
    )
    assert pool.requests_unanswered(1, [1], 1.0) == expected


def test_a_refused_post_goes_again_a_bounded_number_of_times() -> None:
    pool = make()
    pool.request(1, 0.0, idempotent=False, replayable=True)
    assert pool.connection_ready(1, H2, 0.0, max_streams=10) == [Assign(1, 1, NEW, 0.0)]
    for _ in range(MAX_ATTEMPTS - 1):
        assert pool.requests_unanswered(1, [1], 1.0) == [Retry(1), Assign(1, 1, REUSED, 0.0)]
    assert pool.requests_unanswered(1, [1], 2.0) == [Fail(1, FailReason.RETRIES_EXHAUSTED)]


def test_a_retry_assigned_to_a_connection_lost_in_the_same_turn_goes_again() -> None:
    # A refused stream and the connection's end in one read: the retry is assigned to the
    # connection before its loss is known, and never leaves. It goes again, at no cost.
    pool = make()
    pool.request(1, 0.0, idempotent=False, replayable=True)
    assert pool.connection_ready(1, H2, 0.0, max_streams=10) == [Assign(1, 1, NEW, 0.0)]
    assert pool.requests_unanswered(1, [1], 1.0) == [Retry(1), Assign(1, 1, REUSED, 0.0)]
    assert pool.connection_lost(1, 1.0, unanswered=[1], never_sent=[1]) == [Retry(1), Open(2)]
    assert pool.connection_ready(2, H2, 1.5, max_streams=10) == [Assign(1, 2, NEW, 0.5)]
    # Told only that it went unanswered, the pool would fail it: it may have left.
    pool = make()
    pool.request(1, 0.0, idempotent=False, replayable=True)
    pool.connection_ready(1, H2, 0.0, max_streams=10)
    pool.requests_unanswered(1, [1], 1.0)
    assert pool.connection_lost(1, 1.0, unanswered=[1]) == [Fail(1, FailReason.CONNECTION_LOST)]


def test_a_post_lost_on_http1_is_not_sent_again_even_if_replayable() -> None:
    # Only an HTTP/2 origin's word proves a request unprocessed; the keep-alive race (the one
    # request on a reused HTTP/1.1 connection, found closed) is no proof for a POST.
    pool = make()
    pool.request(1, 0.0, idempotent=True)
    pool.connection_ready(1, H1, 0.0)
    pool.request_done(1, 1, 0.5, reusable=True)
    assert pool.request(2, 1.0, idempotent=False, replayable=True) == [Assign(2, 1, REUSED, 0.0)]
    assert pool.connection_lost(1, 1.5, unanswered=[2], first_sent=1) == [
        Fail(2, FailReason.CONNECTION_LOST)
    ]


def test_an_h2_request_that_never_left_costs_no_attempt() -> None:
    # Bounced before a byte of it left (the origin's stream limit, announced late, reached on
    # the connection the request was handed to), again and again: it still goes again.
    pool = make()
    pool.request(1, 0.0, idempotent=False)
    assert pool.connection_ready(1, H2, 0.0, max_streams=10) == [Assign(1, 1, NEW, 0.0)]
    for _ in range(MAX_ATTEMPTS + 1):
        actions = pool.requests_unanswered(1, [1], 1.0, never_sent=True)
        assert actions[0] == Retry(1) and Fail(1, FailReason.RETRIES_EXHAUSTED) not in actions
        assert actions[1:] == [Assign(1, 1, REUSED, 0.0)]


def test_a_failed_connect_that_was_to_take_the_whole_queue_fails_it_all() -> None:
    # An https origin is expected to speak HTTP/2: one connect at a time, for every waiter.
    # Rejecting one waiter per failure made the last of n wait n connect timeouts (or the
    # queue's, for a 503) before it heard that the origin could not be reached.
    pool = HostPool(HTTPS_KEY, limits(max_connections=6))
    assert pool.request(1, 0.0, idempotent=True) == [Open(1)]
    assert pool.request(2, 0.0, idempotent=True) == []
    assert pool.request(3, 0.0, idempotent=False) == []
    assert pool.connection_failed(1, 1.0) == [
        Reject(1, RejectReason.CONNECT_FAILED),
        Reject(2, RejectReason.CONNECT_FAILED),
        Reject(3, RejectReason.CONNECT_FAILED),
    ]
    # HTTP/1.1, a connect per waiter: each failure is its own waiter's.
    pool = make(max_connections=6, http2=False)
    assert pool.request(1, 0.0, idempotent=True) == [Open(1)]
    assert pool.request(2, 0.0, idempotent=True) == [Open(2)]
    assert pool.connection_failed(1, 1.0) == [Reject(1, RejectReason.CONNECT_FAILED)]


def test_a_request_that_never_leaves_is_not_sent_round_new_connections_for_ever() -> None:
    # An origin that closes (or speaks) the moment it accepts: the request never leaves, and
    # went again at no cost on connection after connection, its queue clock starting anew each
    # time (a review measured ~430 connections in 5 s). A few such goes are free; then each
    # costs an attempt, and the request fails.
    pool = make()
    pool.request(1, 0.0, idempotent=False)
    assert pool.connection_ready(1, H1, 0.0) == [Assign(1, 1, NEW, 0.0)]
    conn_id, outcomes = 1, []
    for _ in range(20):
        actions = pool.requests_unanswered(conn_id, [1], 1.0, never_sent=True)
        outcomes.append(actions[0])
        if isinstance(actions[0], Fail):
            break
        pool.connection_lost(conn_id, 1.0, unanswered=[])
        conn_id += 1
        assert pool.connection_ready(conn_id, H1, 1.0) == [Assign(1, conn_id, NEW, 0.0)]
    assert outcomes == [Retry(1)] * (MAX_FREE_GOES + MAX_ATTEMPTS - 1) + [
        Fail(1, FailReason.RETRIES_EXHAUSTED)
    ]


def test_an_h1_request_that_never_left_goes_to_another_connection() -> None:
    pool = make(max_connections=2, pipeline_depth=3)
    busy_h1(pool, 2)
    assert pool.request(1, 0.0, idempotent=True) == [Assign(1, 1, PIPELINED, 0.0)]
    # Connection 1 had closed before request 1 went out: it takes nothing more.
    assert pool.requests_unanswered(1, [1], 1.0) == [Retry(1), Assign(1, 2, PIPELINED, 0.0)]
    assert pool.request(2, 1.0, idempotent=True) == [Assign(2, 2, PIPELINED, 0.0)]
    assert pool.request_done(1, 101, 2.0, reusable=True) == [Close(1, CloseReason.SERVER_CLOSED)]


def test_an_h1_request_that_never_left_costs_no_attempt() -> None:
    pool = make()
    pool.request(1, 0.0, idempotent=True)
    assert pool.connection_ready(1, H1, 0.0) == [Assign(1, 1, NEW, 0.0)]
    for conn_id in range(1, MAX_ATTEMPTS + 2):
        assert pool.requests_unanswered(conn_id, [1], 1.0, never_sent=True) == [
            Retry(1),
            Close(conn_id, CloseReason.SERVER_CLOSED),  # done, and nothing left on it
            Open(conn_id + 1),
        ]
        assert pool.connection_lost(conn_id, 1.0, unanswered=[]) == []  # already forgotten
        assert pool.connection_ready(conn_id + 1, H1, 1.0) == [Assign(1, conn_id + 1, NEW, 0.0)]
    # One that left (its write failed, or it was pipelined behind a stalled response) may have
    # reached the origin: it costs an attempt, and goes again once at most.
    conn_id = MAX_ATTEMPTS + 2
    assert pool.requests_unanswered(conn_id, [1], 2.0) == [
        Retry(1),
        Close(conn_id, CloseReason.SERVER_CLOSED),
        Open(conn_id + 1),
    ]
    pool.connection_ready(conn_id + 1, H1, 2.0)
    assert pool.requests_unanswered(conn_id + 1, [1], 3.0) == [
        Fail(1, FailReason.RETRIES_EXHAUSTED),
        Close(conn_id + 1, CloseReason.SERVER_CLOSED),
    ]


def idle_h1(pool: HostPool, conns: int) -> None:
    """`conns` HTTP/1.1 connections that have each served one request (waiters 101, 102, ...)
    and are idle; connection n went idle at time n / 10."""
    busy_h1(pool, conns)
    for n in range(conns):
        assert pool.request_done(n + 1, 101 + n, (n + 1) / 10, reusable=True) == []


def test_a_request_going_again_after_a_loss_takes_a_new_connection() -> None:
    # The origin dropped a reused connection without notice (a keep-alive race): the others
    # open at that moment may be dropped next, so the request goes on a new one; other
    # requests still take the idle ones.
    pool = make(max_connections=3)
    idle_h1(pool, 2)
    assert pool.request(1, 1.0, idempotent=True) == [Assign(1, 2, REUSED, 0.0)]
    assert pool.connection_lost(2, 1.0, unanswered=[1], first_sent=102) == [Retry(1), Open(3)]
    assert pool.request(2, 1.5, idempotent=True) == [Assign(2, 1, REUSED, 0.0)]
    assert pool.connection_ready(3, H1, 2.0) == [Assign(1, 3, NEW, 1.0)]


def test_a_request_going_again_does_not_take_a_connection_that_frees_up() -> None:
    pool = make(max_connections=3)
    idle_h1(pool, 2)
    assert pool.request(1, 1.0, idempotent=True) == [Assign(1, 2, REUSED, 0.0)]
    assert pool.request(2, 1.0, idempotent=True) == [Assign(2, 1, REUSED, 0.0)]
    assert pool.connection_lost(2, 1.0, unanswered=[1], first_sent=102) == [Retry(1), Open(3)]
    assert pool.request(3, 1.0, idempotent=True) == [Open(4)]
    # Connection 1 frees up: it goes to request 3, not to the one going again.
    assert pool.request_done(1, 2, 1.5, reusable=True) == [Assign(3, 1, REUSED, 0.5)]
    assert pool.connection_ready(3, H1, 2.0) == [Assign(1, 3, NEW, 1.0)]
    assert pool.connection_ready(4, H1, 2.0) == []


def test_at_the_cap_an_idle_connection_is_closed_for_a_request_going_again() -> None:
    pool = make(max_connections=2)
    idle_h1(pool, 2)
    assert pool.request(1, 1.0, idempotent=True) == [Assign(1, 2, REUSED, 0.0)]
    assert pool.connection_lost(2, 1.0, unanswered=[1], first_sent=102) == [Retry(1), Open(3)]
    # Two requests lost from one pipeline, one slot free and one idle connection: the idle
    # one is closed, and each gets a connection of its own.
    pool = make(max_connections=2, pipeline_depth=3)
    idle_h1(pool, 2)
    assert pool.request(1, 1.0, idempotent=True) == [Assign(1, 2, REUSED, 0.0)]
    assert pool.request(2, 1.0, idempotent=True) == [Assign(2, 1, REUSED, 0.0)]
    assert pool.request(3, 1.0, idempotent=True) == [Assign(3, 1, PIPELINED, 0.0)]
    assert pool.request_done(2, 1, 1.5, reusable=True) == []  # connection 2 idle again
    assert pool.connection_lost(1, 2.0, unanswered=[2, 3], first_sent=101) == [
        Retry(2),
        Retry(3),
        Close(2, CloseReason.ROOM_FOR_RETRY),
        Open(3),
        Open(4),
    ]
    assert pool.connection_ready(3, H1, 2.5) == [Assign(2, 3, NEW, 0.5)]
    assert pool.connection_ready(4, H1, 2.5) == [Assign(3, 4, NEW, 0.5)]


def test_a_request_going_again_is_not_pipelined_onto_an_older_connection() -> None:
    pool = make(max_connections=2, pipeline_depth=3)
    busy_h1(pool, 2)
    assert pool.request(1, 0.0, idempotent=True) == [Assign(1, 1, PIPELINED, 0.0)]
    assert pool.request(2, 0.0, idempotent=True) == [Assign(2, 2, PIPELINED, 0.0)]
    # Connection 1 is lost with 101 answering and 1 behind it: pipelining is off from now on,
    # and request 1 waits for a connection opened after the loss.
    assert pool.connection_lost(1, 1.0, unanswered=[1], first_sent=101) == [Retry(1), Open(3)]
    assert pool.connection_ready(3, H1, 1.5) == [Assign(1, 3, NEW, 0.5)]


def test_a_request_going_again_is_served_before_other_clients() -> None:
    # With per-client shares a new connection would go to the client with the fewest requests
    # in flight (b); the request that lost its connection (a's) takes it first.
    pool = make(max_connections=4, per_client=2)
    pool.request(101, 0.0, idempotent=True, client="a")
    pool.request(102, 0.0, idempotent=True, client="a")
    pool.connection_ready(1, H1, 0.0)
    pool.connection_ready(2, H1, 0.0)
    pool.request_done(1, 101, 0.1, reusable=True)
    assert pool.request(1, 1.0, idempotent=True, client="a") == [Assign(1, 1, REUSED, 0.0)]
    assert pool.connection_lost(1, 1.0, unanswered=[1], first_sent=101) == [Retry(1), Open(3)]
    assert pool.request(2, 1.0, idempotent=True, client="b") == [Open(4)]
    assert pool.connection_ready(3, H1, 1.5) == [Assign(1, 3, NEW, 0.5)]
    assert pool.connection_ready(4, H1, 1.5) == [Assign(2, 4, NEW, 0.5)]


def test_a_request_going_again_opens_within_the_cap_not_its_clients_share() -> None:
    # Clients b and c left their connections idle: the pool holds 6 against a's share of 2.
    # The request going again replaces the connection it lost (within the cap of 6): the idle
    # ones stay for whoever comes next.
    pool = make(max_connections=6, per_client=2)
    for n, client in enumerate("aabbcc"):
        pool.request(101 + n, 0.0, idempotent=True, client=client)
    carried = {}
    for conn_id in range(1, 7):
        (assigned,) = pool.connection_ready(conn_id, H1, 0.0)
        assert isinstance(assigned, Assign)
        carried[conn_id] = assigned.waiter_id
    for conn_id, waiter in carried.items():
        if waiter != 101:
            assert pool.request_done(conn_id, waiter, conn_id / 10, reusable=True) == []
    assert pool.request(1, 1.0, idempotent=True, client="a") == [Assign(1, 6, REUSED, 0.0)]
    assert pool.connection_lost(6, 1.0, unanswered=[1], first_sent=UNKNOWN) == [
        Retry(1),
        Open(7),
    ]
    assert pool.tick(1.0) == []
    assert pool.connection_ready(7, H1, 1.5) == [Assign(1, 7, NEW, 0.5)]


def test_at_the_cap_a_connection_that_frees_up_is_closed_for_a_request_going_again() -> None:
    # Under a ceiling of 1, with others queued behind: the one connection left, once free, is
    # not handed to them (the request going again would wait for ever) but closed for a new one.
    pool = make(max_connections=2)
    busy_h1(pool, 2)
    pool.request_done(1, 101, 0.5, reusable=True)
    assert pool.request(1, 1.0, idempotent=True) == [Assign(1, 1, REUSED, 0.0)]
    assert pool.set_ceiling(1, 1.0) == []
    assert pool.connection_lost(1, 1.0, unanswered=[1], first_sent=101) == [Retry(1)]
    for waiter in range(2, 5):
        assert pool.request(waiter, 1.5, idempotent=True) == []
    assert pool.request_done(2, 102, 2.0, reusable=True) == [
        Close(2, CloseReason.ROOM_FOR_RETRY),
        Open(3),
    ]
    assert pool.connection_ready(3, H1, 2.5) == [Assign(1, 3, NEW, 1.5)]
    assert pool.request_done(3, 1, 3.0, reusable=True) == [Assign(2, 3, REUSED, 1.5)]


def test_after_http2_at_the_cap_a_connection_that_frees_up_makes_room_for_one_going_again() -> None:
    # The origin answers HTTP/2 on some connections and HTTP/1.1 on others (a balancer in front
    # of mixed servers), the last one up spoke HTTP/2 and has gone: the pool expects HTTP/2 of
    # its next connection, and still makes room for the request going again instead of leaving
    # it to time out beside an idle connection it may not use.
    pool = make(max_connections=3)
    for waiter in (101, 102, 103):
        pool.request(waiter, 0.0, idempotent=True)
    assert pool.connection_ready(1, H1, 0.0) == [Assign(101, 1, NEW, 0.0)]
    assert pool.connection_ready(2, H1, 0.0) == [Assign(102, 2, NEW, 0.0)]
    assert pool.connection_ready(3, H2, 0.0) == [Assign(103, 3, NEW, 0.0)]
    assert pool.request_done(3, 103, 0.5, reusable=True) == []
    assert pool.goaway(3, 0.5) == [Close(3, CloseReason.GOAWAY)]
    assert pool.request_done(1, 101, 0.5, reusable=True) == []
    assert pool.request(1, 1.0, idempotent=True) == [Assign(1, 1, REUSED, 0.0)]
    assert pool.set_ceiling(1, 1.0) == []
    assert pool.connection_lost(1, 1.0, unanswered=[1], first_sent=101) == [Retry(1)]
    assert pool.request(2, 1.5, idempotent=True) == []
    assert pool.request_done(2, 102, 2.0, reusable=True) == [
        Close(2, CloseReason.ROOM_FOR_RETRY),
        Open(4),
    ]
    assert pool.connection_ready(4, H1, 2.5) == [Assign(1, 4, NEW, 1.5)]


def test_a_request_going_again_waits_for_an_http2_stream_and_leaves_idle_ones_to_others() -> None:
    # At the cap, with an HTTP/2 connection whose one stream is busy: the request going again
    # will take that stream; an idle HTTP/1.1 connection is not held back for it.
    pool = make(max_connections=3)
    for waiter in (101, 102, 103):
        pool.request(waiter, 0.0, idempotent=True)
    assert pool.connection_ready(1, H1, 0.0) == [Assign(101, 1, NEW, 0.0)]
    assert pool.connection_ready(2, H2, 0.0, max_streams=1) == [Assign(102, 2, NEW, 0.0)]
    assert pool.connection_ready(3, H1, 0.0) == [Assign(103, 3, NEW, 0.0)]
    assert pool.request_done(1, 101, 0.1, reusable=True) == []
    assert pool.request_done(3, 103, 0.2, reusable=True) == []
    assert pool.request(1, 1.0, idempotent=True) == [Assign(1, 3, REUSED, 0.0)]
    assert pool.connection_lost(3, 1.0, unanswered=[1], first_sent=103) == [Retry(1)]
    assert pool.set_ceiling(2, 1.0) == []
    assert pool.request(2, 1.5, idempotent=True) == [Assign(2, 1, REUSED, 0.0)]
    assert pool.request_done(2, 102, 2.0, reusable=True) == [Assign(1, 2, REUSED, 1.0)]


def test_a_warm_connection_still_connecting_at_the_loss_serves_a_request_going_again() -> None:
    # It has carried nothing and has not idled: as good as a new one. One that came up
    # before the loss and idled unused is not.
    pool = make(max_connections=3)
    idle_h1(pool, 1)
    assert pool.preconnect(3, 0.5, idle_timeout=5.0) == [Open(2, warm=True), Open(3, warm=True)]
    assert pool.connection_ready(2, H1, 0.6) == []  # up before the loss, idle
    assert pool.request(1, 1.0, idempotent=True) == [Assign(1, 2, PRECONNECTED, 0.0)]
    assert pool.request(2, 1.0, idempotent=True) == [Assign(2, 1, REUSED, 0.0)]
    assert pool.connection_lost(1, 1.0, unanswered=[2], first_sent=101) == [Retry(2)]
    assert pool.connection_ready(3, H1, 1.5) == [Assign(2, 3, PRECONNECTED, 0.5)]


def test_an_announced_close_sends_the_requests_behind_to_any_connection() -> None:
    # `graceful`: the origin said it would close; what was pipelined behind never reached it.
    pool = make(max_connections=2, pipeline_depth=3)
    idle_h1(pool, 2)
    assert pool.request(1, 1.0, idempotent=True) == [Assign(1, 2, REUSED, 0.0)]
    assert pool.request(2, 1.0, idempotent=True) == [Assign(2, 1, REUSED, 0.0)]
    assert pool.request(3, 1.0, idempotent=True) == [Assign(3, 1, PIPELINED, 0.0)]
    assert pool.request_done(2, 1, 1.5, reusable=True) == []
    assert pool.connection_lost(1, 2.0, unanswered=[3], graceful=True) == [
        Retry(3),
        Assign(3, 2, REUSED, 0.0),
    ]


def test_the_keep_alive_race_is_free_once_per_request() -> None:
    # A request that kills every connection it is sent on must not go round them: after the
    # free race it goes on a new connection, and losing that one (it is the first request
    # there, so it most likely reached the origin) fails it.
    pool = make(max_connections=4)
    idle_h1(pool, 4)
    assert pool.request(1, 1.0, idempotent=True) == [Assign(1, 4, REUSED, 0.0)]
    assert pool.connection_lost(4, 1.0, unanswered=[1], first_sent=104) == [Retry(1), Open(5)]
    assert pool.connection_ready(5, H1, 1.5) == [Assign(1, 5, NEW, 0.5)]
    assert pool.connection_lost(5, 2.0, unanswered=[1], first_sent=1) == [
        Fail(1, FailReason.CONNECTION_LOST)
    ]


def test_a_request_lost_behind_a_response_whose_client_left_is_not_pipelined_on_old_ones() -> None:
    # Request 1 is pipelined behind 101, whose client leaves: the driver closes the connection
    # (`graceful`), and 1, written to the origin behind it, goes again at no cost. Pipelined
    # again (it is the oldest waiter, the first to be pipelined), it was caught behind the next
    # response whose client left, and the next, at no cost each time: sent to the origin round
    # after round and never failed (11 sends in 10 rounds), its queue clock starting anew. Now
    # it is pipelined only on a connection opened since, and its free goes are bounded (below).
    pool = make(max_connections=2, pipeline_depth=2)
    pool.request(101, 0.0, idempotent=True)
    pool.request(102, 0.0, idempotent=True)
    pool.connection_ready(1, H1, 0.0)
    pool.connection_ready(2, H1, 0.0)
    assert pool.request(1, 0.0, idempotent=True) == [Assign(1, 1, PIPELINED, 0.0)]
    assert pool.request_done(1, 101, 1.0, reusable=False) == []  # its client left
    assert pool.connection_lost(1, 1.0, unanswered=[1], graceful=True, first_sent=101) == [
        Retry(1),
        Open(3),
    ]
    # A younger request is pipelined behind 102 in its place; 1 waits for the new connection.
    assert pool.request(201, 1.0, idempotent=True) == [Assign(201, 2, PIPELINED, 0.0)]
    assert pool.connection_ready(3, H1, 1.5) == [Assign(1, 3, NEW, 0.5)]
    # 102's client leaves in turn: 201 goes again; 1, at the head of its own connection, is
    # not caught.
    assert pool.request_done(2, 102, 2.0, reusable=False) == []
    assert pool.connection_lost(2, 2.0, unanswered=[201], graceful=True, first_sent=102) == [
        Retry(201),
        Open(4),
    ]
    assert pool.request_done(3, 1, 2.5, reusable=True) == [Assign(201, 3, REUSED, 0.5)]


def test_goes_at_no_cost_are_bounded_however_they_are_reported() -> None:
    # A driver that reported one request lost behind a close (or never sent) on connection
    # after connection would have it go round them for ever: a few goes are free, then each
    # costs an attempt.
    pool = make()
    pool.request(1, 0.0, idempotent=True)
    assert pool.connection_ready(1, H1, 0.0) == [Assign(1, 1, NEW, 0.0)]
    outcomes: list[Action] = []
    for conn_id in range(1, 20):
        actions = pool.connection_lost(conn_id, 1.0, unanswered=[1], graceful=True)
        outcomes.append(actions[0])
        if isinstance(actions[0], Fail):
            break
        assert pool.connection_ready(conn_id + 1, H1, 1.0) == [Assign(1, conn_id + 1, NEW, 0.0)]
    assert outcomes == [Retry(1)] * (MAX_FREE_GOES + MAX_ATTEMPTS - 1) + [
        Fail(1, FailReason.RETRIES_EXHAUSTED)
    ]


def test_a_connections_first_request_lost_alone_is_no_keep_alive_race() -> None:
    # Request 2 was pipelined behind 1 and taken back; 1, the first on the wire, then finds
    # the connection lost: it most likely reached the origin.
    pool = make(max_connections=1, pipeline_depth=2)
    pool.request(1, 0.0, idempotent=True)
    pool.connection_ready(1, H1, 0.0)
    assert pool.request(2, 0.0, idempotent=True) == [Assign(2, 1, PIPELINED, 0.0)]
    pool.cancel(2, 0.5)
    assert pool.connection_lost(1, 1.0, unanswered=[1], first_sent=1) == [
        Fail(1, FailReason.CONNECTION_LOST)
    ]


def test_streams_above_goaway_go_to_a_new_connection() -> None:
    pool = make()
    pool.request(1, 0.0, idempotent=True)
    pool.request(2, 0.0, idempotent=True)
    pool.connection_ready(1, H2, 0.0, max_streams=10)
    assert pool.goaway(1, 1.0) == []
    assert pool.requests_unanswered(1, [2], 1.0) == [Retry(2)]
    assert pool.request_done(1, 1, 2.0, reusable=True) == [Close(1, CloseReason.GOAWAY), Open(2)]
    assert pool.connection_ready(2, H2, 2.5) == [Assign(2, 2, NEW, 1.5)]


# -- policy reload


def test_a_lowered_cap_closes_idle_connections_at_once_and_busy_ones_when_idle() -> None:
    pool = make(max_connections=3)
    busy_h1(pool, 3)
    pool.request_done(3, 103, 1.0, reusable=True)
    pool.request_done(2, 102, 2.0, reusable=True)
    # Least recently used first.
    assert pool.set_limits(limits(max_connections=2), 3.0) == [Close(3, CloseReason.OVER_LIMIT)]
    assert pool.request(1, 3.0, idempotent=True) == [Assign(1, 2, REUSED, 0.0)]
    assert pool.set_limits(limits(max_connections=1), 3.0) == []  # both busy: kept
    assert pool.request(2, 3.0, idempotent=True) == []  # no Open above the cap
    # Idle above the cap: closed even though a request waits; the other one serves it.
    assert pool.request_done(1, 101, 4.0, reusable=True) == [Close(1, CloseReason.OVER_LIMIT)]
    assert pool.request_done(2, 1, 5.0, reusable=True) == [Assign(2, 2, REUSED, 2.0)]


def test_a_raised_cap_opens_for_waiters() -> None:
    pool = make()
    for w in (1, 2, 3):
        pool.request(w, 0.0, idempotent=True)
    assert pool.set_limits(limits(max_connections=3), 1.0) == [Open(2), Open(3)]
    assert pool.limits.max_connections == 3


def test_a_lowered_max_queue_rejects_the_newest() -> None:
    pool = make()
    for w in (1, 2, 3, 4):
        pool.request(w, 0.0, idempotent=True)
    assert pool.set_limits(limits(max_queue=1), 1.0) == [
        Reject(4, RejectReason.QUEUE_FULL),
        Reject(3, RejectReason.QUEUE_FULL),
    ]


def test_a_pool_a_reload_retires_serves_what_it_holds_then_closes_each_connection_once_idle() -> (
    None
):
    # A reload that changes a policy's limits sends its new requests to a new pool; the old one
    # kept its idle connections until their idle timeout (60 s), beside the new pool's: 12
    # connections to an origin whose cap had been 2 all along, after 6 reloads.
    pool = make(max_connections=3, idle_timeout=300.0)
    busy_h1(pool, 3)
    pool.request_done(3, 103, 1.0, reusable=True)
    assert pool.request(1, 1.0, idempotent=True) == [Assign(1, 3, REUSED, 0.0)]
    assert pool.request(2, 1.0, idempotent=True) == []  # waits: all three are busy
    assert pool.retire(True, 2.0) == []  # all busy, and a request waits
    # The request waiting is served on the first connection that frees up; the next one to
    # free up closes at once.
    assert pool.request_done(1, 101, 3.0, reusable=True) == [Assign(2, 1, REUSED, 2.0)]
    assert pool.request_done(2, 102, 3.0, reusable=True) == [Close(2, CloseReason.OVER_LIMIT)]
    assert pool.request_done(3, 1, 4.0, reusable=True) == [Close(3, CloseReason.OVER_LIMIT)]
    assert pool.request_done(1, 2, 4.0, reusable=True) == [Close(1, CloseReason.OVER_LIMIT)]
    assert pool.active_connections == 0 and pool.next_deadline() is None
    # Limits a reload brings back keep their connections as before.
    kept = make(max_connections=2, idle_timeout=300.0)
    busy_h1(kept, 2)
    assert kept.retire(True, 1.0) == []
    assert kept.retire(False, 1.0) == []
    kept.request_done(1, 101, 2.0, reusable=True)
    assert kept.tick(250.0) == [] and kept.active_connections == 2
    # Idle already when retired: closed at once.
    assert kept.retire(True, 251.0) == [Close(1, CloseReason.OVER_LIMIT)]


# -- a ceiling below the cap (workers sharing the cap: reshape/upstream/budget/)


def test_a_ceiling_closes_an_idle_connection_at_once_and_a_busy_one_when_it_falls_idle() -> None:
    pool = make(max_connections=3)
    busy_h1(pool, 3)
    pool.request_done(2, 102, 1.0, reusable=True)
    assert pool.set_ceiling(1, 2.0) == [Close(2, CloseReason.OVER_LIMIT)]
    assert pool.max_connections == 1
    assert pool.request(1, 2.0, idempotent=True) == []  # no Open above the ceiling
    # Idle above the ceiling: closed even though a request waits (the slot is owed elsewhere).
    assert pool.request_done(1, 101, 3.0, reusable=True) == [Close(1, CloseReason.OVER_LIMIT)]
    assert pool.request_done(3, 103, 4.0, reusable=True) == [Assign(1, 3, REUSED, 2.0)]


def test_a_lifted_ceiling_opens_for_waiters_and_never_rises_above_the_limits() -> None:
    pool = make(max_connections=2)
    assert pool.set_ceiling(0, 0.0) == []
    for w in (1, 2, 3):
        assert pool.request(w, 0.0, idempotent=True) == []
    assert pool.set_ceiling(5, 1.0) == [Open(1), Open(2)]
    assert pool.max_connections == 2
    assert pool.set_ceiling(None, 1.0) == []
    with pytest.raises(ValueError, match="ceiling"):
        pool.set_ceiling(-1, 1.0)


def test_a_ceiling_bounds_preconnect() -> None:
    pool = make(max_connections=3, http2=False)
    pool.set_ceiling(1, 0.0)
    assert pool.preconnect(3, 0.0, idle_timeout=5.0) == [Open(1, warm=True)]


def test_lending_closes_connections_that_stay_idle_and_keeps_those_taken_in_time() -> None:
    pool = make(max_connections=3, http2=False)
    busy_h1(pool, 3)
    pool.request_done(1, 101, 1.0, reusable=True)
    pool.request_done(2, 102, 2.0, reusable=True)
    assert pool.lend(1, 2.5, after=1.0) == [Close(1, CloseReason.NEEDED_ELSEWHERE)]
    assert pool.lend(2, 2.5, after=1.0) == []  # connection 2 has been idle 0.5 s
    assert pool.next_deadline() == 3.0
    assert pool.request(4, 2.9, idempotent=True) == [Assign(4, 2, REUSED, 0.0)]  # taken in time
    assert pool.tick(3.5) == []
    assert pool.request_done(2, 4, 4.0, reusable=True) == []
    assert pool.request_done(3, 103, 4.5, reusable=True) == []
    assert pool.tick(5.0) == [Close(2, CloseReason.NEEDED_ELSEWHERE)]
    assert pool.tick(5.5) == [Close(3, CloseReason.NEEDED_ELSEWHERE)]
    assert pool.tick(9.0) == []  # both lent: the rest stays
    assert pool.request(5, 9.0, idempotent=True) == [Open(4)]  # lending does not lower the cap
    with pytest.raises(ValueError, match="count"):
        pool.lend(-1, 9.0, after=1.0)
    with pytest.raises(ValueError, match="after"):
        pool.lend(1, 9.0, after=0.0)


def test_an_abandoned_connect_rejects_nobody_and_is_planned_again() -> None:
    pool = make(max_connections=2, http2=False)
    assert pool.request(1, 0.0, idempotent=True) == [Open(1)]
    assert pool.abandon_connect(1, 0.5) == [Open(2)]  # the request still needs one
    assert pool.cancel(1, 0.6) == []
    assert pool.abandon_connect(2, 0.7) == []  # nobody waits: nothing opens
    assert pool.active_connections == 0 and pool.queued == 0
    assert pool.abandon_connect(2, 0.8) == []  # unknown: ignored
    pool.request(3, 1.0, idempotent=True)
    pool.connection_ready(3, H1, 1.0)
    assert pool.abandon_connect(3, 1.1) == []  # ready, not connecting: not abandoned
    assert pool.active_connections == 1


# -- shutdown, unknown ids, views


def test_close_all_fails_every_request_and_closes_every_connection() -> None:
    pool = make(max_connections=2)
    busy_h1(pool, 1)
    pool.request(1, 0.0, idempotent=True)  # opens connection 2
    pool.request(2, 0.0, idempotent=True)
    assert pool.close_all(1.0) == [
        Fail(1, FailReason.SHUTDOWN),
        Fail(2, FailReason.SHUTDOWN),
        Fail(101, FailReason.SHUTDOWN),
        Close(1, CloseReason.SHUTDOWN),
        Close(2, CloseReason.SHUTDOWN),
    ]
    assert (pool.queued, pool.active_connections, pool.in_flight) == (0, 0, 0)
    assert pool.request(3, 2.0, idempotent=True) == [Fail(3, FailReason.SHUTDOWN)]
    assert Fail(3, FailReason.SHUTDOWN).message == "shutdown"


@pytest.mark.parametrize(
    "call",
    [
        lambda p: p.cancel(77, 1.0),
        lambda p: p.connection_ready(77, H1, 1.0),
        lambda p: p.connection_ready(1, H1, 1.0),  # already ready
        lambda p: p.connection_failed(77, 1.0),
        lambda p: p.connection_failed(1, 1.0),  # ready, so it did not fail to connect
        lambda p: p.request_done(77, 101, 1.0, reusable=True),
        lambda p: p.request_done(1, 77, 1.0, reusable=True),
        lambda p: p.requests_unanswered(77, [101], 1.0),
        lambda p: p.requests_unanswered(1, [77], 1.0),
        lambda p: p.connection_lost(77, 1.0, unanswered=[101]),
        lambda p: p.max_streams_changed(77, 5, 1.0),
        lambda p: p.max_streams_changed(1, 5, 1.0),  # h1
        lambda p: p.goaway(77, 1.0),
        lambda p: p.idle_connection_closed_by_server(77, 1.0),
    ],
)
def test_unknown_ids_are_ignored(call: Callable[[HostPool], list[Action]]) -> None:
    pool = make()
    busy_h1(pool, 1)
    before = repr(pool)
    assert call(pool) == []
    assert repr(pool) == before


def test_repr_shows_the_state() -> None:
    pool = make(max_connections=2, pipeline_depth=2)
    busy_h1(pool, 1)
    pool.request(1, 0.0, idempotent=True)
    pool.request(2, 0.0, idempotent=True)
    pool.pipelining_failed(0.0)
    assert repr(pool) == (
        "<HostPool http://origin.test:80 conns=2/2 (connecting=1 idle=0) in_flight=2"
        " queued=1 pipelining_broken>"
    )
    assert str(PoolKey("http", "::1", 80, "example.test")) == "http://[::1]:80 sni=example.test"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"max_connections": 0}, "max_connections"),
        ({"max_queue": -1}, "max_queue"),
        ({"queue_timeout": 0.0}, "queue_timeout"),
        ({"idle_timeout": -1.0}, "idle_timeout"),
        ({"idle_timeout": math.nan}, "idle_timeout"),
        ({"pipeline_depth": -1}, "pipeline_depth"),
    ],
)
def test_bad_limits_are_refused(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        limits(**overrides)


def test_bad_scheme_is_refused() -> None:
    with pytest.raises(ValueError, match="scheme"):
        PoolKey("ftp", "origin.test", 21, None)


# -- ALPN probing and announced closes


def test_an_https_origin_gets_one_connection_until_alpn_is_known() -> None:
    pool = HostPool(HTTPS_KEY, limits(max_connections=6))
    actions = [a for i in range(1, 6) for a in pool.request(i, 0.0, idempotent=True)]
    assert actions == [Open(1)]
    # It spoke h2: everyone rides the one connection.
    ready = pool.connection_ready(1, H2, 0.1, max_streams=100)
    assert [a.waiter_id for a in ready if isinstance(a, Assign)] == [1, 2, 3, 4, 5]
    assert not any(isinstance(a, Open) for a in ready)


def test_an_https_origin_that_speaks_http1_gets_more_connections_after_the_first() -> None:
    pool = HostPool(HTTPS_KEY, limits(max_connections=3))
    for i in range(1, 5):
        pool.request(i, 0.0, idempotent=True)
    ready = pool.connection_ready(1, H1, 0.1)
    assert Assign(1, 1, NEW, 0.1) in ready
    assert [a for a in ready if isinstance(a, Open)] == [Open(2), Open(3)]


def test_without_http2_an_https_origin_is_not_probed() -> None:
    pool = HostPool(HTTPS_KEY, limits(max_connections=3, http2=False))
    actions = [a for i in range(1, 4) for a in pool.request(i, 0.0, idempotent=True)]
    assert actions == [Open(1), Open(2), Open(3)]


def pipelined_pool() -> HostPool:
    pool = make(max_connections=1, pipeline_depth=4)
    for i in range(1, 5):
        pool.request(i, 0.0, idempotent=True)
    pool.connection_ready(1, H1, 0.0)
    return pool


def test_an_announced_close_is_no_broken_pipeline_and_costs_no_attempt() -> None:
    pool = pipelined_pool()
    pool.request_done(1, 1, 0.1, reusable=False)  # response 1 said Connection: close
    assert pool.connection_lost(1, 1.0, unanswered=[2, 3, 4], graceful=True) == [
        Retry(2),
        Retry(3),
        Retry(4),
        Open(2),
    ]
    assert not pool.pipelining_broken
    assert pool.connection_ready(2, H1, 1.5) == [
        Assign(2, 2, NEW, 0.5),
        Assign(3, 2, PIPELINED, 0.5),
        Assign(4, 2, PIPELINED, 0.5),
    ]


def test_requests_lost_behind_an_announced_close_are_pipelined_only_on_a_new_connection() -> None:
    # nginx announces its close every `keepalive_requests` responses: the requests pipelined
    # beyond go again. Pipelined again behind an old connection's requests (the oldest waiters
    # are pipelined first), they were the likeliest to be caught behind its close, and the next:
    # under load 68 of 1,518 were caught twice or more, one four times (a hit from failing).
    pool = make(max_connections=2, pipeline_depth=4)
    busy_h1(pool, 2)
    assert pool.request(1, 0.0, idempotent=True) == [Assign(1, 1, PIPELINED, 0.0)]
    assert pool.request_done(1, 101, 1.0, reusable=False) == []  # Connection: close
    assert pool.connection_lost(1, 1.0, unanswered=[1], graceful=True, first_sent=101) == [
        Retry(1),
        Open(3),
    ]
    # Not behind 102 on connection 2, which had carried requests when the origin closed 1:
    # request 2 takes that place, and 1 the new connection.
    assert pool.request(2, 1.0, idempotent=True) == [Assign(2, 2, PIPELINED, 0.0)]
    assert pool.request(3, 1.0, idempotent=True) == [Assign(3, 2, PIPELINED, 0.0)]
    assert pool.connection_ready(3, H1, 1.5) == [Assign(1, 3, NEW, 0.5)]


def test_an_unannounced_close_breaks_pipelining_for_good() -> None:
    pool = pipelined_pool()
    pool.connection_lost(1, 0.2, unanswered=[2, 3, 4])
    assert pool.pipelining_broken


# -- random sequences against a model


@dataclass
class ModelConn:
    ready: bool = False
    proto: Proto | None = None
    max_streams: int = 1
    in_flight: list[int] = field(default_factory=list)
    served: int = 0
    draining: bool = False
    idle_since: float = 0.0
    # HTTP/1.1, what its origin said (Keep-Alive): how long it may idle, the requests it takes
    origin_idle: float | None = None
    takes: int | None = None

    @property
    def usable(self) -> bool:
        """Up, and takes requests: not draining, and its origin takes more."""
        return self.ready and not self.draining and (self.takes is None or self.takes > 0)

    def idle_timeout(self, limits: PoolLimits) -> float:
        if self.origin_idle is None:
            return limits.idle_timeout
        return min(limits.idle_timeout, self.origin_idle)


@dataclass
class ModelWaiter:
    idempotent: bool
    enqueued_at: float
    replayable: bool = False  # its body could be sent again (implied by idempotent)
    status: str = "queued"  # queued | in_flight | unanswered | final
    requeued: bool = False
    assigns: int = 0
    attempts: int = 0  # assigns, less those that went again at no cost
    raced: bool = False  # had its free retry after a keep-alive race
    free_goes: int = 0  # went again at no cost, never taken up by the origin
    # Went unanswered behind a close: pipelined again only on a connection above this id.
    bounced_at: int = 0
    sent: int = 0  # when it was last assigned, in assignment order
    # Going again after a connection lost without notice: no HTTP/1.1 connection up to this id.
    after: int = 0
    client: object = None  # who asked (PoolLimits.per_client); None: a client of its own
    took_idle: float | None = None  # its connection's idle_since, if idle when assigned


LIMITS = st.builds(
    PoolLimits,
    max_connections=st.integers(1, 3),
    max_queue=st.integers(0, 4),
    queue_timeout=st.sampled_from([1.0, 2.5, math.inf]),
    idle_timeout=st.sampled_from([1.0, 5.0, math.inf]),
    pipeline_depth=st.sampled_from([0, 2, 3]),
    http2=st.booleans(),
    per_client=st.sampled_from([0, 0, 1, 2]),
)
CLIENTS = st.sampled_from([None, "a", "b"])
UNKNOWN = 10**6


class PoolMachine(RuleBasedStateMachine):
    """Drives a HostPool with random events and checks every action against a model of what
    the driver would know from the actions alone."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.conns: dict[int, ModelConn] = {}
        self.waiters: dict[int, ModelWaiter] = {}
        self.queue: list[int] = []
        self.last_waiter = 0
        self.last_conn = 0
        self.broken = False
        self.known_h2 = False
        self.requests_per_connection: int | None = None  # what the origin said (Keep-Alive)
        self.learned_proto = False
        self.connect_failures_allowed = 1
        self.assignments = 0
        self.ceiling: int | None = None
        self.lend = 0  # connections to close once idle lend_after seconds
        self.lend_after = 1.0

    @initialize(key=st.sampled_from([KEY, HTTPS_KEY]), limits=LIMITS)
    def start(self, key: PoolKey, limits: PoolLimits) -> None:
        self.key = key
        self.limits = limits
        self.highest_cap = limits.max_connections
        self.pool = HostPool(key, limits)

    # model helpers

    def cap(self) -> int:
        if self.ceiling is None:
            return self.limits.max_connections
        return min(self.ceiling, self.limits.max_connections)

    def connecting(self) -> int:
        return sum(1 for c in self.conns.values() if not c.ready)

    def client_of(self, waiter_id: int) -> object:
        client = self.waiters[waiter_id].client
        return ("alone", waiter_id) if client is None else client

    def opening_cap(self) -> int:
        """The cap, or with per_client that many per client with requests here if lower."""
        if not self.limits.per_client:
            return self.cap()
        waiting = self.queue + [w for _, w in self.in_flight_pairs()]
        clients = {self.client_of(w) for w in waiting}
        return min(self.cap(), self.limits.per_client * max(1, len(clients)))

    def turn_takers(self) -> set[int]:
        """With per_client, whose request a connection anyone can use may serve: the oldest
        waiting request of a client with the fewest requests in flight (`_Turns`; its tie
        rule, the client waiting longest, is left unchecked)."""
        firsts: dict[object, int] = {}
        for w in self.queue:
            if not self.waiters[w].after:
                firsts.setdefault(self.client_of(w), w)
        in_flight: dict[object, int] = {}
        for _, w in self.in_flight_pairs():
            in_flight[self.client_of(w)] = in_flight.get(self.client_of(w), 0) + 1
        fewest = min((in_flight.get(c, 0) for c in firsts), default=0)
        return {w for c, w in firsts.items() if in_flight.get(c, 0) == fewest}

    def go_free(self, waiter_id: int) -> None:
        """The request goes again at no attempt's cost, up to MAX_FREE_GOES times."""
        waiter = self.waiters[waiter_id]
        if waiter.free_goes < MAX_FREE_GOES:
            waiter.free_goes += 1
            waiter.attempts -= 1

    def ready_conns(self) -> list[int]:
        return sorted(c for c, conn in self.conns.items() if conn.ready)

    def in_flight_pairs(self) -> list[tuple[int, int]]:
        return [(c, w) for c, conn in sorted(self.conns.items()) for w in conn.in_flight]

    def expects_h2(self) -> bool:
        """Whether one connection is expected to serve everyone: the origin spoke h2, or it is
        an https origin whose ALPN answer is not known yet."""
        probing = not self.learned_proto and self.key.scheme == "https"
        return self.limits.http2 and (self.known_h2 or probing)

    def live_h2(self) -> bool:
        """A usable h2 connection: waiters wait for its streams rather than open another."""
        return any(x.ready and x.proto is H2 and not x.draining for x in self.conns.values())

    def fits(self, waiter_id: int, conn_id: int) -> bool:
        """A request going again after a loss takes no HTTP/1.1 connection that had carried a
        request at the loss (the model has no warm connections)."""
        conn = self.conns[conn_id]
        return conn_id > self.waiters[waiter_id].after or conn.proto is not H1 or conn.served == 0

    def expected_assignment(self) -> tuple[set[int], int] | None:
        """Rules 1 and 2, for (waiters, connection): free connections in order of preference
        (the oldest h2 one with a free stream, else idle h1 ones, the most recently used
        first); the first one that a request going again may use goes to the first such
        request in the queue, else to the first other request (with per_client, one of
        `turn_takers`)."""
        usable = {c: x for c, x in self.conns.items() if x.usable}
        h2 = [c for c, x in usable.items() if x.proto is H2 and len(x.in_flight) < x.max_streams]
        if h2:
            free = sorted(h2)
        else:
            idle = [
                (x.idle_since, c) for c, x in usable.items() if x.proto is H1 and not x.in_flight
            ]
            free = [c for _, c in sorted(idle, reverse=True)]
        for conn_id in free:
            retrying = [w for w in self.queue if self.waiters[w].after and self.fits(w, conn_id)]
            if retrying:
                return {retrying[0]}, conn_id
            others = [w for w in self.queue if not self.waiters[w].after]
            if others:
                return (self.turn_takers() if self.limits.per_client else {others[0]}), conn_id
        return None

    def play(
        self,
        actions: list[Action],
        call: str,
        *,
        unanswered: list[int] | None = None,
        never_sent: Collection[int] = (),
        unprocessed: bool = False,
        refused: bool = False,
        unproven: int | None = None,
        new_waiter: int | None = None,
        fresh: bool = False,
        bounced: bool = False,
    ) -> None:
        """Check each action against the model as it stands, then apply it."""
        pending = list(unanswered or [])

        def may_go_again(waiter: ModelWaiter, waiter_id: int) -> bool:
            """Whether an unanswered request is sent again (unless out of attempts)."""
            return (
                waiter_id in never_sent
                or (refused and waiter.replayable)
                or (waiter.idempotent and (unprocessed or waiter_id != unproven))
            )

        overtaken: list[int] = []  # same-class waiters that were ahead of an assigned one
        front = 0  # where the next Retry goes
        connect_failures = 0
        opened = False
        for action in actions:
            if isinstance(action, Open):
                assert action.conn_id > self.last_conn
                # A request going again replaces the connection it lost within the cap, not
                # its client's share (HostPool._plan_for_waiters).
                going_again = any(self.waiters[w].after for w in self.queue)
                assert len(self.conns) < (self.cap() if going_again else self.opening_cap())
                self.last_conn = action.conn_id
                self.conns[action.conn_id] = ModelConn()
                opened = True
            elif isinstance(action, Assign):
                waiter = self.waiters[action.waiter_id]
                conn = self.conns[action.conn_id]
                assert waiter.status == "queued"
                assert conn.usable
                if conn.served == 0:
                    kind = NEW
                elif not conn.in_flight:
                    kind = REUSED
                else:
                    kind = MULTIPLEXED if conn.proto is H2 else PIPELINED
                assert action.kind is kind
                if conn.proto is H2:
                    assert len(conn.in_flight) < conn.max_streams
                elif kind is PIPELINED:
                    assert waiter.idempotent and not self.broken
                    assert action.conn_id > waiter.bounced_at
                    assert len(conn.in_flight) < self.limits.pipeline_depth
                    assert all(self.waiters[w].idempotent for w in conn.in_flight)
                assert self.fits(action.waiter_id, action.conn_id)
                if kind is not PIPELINED:
                    # shared capacity goes in order, requests going again first
                    expected = self.expected_assignment()
                    assert expected is not None and action.conn_id == expected[1]
                    assert action.waiter_id in expected[0]
                if not waiter.after:  # one going again may pass others
                    position = self.queue.index(action.waiter_id)
                    overtaken += [
                        w
                        for w in self.queue[:position]
                        if self.waiters[w].idempotent == waiter.idempotent
                        # one that may not be pipelined there may be passed by one that may
                        and (kind is not PIPELINED or action.conn_id > self.waiters[w].bounced_at)
                        and not self.waiters[w].after
                        and (  # with shares, in order within each client
                            not self.limits.per_client
                            or self.client_of(w) == self.client_of(action.waiter_id)
                        )
                    ]
                assert action.queued_for == self.now - waiter.enqueued_at
                self.queue.remove(action.waiter_id)
                waiter.status = "in_flight"
                waiter.requeued = False
                waiter.after = 0
                waiter.assigns += 1
                waiter.attempts += 1
                self.assignments += 1
                waiter.sent = self.assignments
                waiter.took_idle = None if conn.in_flight else conn.idle_since
                conn.in_flight.append(action.waiter_id)
                conn.served += 1
                if conn.takes is not None:  # never past what the origin said it takes
                    conn.takes -= 1
            elif isinstance(action, Reject):
                waiter = self.waiters[action.waiter_id]
                assert waiter.status == "queued"
                if action.reason is RejectReason.QUEUE_FULL:
                    if call == "request":
                        assert action.waiter_id == new_waiter
                        assert len(self.queue) - 1 >= self.limits.max_queue + self.connecting()
                    else:
                        assert call == "set_limits" and self.queue[-1] == action.waiter_id
                elif action.reason is RejectReason.QUEUE_TIMEOUT:
                    assert self.now - waiter.enqueued_at >= self.limits.queue_timeout
                else:
                    assert call == "connection_failed" and self.queue[0] == action.waiter_id
                    connect_failures += 1
                self.queue.remove(action.waiter_id)
                waiter.status = "final"
            elif isinstance(action, Close):
                conn = self.conns.pop(action.conn_id)
                if action.reason is CloseReason.SHUTDOWN:
                    assert call == "close_all"
                    assert all(self.waiters[w].status == "final" for w in conn.in_flight)
                    continue
                assert conn.ready and not conn.in_flight  # never close a busy connection
                if action.reason is CloseReason.IDLE_TIMEOUT:
                    assert self.now - conn.idle_since >= self.limits.idle_timeout
                elif action.reason is CloseReason.ORIGIN_IDLE_TIMEOUT:
                    assert conn.origin_idle is not None
                    assert conn.origin_idle < self.limits.idle_timeout
                    assert self.now - conn.idle_since >= conn.origin_idle
                elif action.reason is CloseReason.OVER_LIMIT:
                    assert len(self.conns) + 1 > self.cap()
                elif action.reason is CloseReason.NEEDED_ELSEWHERE:
                    assert self.lend > 0 and self.now - conn.idle_since >= self.lend_after
                    self.lend -= 1
                elif action.reason is CloseReason.ROOM_FOR_RETRY:
                    # at the cap, for a request going again that may not use it
                    assert conn.proto is H1
                    assert any(self.waiters[w].after >= action.conn_id for w in self.queue)
                elif action.reason is CloseReason.REQUEST_LIMIT:
                    assert conn.takes is not None and conn.takes <= 0
                else:
                    assert conn.draining
            elif isinstance(action, Retry):
                waiter = self.waiters[action.waiter_id]
                assert action.waiter_id in pending and waiter.status == "unanswered"
                assert may_go_again(waiter, action.waiter_id)
                assert waiter.attempts < MAX_ATTEMPTS
                pending.remove(action.waiter_id)
                self.queue.insert(front, action.waiter_id)
                front += 1
                waiter.status = "queued"
                waiter.requeued = True
                waiter.enqueued_at = self.now
                waiter.after = self.last_conn if fresh else 0
                if bounced and action.waiter_id not in never_sent:
                    waiter.bounced_at = self.last_conn
            else:
                assert isinstance(action, Fail)
                waiter = self.waiters[action.waiter_id]
                if call == "close_all":
                    assert action.reason is FailReason.SHUTDOWN
                    assert waiter.status in ("queued", "in_flight")
                    if waiter.status == "queued":
                        self.queue.remove(action.waiter_id)
                    else:
                        conn_id = next(
                            c for c, w in self.in_flight_pairs() if w == action.waiter_id
                        )
                        self.conns[conn_id].in_flight.remove(action.waiter_id)
                else:
                    assert action.waiter_id in pending and waiter.status == "unanswered"
                    pending.remove(action.waiter_id)
                    if may_go_again(waiter, action.waiter_id):
                        assert action.reason is FailReason.RETRIES_EXHAUSTED
                        assert waiter.attempts >= MAX_ATTEMPTS
                    else:
                        assert action.reason is FailReason.CONNECTION_LOST
                waiter.status = "final"
        assert not pending, "every unanswered request is sent again or failed"
        assert all(self.waiters[w].status != "queued" for w in overtaken), "FIFO within a class"
        assert connect_failures <= self.connect_failures_allowed
        if opened:  # one connect per waiter, one at a time for a known h2 origin, none beside
            assert not self.live_h2()  # a live h2 connection
            if self.expects_h2():
                assert self.connecting() == 1
            else:
                assert self.connecting() <= len(self.queue)

    # events

    @rule(asks=st.lists(st.tuples(st.booleans(), st.booleans(), CLIENTS), min_size=1, max_size=3))
    def request(self, asks: list[tuple[bool, bool, object]]) -> None:
        for idempotent, replayable, client in asks:
            self._request(idempotent, client, replayable=replayable)

    def _request(
        self, idempotent: bool, client: object = None, *, replayable: bool = False
    ) -> None:
        self.last_waiter += 1
        w = self.last_waiter
        self.waiters[w] = ModelWaiter(
            idempotent, self.now, replayable=idempotent or replayable, client=client
        )
        self.queue.append(w)
        actions = self.pool.request(
            w, self.now, idempotent=idempotent, replayable=replayable, client=client
        )
        self.play(actions, "request", new_waiter=w)
        if self.waiters[w].status == "queued":
            assert len(self.queue) <= self.limits.max_queue + self.connecting()

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        w = data.draw(st.sampled_from([UNKNOWN, *sorted(self.waiters)]))
        queued = w in self.queue
        if queued:
            self.queue.remove(w)
            self.waiters[w].status = "final"
        actions = self.pool.cancel(w, self.now)
        if not queued:
            assert actions == []
        self.play(actions, "cancel")

    def _ready(self, conn_id: int, proto: Proto, max_streams: int) -> None:
        conn = self.conns[conn_id]
        conn.ready, conn.proto, conn.idle_since = True, proto, self.now
        conn.max_streams = max_streams if proto is H2 else 1
        conn.takes = self.requests_per_connection if proto is H1 else None
        self.known_h2 = proto is H2
        self.learned_proto = True
        actions = self.pool.connection_ready(conn_id, proto, self.now, max_streams=max_streams)
        self.play(actions, "connection_ready")

    @precondition(lambda self: self.connecting())
    @rule(data=st.data(), proto=st.sampled_from(Proto), max_streams=st.integers(1, 3))
    def connection_ready(self, data: st.DataObject, proto: Proto, max_streams: int) -> None:
        conn_id = data.draw(st.sampled_from([c for c, x in self.conns.items() if not x.ready]))
        self._ready(conn_id, proto, max_streams)

    @precondition(lambda self: self.connecting())
    @rule(data=st.data(), as_lost=st.booleans())
    def connection_failed(self, data: st.DataObject, as_lost: bool) -> None:
        conn_id = data.draw(st.sampled_from([c for c, x in self.conns.items() if not x.ready]))
        del self.conns[conn_id]
        # One HTTP/2 connection was to take the whole queue, and no other is up or on its way:
        # every waiter fails with it; otherwise the oldest, unless the connects still under way
        # serve the whole queue.
        for_all = self.expects_h2() and not any(
            not x.ready or x.usable for x in self.conns.values()
        )
        covered: float = self.connecting()
        if self.expects_h2() or self.live_h2():
            covered = math.inf if self.connecting() else 0
        queued = list(self.queue)
        oldest = queued[0] if len(queued) > covered else None
        if as_lost:
            actions = self.pool.connection_lost(conn_id, self.now, unanswered=[])
        else:
            actions = self.pool.connection_failed(conn_id, self.now)
        if oldest is not None:
            assert actions[0] == Reject(oldest, RejectReason.CONNECT_FAILED)
        rejected = [
            a.waiter_id
            for a in actions
            if isinstance(a, Reject) and a.reason is RejectReason.CONNECT_FAILED
        ]
        assert rejected == (queued if for_all else queued[:1] if oldest is not None else [])
        self.connect_failures_allowed = len(rejected)
        self.play(actions, "connection_failed")
        self.connect_failures_allowed = 1

    def _done(
        self,
        conn_id: int,
        waiter_id: int,
        reusable: bool,
        *,
        idle_timeout: float | None = None,
        takes: int | None = None,
    ) -> None:
        conn = self.conns[conn_id]
        conn.in_flight.remove(waiter_id)
        self.waiters[waiter_id].status = "final"
        conn.draining |= not reusable
        if idle_timeout is not None:
            conn.origin_idle = idle_timeout
        if takes is not None:
            conn.takes = takes - len(conn.in_flight)  # those pipelined behind it count
            # What a connection carries: a first statement may read one short, so it only
            # raises what is known; connections up with no bound get it, less what they carried.
            answered = conn.served - len(conn.in_flight)
            known = self.requests_per_connection
            if known is None or answered > 1 or answered + takes > known:
                self.requests_per_connection = answered + takes
                for other in self.conns.values():
                    unanswered = other.served == len(other.in_flight)  # no answer yet
                    if other.proto is H1 and other.takes is None and unanswered:
                        other.takes = answered + takes - other.served
        if not conn.in_flight:
            conn.idle_since = self.now
        actions = self.pool.request_done(
            conn_id, waiter_id, self.now, reusable=reusable, idle_timeout=idle_timeout, takes=takes
        )
        self.play(actions, "request_done")

    @precondition(lambda self: self.in_flight_pairs())
    @rule(
        data=st.data(),
        reusable=st.booleans(),
        idle_timeout=st.none() | st.sampled_from([0.5, 2.0, 60.0]),
        takes=st.none() | st.integers(0, 4),
    )
    def request_done(
        self, data: st.DataObject, reusable: bool, idle_timeout: float | None, takes: int | None
    ) -> None:
        conn_id, waiter_id = data.draw(st.sampled_from(self.in_flight_pairs()))
        if self.conns[conn_id].proto is not H1:  # only HTTP/1.1 origins say so (Keep-Alive)
            idle_timeout = takes = None
        self._done(conn_id, waiter_id, reusable, idle_timeout=idle_timeout, takes=takes)

    @precondition(lambda self: self.in_flight_pairs())
    @rule(data=st.data())
    def unassign(self, data: st.DataObject) -> None:
        """The driver gives back an assignment it did not carry out (its client left): the
        connection is as it was."""
        conn_id, waiter_id = data.draw(st.sampled_from(self.in_flight_pairs()))
        conn = self.conns[conn_id]
        conn.in_flight.remove(waiter_id)
        conn.served -= 1
        if conn.takes is not None:
            conn.takes += 1
        took_idle = self.waiters[waiter_id].took_idle
        if not conn.in_flight:  # idle since then, if it was when assigned
            conn.idle_since = self.now if took_idle is None else took_idle
        self.waiters[waiter_id].status = "final"
        self.play(self.pool.unassign(conn_id, waiter_id, self.now), "unassign")

    def _draw_unanswered(self, data: st.DataObject, conn: ModelConn) -> list[int]:
        if conn.proto is H1:  # responses come in order: the unanswered are a suffix
            return conn.in_flight[data.draw(st.integers(0, len(conn.in_flight))) :]
        chosen = data.draw(
            st.sets(st.sampled_from(conn.in_flight)) if conn.in_flight else st.just(set())
        )
        return [w for w in conn.in_flight if w in chosen]

    @precondition(lambda self: self.ready_conns())
    @rule(data=st.data(), graceful=st.booleans())
    def connection_lost(self, data: st.DataObject, graceful: bool) -> None:
        conn_id = data.draw(st.sampled_from(self.ready_conns()))
        conn = self.conns.pop(conn_id)
        unanswered = self._draw_unanswered(data, conn)
        # Assigned in the turn the connection was lost, never handed to its driver: the last
        # ones assigned, unanswered. They go again whatever their method, the attempt free (a
        # few times).
        most = 0
        while most < len(conn.in_flight) and conn.in_flight[-1 - most] in unanswered:
            most += 1
        never_sent = conn.in_flight[len(conn.in_flight) - data.draw(st.integers(0, most)) :]
        for w in never_sent:
            self.go_free(w)
        sent = [w for w in conn.in_flight if w not in never_sent]
        lost = [w for w in unanswered if w not in never_sent]
        # The first request on the wire (the driver knows; the model has no warm connections):
        # one it had, one done or unknown, or none.
        first_sent = data.draw(st.sampled_from([*sent, UNKNOWN, None]))
        # An announced close (a few times per request), or the keep-alive race (the one
        # request on a reused HTTP/1.1 connection finding it closed, not its first, once per
        # request): expected, so no attempt is used up.
        keep_alive_race = (
            conn.proto is H1
            and len(sent) == 1
            and conn.served > 1
            and first_sent not in lost
            and not any(self.waiters[w].raced for w in lost)
        )
        if graceful:
            for w in lost:
                self.go_free(w)
        elif keep_alive_race:
            for w in lost:
                self.waiters[w].raced = True
                self.waiters[w].attempts -= 1
        elif conn.proto is H1 and len(sent) >= 2 and lost:
            self.broken = True
        for w in conn.in_flight:
            self.waiters[w].status = "unanswered" if w in unanswered else "final"
        # The driver may name a request it does not know any more: ignored.
        actions = self.pool.connection_lost(
            conn_id,
            self.now,
            unanswered=[*unanswered, UNKNOWN],
            graceful=graceful,
            first_sent=first_sent,
            never_sent=never_sent,
        )
        self.play(
            actions,
            "connection_lost",
            unanswered=unanswered,
            never_sent=never_sent,
            unprocessed=graceful or keep_alive_race,
            unproven=first_sent,
            fresh=not graceful,
            bounced=graceful,
        )

    @precondition(lambda self: any(self.conns[c].in_flight for c in self.ready_conns()))
    @rule(data=st.data(), never_sent=st.booleans())
    def requests_unanswered(self, data: st.DataObject, never_sent: bool) -> None:
        conn_id = data.draw(
            st.sampled_from([c for c in self.ready_conns() if self.conns[c].in_flight])
        )
        conn = self.conns[conn_id]
        unanswered = self._draw_unanswered(data, conn)
        if conn.proto is H1:  # the connection is done
            conn.draining = True
        if never_sent:  # not a byte of them left: the attempt is free (a few times)
            for w in unanswered:
                self.go_free(w)
        for w in unanswered:
            conn.in_flight.remove(w)
            self.waiters[w].status = "unanswered"
        if not conn.in_flight:
            conn.idle_since = self.now
        actions = self.pool.requests_unanswered(
            conn_id, unanswered, self.now, never_sent=never_sent
        )
        self.play(
            actions,
            "requests_unanswered",
            unanswered=unanswered,
            never_sent=unanswered if never_sent else (),
            unprocessed=never_sent or conn.proto is H2,
            refused=conn.proto is H2,
        )

    @precondition(lambda self: self.ready_conns())
    @rule(data=st.data())
    def goaway(self, data: st.DataObject) -> None:
        conn_id = data.draw(st.sampled_from(self.ready_conns()))
        self.conns[conn_id].draining = True
        self.play(self.pool.goaway(conn_id, self.now), "goaway")

    def _max_streams(self, conn_id: int, max_streams: int) -> None:
        self.conns[conn_id].max_streams = max_streams
        self.play(self.pool.max_streams_changed(conn_id, max_streams, self.now), "max_streams")

    @precondition(lambda self: any(self.conns[c].proto is H2 for c in self.ready_conns()))
    @rule(data=st.data(), max_streams=st.integers(0, 3))
    def max_streams_changed(self, data: st.DataObject, max_streams: int) -> None:
        h2 = [c for c in self.ready_conns() if self.conns[c].proto is H2]
        self._max_streams(data.draw(st.sampled_from(h2)), max_streams)

    @precondition(lambda self: self.ready_conns())
    @rule(data=st.data())
    def idle_connection_closed_by_server(self, data: st.DataObject) -> None:
        conn_id = data.draw(st.sampled_from(self.ready_conns()))
        if self.conns[conn_id].in_flight:
            self.conns[conn_id].draining = True
        else:
            del self.conns[conn_id]
        actions = self.pool.idle_connection_closed_by_server(conn_id, self.now)
        self.play(actions, "idle_connection_closed_by_server")

    # Rare: once set it stays set, and would hide pipelining from the rest of the run.
    @precondition(lambda self: not self.broken)
    @rule(now=st.integers(0, 4))
    def pipelining_failed(self, now: int) -> None:
        if now:
            return
        self.broken = True
        self.play(self.pool.pipelining_failed(self.now), "pipelining_failed")

    @rule(limits=LIMITS)
    def set_limits(self, limits: PoolLimits) -> None:
        self.limits = limits
        self.highest_cap = max(self.highest_cap, limits.max_connections)
        self.play(self.pool.set_limits(limits, self.now), "set_limits")
        assert len(self.queue) <= limits.max_queue + self.connecting()

    @rule(ceiling=st.one_of(st.none(), st.integers(0, 3)))
    def set_ceiling(self, ceiling: int | None) -> None:
        self.ceiling = ceiling
        self.play(self.pool.set_ceiling(ceiling, self.now), "set_ceiling")

    @rule(count=st.integers(0, 2), after=st.sampled_from([0.5, 1.0]))
    def lend_idle(self, count: int, after: float) -> None:
        self.lend, self.lend_after = count, after
        self.play(self.pool.lend(count, self.now, after=after), "lend")

    @precondition(lambda self: self.connecting())
    @rule(data=st.data())
    def abandon_connect(self, data: st.DataObject) -> None:
        conn_id = data.draw(st.sampled_from([c for c, x in self.conns.items() if not x.ready]))
        del self.conns[conn_id]
        actions = self.pool.abandon_connect(conn_id, self.now)
        assert not any(isinstance(a, Reject) for a in actions)
        self.play(actions, "abandon_connect")

    @rule(dt=st.sampled_from([0.25, 1.0, 2.5, 10.0]))
    def tick(self, dt: float) -> None:
        deadline = self.pool.next_deadline()
        self.now += dt
        actions = self.pool.tick(self.now)
        # next_deadline is exact: work is due at it and not before.
        assert bool(actions) == (deadline is not None and deadline <= self.now)
        self.play(actions, "tick")

    @rule()
    def serve_everything(self) -> None:
        """Liveness: if every connect succeeds and every response ends, nobody waits forever
        (once a ceiling is lifted: the other workers got the slots they were owed)."""
        self.set_ceiling(None)
        for _ in range(200):
            work = [
                c
                for c, x in sorted(self.conns.items())
                if not x.ready or x.in_flight or (x.proto is H2 and x.max_streams == 0)
            ]
            if not work:
                break
            conn = self.conns[work[0]]
            if not conn.ready:
                self._ready(work[0], H1, 1)
            elif conn.in_flight:
                self._done(work[0], conn.in_flight[0], True)
            else:
                self._max_streams(work[0], 1)
        assert not self.queue

    @precondition(
        lambda self: any(
            not self.waiters[w].idempotent or self.waiters[w].bounced_at for w in self.queue
        )
    )
    @rule()
    def steady_pipelined_load(self) -> None:
        """Liveness under load: a new idempotent request for every response that ends (oldest
        first) must not keep every connection busy forever while a non-idempotent one waits."""
        target = next(
            w for w in self.queue if not self.waiters[w].idempotent or self.waiters[w].bounced_at
        )
        self.set_ceiling(None)
        for _ in range(100):
            if self.waiters[target].status != "queued":
                return
            self._request(True)
            # Fair progress: a connect under way completes, and the oldest response ends.
            connecting = [c for c, x in self.conns.items() if not x.ready]
            if connecting:
                self._ready(min(connecting), H1, 1)
            if pairs := self.in_flight_pairs():
                conn_id, waiter_id = min(pairs, key=lambda p: self.waiters[p[1]].sent)
                self._done(conn_id, waiter_id, True)
            elif not connecting:
                stuck = [c for c, x in self.conns.items() if x.proto is H2 and x.max_streams == 0]
                assert stuck, "waits with nothing in flight and nothing coming"
                self._max_streams(min(stuck), 1)
        raise AssertionError(f"waiter {target}, which may not be pipelined, starved")

    # invariants

    @invariant()
    def pool_is_settled_and_matches_the_model(self) -> None:
        pool = self.pool
        assert pool.tick(self.now) == []  # nothing left undone
        assert pool.queued == len(self.queue)
        assert pool.active_connections == len(self.conns)
        assert pool.in_flight == len(self.in_flight_pairs())
        assert pool.pipelining_broken == self.broken
        assert pool.requests_per_connection == self.requests_per_connection
        assert list(pool._queue) == self.queue
        deadlines = [
            self.waiters[w].enqueued_at + self.limits.queue_timeout for w in self.queue
        ] + [
            c.idle_since + c.idle_timeout(self.limits)
            for c in self.conns.values()
            if c.ready and not c.in_flight
        ]
        if self.lend:
            deadlines += [
                c.idle_since + self.lend_after
                for c in self.conns.values()
                if c.ready and not c.in_flight
            ]
        assert pool.next_deadline() == min((d for d in deadlines if d != math.inf), default=None)
        assert repr(pool)

    @invariant()
    def nobody_waits_who_could_be_served(self) -> None:
        if len(self.conns) > self.cap():  # a lowered cap: only busy ones stay
            assert all(not x.ready or x.in_flight for x in self.conns.values())
        requeued = sum(1 for w in self.queue if self.waiters[w].requeued)
        assert len(self.queue) <= self.limits.max_queue + self.highest_cap + requeued
        if not self.queue:
            return
        for conn_id, conn in self.conns.items():
            if conn.usable:
                assert not (
                    conn.proto is H1
                    and not conn.in_flight
                    and any(self.fits(w, conn_id) for w in self.queue)
                ), "an idle connection"
                assert not (conn.proto is H2 and len(conn.in_flight) < conn.max_streams)
        if self.live_h2():  # waits for a stream
            return
        for w in self.queue:  # a request going again has a connection coming, or waits for one
            if self.waiters[w].after:  # to free up at the cap (then closed for a new one)
                idle_h1 = [
                    c
                    for c, x in self.conns.items()
                    if x.usable and x.proto is H1 and not x.in_flight
                ]
                assert self.connecting() or (len(self.conns) >= self.cap() and not idle_h1)
        if len(self.conns) < self.opening_cap():  # room: connects cover the queue
            if self.expects_h2():
                assert self.connecting() >= 1
            else:
                assert self.connecting() >= len(self.queue)
        elif (
            not self.connecting()
            and self.waiters[self.queue[0]].idempotent
            and self.limits.pipeline_depth >= 2
            and not self.broken
        ):  # at the cap with nothing coming: the head would be pipelined if it could
            for conn_id, conn in self.conns.items():
                assert not (
                    conn.ready
                    and self.fits(self.queue[0], conn_id)
                    and conn_id > self.waiters[self.queue[0]].bounced_at
                    and conn.proto is H1
                    and conn.usable
                    and 1 <= len(conn.in_flight) < self.limits.pipeline_depth
                    and all(self.waiters[w].idempotent for w in conn.in_flight)
                )

    def teardown(self) -> None:
        if not hasattr(self, "pool"):
            return
        self.play(self.pool.close_all(self.now), "close_all")
        assert not self.conns and not self.queue and not self.in_flight_pairs()
        assert self.pool.request(UNKNOWN, self.now, idempotent=True) == [
            Fail(UNKNOWN, FailReason.SHUTDOWN)
        ]


PoolMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=50, deadline=None)
TestPoolMachine = PoolMachine.TestCase


# -- a cap per client (policies without `upstream:`)


def test_per_client_opens_each_clients_share_within_the_cap() -> None:
    pool = make(max_connections=5, per_client=2)
    assert pool.request(1, 0.0, idempotent=True, client="a") == [Open(1)]
    assert pool.request(2, 0.0, idempotent=True, client="a") == [Open(2)]
    assert pool.request(3, 0.0, idempotent=True, client="a") == []  # a's two are opening
    # Client b brings room for two more: one for a's waiting request, one for its own.
    assert pool.request(4, 0.0, idempotent=True, client="b") == [Open(3), Open(4)]
    assert pool.request(5, 0.0, idempotent=True, client="b") == []
    # Client c: one more, and no further than max_connections.
    assert pool.request(6, 0.0, idempotent=True, client="c") == [Open(5)]
    assert pool.request(7, 0.0, idempotent=True, client="c") == []
    assert pool.active_connections == 5


def test_per_client_idle_connections_stay_and_serve_anyone() -> None:
    pool = make(max_connections=5, per_client=2)
    for waiter, client in ((1, "a"), (2, "a"), (3, "b"), (4, "b")):
        pool.request(waiter, 0.0, idempotent=True, client=client)
    ready = [a for c in range(1, 5) for a in pool.connection_ready(c, H1, 0.0)]
    for assign in ready:
        assert isinstance(assign, Assign)
        assert pool.request_done(assign.conn_id, assign.waiter_id, 1.0, reusable=True) == []
    # Nobody has requests now: the four idle connections stay (a warm pool), and one client's
    # requests take them all, though it could not have opened more than two.
    assert pool.active_connections == 4
    assigned = [pool.request(10 + n, 2.0, idempotent=True, client="c") for n in range(5)]
    assert [a for actions in assigned for a in actions if isinstance(a, Assign)] == [
        Assign(10 + n, conn_id, REUSED, 0.0) for n, conn_id in enumerate((4, 3, 2, 1))
    ]
    assert assigned[4] == []  # 4 connections held, 2 for its one client: it waits


def test_per_client_a_free_connection_serves_the_client_with_fewest_in_flight() -> None:
    pool = make(max_connections=10, per_client=2)
    for waiter in range(1, 7):  # client a: six at once, two connections opening for it
        pool.request(waiter, 0.0, idempotent=True, client="a")
    assert pool.active_connections == 2
    # b arrives later and brings two more connections; a's older requests do not take them.
    assert pool.request(7, 0.1, idempotent=True, client="b") == [Open(3), Open(4)]
    pool.request(8, 0.1, idempotent=True, client="b")
    served = [a for c in (1, 2, 3, 4) for a in pool.connection_ready(c, H1, 0.2)]
    assert [(a.waiter_id, a.conn_id) for a in served if isinstance(a, Assign)] == [
        (1, 1),  # a: 0 in flight, b: 0 in flight; a waited longer
        (7, 2),  # b: 0, a: 1
        (2, 3),  # a: 1, b: 1; a waited longer
        (8, 4),  # b: 1, a: 2
    ]
    # Each client's own requests keep their order; a's next goes when one of its connections
    # frees up (b has nothing more waiting).
    done = pool.request_done(2, 7, 0.3, reusable=True)
    assert [(a.waiter_id, a.conn_id) for a in done if isinstance(a, Assign)] == [(3, 2)]


def test_without_per_client_the_cap_is_everyones() -> None:
    pool = make(max_connections=2)
    assert pool.request(1, 0.0, idempotent=True, client="a") == [Open(1)]
    assert pool.request(2, 0.0, idempotent=True, client="b") == [Open(2)]
    assert pool.request(3, 0.0, idempotent=True, client="c") == []


_TURN_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("request"), st.sampled_from("abc")),
        st.tuples(st.just("ready"), st.integers(0, 7)),
        st.tuples(st.just("done"), st.integers(0, 15)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(per_client=st.integers(1, 2), cap=st.integers(1, 5), steps=_TURN_STEPS)
def test_per_client_turns_keep_each_clients_order_and_serve_the_least_loaded(
    per_client: int, cap: int, steps: list[tuple[str, str | int]]
) -> None:
    """Random requests from three clients, connections coming up and responses ending: every
    assignment serves the client with the fewest requests in flight (ties: the one waiting
    longest), takes that client's oldest request, and no connection opens beyond the shares."""
    pool = make(max_connections=cap, per_client=per_client, max_queue=100, http2=False)
    client_of: dict[int, str] = {}
    queue: list[int] = []  # waiting requests, oldest first
    in_flight: dict[int, int] = {}  # waiter -> connection
    connecting: list[int] = []
    conns: set[int] = set()

    def play(actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Open):
                connecting.append(action.conn_id)
                conns.add(action.conn_id)
                clients = {client_of[w] for w in [*queue, *in_flight]}
                assert len(conns) <= min(cap, per_client * len(clients))
            elif isinstance(action, Assign):
                loads = {c: 0 for c in (client_of[w] for w in queue)}
                for w in in_flight:
                    if client_of[w] in loads:
                        loads[client_of[w]] += 1
                first: dict[str, int] = {}
                for position, w in enumerate(queue):
                    first.setdefault(client_of[w], position)
                turn = min(loads, key=lambda c: (loads[c], first[c]))
                client = client_of[action.waiter_id]
                assert client == turn, (action, loads, first)
                assert queue[first[client]] == action.waiter_id  # the client's oldest
                queue.remove(action.waiter_id)
                in_flight[action.waiter_id] = action.conn_id
            elif isinstance(action, Close):
                conns.discard(action.conn_id)
            else:
                raise AssertionError(f"unexpected {action}")

    waiter = 0
    for kind, arg in steps:
        if kind == "request":
            waiter += 1
            client_of[waiter] = str(arg)
            queue.append(waiter)
            play(pool.request(waiter, 0.0, idempotent=True, client=arg))
        elif kind == "ready" and connecting:
            play(pool.connection_ready(connecting.pop(int(arg) % len(connecting)), H1, 0.0))
        elif kind == "done" and in_flight:
            done = sorted(in_flight)[int(arg) % len(in_flight)]
            play(pool.request_done(in_flight.pop(done), done, 0.0, reusable=True))
    assert pool.queued == len(queue) and pool.in_flight == len(in_flight)
