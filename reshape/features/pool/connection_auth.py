"""Origins that authenticate a connection, not a request: NTLM and Negotiate (RFC 4559 §4).

Sans-IO. An IIS origin (or another that speaks these schemes) runs its handshake over one TCP
connection (a request with `Authorization: NTLM <type 1>`, a 401 with the challenge, the same
request with the answer) and from then on serves every request on that connection as the user
who authenticated, with or without an `Authorization` field. A pool shared by every client hands
such a connection to the next user who asks, who is then served as the first (found by a review:
another client, with no credentials, got `200 secret data of alice`); and the handshake's second
step may go on another connection than its first, which the origin refuses.

So a client connection that sends such an `Authorization` to a destination is pinned to it, as
Squid pins a client connection to its server connection and nginx's `ntlm` keeps an upstream
connection to one client: from that request on, its requests there go through a pool of its
own (`Route.owner`, closed when the client connection goes) of one HTTP/1.1 connection, so
that the handshake's steps and what follows share that connection and nobody else uses it. A
shared connection never carries such a request, so it is never authenticated.

The costs: the pinned client's requests to that origin take turns on one connection (an
HTTP/2 client's streams too: HTTP/2 cannot carry these schemes, IIS refuses them with
HTTP_1_1_REQUIRED), a long one holding the others up to the queue timeout; and pinned
connections are outside the per-host cap (`max_connections_per_host`, shared by workers),
one per client connection and destination, as a proxy without a pool would open them: a
client that sends such a field to any origin gets a connection of its own there.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable

# Schemes whose handshake authenticates the connection (compared lowercased: RFC 9110 §11.1).
CONNECTION_SCHEMES = frozenset({"ntlm", "negotiate"})
# Pinned (client connection, destination) pairs remembered, the least recently used forgotten
# first: a client forgotten goes back to the shared pool, where its next request without
# credentials gets the origin's 401 and its browser authenticates again (and is pinned again).
PINS_KEPT = 4096


def authenticates_connection(authorization: Iterable[str]) -> bool:
    """Whether a request's `Authorization` field values use a scheme that authenticates the
    connection they go on."""
    for value in authorization:
        words = value.split(None, 1)
        if words and words[0].lower() in CONNECTION_SCHEMES:
            return True
    return False


class Pins[R]:
    """The route each client connection pinned to a destination keeps (`pin`): the one made
    when it was pinned, whatever policy its later requests get (a reload, or an experiment's
    arms with other knobs, would otherwise give it another pool, and a connection the origin
    has not authenticated). Remembered while they are among the PINS_KEPT most recently used:
    a client connection's id is never reused, so one that has gone is only forgotten in its
    turn; one forgotten while it lives goes back to the shared pool, where its next request
    without credentials gets the origin's 401 (its pinned connection stays its own, idle)."""

    def __init__(self, kept: int = PINS_KEPT) -> None:
        if kept < 1:
            raise ValueError(f"kept must be at least 1, not {kept}")
        self._kept = kept
        self._pins: OrderedDict[tuple[str, Hashable], R] = OrderedDict()

    def pin(self, client: str, destination: Hashable, route: R) -> None:
        key = (client, destination)
        self._pins[key] = route
        self._pins.move_to_end(key)
        while len(self._pins) > self._kept:
            self._pins.popitem(last=False)

    def route_of(self, client: str, destination: Hashable) -> R | None:
        key = (client, destination)
        route = self._pins.get(key)
        if route is not None:
            self._pins.move_to_end(key)
        return route

    def __len__(self) -> int:
        return len(self._pins)
