"""Which requests reshape's engine carries (reshape/upstream/), and under which route.

Thin on purpose: the decision is `route_for(flow)`, which the engine's join
(reshape/mitm/patches/engine_join.py) asks when a request needs a connection. Every HTTP request
goes through the engine except upgrades (WebSocket and other protocols after a 101 stay on
mitmproxy's own connections: the engine speaks HTTP only). A client connection that
authenticates to an origin with NTLM or Negotiate gets a connection there of its own
(reshape/features/pool/connection_auth.py).
"""

from __future__ import annotations

from mitmproxy import http

from reshape.features.destinations.rules import OwnAddressBook
from reshape.features.pool.connection_auth import Pins, authenticates_connection
from reshape.features.pool.routes import (
    BROWSER_LIKE,
    Destination,
    knobs_of,
    limits_of,
    pinned_route,
    route,
)
from reshape.policy.chooser import selection_of
from reshape.policy.schema import Policy, PolicyFile, UpstreamKnobs
from reshape.upstream.engine import Route
from reshape.upstream.pool import PoolLimits

# Routes remembered (a route is the same for every request of one client connection to one
# destination under one policy; building it was 1.8% of the pool's CPU per request in a burst
# profile). When full, forgotten all at once.
ROUTES_KEPT = 4096


class PoolRouting:
    def __init__(
        self, defaults: UpstreamKnobs = BROWSER_LIKE, own: OwnAddressBook | None = None
    ) -> None:
        # The knobs of policies without `upstream:` (`reshape run --origin-connect-timeout`,
        # `--origin-read-timeout` set theirs).
        self.defaults = defaults
        # The proxy's own addresses: every route's connections are checked against them and
        # against its policy's `destinations` once connected.
        self.own = own
        # (destination, policy's identity, name, arm, client, client address) → (policy, route);
        # the policy is kept so that its identity cannot be reused by another (a reload).
        self._routes: dict[tuple[object, ...], tuple[Policy, Route]] = {}
        # The routes of client connections that authenticate their origin connection (NTLM,
        # Negotiate) to a destination.
        self.pins: Pins[Route] = Pins()

    def route_to(
        self,
        destination: Destination,
        policy: Policy,
        policy_name: str,
        arm: str,
        client: str | None = None,
        client_address: str | None = None,
    ) -> Route:
        key = (destination, id(policy), policy_name, arm, client, client_address)
        known = self._routes.get(key)
        if known is not None and known[0] is policy:
            return known[1]
        made = route(
            destination,
            policy,
            policy_name,
            arm,
            client=client,
            client_address=client_address,
            defaults=self.defaults,
            own=self.own,
        )
        if len(self._routes) >= ROUTES_KEPT:
            self._routes.clear()
        self._routes[key] = (policy, made)
        return made

    def shared_limits(self, policy_file: PolicyFile) -> set[PoolLimits]:
        """The limits of the shared pools the file's policies route to (a client's own pools,
        `share: false` or pinned, go with their client)."""
        return {
            limits_of(knobs_of(policy, self.defaults)) for policy in policy_file.policies.values()
        }

    def route_for(self, flow: http.HTTPFlow) -> Route | None:
        request = flow.request
        if request.method == "CONNECT" or "upgrade" in request.headers:
            return None
        selection = selection_of(flow)
        destination = Destination.of(
            request.scheme, request.host, request.port, flow.client_conn.sni
        )
        client = flow.client_conn.id
        pinned = self.pins.route_of(client, destination)
        if pinned is not None:
            return pinned
        made = self.route_to(
            destination,
            selection.policy,
            selection.policy_name,
            selection.arm,
            client=client,
            client_address=flow.client_conn.peername[0] if flow.client_conn.peername else None,
        )
        if "authorization" in request.headers and authenticates_connection(
            request.headers.get_all("authorization")
        ):
            made = pinned_route(made, client)
            self.pins.pin(client, destination, made)
        return made
