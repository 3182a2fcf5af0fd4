"""Which requests belong to which page load (sans-IO).

A proxy sees requests, not pages. A navigation starts with a document request (`Sec-Fetch-Dest:
document`, or, from a client that sends no Fetch Metadata, a GET that accepts text/html) and
collects the client's later requests for a while:

- the client is the client address (and proxy user, if any): a browser reaches the proxy over
  several connections (one CONNECT tunnel per origin), so the connection cannot be the key;
- a request belongs to the client's open navigation if it comes within `window` seconds of the
  navigation's start and its Referer (when it has one) names the first party or an origin the
  navigation already used: resources referenced by a stylesheet on a CDN carry the stylesheet's
  URL as Referer;
- a navigation ends when the same client starts another one, or `quiet` seconds after its last
  request, or `window` seconds after it started.

For each origin it records the resources fetched and the most requests in flight at once: the
connections an HTTP/1.1 origin would have needed. The first party itself is not recorded: its
connection is opened by the document request, at the moment a preconnect could be.

Memory is bounded: at most `max_open` navigations and `max_origins` origins per navigation;
the oldest navigation is ended early to make room.

With several workers (SO_REUSEPORT), one browser's connections land on different workers, so each
worker sees part of a page load. The worker that saw the document request announces it
(reshape/features/preconnect/board.py) and the others `adopt` it: every part carries the
navigation's key
(client, first party, start), and parts are put together before anything is learned
(reshape/features/preconnect/assembly.py).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass(frozen=True)
class OriginUse:
    """What one page load needed from one origin."""

    resources: int
    peak_in_flight: int


@dataclass(frozen=True)
class NavigationOutcome:
    """A finished page load (or the part of one a worker saw): what the table learns from."""

    first_party: str
    origins: dict[str, OriginUse]
    ended_at: float
    client: str = ""
    started: float = 0.0
    document: bool = True  # this part saw the document request (else it was adopted)


@dataclass(eq=False)
class _Navigation:
    client: str
    first_party: str
    started: float
    last_request: float
    resources: dict[str, int] = field(default_factory=dict)
    in_flight: dict[str, int] = field(default_factory=dict)
    peak: dict[str, int] = field(default_factory=dict)
    handles: set[int] = field(default_factory=set)
    document: bool = True

    def outcome(self) -> NavigationOutcome:
        return NavigationOutcome(
            self.first_party,
            {o: OriginUse(n, self.peak.get(o, 1)) for o, n in self.resources.items()},
            self.last_request,
            self.client,
            self.started,
            self.document,
        )


class NavigationTracker:
    """Groups requests into navigations; returns each finished one's outcome once."""

    def __init__(
        self,
        *,
        window: float = 30.0,
        quiet: float = 5.0,
        max_open: int = 1024,
        max_origins: int = 100,
    ) -> None:
        if not (window > 0 and quiet > 0 and max_open >= 1 and max_origins >= 1):
            raise ValueError("window and quiet must be positive, max_open and max_origins >= 1")
        self.window = window
        self.quiet = quiet
        self.max_open = max_open
        self.max_origins = max_origins
        self._open: OrderedDict[str, _Navigation] = OrderedDict()  # by client, oldest first
        self._requests: dict[int, tuple[_Navigation, str]] = {}
        self._handles = itertools.count(1)

    @property
    def open_navigations(self) -> int:
        return len(self._open)

    @property
    def requests_in_flight(self) -> int:
        return len(self._requests)

    def document(self, client: str, first_party: str, now: float) -> list[NavigationOutcome]:
        """`client` navigates to `first_party`; ends the client's previous navigation."""
        return self._start(_Navigation(client, first_party, now, now), now)

    def adopt(
        self, client: str, first_party: str, started: float, now: float
    ) -> list[NavigationOutcome]:
        """Another worker saw `client` navigate to `first_party` at `started`: this worker's
        requests from the client count towards that navigation from now on, unless it is over
        or this worker already follows it (or a later one)."""
        current = self._open.get(client)
        if now - started >= self.window or (current is not None and current.started >= started):
            return []
        return self._start(_Navigation(client, first_party, started, now, document=False), now)

    def current(self, client: str) -> tuple[str, float] | None:
        """The first party and start of the client's open navigation, if any."""
        nav = self._open.get(client)
        return None if nav is None else (nav.first_party, nav.started)

    def _start(self, nav: _Navigation, now: float) -> list[NavigationOutcome]:
        finished = self.expire(now)
        previous = self._open.pop(nav.client, None)
        if previous is not None:
            finished.append(self._end(previous))
        while len(self._open) >= self.max_open:
            _, oldest = self._open.popitem(last=False)
            finished.append(self._end(oldest))
        self._open[nav.client] = nav
        return finished

    def subresource(
        self, client: str, origin: str, referer_origin: str | None, now: float
    ) -> int | None:
        """A request that is not a navigation. Returns a handle for `finished` if it counts
        towards the client's open navigation, else None."""
        nav = self._open.get(client)
        if nav is None or not self._alive(nav, now):
            return None
        known = (nav.first_party, *nav.resources)
        if referer_origin is not None and referer_origin not in known:
            return None  # referred by a page the navigation did not load
        nav.last_request = now
        if origin == nav.first_party:
            return None
        if origin not in nav.resources and len(nav.resources) >= self.max_origins:
            return None
        nav.resources[origin] = nav.resources.get(origin, 0) + 1
        in_flight = nav.in_flight[origin] = nav.in_flight.get(origin, 0) + 1
        nav.peak[origin] = max(nav.peak.get(origin, 0), in_flight)
        handle = next(self._handles)
        self._requests[handle] = (nav, origin)
        nav.handles.add(handle)
        return handle

    def finished(self, handle: int) -> None:
        """The request's response ended (or it failed); unknown handles are ignored."""
        entry = self._requests.pop(handle, None)
        if entry is not None:
            nav, origin = entry
            nav.in_flight[origin] -= 1
            nav.handles.discard(handle)

    def expire(self, now: float) -> list[NavigationOutcome]:
        """End the navigations that are over by time."""
        over = [nav for nav in self._open.values() if not self._alive(nav, now)]
        for nav in over:
            del self._open[nav.client]
        return [self._end(nav) for nav in over]

    def _alive(self, nav: _Navigation, now: float) -> bool:
        return now - nav.started < self.window and now - nav.last_request < self.quiet

    def _end(self, nav: _Navigation) -> NavigationOutcome:
        for handle in nav.handles:
            del self._requests[handle]
        return nav.outcome()
