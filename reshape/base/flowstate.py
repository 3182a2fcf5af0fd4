"""What reshape knows about one request, on the flow, under one metadata key.

Every addon reads and writes its part of a flow's state here instead of under string keys of its
own in `flow.metadata`: the fields, their types and who sets them are in one place. The types of
the fields belong to the features that own them; they are named here for the type checker only,
so this module (the base every layer may import) imports none of them at run time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mitmproxy import http

    from reshape.features.telemetry.addon import ByteCounter
    from reshape.features.trailers.addon import FlowTrailers
    from reshape.policy.selection import Selection
    from reshape.upstream.engine import Route
    from reshape.upstream.types import Assignment

KEY = "reshape"


@dataclass(slots=True)
class FlowState:
    # The policy the request runs under (PolicyChooser, in requestheaders): set for every flow
    # that reached the chooser; a flow keeps it even if the policy file is reloaded meanwhile.
    selection: Selection | None = None
    # A fresh experiment unit id the response must set as a cookie (PolicyChooser).
    set_unit_cookie: str | None = None
    # Counted in Telemetry's requests in flight (the graceful shutdown waits on these).
    in_flight: bool = False
    # Counts the body bytes of a streamed response (Telemetry); later addons may wrap the
    # stream callable, so this keeps the counter itself.
    byte_counter: ByteCounter | None = None
    # How the request ended when an addon answered for the origin or the pool refused it
    # ("rejected", "upstream_error"); None: decided by the response or the error.
    outcome: str | None = None
    # Carried by reshape's engine (not by mitmproxy's own origin connections): where and under
    # which limits (set when the request is handed over), and how the pool served it.
    pooled: bool = False
    route: Route | None = None
    assignment: Assignment | None = None
    # The user that proxy authentication admitted (`--users`).
    proxy_user: str | None = None
    # The preconnect addon's record of this navigation request, if it is one.
    preconnect: Any = None
    # The Link values the early hints addon wants sent in a 103 before this document's response;
    # and, for a request that may be one of a page's preloads, its record until the response.
    early_hints: list[str] | None = None
    hint_candidate: Any = None
    # What the trailers addon decided for this exchange.
    trailers: FlowTrailers | None = None
    # The request as the client asked for it (method, scheme, host), before any addon changed
    # where it goes (request log); and whether its log line is written.
    asked: tuple[str, str, str] | None = None
    logged: bool = False


def state_of(flow: http.HTTPFlow) -> FlowState:
    """The flow's state, created empty on first use."""
    state = flow.metadata.get(KEY)
    if state is None:
        state = flow.metadata[KEY] = FlowState()
    return state
