"""A mitmproxy addon that picks each request's policy, before any other reshape addon looks at it.

The choice is stored on the flow, so a request keeps its policy even if the file is reloaded while
it is in flight; each new request reads the file in force (`PolicyHolder.current`).

For experiments with unit `cookie` the chooser also keeps the unit: a request without the
`reshape_unit` cookie gets a fresh random id, is assigned by it, and its response sets the cookie,
so the client's next requests carry the same id and land in the same arm. Browsers keep cookies
per site, so the unit is one browser on one site. The cookie is removed from the request before it
goes to the origin: it is reshape's, not the site's.
"""

from __future__ import annotations

import secrets

from mitmproxy import http

from reshape.base.flowstate import state_of
from reshape.policy.reload import PolicyHolder
from reshape.policy.schema import PolicyFile
from reshape.policy.selection import RequestFacts, Selection, select, uses_cookie_unit

UNIT_COOKIE = "reshape_unit"
# A year: the unit should outlive an experiment; a new salt or name re-assigns anyway.
UNIT_COOKIE_MAX_AGE = 365 * 24 * 3600


def selection_of(flow: http.HTTPFlow) -> Selection:
    """The selection made for `flow` (set by PolicyChooser in requestheaders)."""
    selection = state_of(flow).selection
    if selection is None:
        raise LookupError("no policy was chosen for this flow")
    return selection


def new_unit_id() -> str:
    return secrets.token_urlsafe(12)


def unit_cookie_header(unit_id: str) -> str:
    """The Set-Cookie value that makes a client keep `unit_id`."""
    return f"{UNIT_COOKIE}={unit_id}; Path=/; Max-Age={UNIT_COOKIE_MAX_AGE}; SameSite=Lax; HttpOnly"


def take_unit_cookie(cookie_headers: list[str]) -> tuple[str | None, list[str]]:
    """The client's unit id from its Cookie header fields, and those fields without it.

    Parsed by hand, not with http.cookies, which rejects a whole header for one odd cookie."""
    unit: str | None = None
    kept_headers = []
    for header in cookie_headers:
        kept = []
        for pair in header.split(";"):
            name, sep, value = pair.strip().partition("=")
            if sep and name == UNIT_COOKIE:
                unit = unit or value or None
            elif pair.strip():
                kept.append(pair.strip())
        if kept:
            kept_headers.append("; ".join(kept))
    return unit, kept_headers


class PolicyChooser:
    def __init__(self, policy: PolicyHolder | PolicyFile) -> None:
        # A bare PolicyFile (unit tests, embedding) is held as one that never reloads.
        self.holder = policy if isinstance(policy, PolicyHolder) else PolicyHolder(None, policy)
        self._file: PolicyFile | None = None
        self._constant: Selection | None = None
        self._cookie_unit = False

    def _refresh(self, policy_file: PolicyFile) -> None:
        """Per-file facts, computed once per reload rather than per request."""
        self._file = policy_file
        # Without rules or experiments every request gets the default: skip gathering facts.
        self._constant = (
            select(policy_file, RequestFacts("", "", "", {}))
            if not policy_file.rules and not policy_file.experiments
            else None
        )
        self._cookie_unit = uses_cookie_unit(policy_file)

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        policy_file = self.holder.current
        if policy_file is not self._file:
            self._refresh(policy_file)
        state = state_of(flow)
        if self._constant is not None:
            state.selection = self._constant
            return
        request = flow.request
        unit_cookie = None
        if self._cookie_unit:
            unit_cookie, kept = take_unit_cookie(request.headers.get_all("cookie"))
            if unit_cookie is None:
                unit_cookie = new_unit_id()
                state.set_unit_cookie = unit_cookie
            else:
                request.headers.set_all("cookie", kept)
        facts = RequestFacts(
            client_ip=flow.client_conn.peername[0] if flow.client_conn.peername else "",
            user_agent=request.headers.get("user-agent", ""),
            destination=request.pretty_host,
            headers=request.headers,
            unit_cookie=unit_cookie,
        )
        selection = select(policy_file, facts)
        state.selection = selection
        if state.set_unit_cookie is not None and not _chosen_by_cookie(policy_file, selection):
            state.set_unit_cookie = None  # a rule or another experiment decided: no unit needed

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        self._set_unit_cookie(flow)

    def response(self, flow: http.HTTPFlow) -> None:
        # Responses made by an addon (no responseheaders hook) get the cookie here.
        self._set_unit_cookie(flow)

    def _set_unit_cookie(self, flow: http.HTTPFlow) -> None:
        state = state_of(flow)
        unit_id, state.set_unit_cookie = state.set_unit_cookie, None
        if unit_id is not None and flow.response is not None:
            flow.response.headers.add("set-cookie", unit_cookie_header(unit_id))


def _chosen_by_cookie(policy_file: PolicyFile, selection: Selection) -> bool:
    experiment = selection.arm.partition(":")[0]
    return any(e.name == experiment and e.unit == "cookie" for e in policy_file.experiments)
