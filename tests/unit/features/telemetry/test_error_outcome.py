"""reshape/features/telemetry/addon.py `error_outcome`: a flow its client left ends as the
client's doing (`client_aborted`), never as the origin's error."""

from __future__ import annotations

import pytest
from mitmproxy import flow
from mitmproxy.connection import ConnectionState
from mitmproxy.test import tflow

from reshape.features.telemetry.addon import error_outcome


@pytest.mark.parametrize(
    ("message", "state", "outcome"),
    [
        # mitmproxy's HTTP/1.1 and HTTP/2 servers, when the client's connection closes (or its
        # side of it): its end time is not set yet when the flow's error hooks run.
        ("Client disconnected.", ConnectionState.CAN_WRITE, "client_aborted"),
        ("peer closed connection", ConnectionState.CLOSED, "client_aborted"),
        # The client still there: the origin's doing.
        (
            "connection lost (the last attempt: closed by the origin)",
            ConnectionState.OPEN,
            "upstream_error",
        ),
    ],
)
def test_a_client_that_left_is_no_origin_error(
    message: str, state: ConnectionState, outcome: str
) -> None:
    f = tflow.tflow()
    f.client_conn.timestamp_end = None
    f.client_conn.state = state
    f.error = flow.Error(message)
    assert error_outcome(f) == outcome
