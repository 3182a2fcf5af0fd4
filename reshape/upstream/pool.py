"""One destination's pool of origin connections, as pure bookkeeping (sans-IO).

A `HostPool` decides; the asyncio driver (`reshape/upstream/engine.py`) acts. Every method is
told what happened (a request arrived, a connection came up, a response ended, time passed) and
returns the `Action`s that follow, in the order the driver must carry them out. Nothing here
touches a socket, a task or a clock: time arrives as `now`.

The pool serves each request from the front of its FIFO queue by the first rule that fits:

1. an HTTP/2 connection with a free stream (oldest connection first, so younger ones can expire);
   while a usable HTTP/2 connection exists, nobody opens another one: waiters wait for a stream;
2. an idle HTTP/1.1 connection (the most recently used: its server is the least likely to have
   dropped it);
3. a connection being opened for it: connections still connecting are future capacity (one
   request each, or every request when the origin is known to speak HTTP/2, or is an https
   origin whose ALPN answer is not known yet), and beyond that one `Open` per request while
   under `max_connections`;
4. HTTP/1.1 pipelining behind another idempotent request (the connection with the fewest in
   flight), only for idempotent requests, only while the origin has not broken it (a request
   that went unanswered behind a close: only on a connection opened since, see below);
5. otherwise it waits, or is rejected at once if the queue is full.

A request that goes again because its connection was lost without notice (see MAX_ATTEMPTS) is
never sent on an HTTP/1.1 connection that had carried requests at that moment: when an origin
drops one reused connection unannounced (its keep-alive timeout, a limit of requests per
connection, a pipeline it breaks), its other used connections are the likeliest to be dropped
next, and a second loss would fail the request. It takes a connection that has carried nothing
yet (one being opened, or opened after the loss; not a warm one that idled) or an HTTP/2 one,
before any other request does; when the pool is at its cap, an idle HTTP/1.1 connection is
closed to make room for it (`CloseReason.ROOM_FOR_RETRY`).

A request pipelined behind a response after which the connection closes as expected (the
origin announced it, or a client left that response) goes again at no attempt's cost, and is
pipelined again only on a connection opened after that close (`_Waiter.bounced_at`); short of
one, it waits for a connection of its own, as a non-idempotent request does. Pipelined again
anywhere, it was the oldest waiter, the first to be pipelined, and was caught behind such a
close time after time: nginx announces one every `keepalive_requests` responses, and a
connection that has served many is the likeliest to announce the next; a new one serves a few
before it does.

Warm connections (`preconnect`): connections opened before any request asked for them, because a
page load is expected to need them soon. They count against `max_connections` like any other,
a request takes a warm one before any other free connection (rules 1 and 2), and one that no
request has used closes after its own, shorter, idle timeout. Its first request is counted as
`AssignKind.PRECONNECTED`.

FIFO versus pipelining. Rules 1 and 2 always go to the front of the queue, so nobody overtakes
on a connection everyone can use. Pipelining (rule 4) can only take idempotent requests, so an
idempotent request may be pipelined past an older non-idempotent one, which could not have used
that connection anyway; within a class the order stays strict. Pipelining is also used only for
the requests that rules 3 cannot cover, and those go to the *oldest* idempotent waiters, the
younger ones taking the connections being opened. To keep a steady stream of pipelined requests
from keeping every connection busy forever (starving the non-idempotent waiter, which needs an
idle one), each waiting non-idempotent request that no connect covers holds back one busy
HTTP/1.1 connection from pipelining: the one with the fewest in flight. Nothing is added to a
held-back connection, so it drains and goes to that request by rule 2. A request going again
after a close (above) that finds no connection opened since counts as a non-idempotent one here.

Clients' shares (`PoolLimits.per_client`, browser-like limits): each client with requests here
brings that many connections to the cap, and a connection anyone can use (rules 1 and 2) serves
the oldest request of the client with the fewest requests in flight, not the queue's front, so
a client that queued a hundred requests does not take the connections a newcomer brought. Each
client's own requests keep their order.

The workers of one `reshape run --workers N` share each cap (reshape/upstream/budget/). A worker
whose slots another worker needs is asked for them back, in one of two ways: a ceiling
(`set_ceiling`) lowers the cap for a while, as a policy reload can; `lend` closes connections
that stay idle a moment, which this worker's own requests evidently do not need.

`max_queue` bounds the requests waiting for capacity. Requests matched one-to-one with a
connection being opened are not counted against it; otherwise `max_queue=0` could never open
a connection.
"""

from __future__ import annotations

import enum
import heapq
import itertools
import math
from collections import OrderedDict, deque
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field

# How often one idempotent request may be sent before a lost connection fails it instead of
# sending it again: once more at most (a request that kills connections must not loop, and an
# origin must not see it many times). Only requests that got no byte of an answer go again (RFC
# 9110 §9.2.2): one the origin answered at all, even with garbage, never does
# (reshape/upstream/h1.py marks it answered). And only where the loss says the origin did not
# take the request up, which is Chromium's rule (HttpNetworkTransaction::ShouldResendRequest):
# a connection that had carried requests before, was opened ahead of need and idled, carries
# others ahead of it, or (HTTP/2) had heard from the origin is closed by origins that no longer
# want it (their keep-alive timeouts, request limits, a pipeline they drop); the first request on a
# connection opened for it, lost without an answer, is most likely the cause, and has most
# likely been processed: it fails (502), as it would in a browser. Only the driver knows which
# request went out first (`connection_lost(first_sent=)`). A keep-alive race (the origin
# closed an idle connection as the request left) costs no attempt, once per request; nor do
# requests pipelined behind a response that announced its close, or whose client left (they
# most likely never reached the origin's application), up to MAX_FREE_GOES times. A request
# that goes again after an unannounced loss goes on a connection that has carried nothing yet
# (the module docstring), so the origin's other stale connections cannot use up its attempts.
MAX_ATTEMPTS = 2

# How often a request may go again at no attempt's cost because the origin never took it up:
# not a byte of it left (its connection closed before the write, or an HTTP/2 one was draining
# or full), or it was pipelined behind a response that announced its close or whose client left
# (`connection_lost(graceful=True)`). An origin that closes every connection the moment it is
# accepted (an overloaded server, a balancer without backends), or speaks first, sent each
# request round new connections for ever, the queue's clock starting again each time; so did
# one pipelined each time behind such a response (11 sends in 10 rounds in a test, never
# failed). Past this many, such a loss costs an attempt. (Pipelined again only on a connection
# opened since, `_Waiter.bounced_at`, a request is seldom caught so twice: behind nginx's
# announced closes, pipelined anywhere, 68 of 1,518 were caught twice or more in a test, one
# four times; pipelined only on new connections, one of 2,656.)
MAX_FREE_GOES = 3


def _go_free(waiter: _Waiter) -> None:
    """A request the origin never took up goes again without using up an attempt, a few
    times."""
    if waiter.free_goes < MAX_FREE_GOES:
        waiter.free_goes += 1
        waiter.attempts -= 1


@dataclass(frozen=True)
class PoolKey:
    """Where a pool's connections go: requests with equal keys may share a connection."""

    scheme: str  # "http" | "https"
    host: str
    port: int
    sni: str | None

    def __post_init__(self) -> None:
        if self.scheme not in ("http", "https"):
            raise ValueError(f"scheme must be http or https, not {self.scheme!r}")

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        sni = f" sni={self.sni}" if self.sni is not None and self.sni != self.host else ""
        return f"{self.scheme}://{host}:{self.port}{sni}"


@dataclass(frozen=True)
class PoolLimits:
    """The knobs a policy sets for one destination."""

    max_connections: int  # >= 1; connections still connecting count
    max_queue: int  # >= 0; requests waiting for capacity beyond this are rejected at once
    queue_timeout: float  # > 0 seconds a request may wait before rejection (may be math.inf)
    idle_timeout: float  # > 0 seconds an idle connection is kept (may be math.inf)
    pipeline_depth: int  # 0 = off; else max requests in flight on one HTTP/1.1 connection
    http2: bool  # whether h2 may be negotiated (the driver offers ALPN accordingly)
    # 0: `max_connections` is the cap for all clients together. n > 0: a connection opens only
    # while the pool holds fewer than n per client with requests here (queued or in flight), as
    # each browser would on its own; `max_connections` stays the most in all. Idle connections
    # are everyone's and stay (until their idle timeout) when clients leave.
    per_client: int = 0

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, not {self.max_connections}")
        if self.max_queue < 0:
            raise ValueError(f"max_queue must not be negative, not {self.max_queue}")
        # Zero timeouts are refused rather than given a meaning: a zero queue timeout would
        # reject a request in the same instant it could be served, and a zero idle timeout would
        # close a fresh connection before it takes the request it was opened for.
        if not self.queue_timeout > 0:
            raise ValueError(f"queue_timeout must be positive, not {self.queue_timeout}")
        if not self.idle_timeout > 0:
            raise ValueError(f"idle_timeout must be positive, not {self.idle_timeout}")
        if self.pipeline_depth < 0:
            raise ValueError(f"pipeline_depth must not be negative, not {self.pipeline_depth}")
        if self.per_client < 0:
            raise ValueError(f"per_client must not be negative, not {self.per_client}")


class Proto(enum.Enum):
    """The protocol a connection speaks, as ALPN (or its absence) decided."""

    H1 = "h1"
    H2 = "h2"


class AssignKind(enum.Enum):
    """How a request got its connection (a metrics label)."""

    NEW = "new"  # the connection's first request
    REUSED = "reused"  # the connection had served before and had nothing in flight
    PIPELINED = "pipelined"  # HTTP/1.1, behind at least one request still in flight
    MULTIPLEXED = "multiplexed"  # HTTP/2, next to at least one stream still in flight
    PRECONNECTED = "preconnected"  # the first request on a warm connection (see `preconnect`)


class RejectReason(enum.Enum):
    """Why a request that was never sent gets no connection."""

    QUEUE_FULL = "queue_full"
    QUEUE_TIMEOUT = "queue_timeout"
    CONNECT_FAILED = "connect_failed"


class FailReason(enum.Enum):
    """Why a request will not complete (it may have been sent already)."""

    # Unanswered, and it may have been processed (not idempotent, or the first request on a
    # connection opened for it), or its body cannot be sent again (it streamed): never sent
    # twice.
    CONNECTION_LOST = "connection_lost"
    RETRIES_EXHAUSTED = "retries_exhausted"  # unanswered MAX_ATTEMPTS times
    SHUTDOWN = "shutdown"


class CloseReason(enum.Enum):
    """Why the pool closes a connection."""

    IDLE_TIMEOUT = "idle_timeout"
    # HTTP/1.1: idle as long as its origin said it keeps it (`Keep-Alive: timeout`), less a margin
    ORIGIN_IDLE_TIMEOUT = "origin_idle_timeout"
    SHUTDOWN = "shutdown"
    NOT_REUSABLE = "not_reusable"  # a response said so (Connection: close, an error)
    GOAWAY = "goaway"  # HTTP/2 GOAWAY, and its streams have finished
    OVER_LIMIT = "over_limit"  # idle, and above a cap lowered by a policy reload or a ceiling
    NEEDED_ELSEWHERE = "needed_elsewhere"  # idle a while, and another worker waits (`lend`)
    SERVER_CLOSED = "server_closed"  # the server closed it while the pool thought it idle
    # idle HTTP/1.1, at the cap, and a request going again after a loss needs a new connection
    ROOM_FOR_RETRY = "room_for_retry"
    # HTTP/1.1: it carries as many requests as its origin said it takes (`Keep-Alive: max`)
    REQUEST_LIMIT = "request_limit"


@dataclass(frozen=True)
class Open:
    """Start connecting (TCP, then TLS for https); report `connection_ready` or `_failed`."""

    conn_id: int
    warm: bool = False  # opened by `preconnect`, for requests that have not arrived yet


@dataclass(frozen=True)
class Assign:
    """Send the waiter's request on the connection; report `request_done` when it ends."""

    waiter_id: int
    conn_id: int
    kind: AssignKind
    queued_for: float  # seconds since the request (re-)entered the queue; 0 if served at once


@dataclass(frozen=True)
class Reject:
    """The request was never sent and will not be: answer the client (503)."""

    waiter_id: int
    reason: RejectReason


@dataclass(frozen=True)
class Close:
    """Close the connection; the pool has already forgotten it."""

    conn_id: int
    reason: CloseReason


@dataclass(frozen=True)
class Retry:
    """The request went unanswered on a lost connection and is back at the front of the queue.

    A later `Assign` carries it again; the driver must be ready to send it a second time.
    """

    waiter_id: int


@dataclass(frozen=True)
class Fail:
    """The request will not complete: answer the client (502)."""

    waiter_id: int
    reason: FailReason

    @property
    def message(self) -> str:
        return self.reason.value.replace("_", " ")


type Action = Open | Assign | Reject | Close | Retry | Fail


class ConnState(enum.Enum):
    """Where a connection is in its life. Closed connections leave the pool."""

    CONNECTING = "connecting"  # opened, not up yet; counts as capacity
    IDLE = "idle"  # up, nothing in flight
    BUSY = "busy"  # up, requests in flight; takes more (HTTP/2 streams, pipelining) if it can
    DRAINING = "draining"  # takes nothing new; closes once nothing is in flight


class ConnEvent(enum.Enum):
    UP = "up"  # connected (and TLS done)
    ASSIGNED = "assigned"  # a request was assigned to it
    ENDED = "ended"  # a request in flight ended (or went back unanswered), others remain
    LAST_ENDED = "last_ended"  # the last request in flight ended
    DRAIN = "drain"  # it takes nothing new (GOAWAY, not reusable, closed by the server)


# Every transition a connection makes; anything else is a bug in the pool, and raises.
TRANSITIONS: dict[tuple[ConnState, ConnEvent], ConnState] = {
    (ConnState.CONNECTING, ConnEvent.UP): ConnState.IDLE,
    (ConnState.IDLE, ConnEvent.ASSIGNED): ConnState.BUSY,
    (ConnState.BUSY, ConnEvent.ASSIGNED): ConnState.BUSY,
    (ConnState.BUSY, ConnEvent.ENDED): ConnState.BUSY,
    (ConnState.BUSY, ConnEvent.LAST_ENDED): ConnState.IDLE,
    (ConnState.IDLE, ConnEvent.DRAIN): ConnState.DRAINING,
    (ConnState.BUSY, ConnEvent.DRAIN): ConnState.DRAINING,
    (ConnState.DRAINING, ConnEvent.DRAIN): ConnState.DRAINING,
    (ConnState.DRAINING, ConnEvent.ENDED): ConnState.DRAINING,
    (ConnState.DRAINING, ConnEvent.LAST_ENDED): ConnState.DRAINING,
}


class PoolStateError(Exception):
    """A connection was told of an event its state has no transition for."""


@dataclass(eq=False)
class _Waiter:
    waiter_id: int
    idempotent: bool
    # Its body can be sent again (none, or one held whole): an HTTP/2 origin's word that the
    # request went unprocessed (REFUSED_STREAM, above a GOAWAY's last stream) lets it go again
    # even if it is not idempotent. Idempotent requests are replayable.
    replayable: bool
    enqueued_at: float
    # Identifies this waiter's entry in the deadline heap; a re-queued waiter gets a new one,
    # which makes the old entry stale.
    token: int
    attempts: int = 0  # Assigns so far
    raced: bool = False  # it had its one free retry after a keep-alive race
    free_goes: int = 0  # times it went again at no cost, never taken up (see MAX_FREE_GOES)
    # It went unanswered behind a close, announced or made for a client that left, and is
    # pipelined again only on a connection with a higher id, opened since (the module
    # docstring says why). 0: anywhere.
    bounced_at: int = 0
    # Going again after its connection was lost without notice: it takes no HTTP/1.1 connection
    # with this id or lower (open at the loss) that had carried requests (`_fits`). 0: any.
    after_conn: int = 0
    lost_at: float = 0.0  # when (with after_conn)
    client: object = None  # who asked (PoolLimits.per_client); None: a client of its own
    # The connection it was assigned to was idle since then, and had idled warm so (its
    # `idle_since`, `idled_warm`): what `unassign` gives back. None: it was busy.
    took_idle: tuple[float, bool] | None = None


@dataclass(eq=False)
class _Connection:
    """One connection's record, the only one: its state is read, never derived."""

    conn_id: int
    state: ConnState = ConnState.CONNECTING
    proto: Proto | None = None
    max_streams: int = 1  # HTTP/2 only
    in_flight: dict[int, _Waiter] = field(default_factory=dict)  # in the order they were sent
    served: int = 0
    draining: CloseReason | None = None  # why it is DRAINING
    idle_since: float = 0.0  # meaningful while up with nothing in flight
    # Set for a warm connection (see `preconnect`): its idle timeout until a request uses it.
    warm_idle_timeout: float | None = None
    # A warm connection whose first request found it idle a while (not one taken the moment it
    # came up): proven, as Chromium's UNUSED_IDLE sockets are.
    idled_warm: bool = False
    # HTTP/1.1, what its origin said (`Keep-Alive`, reshape/upstream/keep_alive.py): how long it
    # may stay idle, and how many requests it still takes (None: not said).
    origin_idle_timeout: float | None = None
    takes: int | None = None

    def move(self, event: ConnEvent) -> None:
        try:
            self.state = TRANSITIONS[(self.state, event)]
        except KeyError:
            raise PoolStateError(
                f"connection {self.conn_id}: no transition from {self.state.value} on {event.value}"
            ) from None

    def drain(self, reason: CloseReason) -> None:
        """Take nothing new; the first reason given is the one it closes for."""
        if self.draining is None:
            self.draining = reason
        self.move(ConnEvent.DRAIN)

    def ended(self) -> None:
        """A request in flight has just been taken off `in_flight`."""
        self.move(ConnEvent.ENDED if self.in_flight else ConnEvent.LAST_ENDED)

    @property
    def up(self) -> bool:
        return self.state is not ConnState.CONNECTING

    @property
    def idle(self) -> bool:
        """Up with nothing in flight (IDLE, or DRAINING and about to close)."""
        return self.state is ConnState.IDLE or (
            self.state is ConnState.DRAINING and not self.in_flight
        )

    @property
    def unused_warm(self) -> bool:
        return self.warm_idle_timeout is not None and self.served == 0

    def idle_timeout(self, limits: PoolLimits) -> float:
        if self.warm_idle_timeout is not None and self.served == 0:
            return self.warm_idle_timeout
        if self.origin_idle_timeout is not None:
            return min(limits.idle_timeout, self.origin_idle_timeout)
        return limits.idle_timeout

    def idle_timeout_reason(self, limits: PoolLimits) -> CloseReason:
        """Whose idle timeout `idle_timeout` is: the origin's when it is the shorter (it is
        said with a response, so never a warm connection's)."""
        origins = self.origin_idle_timeout
        if origins is not None and origins < limits.idle_timeout:
            return CloseReason.ORIGIN_IDLE_TIMEOUT
        return CloseReason.IDLE_TIMEOUT

    @property
    def open_for_work(self) -> bool:
        return (self.state is ConnState.IDLE or self.state is ConnState.BUSY) and (
            self.takes is None or self.takes > 0
        )

    @property
    def h1_open_for_work(self) -> bool:
        return self.open_for_work and self.proto is Proto.H1

    @property
    def free_h2_stream(self) -> bool:
        return (
            self.open_for_work and self.proto is Proto.H2 and len(self.in_flight) < self.max_streams
        )


class HostPool:
    """The connections to one destination and the requests waiting for them."""

    def __init__(self, key: PoolKey, limits: PoolLimits) -> None:
        self.key = key
        self._limits = limits
        self.known_h2 = False  # the last connection that came up spoke h2
        self.learned_proto = False  # a connection has come up, so known_h2 means something
        self.pipelining_broken = False  # sticky: this origin mangled a pipeline once
        # HTTP/1.1: how many requests the origin takes on a connection, as the latest of its
        # statements (`Keep-Alive: max`) implies; a new connection takes no more. None: never
        # said.
        self.requests_per_connection: int | None = None
        # (budget) While other workers wait for slots of the cap they share with this pool: a
        # cap below the limits' (set_ceiling), and connections to close once idle a while (lend).
        self._ceiling: int | None = None
        # No policy's route has these limits since a reload (`retire`).
        self._retired = False
        self._lend = 0
        self._lend_after = 0.0
        self._closed = False
        self._conns: dict[int, _Connection] = {}
        self._queue: OrderedDict[int, _Waiter] = OrderedDict()
        self._assigned: dict[int, _Connection] = {}
        # (enqueued_at, token, waiter_id): keyed by enqueue time, not deadline, so that a new
        # queue_timeout from set_limits keeps the heap in order.
        self._deadlines: list[tuple[float, int, int]] = []
        self._tokens = itertools.count()
        self._conn_ids = itertools.count(1)
        self._last_conn_id = 0
        # Waiters going again after a loss (`_Waiter.after_conn`); entries of waiters that left
        # the queue are dropped lazily (`_retrying_waiters`).
        self._retrying: dict[int, _Waiter] = {}

    # views

    @property
    def limits(self) -> PoolLimits:
        return self._limits

    @property
    def max_connections(self) -> int:
        """The cap in force: the limits', or a lower ceiling."""
        if self._ceiling is None:
            return self._limits.max_connections
        return min(self._ceiling, self._limits.max_connections)

    @property
    def opening_cap(self) -> int:
        """How many connections the pool may hold before it opens another: the cap in force,
        or, with `per_client`, that many per client with requests here, whichever is lower."""
        cap = self.max_connections
        per_client = self._limits.per_client
        if not per_client:
            return cap
        clients = {
            _client_of(waiter)
            for waiter in itertools.chain(
                self._queue.values(), *(c.in_flight.values() for c in self._conns.values())
            )
        }
        return min(cap, per_client * max(1, len(clients)))

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def active_connections(self) -> int:
        """Every connection the pool holds, connecting ones included."""
        return len(self._conns)

    @property
    def in_flight(self) -> int:
        return len(self._assigned)

    def in_flight_on(self, conn_id: int) -> list[int]:
        """The requests assigned to the connection whose responses have not ended, in the order
        they were assigned."""
        conn = self._conns.get(conn_id)
        return list(conn.in_flight) if conn is not None else []

    def __repr__(self) -> str:
        connecting = sum(1 for c in self._conns.values() if c.state is ConnState.CONNECTING)
        idle = sum(1 for c in self._conns.values() if c.idle)
        flags = "".join(
            f" {name}"
            for name, on in (
                ("h2", self.known_h2),
                ("pipelining_broken", self.pipelining_broken),
                ("closed", self._closed),
            )
            if on
        )
        return (
            f"<HostPool {self.key} conns={len(self._conns)}/{self.max_connections}"
            f" (connecting={connecting} idle={idle}) in_flight={self.in_flight}"
            f" queued={self.queued}{flags}>"
        )

    def next_deadline(self) -> float | None:
        """When `tick` next has work to do, if ever."""
        deadlines = [
            c.idle_since + c.idle_timeout(self._limits) for c in self._conns.values() if c.idle
        ]
        if self._lend:
            deadlines += [c.idle_since + self._lend_after for c in self._conns.values() if c.idle]
        oldest = self._oldest_waiter()
        if oldest is not None:
            deadlines.append(oldest.enqueued_at + self._limits.queue_timeout)
        return min((d for d in deadlines if d != math.inf), default=None)

    # events

    def request(
        self,
        waiter_id: int,
        now: float,
        *,
        idempotent: bool,
        replayable: bool = False,
        client: object = None,
    ) -> list[Action]:
        """A request for this destination; `waiter_id` must not be waiting or in flight.
        `replayable`: its body could be sent again (see `_Waiter`; implied by `idempotent`).
        `client`: who asks, for a `per_client` cap (any hashable; None counts as a client of
        its own)."""
        if self._closed:
            return [Fail(waiter_id, FailReason.SHUTDOWN)]
        if waiter_id in self._queue or waiter_id in self._assigned:
            raise ValueError(f"waiter {waiter_id} is already waiting or in flight")
        waiter = _Waiter(
            waiter_id, idempotent, idempotent or replayable, now, next(self._tokens), client=client
        )
        self._enqueue([waiter], now, front=False)
        actions = self._settle(now)
        if waiter_id in self._queue and len(self._queue) > self._admissible_queue():
            # Settling cannot have acted on this request's account: an Open or a pipelined
            # request it caused would have made room for it. So rejecting it undoes nothing.
            del self._queue[waiter_id]
            actions.append(Reject(waiter_id, RejectReason.QUEUE_FULL))
        return actions

    def preconnect(self, count: int, now: float, *, idle_timeout: float) -> list[Action]:
        """Have `count` connections ready for requests that have not arrived yet: open warm
        ones for what is missing, within `max_connections`. Connections already free or being
        opened, beyond what waiting requests need, count as ready; for an origin that speaks
        HTTP/2 (or may: an https origin whose ALPN answer is not known yet) one connection is
        enough. A warm connection no request uses closes after `idle_timeout` seconds idle."""
        if count < 0:
            raise ValueError(f"count must not be negative, not {count}")
        if not idle_timeout > 0:
            raise ValueError(f"idle_timeout must be positive, not {idle_timeout}")
        if self._closed:
            return []
        usable = [c for c in self._conns.values() if c.state is not ConnState.DRAINING]
        if self._expects_h2 or any(c.proto is Proto.H2 for c in usable):
            # One h2 connection carries every request (RFC 9113 section 9.1).
            missing = 0 if usable else min(count, 1)
        else:
            spare = sum(1 for c in usable if c.state is ConnState.CONNECTING or c.idle)
            missing = count - max(0, spare - len(self._queue))
        room = self.opening_cap - len(self._conns)
        actions: list[Action] = []
        for _ in range(max(0, min(missing, room))):
            conn = self._new_connection(warm_idle_timeout=idle_timeout)
            actions.append(Open(conn.conn_id, warm=True))
        return actions

    def cancel(self, waiter_id: int, now: float) -> list[Action]:
        """The client went away while its request waited (ignored once it was assigned)."""
        if self._queue.pop(waiter_id, None) is None:
            return []
        return self._settle(now)

    def connection_ready(
        self, conn_id: int, proto: Proto, now: float, *, max_streams: int = 1
    ) -> list[Action]:
        """Connected (and TLS done); `max_streams` is the server's HTTP/2 stream limit."""
        conn = self._conns.get(conn_id)
        if conn is None or conn.state is not ConnState.CONNECTING:
            return []
        if max_streams < 0:
            raise ValueError(f"max_streams must not be negative, not {max_streams}")
        conn.move(ConnEvent.UP)
        conn.proto = proto
        conn.max_streams = max_streams if proto is Proto.H2 else 1
        if proto is Proto.H1:
            conn.takes = self.requests_per_connection
        conn.idle_since = now
        self.known_h2 = proto is Proto.H2
        self.learned_proto = True
        return self._settle(now)

    def connection_failed(self, conn_id: int, now: float) -> list[Action]:
        """Connecting (TCP or TLS) failed; the oldest waiter, the one it was for, is rejected,
        unless the connects still under way serve every waiter (see `_connect_failed`)."""
        conn = self._conns.get(conn_id)
        if conn is None or conn.state is not ConnState.CONNECTING:
            return []
        return self._connect_failed(conn, now)

    def request_done(
        self,
        conn_id: int,
        waiter_id: int,
        now: float,
        *,
        reusable: bool,
        idle_timeout: float | None = None,
        takes: int | None = None,
    ) -> list[Action]:
        """The response ended; `reusable=False`: the connection takes nothing more. What the
        origin said with it (HTTP/1.1's `Keep-Alive`): `idle_timeout`, how long the connection
        may stay idle (it closes sooner than the policy's idle timeout, never later), and
        `takes`, how many requests the origin takes on it after this one: those pipelined
        behind it count, and once they are all assigned it takes nothing more (it closes once
        idle, `CloseReason.REQUEST_LIMIT`). With the responses it has carried, `takes` also
        says how many requests a connection to this origin carries (`requests_per_connection`),
        which bounds the connections that have none yet, new ones from the start: they would
        otherwise pipeline past it before their first answer said so."""
        taken = self._take_off(conn_id, waiter_id)
        if taken is None:
            return []
        conn, _ = taken
        if idle_timeout is not None:
            conn.origin_idle_timeout = idle_timeout
        if takes is not None:
            conn.takes = takes - len(conn.in_flight)
            self._learn_requests_per_connection(conn, takes)
        if not reusable:
            # The last of the requests its origin said it takes (its close announced, as
            # Apache's and Node's are at their limit), or a response that ends it early.
            limit = conn.takes is not None and conn.takes <= 0 and not conn.in_flight
            conn.drain(CloseReason.REQUEST_LIMIT if limit else CloseReason.NOT_REUSABLE)
        if not conn.in_flight:
            conn.idle_since = now
        return self._settle(now)

    def unassign(self, conn_id: int, waiter_id: int, now: float) -> list[Action]:
        """An `Assign` the driver did not carry out (its client left as the decision arrived):
        nothing was sent, so the connection is as it was, its count of requests served and of
        those its origin still takes included."""
        taken = self._take_off(conn_id, waiter_id)
        if taken is None:
            return []
        conn, waiter = taken
        conn.served -= 1
        if conn.takes is not None:
            conn.takes += 1
        if waiter.took_idle is not None and not conn.in_flight:
            # Idle since then still: a warm connection that idled a while stays proven, and
            # the idle timeouts (the origin's too) run from then.
            conn.idle_since, conn.idled_warm = waiter.took_idle
        elif not conn.in_flight:
            conn.idle_since = now
        return self._settle(now)

    def requests_unanswered(
        self, conn_id: int, waiter_ids: Sequence[int], now: float, *, never_sent: bool = False
    ) -> list[Action]:
        """These requests got no response byte and were not processed: HTTP/2 streams refused
        or above a GOAWAY's last stream, or HTTP/1.1 requests that never left because the
        connection had closed. Idempotent ones go again, at the front of the queue; on HTTP/2,
        whose origin said they were not processed, so do non-idempotent ones whose body can be
        sent again (`replayable`; RFC 9113 §8.7, as Chromium retries a refused stream whatever
        its method), each costing an attempt.

        An HTTP/2 connection lives on. An HTTP/1.1 one cannot refuse a single request and carry
        on, so it takes nothing more (its loss is reported later); and as those requests never
        left, going again costs them no attempt.

        `never_sent`: not a byte of these requests reached the origin, so non-idempotent ones go
        again too (the rule is that no request is *sent* twice unless idempotent)."""
        conn = self._conns.get(conn_id)
        if conn is None:
            return []
        if conn.proto is Proto.H1 and conn.up:
            conn.drain(CloseReason.SERVER_CLOSED)
        if never_sent:
            # Not a byte of them left (a closed HTTP/1.1 connection, an HTTP/2 one draining or
            # at the origin's stream limit): going again costs them no attempt.
            for waiter_id in set(waiter_ids) & conn.in_flight.keys():
                _go_free(conn.in_flight[waiter_id])
        # HTTP/2 says these were not processed (REFUSED_STREAM, above a GOAWAY's last stream);
        # HTTP/1.1 requests that left (a write that failed, a pipeline behind a stalled
        # response) may have been: they cost an attempt.
        unprocessed = never_sent or conn.proto is Proto.H2
        actions = self._take_back(
            conn,
            waiter_ids,
            now,
            never_sent=never_sent,
            unprocessed=unprocessed,
            refused=conn.proto is Proto.H2,
        )
        if not conn.in_flight:
            conn.idle_since = now
        return actions + self._settle(now)

    def connection_lost(
        self,
        conn_id: int,
        now: float,
        *,
        unanswered: Sequence[int],
        graceful: bool = False,
        first_sent: int | None = None,
        never_sent: Collection[int] = (),
    ) -> list[Action]:
        """The connection closed. `unanswered` got no response byte: idempotent ones go again
        at the front of the queue, unless each was the first request on a connection opened for
        it (see MAX_ATTEMPTS); the others fail (a request the origin may have processed is never
        sent twice). The rest of what was in flight had begun its response: the driver ends it.
        Unless the close was `graceful`, those going again take no HTTP/1.1 connection that has
        carried requests by now (the module docstring says why).

        `first_sent`: the request that went out first on it, which only the driver knows (the
        order on the wire can differ from the order of assignment); if the connection was opened
        for requests (not ahead of need) and it is unanswered, it is the one not sent again.

        `graceful`: the origin announced the close (`Connection: close` on its last response),
        or the driver closed it for a client that abandoned its response, so requests pipelined
        behind were expected to go unanswered: that does not count as breaking pipelining, nor
        as an attempt, up to MAX_FREE_GOES times a request. Neither does the keep-alive race,
        once per request: the one request on a reused HTTP/1.1 connection finding it closed by
        the origin (RFC 9112 §9.3.1, as browsers retry it).

        `never_sent`: those of `unanswered` the driver never had (assigned to this connection in
        the turn it was lost, as when a refused stream's retry was given it again): they go
        again whatever their method, at no attempt's cost."""
        conn = self._conns.get(conn_id)
        if conn is None:
            return []
        if conn.state is ConnState.CONNECTING:
            return self._connect_failed(conn, now)
        del self._conns[conn_id]
        unsent = [w for w in conn.in_flight if w in never_sent]
        for waiter_id in unsent:
            _go_free(conn.in_flight[waiter_id])
        requeued = self._take_back(conn, unsent, now, never_sent=True, fresh=not graceful)
        lost = set(unanswered) & conn.in_flight.keys()
        # The race: the one request in flight on a connection that had served others before it
        # (not the connection's first request: that one is no race), once per request (a
        # request that kills connections must not go round every idle one for free).
        keep_alive_race = (
            conn.proto is Proto.H1
            and len(conn.in_flight) == 1
            and conn.served > 1
            and first_sent not in lost
            and not any(conn.in_flight[w].raced for w in lost)
        )
        if graceful:
            for waiter_id in lost:
                waiter = conn.in_flight[waiter_id]
                _go_free(waiter)
                waiter.bounced_at = self._last_conn_id
        elif keep_alive_race:
            for waiter_id in lost:
                waiter = conn.in_flight[waiter_id]
                waiter.attempts -= 1
                waiter.raced = True
        elif conn.proto is Proto.H1 and len(conn.in_flight) >= 2 and lost:
            self.pipelining_broken = True
        unproven = None if conn.idled_warm else first_sent
        actions = self._take_back(
            conn,
            lost,
            now,
            unprocessed=graceful or keep_alive_race,
            unproven=unproven,
            fresh=not graceful,
        )
        for waiter_id in conn.in_flight:
            del self._assigned[waiter_id]
        # In queue order: the others went to the front after, so ahead of, the never-sent ones
        # (assigned last).
        return actions + requeued + self._settle(now)

    def idle_connection_closed_by_server(self, conn_id: int, now: float) -> list[Action]:
        """The driver saw an idle connection turn readable or hit EOF: it is never handed out."""
        conn = self._conns.get(conn_id)
        if conn is None or not conn.up:
            return []
        if conn.in_flight:
            # Raced with an Assign; the driver reports those requests through connection_lost.
            conn.drain(CloseReason.SERVER_CLOSED)
        else:
            del self._conns[conn_id]
        return self._settle(now)

    def pipelining_failed(self, now: float) -> list[Action]:
        """Responses on a pipeline came out of order or garbled: never pipeline here again."""
        self.pipelining_broken = True
        return self._settle(now)

    def max_streams_changed(self, conn_id: int, max_streams: int, now: float) -> list[Action]:
        """HTTP/2 SETTINGS changed the stream limit; streams above a lowered one carry on."""
        conn = self._conns.get(conn_id)
        if conn is None or not conn.up or conn.proto is not Proto.H2:
            return []
        if max_streams < 0:
            raise ValueError(f"max_streams must not be negative, not {max_streams}")
        conn.max_streams = max_streams
        return self._settle(now)

    def goaway(self, conn_id: int, now: float) -> list[Action]:
        """HTTP/2 GOAWAY: no new streams; the connection closes once its streams finish."""
        conn = self._conns.get(conn_id)
        if conn is None or not conn.up:
            return []
        conn.drain(CloseReason.GOAWAY)
        return self._settle(now)

    def set_limits(self, limits: PoolLimits, now: float) -> list[Action]:
        """A policy reload. A lowered cap closes connections as they become idle, never busy
        ones; a lowered max_queue rejects the newest waiters beyond it."""
        self._limits = limits
        actions = self._settle(now)
        # After settling, so that room under a raised cap serves waiters before any is
        # rejected; rejecting from the back leaves the pool settled.
        while len(self._queue) > self._admissible_queue():
            waiter_id, _ = self._queue.popitem(last=True)
            actions.append(Reject(waiter_id, RejectReason.QUEUE_FULL))
        return actions

    def retire(self, retired: bool, now: float) -> list[Action]:
        """A policy reload: `retired`, no policy's route has these limits any more (new requests
        go to the pool of their new limits). The requests already here are served; then every
        connection closes as soon as nobody here waits for it (`OVER_LIMIT`: the reload took
        these limits' cap to none), not at its idle timeout, so the origin never holds more
        than the new cap for longer than the old pool's requests last. False: a reload brought
        these limits back."""
        self._retired = retired
        return self._settle(now)

    def set_ceiling(self, ceiling: int | None, now: float) -> list[Action]:
        """(budget) Hold at most `ceiling` connections (connecting ones count), below the
        limits' cap; None: the limits' cap alone. As under a lowered cap, idle connections above
        it close at once (least recently used first), busy ones as they fall idle, and none
        opens meanwhile."""
        if ceiling is not None and ceiling < 0:
            raise ValueError(f"ceiling must not be negative, not {ceiling}")
        self._ceiling = ceiling
        return self._settle(now)

    def lend(self, count: int, now: float, *, after: float) -> list[Action]:
        """(budget) Other workers wait for `count` slots of the cap they share with this pool:
        close up to `count` connections once they have stayed idle `after` seconds (least
        recently used first). A connection a request of this pool takes in time is kept."""
        if count < 0:
            raise ValueError(f"count must not be negative, not {count}")
        if not after > 0:
            raise ValueError(f"after must be positive, not {after}")
        self._lend, self._lend_after = count, after
        return self._settle(now)

    def abandon_connect(self, conn_id: int, now: float) -> list[Action]:
        """(budget) The driver dropped a connection before it began to connect (no slot of a
        shared cap for it, or nobody left to use it): unlike `connection_failed`, nobody is
        rejected for it; the queue is planned again."""
        conn = self._conns.get(conn_id)
        if conn is None or conn.state is not ConnState.CONNECTING:
            return []
        del self._conns[conn_id]
        return self._settle(now)

    def tick(self, now: float) -> list[Action]:
        """Time passed: queue timeouts and idle expiry (see `next_deadline`)."""
        return self._settle(now)

    def close_all(self, now: float) -> list[Action]:
        """Shutdown: every request fails, every connection closes, later requests fail too."""
        actions: list[Action] = [Fail(w, FailReason.SHUTDOWN) for w in self._queue]
        for conn in self._conns.values():
            actions += [Fail(w, FailReason.SHUTDOWN) for w in conn.in_flight]
            actions.append(Close(conn.conn_id, CloseReason.SHUTDOWN))
        self._queue.clear()
        self._retrying.clear()
        self._deadlines.clear()
        self._conns.clear()
        self._assigned.clear()
        self._closed = True
        return actions

    # the pure step: from any state, do everything that is due

    def _settle(self, now: float) -> list[Action]:
        """Expire, close what should not be kept, then serve the queue. Idempotent: a second
        call at the same `now` returns nothing."""
        actions = self._expire_waiters(now)
        actions += self._close_unwanted(now)
        actions += self._serve_front(now)
        if self._retired and not self._queue:
            idle = [c for c in self._conns.values() if c.idle]
            actions += [self._close(c, CloseReason.OVER_LIMIT) for c in idle]
        actions += self._lend_spare(now)
        if self._queue:
            actions += self._plan_for_waiters(now)
        return actions

    def _expire_waiters(self, now: float) -> list[Action]:
        actions: list[Action] = []
        while (waiter := self._oldest_waiter()) is not None:
            if now - waiter.enqueued_at < self._limits.queue_timeout:
                break
            del self._queue[waiter.waiter_id]
            actions.append(Reject(waiter.waiter_id, RejectReason.QUEUE_TIMEOUT))
        return actions

    def _close_unwanted(self, now: float) -> list[Action]:
        """Close idle connections that are draining, expired, or above the cap (LRU first).
        Expiry comes before serving so that a stale connection is never handed out."""
        actions: list[Action] = []
        for conn in [c for c in self._conns.values() if c.idle]:
            if conn.draining is not None:
                actions.append(self._close(conn, conn.draining))
            elif conn.takes is not None and conn.takes <= 0:
                actions.append(self._close(conn, CloseReason.REQUEST_LIMIT))
            elif now - conn.idle_since >= conn.idle_timeout(self._limits):
                actions.append(self._close(conn, conn.idle_timeout_reason(self._limits)))
        excess = len(self._conns) - self.max_connections
        if excess > 0:
            idle = sorted(
                (c for c in self._conns.values() if c.idle), key=lambda c: (c.idle_since, c.conn_id)
            )
            actions += [self._close(c, CloseReason.OVER_LIMIT) for c in idle[:excess]]
        return actions

    def _lend_spare(self, now: float) -> list[Action]:
        """(budget) After serving the queue: close connections nobody here wanted a while."""
        actions: list[Action] = []
        if self._lend:
            spare = sorted(
                (
                    c
                    for c in self._conns.values()
                    if c.idle and now - c.idle_since >= self._lend_after
                ),
                key=lambda c: (c.idle_since, c.conn_id),
            )
            for conn in spare[: self._lend]:
                actions.append(self._close(conn, CloseReason.NEEDED_ELSEWHERE))
                self._lend -= 1
        return actions

    def _serve_front(self, now: float) -> list[Action]:
        """Rules 1 and 2: connections anyone can use go to the front of the queue (with
        `per_client`, the front of the queue of the client with the fewest requests in flight
        here: see `_Turns`)."""
        actions: list[Action] = []
        turns: _Turns | None = None
        while self._queue:
            retrying = self._retrying_waiters()
            # No room to open a connection for a request going again, and none coming: an
            # HTTP/1.1 connection that frees up is kept for `_make_room` to close, not handed
            # to a later request (which would starve the one going again). Not while an HTTP/2
            # connection lives: the request going again waits for one of its streams.
            reserve = (
                bool(retrying)
                and len(self._conns) >= self.max_connections
                and self._retries_without_connection(retrying) > 0
                and not self._live_h2()
            )
            match: tuple[_Waiter, _Connection] | None = None
            for conn in self._free_connections():
                # A request going again takes a connection it may use before anyone else.
                waiter = next((w for w in retrying if _fits(w, conn)), None)
                if waiter is not None and turns is not None:
                    turns.count(waiter)
                if waiter is None and reserve and conn.proto is Proto.H1:
                    continue
                if waiter is None and len(retrying) < len(self._queue):
                    if self._limits.per_client:
                        if turns is None:
                            turns = _Turns(
                                (w for w in self._queue.values() if not w.after_conn),
                                self._conns.values(),
                            )
                        waiter = turns.take()
                    else:
                        waiter = next(w for w in self._queue.values() if not w.after_conn)
                if waiter is not None:
                    match = (waiter, conn)
                    break
            if match is None:
                break
            actions.append(self._assign(*match, now))
        return actions

    def _free_connections(self) -> list[_Connection]:
        """Connections that can take a request now, the one to use first first: an HTTP/2 one
        with a free stream if any (the oldest), else idle HTTP/1.1 ones (the most recently
        used). A warm connection first: it was opened for this, and would otherwise go to
        waste."""
        h2 = [c for c in self._conns.values() if c.free_h2_stream]
        if h2:
            return sorted(h2, key=lambda c: (not c.unused_warm, c.conn_id))
        h1 = [c for c in self._conns.values() if c.idle and c.h1_open_for_work]
        return sorted(h1, key=lambda c: (c.unused_warm, c.idle_since, c.conn_id), reverse=True)

    def _plan_for_waiters(self, now: float) -> list[Action]:
        """Rules 3 and 4 for a queue that no free connection can serve."""
        connecting = self._connecting_count()
        room = max(0, self.opening_cap - len(self._conns))
        # A live h2 connection whose streams are all busy is waited for, not added to: clients
        # should hold one h2 connection per origin (RFC 9113 section 9.1), and its streams free
        # up as responses end.
        live_h2 = self._live_h2()
        coverage: float
        if live_h2 or self._expects_h2:
            # One h2 connection will take the whole queue (up to its stream limit).
            coverage = math.inf if live_h2 or connecting or room else 0
        else:
            coverage = connecting + room
        actions = self._pipeline(len(self._queue) - coverage, coverage, now)
        if live_h2:
            return actions
        unserved = self._retries_without_connection()
        if self._expects_h2:
            opens = 1 if self._queue and room and not connecting else 0
            # One connection, HTTP/2 as expected, serves every request going again.
            unserved = min(unserved, 0 if connecting else 1)
        else:
            opens = min(room, max(0, len(self._queue) - connecting))
        if unserved > opens:
            # Each replaces the connection it lost: within the cap in force, not a client's
            # share (`opening_cap`), which idle connections kept from clients that left can
            # exceed; idle ones are closed only as far as the cap needs.
            actions += self._make_room(unserved - (self.max_connections - len(self._conns)))
            room = max(0, self.max_connections - len(self._conns))
            opens = max(opens, min(room, unserved))
        for _ in range(opens):
            actions.append(Open(self._new_connection().conn_id))
        return actions

    def _pipeline(self, overflow: float, coverage: float, now: float) -> list[Action]:
        """Pipeline the `overflow` waiters that no connect covers, taking the oldest idempotent
        ones; each uncovered waiter that may not be pipelined (non-idempotent, or `bounced_at`
        with no connection opened since to take it) holds back one connection to drain for
        it."""
        if overflow <= 0 or self.pipelining_broken or self._limits.pipeline_depth < 2:
            return []
        actions: list[Action] = []
        held: set[int] = set()
        others_passed = 0  # waiters passed that may not be pipelined; they take the coverage
        for waiter in list(self._queue.values()):
            if len(actions) >= overflow:
                break
            if waiter.idempotent:
                conn = self._pipeline_target(held, waiter)
                if conn is not None:
                    actions.append(self._assign(waiter, conn, now))
                    continue
                if waiter.after_conn:
                    continue  # it goes again, and only on a new connection
                if not waiter.bounced_at:
                    break  # nobody behind can be pipelined either
            if others_passed >= coverage:
                drains_first = min(
                    (
                        c
                        for c in self._conns.values()
                        if c.h1_open_for_work and c.in_flight and c.conn_id not in held
                    ),
                    key=lambda c: (len(c.in_flight), c.conn_id),
                    default=None,
                )
                if drains_first is not None:
                    held.add(drains_first.conn_id)
            others_passed += 1
        return actions

    def _pipeline_target(self, held: set[int], waiter: _Waiter) -> _Connection | None:
        candidates = [
            c
            for c in self._conns.values()
            if c.h1_open_for_work
            and 1 <= len(c.in_flight) < self._limits.pipeline_depth
            and c.conn_id not in held
            and _fits(waiter, c)
            and c.conn_id > waiter.bounced_at
            and all(w.idempotent for w in c.in_flight.values())
        ]
        return min(candidates, key=lambda c: (len(c.in_flight), c.conn_id), default=None)

    # helpers

    def _live_h2(self) -> bool:
        """An HTTP/2 connection is up and takes requests (its streams may all be busy)."""
        return any(c.open_for_work and c.proto is Proto.H2 for c in self._conns.values())

    @property
    def _expects_h2(self) -> bool:
        # Until the first connection to an https origin has negotiated ALPN, assume h2 (one
        # connection, then wait): an h2 origin then gets one connection, not a burst of them,
        # at the cost of one handshake's wait for the second wave of an HTTP/1.1-only origin.
        probing = not self.learned_proto and self.key.scheme == "https"
        return self._limits.http2 and (self.known_h2 or probing)

    def _connecting_count(self) -> int:
        return sum(1 for c in self._conns.values() if c.state is ConnState.CONNECTING)

    def _admissible_queue(self) -> int:
        """Waiters beyond this many are rejected: `max_queue` plus one per connect under way."""
        return self._limits.max_queue + self._connecting_count()

    def _assign(self, waiter: _Waiter, conn: _Connection, now: float) -> Assign:
        waiter.took_idle = None if conn.in_flight else (conn.idle_since, conn.idled_warm)
        if conn.unused_warm:
            kind = AssignKind.PRECONNECTED
            conn.idled_warm = now > conn.idle_since
        elif conn.served == 0:
            kind = AssignKind.NEW
        elif not conn.in_flight:
            kind = AssignKind.REUSED
        elif conn.proto is Proto.H2:
            kind = AssignKind.MULTIPLEXED
        else:
            kind = AssignKind.PIPELINED
        del self._queue[waiter.waiter_id]
        if waiter.after_conn:
            waiter.after_conn = 0
            del self._retrying[waiter.waiter_id]
        conn.move(ConnEvent.ASSIGNED)
        conn.in_flight[waiter.waiter_id] = waiter
        conn.served += 1
        if conn.takes is not None:
            conn.takes -= 1
        waiter.attempts += 1
        self._assigned[waiter.waiter_id] = conn
        return Assign(waiter.waiter_id, conn.conn_id, kind, now - waiter.enqueued_at)

    def _take_off(self, conn_id: int, waiter_id: int) -> tuple[_Connection, _Waiter] | None:
        """The waiter off the connection it is in flight on (None: it is not, or the connection
        is gone): its request ended, or was never sent."""
        conn = self._conns.get(conn_id)
        waiter = conn.in_flight.pop(waiter_id, None) if conn is not None else None
        if conn is None or waiter is None:
            return None
        del self._assigned[waiter_id]
        conn.ended()
        return conn, waiter

    def _learn_requests_per_connection(self, conn: _Connection, takes: int) -> None:
        """`conn`'s origin said it takes `takes` more requests on it: how many a connection to
        it carries. A connection's first statement may read one short (keep_alive.Terms: a
        count read as a total), so it only raises what is known; those after it say it as it
        is. Connections up with no answer yet get the one learned, less what they carried."""
        answered = conn.served - len(conn.in_flight)
        count = answered + takes
        known = self.requests_per_connection
        if known is None or answered > 1 or count > known:
            self.requests_per_connection = count
            for other in self._conns.values():
                # Not one that has been answered without a statement: its backend, behind a
                # balancer, may be another that states none.
                if (
                    other.proto is Proto.H1
                    and other.takes is None
                    and other.served == len(other.in_flight)
                ):
                    other.takes = count - other.served

    def _close(self, conn: _Connection, reason: CloseReason) -> Close:
        del self._conns[conn.conn_id]
        return Close(conn.conn_id, reason)

    def _new_connection(self, *, warm_idle_timeout: float | None = None) -> _Connection:
        conn = _Connection(next(self._conn_ids), warm_idle_timeout=warm_idle_timeout)
        self._conns[conn.conn_id] = conn
        self._last_conn_id = conn.conn_id
        return conn

    def _retrying_waiters(self) -> list[_Waiter]:
        """The queued waiters going again after a loss, in queue order; forgets those that left
        the queue (timed out, cancelled, rejected). O(queue) only while there are some."""
        if not self._retrying:
            return []
        gone = [i for i, w in self._retrying.items() if self._queue.get(i) is not w]
        for waiter_id in gone:
            self._retrying[waiter_id].after_conn = 0
            del self._retrying[waiter_id]
        if not self._retrying:
            return []
        return [w for w in self._queue.values() if w.after_conn]

    def _retries_without_connection(self, retrying: list[_Waiter] | None = None) -> int:
        """How many waiters going again after a loss (`retrying`, if the caller has them) no
        connection being opened will serve (HTTP/1.1: one each; any connection still connecting
        has carried nothing)."""
        if retrying is None:
            retrying = self._retrying_waiters()
        if not retrying:
            return 0
        coming = sum(1 for c in self._conns.values() if c.state is ConnState.CONNECTING)
        return max(0, len(retrying) - coming)

    def _make_room(self, count: int) -> list[Action]:
        """Close up to `count` idle connections (least recently used first) so that requests
        going again after a loss get new ones: none of them may use these."""
        if count <= 0:
            return []
        idle = sorted(
            (c for c in self._conns.values() if c.idle and c.proto is Proto.H1),
            key=lambda c: (c.idle_since, c.conn_id),
        )
        return [self._close(c, CloseReason.ROOM_FOR_RETRY) for c in idle[:count]]

    def _connect_failed(self, conn: _Connection, now: float) -> list[Action]:
        """The requests the connection was for are rejected: the oldest waiter, or, where one
        HTTP/2 connection was to take the whole queue and no other is up or on its way, every
        waiter. Connects to such an origin go one at a time, so rejecting one per failure made
        the last of n requests wait n connect timeouts, or the queue's, for its 502 (as Envoy
        and Chromium do, the requests waiting on a failed connect fail with it).

        Nobody is rejected while the connects still under way serve the whole queue (rule 3's
        count): the connection was for nobody waiting now, a warm one (`preconnect`), or one
        whose request left or was served elsewhere. A warm connect's failure rejected the
        oldest waiter while the connect opened for it was still under way. (With nothing
        connecting, the oldest waiter is rejected even if a live HTTP/2 connection at its
        stream limit would serve it later, as before.)"""
        del self._conns[conn.conn_id]
        actions: list[Action] = []
        connecting = self._connecting_count()
        covered: float = connecting
        if self._expects_h2 or self._live_h2():
            covered = math.inf if connecting else 0
        one_for_all = self._expects_h2 and not any(
            c.state is ConnState.CONNECTING or c.open_for_work for c in self._conns.values()
        )
        while len(self._queue) > covered:
            waiter_id, _ = self._queue.popitem(last=False)
            actions.append(Reject(waiter_id, RejectReason.CONNECT_FAILED))
            if not one_for_all:
                break
        return actions + self._settle(now)

    def _take_back(
        self,
        conn: _Connection,
        waiter_ids: Iterable[int],
        now: float,
        *,
        never_sent: bool = False,
        unprocessed: bool = False,
        refused: bool = False,
        unproven: int | None = None,
        fresh: bool = False,
    ) -> list[Action]:
        """Requests on `conn` that got no response: idempotent ones go again (in the order they
        were assigned, which is their queue order) unless one is `unproven`, the first request
        on a connection opened for it (see MAX_ATTEMPTS), and the origin did not say it was
        `unprocessed`; others fail unless they were `never_sent`, or `refused` (an HTTP/2
        origin said it did not process them, which no HTTP/1.1 loss proves) and replayable.
        Ids not in flight on it are ignored. `fresh`: those going again take no HTTP/1.1
        connection used by now."""
        actions: list[Action] = []
        again: list[_Waiter] = []
        named = set(waiter_ids)
        for waiter in [w for w in conn.in_flight.values() if w.waiter_id in named]:
            waiter_id = waiter.waiter_id
            del conn.in_flight[waiter_id]
            conn.ended()
            del self._assigned[waiter_id]
            may_repeat = waiter.idempotent or (refused and waiter.replayable)
            if not never_sent and (not may_repeat or (waiter_id == unproven and not unprocessed)):
                actions.append(Fail(waiter_id, FailReason.CONNECTION_LOST))
            elif waiter.attempts >= MAX_ATTEMPTS:
                actions.append(Fail(waiter_id, FailReason.RETRIES_EXHAUSTED))
            else:
                again.append(waiter)
                actions.append(Retry(waiter_id))
                if fresh:
                    waiter.after_conn, waiter.lost_at = self._last_conn_id, now
                    self._retrying[waiter_id] = waiter
        self._enqueue(again, now, front=True)
        return actions

    def _enqueue(self, waiters: list[_Waiter], now: float, *, front: bool) -> None:
        """Queue `waiters` in their order, at the back or the front. Queue time (for the
        timeout and `queued_for`) starts now, also for a request that goes again."""
        for waiter in waiters:
            waiter.enqueued_at = now
            waiter.token = next(self._tokens)
            self._queue[waiter.waiter_id] = waiter
            heapq.heappush(self._deadlines, (now, waiter.token, waiter.waiter_id))
        if front:
            for waiter in reversed(waiters):
                self._queue.move_to_end(waiter.waiter_id, last=False)
        if len(self._deadlines) > 2 * len(self._queue) + 64:
            # Entries of waiters that left the queue are dropped lazily; don't let them pile up.
            self._deadlines = [(w.enqueued_at, w.token, w.waiter_id) for w in self._queue.values()]
            heapq.heapify(self._deadlines)

    def _oldest_waiter(self) -> _Waiter | None:
        """The waiter whose queue timeout ends first, dropping stale heap entries on the way."""
        while self._deadlines:
            _, token, waiter_id = self._deadlines[0]
            waiter = self._queue.get(waiter_id)
            if waiter is not None and waiter.token == token:
                return waiter
            heapq.heappop(self._deadlines)
        return None


class _Turns:
    """Whose request a free connection serves when each client has a share (`per_client`):
    the oldest waiting request of the client with the fewest requests in flight, ties to the
    client waiting longest. A client that sent 100 requests at once then does not take the
    connections a client arriving after it brought (each brings `per_client` more), and each
    client's own requests keep their order. Built when a connection is free: O(queue)."""

    def __init__(self, queue: Iterable[_Waiter], conns: Iterable[_Connection]) -> None:
        self._waiting: dict[object, deque[_Waiter]] = {}  # client -> its waiters, in order
        for waiter in queue:
            self._waiting.setdefault(_client_of(waiter), deque()).append(waiter)
        self._in_flight: dict[object, int] = {}
        for conn in conns:
            for waiter in conn.in_flight.values():
                client = _client_of(waiter)
                self._in_flight[client] = self._in_flight.get(client, 0) + 1
        self._order = {client: rank for rank, client in enumerate(self._waiting)}

    def count(self, waiter: _Waiter) -> None:
        """`waiter` was assigned (taken here, or one going again, which these turns leave
        out): its client has one more in flight."""
        client = _client_of(waiter)
        self._in_flight[client] = self._in_flight.get(client, 0) + 1

    def take(self) -> _Waiter:
        client = min(self._waiting, key=lambda c: (self._in_flight.get(c, 0), self._order[c]))
        waiters = self._waiting[client]
        waiter = waiters.popleft()
        if not waiters:
            del self._waiting[client]
        self.count(waiter)
        return waiter


def _fits(waiter: _Waiter, conn: _Connection) -> bool:
    """Whether `waiter` may be sent on `conn`: anything may, but a request going again after
    a loss takes no HTTP/1.1 connection that had carried a request, or idled warm, at the loss:
    one opened after it, one that has carried nothing (a warm one only if it was still
    connecting then), or an HTTP/2 one."""
    return (
        conn.conn_id > waiter.after_conn
        or conn.proto is not Proto.H1
        or (
            conn.served == 0
            and (conn.warm_idle_timeout is None or conn.idle_since >= waiter.lost_at)
        )
    )


def _client_of(waiter: _Waiter) -> object:
    """Who a waiter counts for: its client, or itself for a request of no known client."""
    return waiter if waiter.client is None else waiter.client
