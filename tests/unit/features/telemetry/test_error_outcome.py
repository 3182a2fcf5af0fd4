"""reshape/features/telemetry/addon.py `error_outcome`: a flow its client left ends as the
client's doing (`client_aborted`), never as the origin's error; and the bytes such a flow
relayed before it ended are counted."""

from __future__ import annotations

from pathlib import Path

import pytest
from mitmproxy import flow
from mitmproxy.connection import ConnectionState
from mitmproxy.test import tflow

from reshape.features.telemetry import metrics
from reshape.features.telemetry.addon import Telemetry, error_outcome
from reshape.policy.chooser import PolicyChooser
from reshape.policy.loader import parse_policy_text

POLICY = parse_policy_text("version: 1\ndefault: a\npolicies: {a: {}}\n", Path("p.yaml"))


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


def test_the_bytes_of_a_response_broken_off_are_counted() -> None:
    """A black-box review: five clients that left 400 kB into a streamed 2 MB response got
    2,000,000 bytes (the request log said so); reshape_response_bytes_total said 0."""
    telemetry = Telemetry()
    broken = tflow.tflow(resp=True)
    PolicyChooser(POLICY).requestheaders(broken)
    telemetry.requestheaders(broken)
    assert broken.response is not None
    broken.response.headers["content-length"] = str(2_000_000)
    broken.response.stream = True
    telemetry.responseheaders(broken)
    assert callable(broken.response.stream)
    broken.response.stream(b"x" * 400_000)
    counted = metrics.response_bytes_total.labels("a", "none")
    before = counted._value.get()
    broken.error = flow.Error("Client disconnected.")
    telemetry.error(broken)
    assert counted._value.get() == before + 400_000
    telemetry.error(broken)  # once only
    assert counted._value.get() == before + 400_000
