"""A mitmproxy addon that picks each request's policy, before any other reshape addon looks at it.

The choice is stored on the flow, so a request keeps its policy even if the file is reloaded while
it is in flight.
"""

from __future__ import annotations

from mitmproxy import http

from proxy.policy.schema import PolicyFile
from proxy.policy.selection import RequestFacts, Selection, select

_KEY = "reshape.selection"


def selection_of(flow: http.HTTPFlow) -> Selection:
    """The selection made for `flow` (set by PolicyChooser in requestheaders)."""
    return flow.metadata[_KEY]


class PolicyChooser:
    def __init__(self, policy_file: PolicyFile) -> None:
        self.policy_file = policy_file
        # Without rules or experiments every request gets the default: skip gathering facts.
        self._constant = (
            select(policy_file, RequestFacts("", "", "", {}))
            if not policy_file.rules and not policy_file.experiments
            else None
        )

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if self._constant is not None:
            flow.metadata[_KEY] = self._constant
            return
        request = flow.request
        facts = RequestFacts(
            client_ip=flow.client_conn.peername[0] if flow.client_conn.peername else "",
            user_agent=request.headers.get("user-agent", ""),
            destination=request.pretty_host,
            headers=request.headers,
        )
        flow.metadata[_KEY] = select(self.policy_file, facts)
