"""reshape/features/client_errors/rules.py `outcome_by_client`: flows a client ended (a reset
stream, a flood that closed its connection) count as the client's doing, never the origin's."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reshape.features.client_errors.rules import CLIENT_CONNECTION_CLOSED, outcome_by_client


@pytest.mark.parametrize(
    ("message", "outcome"),
    [
        ("stream reset by client (CANCEL)", "client_aborted"),
        ("stream reset by client (NO_ERROR)", "client_aborted"),
        (CLIENT_CONNECTION_CLOSED + "HTTP/2 reset flood", "client_error"),
        (CLIENT_CONNECTION_CLOSED + "HTTP/2 protocol error: frame on stream 0", "client_error"),
        # The same protocol error from an origin's connection is the origin's.
        ("HTTP/2 protocol error: frame on stream 0", None),
        ("server closed connection", None),
        ("Client disconnected.", None),
    ],
)
def test_outcome_by_client(message: str, outcome: str | None) -> None:
    assert outcome_by_client(message) == outcome


@given(st.text(max_size=200))
def test_only_the_two_marks_count(message: str) -> None:
    assert outcome_by_client(message) in (None, "client_aborted", "client_error")
