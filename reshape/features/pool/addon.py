"""Hands requests whose policy has an `upstream:` section to reshape's shared pool of origin
connections (reshape/upstream/), through the engine's internal gateway.

Thin on purpose: it only rewrites where mitmproxy sends the request and records the outcome the
gateway reports. Requests under a policy without `upstream:` are left to mitmproxy.
"""

from __future__ import annotations

import ipaddress

from mitmproxy import http

from reshape.base.addresses import ListenAddress
from reshape.base.flowstate import state_of
from reshape.policy.chooser import selection_of
from reshape.upstream.gateway import ASSIGNMENT_HEADER, OUTCOME_HEADER, ROUTE_HEADER, RouteHeader
from reshape.upstream.types import Assignment


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def route_of(flow: http.HTTPFlow) -> RouteHeader:
    """Where the request really goes, before the addon points it at the gateway."""
    request = flow.request
    default_port = 443 if request.scheme == "https" else 80
    authority = request.host_header or (
        request.host if request.port == default_port else f"{request.host}:{request.port}"
    )
    sni = flow.client_conn.sni or (None if _is_ip(request.host) else request.host)
    selection = selection_of(flow)
    return RouteHeader(
        scheme=request.scheme,
        host=request.host,
        port=request.port,
        sni=sni if request.scheme == "https" else None,
        authority=authority,
        policy=selection.policy_name,
        arm=selection.arm,
    )


class UpstreamPool:
    def __init__(self, gateway: ListenAddress, token: str) -> None:
        self.gateway = gateway
        self.token = token

    def request(self, flow: http.HTTPFlow) -> None:
        # A route header from a client is never trusted, whatever the policy.
        flow.request.headers.pop(ROUTE_HEADER, None)
        if flow.response is not None or flow.request.method == "CONNECT":
            return
        if selection_of(flow).policy.upstream is None:
            return
        if "upgrade" in flow.request.headers:
            return  # WebSocket and other upgrades stay with mitmproxy
        route = route_of(flow)
        flow.request.headers[ROUTE_HEADER] = route.encode(self.token)
        flow.request.scheme = "http"
        flow.request.host = self.gateway.host
        flow.request.port = self.gateway.port
        state_of(flow).pooled = True

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        state = state_of(flow)
        if state.pooled and flow.response is not None:
            outcome = flow.response.headers.pop(OUTCOME_HEADER, None)
            if outcome:
                state.outcome = outcome
            assignment = parse_assignment(flow.response.headers.pop(ASSIGNMENT_HEADER, ""))
            if assignment is not None:
                state.assignment = assignment


def parse_assignment(value: str) -> Assignment | None:
    """The gateway's `reshape-assignment` header, or None if absent or garbled."""
    parts = value.split(" ")
    if len(parts) != 3 or parts[1] not in ("0", "1"):
        return None
    try:
        return Assignment(parts[0], parts[1] == "1", float(parts[2]))
    except ValueError:
        return None
