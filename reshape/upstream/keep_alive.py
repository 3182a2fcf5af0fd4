"""What an HTTP/1.1 origin says of how long it keeps a connection, and for how many requests:
its responses' `Keep-Alive` field (`timeout=5, max=100`), as sans-IO bookkeeping.

An origin that closes an idle connection at its keep-alive timeout races the next request sent
on it: a request written as the close is under way is lost, and one that is not idempotent
fails (502: it may have been processed, and is never sent twice). Apache (KeepAliveTimeout 5 s
by default) and Node.js (`server.keepAliveTimeout`, 5 s) say when they will close; a pool that
closes its side first never races them. Firefox takes the field's `timeout` as the connection's
idle timeout, and undici (Node's fetch) closes a second before it (`keepAliveTimeoutThreshold`).
`max` bounds the requests the origin takes on the connection: requests pipelined past it would
go unanswered behind its announced close, and wait for another connection.

`max` means two things in the wild. Apache counts down: `max=100` on a connection's first
response, 99 on the next, and it closes after the response that says `max=1` is followed by one
more (httpd's `ap_set_keepalive`: the requests left after this one). Node.js repeats
`server.maxRequestsPerSocket`, the total: `max=3` three times, then `Connection: close`. So
`Terms` reads the first `max` as a total (one request short of Apache's count, never past
Node's) and, from the second on, a value one lower per response as Apache's count, an unchanged
one as a total. Whichever it reads, the connection is never taken for more than the origin
said it takes.

Written here: no HTTP library keeps these terms for a pool (h11 and httpcore ignore the field).
The field is obsolete (RFC 9112 §9.3 leaves persistence to `Connection`), so nothing here is
needed for correctness: a field that is missing, repeated or malformed costs only the pool's
knowledge of it, never a request.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# How long before an origin's stated keep-alive timeout the pool closes an idle connection: a
# second, as undici does (its `keepAliveTimeoutThreshold`), or half of a shorter timeout. The
# origin counts from the moment it sent the response, the pool from the moment it read it, and a
# request takes half a round trip to arrive: the margin covers round trips of up to a second.
MARGIN_SECONDS = 1.0
# Apache states a keep-alive timeout under a second (`KeepAliveTimeout 500ms`) as `timeout=0`:
# an idle connection is then kept only for requests already waiting, this long at most.
SUBSECOND_IDLE = 0.001

# Values past these are no limit worth keeping (a timeout of more than a day, a count no
# connection reaches): read as absent.
_MAX_TIMEOUT = 86_400
_MAX_REQUESTS = 2**31 - 1

_PARAM = re.compile(rb'^\s*([A-Za-z]+)\s*=\s*"?([0-9]{1,12})"?\s*$')


def parse(fields: Iterable[tuple[bytes, bytes]]) -> tuple[int | None, int | None]:
    """The `timeout` (seconds) and `max` of a response's `Keep-Alive` fields, None where not
    given or not valid; a parameter given more than once counts at its lowest."""
    timeout: int | None = None
    most: int | None = None
    for name, value in fields:
        if name.lower() != b"keep-alive":
            continue
        for param in value.split(b","):
            match = _PARAM.match(param)
            if match is None:
                continue
            key, number = match[1].lower(), int(match[2])
            if key == b"timeout" and number <= _MAX_TIMEOUT:
                timeout = number if timeout is None else min(timeout, number)
            elif key == b"max" and number <= _MAX_REQUESTS:
                most = number if most is None else min(most, number)
    return timeout, most


def idle_limit(timeout: int) -> float:
    """How long the pool keeps a connection idle whose origin said `timeout=`: MARGIN_SECONDS
    less, or half a timeout shorter than twice that; SUBSECOND_IDLE for `timeout=0`."""
    return max(timeout - min(MARGIN_SECONDS, timeout / 2), SUBSECOND_IDLE)


class Terms:
    """One connection's terms, told each of its final responses in order (`response`)."""

    __slots__ = ("_counted", "_last_max", "_last_at", "_responses")

    def __init__(self) -> None:
        self._responses = 0
        self._last_max: int | None = None
        self._last_at = 0  # the response that said `_last_max`
        self._counted: bool | None = None  # `max` counts down (Apache); None: not known yet

    def response(self, fields: Iterable[tuple[bytes, bytes]]) -> tuple[float | None, int | None]:
        """Another response came on the connection. → How long the connection may stay idle
        after it (None: the origin did not say), and how many more requests the origin takes
        on it (None: not said)."""
        self._responses += 1
        timeout, most = parse(fields)
        idle = idle_limit(timeout) if timeout is not None else None
        if most is None:
            return idle, None
        if self._last_max is not None:
            step = self._responses - self._last_at
            if most == self._last_max - step:
                self._counted = True
            elif most == self._last_max:
                self._counted = False
            else:
                self._counted = None
        self._last_max, self._last_at = most, self._responses
        left = most if self._counted else most - self._responses
        return idle, max(0, left)
