"""reshape/features/pool/addon.py: a route per client connection, destination and policy,
built once; a reloaded policy gets routes of its own."""

from __future__ import annotations

from reshape.features.pool.addon import ROUTES_KEPT, PoolRouting
from reshape.features.pool.routes import Destination
from reshape.policy.schema import Policy, UpstreamKnobs

ORIGIN = Destination.of("https", "127.0.0.3", 443)


def test_the_same_request_gets_the_same_route_object() -> None:
    routing = PoolRouting()
    policy = Policy(upstream=UpstreamKnobs(max_connections_per_host=2))
    first = routing.route_to(ORIGIN, policy, "pooled", "none", "client-1", "127.0.0.1")
    assert routing.route_to(ORIGIN, policy, "pooled", "none", "client-1", "127.0.0.1") is first
    assert first.limits.max_connections == 2


def test_what_a_route_depends_on_gives_another_route() -> None:
    routing = PoolRouting()
    policy = Policy(upstream=UpstreamKnobs(share=False))
    base = routing.route_to(ORIGIN, policy, "own", "none", "client-1", "127.0.0.1")
    other_client = routing.route_to(ORIGIN, policy, "own", "none", "client-2", "127.0.0.1")
    assert base.owner == "client-1" and other_client.owner == "client-2"
    elsewhere = routing.route_to(
        Destination.of("https", "127.0.0.4", 443), policy, "own", "none", "client-1", "127.0.0.1"
    )
    assert elsewhere.key.host == "127.0.0.4"
    arm = routing.route_to(ORIGIN, policy, "own", "exp:b", "client-1", "127.0.0.1")
    assert arm.labels == ("own", "exp:b")


def test_a_reloaded_policy_of_the_same_name_gets_its_own_knobs() -> None:
    routing = PoolRouting()
    before = Policy(upstream=UpstreamKnobs(max_connections_per_host=2))
    routing.route_to(ORIGIN, before, "pooled", "none", "client-1", "127.0.0.1")
    after = Policy(upstream=UpstreamKnobs(max_connections_per_host=4))
    reloaded = routing.route_to(ORIGIN, after, "pooled", "none", "client-1", "127.0.0.1")
    assert reloaded.limits.max_connections == 4


def test_the_remembered_routes_are_bounded() -> None:
    routing = PoolRouting()
    policy = Policy(upstream=UpstreamKnobs())
    for n in range(ROUTES_KEPT + 10):
        routing.route_to(ORIGIN, policy, "pooled", "none", f"client-{n}", "127.0.0.1")
    assert len(routing._routes) <= ROUTES_KEPT


def test_a_host_names_case_makes_no_other_destination_and_sni_has_no_trailing_dot() -> None:
    # Each case of a name had its own pool, and so its own per-host cap; the dot of an
    # absolute name went into the TLS server name (RFC 6066 §3 forbids it).
    assert Destination.of("https", "Origin.Example", 443) == Destination.of(
        "https", "origin.example", 443
    )
    assert Destination.of("http", "ORIGIN.EXAMPLE", 80).host == "origin.example"
    absolute = Destination.of("https", "origin.example.", 443)
    assert (absolute.host, absolute.sni) == ("origin.example.", "origin.example")
    tunnelled = Destination.of("https", "127.0.0.3", 443, client_sni="Origin.Example.")
    assert tunnelled.sni == "origin.example"
