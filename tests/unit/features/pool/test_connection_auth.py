"""reshape/features/pool/connection_auth.py: a client connection that authenticates to an origin
with NTLM or Negotiate gets a connection there of its own."""

from __future__ import annotations

import pytest
from mitmproxy import http
from mitmproxy.test import tflow

from reshape.base.flowstate import state_of
from reshape.features.pool.addon import PoolRouting
from reshape.features.pool.connection_auth import Pins, authenticates_connection
from reshape.policy.schema import Policy, UpstreamKnobs
from reshape.policy.selection import Selection

POOLED = Policy(upstream=UpstreamKnobs(max_connections_per_host=6, pipeline_depth=8, http2=True))


@pytest.mark.parametrize(
    ("values", "binds"),
    [
        (["NTLM TlRMTVNTUAABAAAAB4IIAAAAAAAAAAAAAAAAAAAAAAA="], True),
        (["Negotiate YIIGhgYGKwYBBQUCoIIGejCCBnag"], True),
        (["ntlm abc"], True),  # schemes are case-insensitive (RFC 9110 §11.1)
        (["  NTLM"], True),
        (["Basic YWxpY2U6c2VjcmV0"], False),  # each request says who it is
        (["Bearer eyJ0eXAi"], False),
        (['Digest username="alice", realm="x"'], False),
        (["NTLMish abc"], False),
        ([""], False),
        ([], False),
    ],
)
def test_the_schemes_that_authenticate_a_connection(values: list[str], binds: bool) -> None:
    assert authenticates_connection(values) is binds


def test_pins_are_remembered_least_recently_used_first_forgotten() -> None:
    pins: Pins[str] = Pins(kept=2)
    pins.pin("a", "origin", "route a")
    pins.pin("b", "origin", "route b")
    assert pins.route_of("a", "origin") == "route a"  # now the most recently used
    pins.pin("c", "origin", "route c")
    assert (pins.route_of("a", "origin"), pins.route_of("b", "origin")) == ("route a", None)
    assert pins.route_of("c", "origin") == "route c" and pins.route_of("c", "elsewhere") is None
    assert len(pins) == 2
    with pytest.raises(ValueError, match="kept"):
        Pins(kept=0)


def flow_of(
    client: str,
    url: str,
    authorization: str | None = None,
    policy: Policy = POOLED,
    arm: str = "none",
) -> http.HTTPFlow:
    flow = tflow.tflow()
    flow.client_conn.id = client
    flow.request.url = url
    if authorization is not None:
        flow.request.headers["Authorization"] = authorization
    state_of(flow).selection = Selection("pooled", policy, arm)
    return flow


def test_a_client_that_authenticates_its_connection_gets_one_of_its_own_from_then_on() -> None:
    # A shared pool handed the connection an origin (IIS) had authenticated for one user to the
    # next who asked: another client, with no credentials at all, was served as the first.
    routing = PoolRouting()
    shared = routing.route_for(flow_of("alice", "http://intranet.test/"))
    assert shared is not None and shared.owner is None
    first_step = routing.route_for(flow_of("alice", "http://intranet.test/", "NTLM TlRMTVNTUAAB"))
    assert first_step is not None and first_step.owner == "alice"
    # One HTTP/1.1 connection, one request at a time: every step of the handshake, and every
    # request after it, goes on the connection the origin authenticated.
    limits = first_step.limits
    assert (limits.max_connections, limits.pipeline_depth, limits.http2) == (1, 0, False)
    assert first_step.pool_id != shared.pool_id
    after = routing.route_for(flow_of("alice", "http://intranet.test/next"))
    assert after is first_step
    # Others, and this client elsewhere, keep the shared pool.
    bob = routing.route_for(flow_of("bob", "http://intranet.test/"))
    assert bob is not None and bob.owner is None and bob.pool_id == shared.pool_id
    elsewhere = routing.route_for(flow_of("alice", "http://other.test/"))
    assert elsewhere is not None and elsewhere.owner is None
    basic = routing.route_for(flow_of("carol", "http://intranet.test/", "Basic YWxpY2U6c2VjcmV0"))
    assert basic is not None and basic.owner is None


def test_a_pinned_client_keeps_its_connection_whatever_policy_its_later_requests_get() -> None:
    # The pinned route was made anew from each request's policy: after a reload that changed
    # any of its knobs, or under an experiment's other arm, the client got another pool of its
    # own, with a connection the origin had not authenticated (a 401, or a handshake whose
    # second step went where its first had not).
    routing = PoolRouting()
    pinned = routing.route_for(flow_of("alice", "http://intranet.test/", "NTLM TlRMTVNTUAAB"))
    reloaded = Policy(upstream=UpstreamKnobs(max_connections_per_host=6, idle_timeout=61))
    other_arm = Policy(upstream=UpstreamKnobs(queue_timeout=5))
    for policy, arm in ((reloaded, "none"), (other_arm, "exp:b")):
        later = routing.route_for(flow_of("alice", "http://intranet.test/x", None, policy, arm))
        assert later is pinned
