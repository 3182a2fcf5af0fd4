"""reshape/upstream/pool.py: a connection's life is the transition table, and nothing else."""

from __future__ import annotations

import itertools

import pytest

from reshape.upstream.pool import (
    TRANSITIONS,
    CloseReason,
    ConnEvent,
    ConnState,
    PoolStateError,
    _Connection,
)


@pytest.mark.parametrize(("state", "event"), list(itertools.product(ConnState, ConnEvent)))
def test_an_event_moves_a_connection_only_as_the_table_says(
    state: ConnState, event: ConnEvent
) -> None:
    conn = _Connection(1, state=state)
    if (state, event) in TRANSITIONS:
        conn.move(event)
        assert conn.state is TRANSITIONS[(state, event)]
    else:
        with pytest.raises(PoolStateError, match=f"from {state.value} on {event.value}"):
            conn.move(event)
        assert conn.state is state


def test_a_draining_connection_takes_nothing_new_and_keeps_its_first_reason() -> None:
    conn = _Connection(1, state=ConnState.BUSY)
    conn.drain(CloseReason.GOAWAY)
    conn.drain(CloseReason.NOT_REUSABLE)
    assert conn.state is ConnState.DRAINING and conn.draining is CloseReason.GOAWAY
    assert not conn.open_for_work
    with pytest.raises(PoolStateError):
        conn.move(ConnEvent.ASSIGNED)


def test_a_connecting_connection_is_neither_idle_nor_open_for_work() -> None:
    conn = _Connection(1)
    assert not conn.idle and not conn.open_for_work and not conn.up
    conn.move(ConnEvent.UP)
    assert conn.idle and conn.open_for_work and conn.up


def test_an_hpack_release_the_engine_was_not_checked_on_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.metadata

    from reshape.upstream import h2

    h2.check_hpack_version()  # the pinned one passes
    pinned = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata, "version", lambda name: "9.9.9" if name == "hpack" else pinned(name)
    )
    with pytest.raises(h2.HpackVersionError, match="checked on hpack 4.2.0, not 9.9.9"):
        h2.check_hpack_version()
