"""Which requests reshape's engine carries (reshape/upstream/), and under which route.

Thin on purpose: the decision is `route_for(flow)`, which the engine's join
(reshape/mitm/patches/engine_join.py) asks when a request needs a connection. Every HTTP request
goes through the engine except upgrades (WebSocket and other protocols after a 101 stay on
mitmproxy's own connections: the engine speaks HTTP only).
"""

from __future__ import annotations

from mitmproxy import http

from reshape.features.pool.routes import BROWSER_LIKE, Destination, route
from reshape.policy.chooser import selection_of
from reshape.policy.schema import UpstreamKnobs
from reshape.upstream.engine import Route


class PoolRouting:
    def __init__(self, defaults: UpstreamKnobs = BROWSER_LIKE) -> None:
        # The knobs of policies without `upstream:` (`reshape run --origin-connect-timeout`,
        # `--origin-read-timeout` set theirs).
        self.defaults = defaults

    def route_for(self, flow: http.HTTPFlow) -> Route | None:
        request = flow.request
        if request.method == "CONNECT" or "upgrade" in request.headers:
            return None
        selection = selection_of(flow)
        destination = Destination.of(
            request.scheme, request.host, request.port, flow.client_conn.sni
        )
        return route(
            destination,
            selection.policy,
            selection.policy_name,
            selection.arm,
            client=flow.client_conn.id,
            defaults=self.defaults,
        )
