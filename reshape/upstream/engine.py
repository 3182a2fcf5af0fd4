"""The upstream engine's asyncio driver: executes what the sans-IO pools decide.

One `Engine` per proxy process. For each request it asks the destination's `HostPool` for a
connection, waits (queued) until the pool assigns one, sends the request on it and hands back the
streamed response. Connections report what happens on them (`ConnectionRecord`, a
ConnectionListener) and the driver feeds that back into the pool, running every action the pool
returns: open, assign, reject, fail, close. A ticker drives timeouts (queue and idle).

`preconnect` opens warm connections for requests expected soon (reshape/features/preconnect/ decides
which);
the engine counts each as used or unused once it is known, under the policy that asked for it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import math
import ssl
from collections import OrderedDict
from collections.abc import Callable, Collection, Coroutine, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from reshape.upstream.budget import ConnectionBudget, PoolIdentity
from reshape.upstream.h1 import H1Upstream
from reshape.upstream.h2 import H2Upstream, check_hpack_version
from reshape.upstream.observer import EngineObserver, Labels
from reshape.upstream.pool import (
    Action,
    Assign,
    AssignKind,
    Close,
    CloseReason,
    Fail,
    FailReason,
    HostPool,
    Open,
    PoolKey,
    PoolLimits,
    Proto,
    Reject,
    RejectReason,
    Retry,
)
from reshape.upstream.tls import ALPN_H1, ALPN_H2, SessionCache, TlsClient, client_context
from reshape.upstream.types import (
    Assignment,
    PeerCheck,
    RecordPlan,
    Unanswered,
    UpstreamError,
    UpstreamRequest,
    UpstreamResponse,
)
from reshape.upstream.wire import PeerFilter, PeerRefused, Wire, WireError

log = logging.getLogger("reshape.upstream")

# Pool timers fire this long after a deadline (see `_schedule`).
TIMER_SLACK = 0.001
# (budget) How long connects may wait for a slot of the cap shared with other workers while
# their pool has no requests for them, before they are called off.
SLOT_WAIT_GRACE = 0.25
# How long a new HTTP/2 connection waits for the server's SETTINGS (its stream limit).
SETTINGS_WAIT = 1.0
# Destinations the engine remembers after their pool is gone (a pool goes once it holds nothing:
# a gateway meets millions of hosts), each table the least recently learned first out: the
# protocol each spoke (h1 or h2), so that a new pool, and a preconnect in particular, opens one
# connection to an h2 origin and several to an HTTP/1.1 one from the start; and those that
# broke an HTTP/1.1 pipeline, never pipelined to again while remembered.
REMEMBERED_ORIGINS = 4096
# Why a connection ended that the pool did not close: the origin closed it (an announced close
# the pool had not acted on yet, its keep-alive timeout unannounced), or it broke (a reset, a
# protocol error, a timeout); the pool's own reasons are `CloseReason`'s.
LOST = "lost"


class QueueRejected(UpstreamError):
    """No connection could be had in time: the client gets 503 with Retry-After."""

    def __init__(self, reason: RejectReason, retry_after: int, last_attempt: str = "") -> None:
        """`last_attempt`: what became of the request's last attempt, if it went before."""
        super().__init__(
            {
                RejectReason.QUEUE_FULL: "too many requests waiting for this origin",
                RejectReason.QUEUE_TIMEOUT: "waited too long for a connection to this origin",
                RejectReason.CONNECT_FAILED: "could not connect to the origin",
            }[reason]
            + last_attempt
        )
        self.reason = reason
        self.retry_after = retry_after


class FirstByteTimeout(UpstreamError):
    """The origin sent no response head within the route's read timeout: the client gets 504."""


class DestinationRefused(UpstreamError):
    """The connection reached an address the route's policy refuses (a name that resolved to an
    allowed address when the request was checked, and to a refused one for the engine: DNS
    rebinding): closed before a byte was sent; the client gets 403."""


@dataclass(frozen=True)
class Route:
    """Where a request goes and under which knobs, as the policy says."""

    key: PoolKey
    limits: PoolLimits
    connect_timeout: float
    read_timeout: float
    policy: str
    arm: str
    # Which addresses its connections may reach, checked on the connected peer; None: any.
    peer_check: PeerCheck | None = None
    # How its connections size their TLS records; None: the TLS library's full records.
    records: RecordPlan | None = None
    # Whose connections these are: None, everyone's (the shared pool); otherwise one client
    # connection's own, closed by `release` when it goes.
    owner: str | None = None
    # HTTP/1.1 pipelining: how long requests behind a response wait while it makes no progress
    # before they go again elsewhere.
    pipeline_stall_timeout: float = 2.0
    # Who asks, for a cap per client (PoolLimits.per_client): not part of the pool's identity.
    client: str | None = None

    @property
    def pool_id(self) -> PoolId:
        """Which pool serves the route: one per destination and set of limits, so that two
        policies (two arms of an experiment) with different `upstream:` knobs for one origin
        each get their own cap, queue and pipelining — and per set of destination and record
        knobs, so that no request rides a connection its policy would have refused or sized
        otherwise."""
        return (self.key, self.limits, self.peer_check, self.records, self.owner)

    @property
    def labels(self) -> Labels:
        return (self.policy, self.arm)


# A pool's identity: its destination, its limits, the addresses it may connect to, how its TLS
# records are sized, and whose it is.
PoolId = tuple[PoolKey, PoolLimits, PeerCheck | None, RecordPlan | None, str | None]


class Mailbox:
    """The pool's decisions about one request, in order. (asyncio.Queue does the same with
    more machinery than one reader and no size limit need: it was 2% of a request's CPU.)"""

    __slots__ = ("_items", "_ready")

    def __init__(self) -> None:
        self._items: collections.deque[Action] = collections.deque()
        self._ready: asyncio.Future[None] | None = None

    def put_nowait(self, item: Action) -> None:
        self._items.append(item)
        if self._ready is not None and not self._ready.done():
            self._ready.set_result(None)

    def empty(self) -> bool:
        return not self._items

    def holds_assign(self, conn_id: int) -> bool:
        """An assignment to connection `conn_id` waits here, not yet taken up."""
        return any(type(item) is Assign and item.conn_id == conn_id for item in self._items)

    def get_nowait(self) -> Action:
        return self._items.popleft()

    async def get(self) -> Action:
        while not self._items:
            self._ready = asyncio.get_running_loop().create_future()
            await self._ready
        return self._items.popleft()


class Waiter:
    """One request's place in the pool: the pool's decisions about it arrive in `mailbox`."""

    __slots__ = ("id", "route", "mailbox", "connect_error")

    def __init__(self, waiter_id: int, route: Route) -> None:
        self.id = waiter_id
        self.route = route
        self.mailbox = Mailbox()
        # Why the connection opened for it failed, when the pool rejects it for that.
        self.connect_error: WireError | None = None


class ConnectionRecord:
    """One open (or opening) upstream connection; relays its reports into the pool."""

    def __init__(self, engine: Engine, pool: HostPool, conn_id: int) -> None:
        self.engine = engine
        self.pool = pool
        self.conn_id = conn_id
        self.upstream: H1Upstream | H2Upstream | None = None
        self.tls: TlsClient | None = None
        # The task opening it, until it is open (cancelled if the pool closes it meanwhile).
        self.connect_task: asyncio.Task[None] | None = None
        # A warm connection: the (policy, arm) that asked for it, and whether a request used it.
        self.warm_for: tuple[str, str] | None = None
        self.warm_used = False
        # (budget) The pool whose slot of the cap shared with other workers this one holds.
        self.slot: PoolId | None = None
        self.opened = False  # it came up (counted opened, and closed when it goes)
        # Counted among the connections open now: from its connect's start (with `--workers`,
        # once it has its slot of the shared cap; until then it is a wait, not a connection).
        self.counted = False
        self.counts_shared = 0  # (budget) its origin's requests per connection, told others
        self.closed_for: CloseReason | None = None  # the pool closed it, for this reason
        # The origin sent a response nobody asked for after requests were pipelined here.
        self.mangled_pipeline = False

    # ConnectionListener

    def request_done(
        self,
        waiter_id: int,
        reusable: bool,
        *,
        idle_timeout: float | None = None,
        takes: int | None = None,
    ) -> None:
        known = self.pool.requests_per_connection
        self.engine.run(
            self.pool,
            self.pool.request_done(
                self.conn_id,
                waiter_id,
                self.engine.now(),
                reusable=reusable,
                idle_timeout=idle_timeout,
                takes=takes,
            ),
        )
        learned = self.pool.requests_per_connection
        if learned is not None and learned != known:
            # (budget) Told the other workers twice a connection at most (its first statement
            # may read one short): an origin whose statements disagree (backends behind a
            # balancer set apart) would otherwise send a message per response.
            share = self.counts_shared < 2
            self.counts_shared += share
            self.engine.remember_requests_per_connection(self.pool.key, learned, share=share)

    def unanswered(self, waiter_ids: list[int], *, never_sent: bool = False) -> None:
        self.engine.run(
            self.pool,
            self.pool.requests_unanswered(
                self.conn_id, waiter_ids, self.engine.now(), never_sent=never_sent
            ),
        )

    def out_of_turn(self, *, pipelined: bool) -> None:
        self.engine.observer.out_of_turn()
        log.warning(
            "%s sent data while no request was outstanding: connection closed",
            _describe(self.pool.key),
        )
        # An extra response on a pipeline is read as the next request's, whoever sent it: the
        # requests behind may have had each other's answers. Never again here (the loss,
        # reported next, settles the pool with pipelining off).
        self.mangled_pipeline = self.mangled_pipeline or pipelined

    def max_streams_changed(self, max_streams: int) -> None:
        self.engine.run(
            self.pool, self.pool.max_streams_changed(self.conn_id, max_streams, self.engine.now())
        )

    def goaway(self) -> None:
        self.engine.run(self.pool, self.pool.goaway(self.conn_id, self.engine.now()))

    def lost(
        self, answered: list[int], *, graceful: bool = False, first_sent: int | None = None
    ) -> None:
        if self.tls is not None:
            self.engine.sessions.put(session_key(self.pool), self.tls.session)
        self.engine.forget_connection(self)
        # The pool's record of what is in flight here is the one record: whatever had no
        # response begun (sent or not yet) goes back as unanswered.
        unanswered = sorted(set(self.pool.in_flight_on(self.conn_id)).difference(answered))
        # Assigned to it in the turn it was lost, the assignment still in the mailbox: the
        # connection never had them.
        untaken = [
            waiter_id
            for waiter_id in unanswered
            if (waiter := self.engine.waiters.get(waiter_id)) is not None
            and waiter.mailbox.holds_assign(self.conn_id)
        ]
        broken_before = self.pool.pipelining_broken
        if self.mangled_pipeline:
            self.pool.pipelining_broken = True
        actions = self.pool.connection_lost(
            self.conn_id,
            self.engine.now(),
            unanswered=unanswered,
            graceful=graceful,
            first_sent=first_sent,
            never_sent=untaken,
        )
        if self.pool.pipelining_broken and not broken_before:
            self._pipelining_broke(
                "sent a response nobody asked for on a pipeline"
                if self.mangled_pipeline
                else "closed a pipeline without warning"
            )
        self.engine.run(self.pool, actions)

    def _pipelining_broke(self, how: str) -> None:
        """The pool has just stopped pipelining to this origin: remembered for its next pools,
        counted, told to the other workers."""
        self.engine.remember_pipelining_broken(self.pool.key)
        self.engine.observer.pipelining_disabled()
        if self.engine.budget is not None:  # (budget) the other workers learn it too
            self.engine.budget.pipelining_broke(self.pool.key)
        log.warning("%s %s: no longer pipelining to it", _describe(self.pool.key), how)


class Engine:
    def __init__(self, trust_bundle: Path | None, observer: EngineObserver | None = None) -> None:
        check_hpack_version()
        self.observer = observer or EngineObserver()
        self.pools: dict[PoolId, HostPool] = {}
        self.connections: dict[tuple[HostPool, int], ConnectionRecord] = {}
        self.waiters: dict[int, Waiter] = {}
        self.sessions = SessionCache()
        self._contexts = {
            True: client_context(trust_bundle, [ALPN_H2, ALPN_H1]),
            False: client_context(trust_bundle, [ALPN_H1]),
        }
        # The latest route of each pool's requests: its connect timeout, peer check and labels
        # apply to the pool's next connection.
        self._routes: dict[HostPool, Route] = {}
        # Each pool's timer for its next deadline (queue and idle timeouts): (when, handle).
        self._timers: dict[HostPool, tuple[float, asyncio.TimerHandle]] = {}
        # Connections open or connecting now (`ConnectionRecord.counted`), per origin.
        self._per_host: collections.Counter[PoolKey] = collections.Counter()
        self._protocols: OrderedDict[PoolKey, Proto] = OrderedDict()
        self._pipelining_broken: OrderedDict[PoolKey, None] = OrderedDict()
        # HTTP/1.1 origins' requests per connection, as they said (`HostPool`'s).
        self._requests_per_connection: OrderedDict[PoolKey, int] = OrderedDict()
        self._warming: tuple[str, str] | None = None  # labels for warm Opens being run
        # Called with the route of a request that found no pool for its destination (an origin
        # seen for the first time in a while); returns how many warm connections to open beside
        # the one the request opens, and their idle timeout (static preconnect, see
        # reshape/features/preconnect/addon.py), or None.
        self.first_sight: Callable[[Route], tuple[int, float] | None] | None = None
        self._next_waiter = 0
        self._tasks: set[asyncio.Task[None]] = set()
        # (budget) Set by a worker of `reshape run --workers N`: each pool's cap is shared with
        # the other workers (reshape/upstream/budget/). None: this process's pools are all.
        self.budget: ConnectionBudget | None = None
        # (budget) Connects waiting for a slot, per pool, oldest first; and when to check
        # that the pool still has requests for them.
        self._slot_waits: dict[HostPool, dict[ConnectionRecord, None]] = {}
        self._slot_wait_checks: dict[HostPool, asyncio.TimerHandle] = {}

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def holdings(self) -> dict[str, int]:
        """How many of each thing the engine holds: pools and what it keys by them (their
        routes, timers, connects waiting for a slot), connections, the hosts they go to,
        requests, tasks; and the bounded tables of what it remembers of origins. Nothing of the
        first kind outlives its pool, which goes once it holds nothing."""
        return {
            "pools": len(self.pools),
            "routes": len(self._routes),
            "timers": len(self._timers),
            "slot_waits": len(self._slot_waits) + len(self._slot_wait_checks),
            "connections": len(self.connections),
            "hosts": len(self._per_host),
            "waiters": len(self.waiters),
            "tasks": len(self._tasks),
            "protocols": len(self._protocols),
            "pipelining_broken": len(self._pipelining_broken),
            "requests_per_connection": len(self._requests_per_connection),
            "sessions": len(self.sessions.sessions),
        }

    def __repr__(self) -> str:
        held = " ".join(f"{kind}={count}" for kind, count in self.holdings().items())
        return f"<Engine {held}>"

    def start(self) -> None:
        """Nothing runs until a request comes: timers are set at each pool's next deadline."""

    async def stop(self) -> None:
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        for handle in self._slot_wait_checks.values():
            handle.cancel()
        self._slot_wait_checks.clear()
        now = self.now()
        for pool in list(self.pools.values()):
            self.run(pool, pool.close_all(now))
        for task in list(self._tasks):
            task.cancel()

    # requests

    async def exchange(self, route: Route, request: UpstreamRequest) -> UpstreamResponse:
        """Send `request` on a pooled connection; the response head has arrived on return."""
        self._next_waiter += 1
        waiter = Waiter(self._next_waiter, route)
        self.waiters[waiter.id] = waiter
        labels = route.labels
        started = self.now()
        first_sight = route.pool_id not in self.pools
        pool = self._pool(route)
        # The connection of an assignment this request took up, until its response exists (from
        # then on the response reports its end): if the exchange fails or is cancelled on the
        # way, `_release` makes sure the pool does not count the request in flight for ever.
        taken: int | None = None
        retrying = False  # it went unanswered: the next Assign sends it again
        unanswered: str | None = None  # why its last attempt went unanswered
        attempts = 0  # connections the pool gave it (a 502 says how many)
        try:
            self.run(
                pool,
                pool.request(
                    waiter.id,
                    started,
                    idempotent=request.idempotent,
                    replayable=request.body_stream is None,
                    client=route.client,
                ),
            )
            if first_sight and self.first_sight is not None:
                # After the request is queued, so that the connection it opens is not warm.
                wanted = self.first_sight(route)
                if wanted is not None:
                    self.preconnect(route, *wanted)
            queued = waiter.mailbox.empty()
            if queued:
                self.observer.request_queued(labels)
            while True:
                decision = await waiter.mailbox.get()
                if isinstance(decision, Reject):
                    # A request that went before and must go again says what became of it:
                    # the origin was reached, whatever kept it from going again.
                    last = f" (the last attempt: {unanswered})" if unanswered else ""
                    if decision.reason is not RejectReason.CONNECT_FAILED:
                        self.observer.request_rejected(labels, decision.reason.value)
                        raise QueueRejected(
                            decision.reason, max(1, math.ceil(route.limits.queue_timeout / 4)), last
                        )
                    if isinstance(waiter.connect_error, PeerRefused):
                        raise DestinationRefused(str(waiter.connect_error))
                    reason = f": {waiter.connect_error}" if waiter.connect_error else ""
                    raise UpstreamError(
                        f"could not connect to {_describe(route.key)}{reason}{last}"
                    )
                if isinstance(decision, Fail):
                    # The pool's reason (it will not go again), and the origin's side of it.
                    raise UpstreamError(_failure(route.key, decision, attempts, unanswered))
                assert isinstance(decision, Assign), decision
                record = self.connections.get((pool, decision.conn_id))
                if record is None or record.upstream is None:
                    # The connection vanished meanwhile; the pool re-decides.
                    unanswered = "connection closed before the request was sent"
                    continue
                attempts += 1  # taken up by a connection (the 502 counts those)
                taken = decision.conn_id
                if retrying:
                    retrying = False
                    self.observer.request_retried(labels)
                if decision.kind is AssignKind.PRECONNECTED and record.warm_for is not None:
                    record.warm_used = True
                    self.observer.preconnect_finished(record.warm_for, True)
                waited = self.now() - started
                coalesced = bool(request.body) or request.body_stream is not None
                self.observer.request_assigned(
                    labels, decision.kind.value, waited, coalesced=coalesced
                )
                request.assignment = Assignment(decision.kind.value, queued, waited)
                # The wait for the response head, the origin's time. A streamed body's clock
                # stops while the connection waits for the client's next chunk (an upload may
                # take the client longer than the read timeout, and a gRPC stream may last for
                # hours) and starts again, whole, when a chunk comes and when the request's
                # last byte has gone out (`UpstreamRequest.sent`). An origin that takes nothing
                # more (its window shut, its socket full) or never answers is still timed.
                # A pipelined request's clock starts again, whole, at its turn, and any
                # request's at each informational response (the origin said it is at work).
                streamed = request.body_stream is not None
                timer = asyncio.timeout(route.read_timeout)
                try:
                    async with timer:
                        if streamed:
                            request.on_sent = functools.partial(
                                _restart, timer, route.read_timeout, False
                            )
                            request.on_client_wait = functools.partial(
                                _restart, timer, route.read_timeout
                            )
                        elif decision.kind is AssignKind.PIPELINED:
                            request.on_turn = functools.partial(
                                _restart, timer, route.read_timeout, False
                            )
                        request.on_at_work = functools.partial(_renew, timer, route.read_timeout)
                        response: UpstreamResponse = await record.upstream.exchange(
                            waiter.id, request
                        )
                except TimeoutError:
                    raise FirstByteTimeout(
                        f"{_describe(route.key)} sent no response within {route.read_timeout:g} s"
                    ) from None
                except Unanswered as e:
                    # The connection reported it; the pool sends it again (counted when it
                    # goes) or fails it.
                    taken = None
                    retrying = True
                    unanswered = str(e)
                    continue
                finally:
                    # The head has come, or never will on this attempt.
                    request.on_sent = request.on_client_wait = request.on_turn = None
                    request.on_at_work = None
                taken = None
                return response
        except asyncio.CancelledError:
            self.run(pool, pool.cancel(waiter.id, self.now()))
            raise
        finally:
            self.waiters.pop(waiter.id, None)
            self._release(pool, waiter, taken)

    def _release(self, pool: HostPool, waiter: Waiter, taken: int | None) -> None:
        """A request leaves the engine without a response (an error, or its client left): give
        back what the pool still counts as its. An assignment it never took up (its client left
        as the decision arrived) frees the slot as it is: nothing was sent. One it took up whose
        connection has not reported the end leaves that connection in an unknown state: it
        takes nothing more. (Both are no-ops when the connection already reported.)"""
        now = self.now()
        while not waiter.mailbox.empty():
            decision = waiter.mailbox.get_nowait()
            if isinstance(decision, Assign) and decision.conn_id != taken:
                self.run(pool, pool.unassign(decision.conn_id, waiter.id, now))
        if taken is not None:
            self.run(pool, pool.request_done(taken, waiter.id, now, reusable=False))

    def retire_pools(self, live: Collection[PoolLimits]) -> None:
        """A policy reload: shared pools whose limits no policy has now (`live`) serve what
        they hold and close each connection as soon as nobody waits for it, rather than keep
        them idle beside the new limits' pool (a cap lowered by a reload would otherwise be
        exceeded until the old idle timeout); the others carry on. A client's own pools go
        with their client (`release`)."""
        now = self.now()
        for pool_id, pool in list(self.pools.items()):
            if pool_id[-1] is None:
                self.run(pool, pool.retire(pool.limits not in live, now))

    def release(self, owner: str) -> None:
        """The client connection `owner` is gone: its own pools (`upstream: share: false`)
        close their connections and go."""
        now = self.now()
        for pool_id, pool in list(self.pools.items()):
            if pool_id[-1] == owner:
                del self.pools[pool_id]
                self._routes.pop(pool, None)
                self.run(pool, pool.close_all(now))

    def preconnect(self, route: Route, count: int, idle_timeout: float) -> int:
        """Have `count` connections to the route's destination ready before its requests
        arrive (fewer for an h2 origin, never above the per-host cap); a warm connection
        nobody uses closes after `idle_timeout` seconds. Returns how many were opened."""
        pool = self._pool(route)
        actions = pool.preconnect(count, self.now(), idle_timeout=idle_timeout)
        # Labelled before they start: a connect can fail before this returns.
        self._warming = route.labels
        try:
            self.run(pool, actions)
        finally:
            self._warming = None
        return sum(1 for action in actions if isinstance(action, Open))

    # the pool's decisions

    def run(self, pool: HostPool, actions: Iterable[Action]) -> None:
        for action in actions:
            if isinstance(action, Open):
                record = ConnectionRecord(self, pool, action.conn_id)
                if action.warm:
                    record.warm_for = self._warming
                self.connections[(pool, action.conn_id)] = record
                record.connect_task = self._spawn(
                    self._connect(pool, record), f"connect {_describe(pool.key)}"
                )
            elif isinstance(action, Close):
                closing = self.connections.get((pool, action.conn_id))
                if closing is not None and closing.closed_for is None:
                    closing.closed_for = action.reason
                if closing is not None and closing.upstream is not None:
                    closing.upstream.close()
                elif closing is not None and closing.connect_task is not None:
                    # Still connecting (a pool closed, a client's own pools released): stop.
                    closing.connect_task.cancel()
            elif isinstance(action, Retry):
                pass  # counted when the request goes again
            elif isinstance(action, (Assign, Reject, Fail)):
                waiter = self.waiters.get(action.waiter_id)
                if waiter is not None:
                    waiter.mailbox.put_nowait(action)
                elif isinstance(action, Assign):
                    # Its client left between the decision and now: give the slot back.
                    self.run(pool, pool.unassign(action.conn_id, action.waiter_id, self.now()))
        self._schedule(pool)
        if self._slot_waits:
            self._watch_slot_waits(pool)

    def forget_connection(self, record: ConnectionRecord) -> None:
        if self.connections.pop((record.pool, record.conn_id), None) is not None:
            if record.counted:
                record.counted = False
                self._per_host[record.pool.key] -= 1
                if self._per_host[record.pool.key] <= 0:
                    del self._per_host[record.pool.key]
                self._connections_changed()
            if record.warm_for is not None and not record.warm_used:
                self.observer.preconnect_finished(record.warm_for, False)
            if record.opened:
                reason = record.closed_for.value if record.closed_for is not None else LOST
                self.observer.connection_closed(reason)
        if record.slot is not None and self.budget is not None:
            self.budget.release(record.slot)  # (budget) its slot of the shared cap goes back
            record.slot = None

    async def _connect(self, pool: HostPool, record: ConnectionRecord) -> None:
        key = pool.key
        route = self._routes.get(pool)
        route_timeout = route.connect_timeout if route is not None else 10.0
        if (
            self.budget is not None
            and route is not None
            and route.owner is None  # a client's own pool is this worker's alone
            and not await self._take_slot(pool, record, route)
        ):
            return
        record.counted = True
        self._per_host[key] += 1
        self._connections_changed()
        tls = None
        try:
            if key.scheme == "https":
                tls = TlsClient(
                    self._contexts[pool.limits.http2],
                    key.sni or key.host,
                    session=self.sessions.get(session_key(pool)),
                )
            record.tls = tls
            wire = await Wire.open(
                key.host,
                key.port,
                tls=tls,
                timeout=route_timeout,
                check_peer=self._peer_filter(route) if route is not None else None,
                sizer=route.records.new_sizer() if route and route.records else None,
                observer=self.observer,
            )
        except (WireError, ssl.SSLError, ValueError) as e:
            log.warning("upstream %s: %s", _describe(key), e)
            self.forget_connection(record)
            self._connect_failed(pool, record, e if isinstance(e, WireError) else WireError(str(e)))
            return
        except asyncio.CancelledError:
            self.forget_connection(record)  # Wire.open closed what it had opened
            raise
        record.connect_task = None
        if wire.alpn == ALPN_H2:
            h2_upstream = H2Upstream(wire, record)
            record.upstream = h2_upstream
            h2_upstream.start()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(h2_upstream.settings_received.wait(), SETTINGS_WAIT)
            if h2_upstream.goaway_received or h2_upstream.closed:
                # GOAWAY before any request (a server shutting down: SETTINGS and GOAWAY in one
                # write): a connect that failed, not a connection to give requests to. Taken as
                # ready, every request went to it again without yielding, for ever.
                error = WireError("the origin sent GOAWAY before any request")
                log.warning("upstream %s: %s", _describe(key), error)
                h2_upstream.close()
                self.forget_connection(record)
                self._connect_failed(pool, record, error)
                return
            proto, max_streams = Proto.H2, h2_upstream.max_streams
        else:
            stall = route.pipeline_stall_timeout if route is not None else 2.0
            record.upstream = H1Upstream(wire, record, stall_timeout=stall)
            proto, max_streams = Proto.H1, 1
        record.opened = True
        self.observer.connection_opened(
            proto.value, tls.session_reused if tls is not None else None
        )
        if tls is not None:
            self.sessions.put(session_key(pool), tls.session)
        if pool.limits.http2 or proto is Proto.H2:
            # A pool that never offered HTTP/2 (`http2: false`, a pinned client's) learns
            # nothing of whether the origin speaks it: remembered as HTTP/1.1, every later
            # burst to an HTTP/2 origin opened a connection per request.
            self._remember_protocol(key, proto)
        self.run(
            pool,
            pool.connection_ready(record.conn_id, proto, self.now(), max_streams=max_streams),
        )

    def _connect_failed(self, pool: HostPool, record: ConnectionRecord, error: WireError) -> None:
        """The pool rejects the requests that were waiting for the connection (none while other
        connects under way serve them all); each is told why."""
        actions = pool.connection_failed(record.conn_id, self.now())
        for action in actions:
            rejected = self.waiters.get(action.waiter_id) if isinstance(action, Reject) else None
            if rejected is not None:
                rejected.connect_error = error
        self.run(pool, actions)

    # (budget) the cap shared with other workers

    async def _take_slot(self, pool: HostPool, record: ConnectionRecord, route: Route) -> bool:
        """Wait for a slot of the cap shared with the other workers (the requests wait in the
        pool's queue meanwhile); a warm connection takes a free one or none. False: the
        connection is dropped, without failing anyone, for want of a slot or of requests (those
        it was opened for timed out, or another connection served them meanwhile)."""
        assert self.budget is not None
        warm = record.warm_for is not None
        if not warm:
            self._slot_waits.setdefault(pool, {})[record] = None
        try:
            # With a cap per client, the cap for this worker's clients: the workers' clients
            # mostly overlap (SO_REUSEPORT spreads each browser's connections), so the shared
            # cap follows the clients, never above the limits' cap.
            granted = await self.budget.acquire(route.pool_id, pool.opening_cap, speculative=warm)
        except asyncio.CancelledError:
            self.forget_connection(record)
            raise
        finally:
            waits = self._slot_waits.get(pool, {})
            waits.pop(record, None)
            if not waits:
                self._slot_waits.pop(pool, None)
        if granted:
            record.slot = route.pool_id
        if granted and (warm or pool.queued):
            return True
        self.forget_connection(record)
        self.run(pool, pool.abandon_connect(record.conn_id, self.now()))
        return False

    def _watch_slot_waits(self, pool: HostPool) -> None:
        """More connects wait for a slot than the pool has requests queued (they were served
        by connections that fell free, timed out, or left): if that still holds a moment later,
        the extra ones are called off. At once would be too soon: a busy worker's queue empties
        and fills again all the time, and its waits are its share of the cap."""
        waits = self._slot_waits.get(pool)
        if waits and len(waits) > pool.queued and pool not in self._slot_wait_checks:
            self._slot_wait_checks[pool] = asyncio.get_running_loop().call_later(
                SLOT_WAIT_GRACE, self._slot_waits_checked, pool
            )

    def _slot_waits_checked(self, pool: HostPool) -> None:
        del self._slot_wait_checks[pool]
        self._call_off_slot_waits(pool)

    def _call_off_slot_waits(self, pool: HostPool) -> None:
        """Connects waiting for a slot beyond the requests queued would only make other workers
        give up slots nobody here needs: the newest are called off."""
        waits = self._slot_waits.get(pool)
        excess = len(waits) - pool.queued if waits else 0
        if excess <= 0 or not waits:
            return
        for record in list(waits)[-excess:]:
            del waits[record]
            if record.connect_task is not None:
                record.connect_task.cancel()
            self.forget_connection(record)
            self.run(pool, pool.abandon_connect(record.conn_id, self.now()))

    def limit_pool(self, pool_id: PoolIdentity, ceiling: int | None) -> None:
        """Other workers wait for slots: the pool holds at most `ceiling` connections (None: its
        own cap), closing idle ones at once and busy ones as they fall idle."""
        pool = self.pools.get(cast(PoolId, pool_id))
        if pool is not None:
            self.run(pool, pool.set_ceiling(ceiling, self.now()))

    def lend_from_pool(self, pool_id: PoolIdentity, count: int, after: float) -> None:
        """Other workers wait for slots: the pool closes up to `count` connections that stay
        idle `after` seconds."""
        pool = self.pools.get(cast(PoolId, pool_id))
        if pool is not None:
            self.run(pool, pool.lend(count, self.now(), after=after))

    def pipelining_broken_elsewhere(self, key: PoolKey) -> None:
        """Another worker saw `key` break a pipeline: this one stops pipelining to it too."""
        self.remember_pipelining_broken(key)
        for pool in self.pools.values():
            if pool.key == key:
                pool.pipelining_broken = True

    def breaks_pipelining(self, key: PoolKey) -> bool:
        """Whether `key` is known to break HTTP/1.1 pipelines: a pool of this engine's saw it
        (and it is still remembered), or (budget) another worker did."""
        if key in self._pipelining_broken:
            self._pipelining_broken.move_to_end(key)
            return True
        return self.budget is not None and self.budget.breaks_pipelining(key)

    def remember_pipelining_broken(self, key: PoolKey) -> None:
        """`key` broke a pipeline: pools for it, now and later, do not pipeline."""
        _remember(self._pipelining_broken, key, None)

    def remember_requests_per_connection(self, key: PoolKey, count: int, *, share: bool) -> None:
        """`key` said how many requests it takes on a connection: later pools for it start
        with it (a pool goes once it holds nothing), here and, if `share`, (budget) in the
        other workers."""
        _remember(self._requests_per_connection, key, count)
        if share and self.budget is not None:
            self.budget.requests_per_connection_learned(key, count)

    # plumbing

    def _pool(self, route: Route) -> HostPool:
        """The route's pool. After a reload that changes a policy's limits its requests go to a
        new pool; the old one serves what it has in flight and closes its connections as they
        fall idle (`retire_pools`)."""
        pool = self.pools.get(route.pool_id)
        if pool is None:
            pool = self.pools[route.pool_id] = HostPool(route.key, route.limits)
            remembered = self._protocols.get(route.key)
            if self.budget is not None:  # (budget) what any worker saw last
                remembered = self.budget.protocol(route.key) or remembered
            if remembered is not None:
                pool.learned_proto = True
                pool.known_h2 = remembered is Proto.H2
            # What one pool learned about an origin that breaks pipelines holds for all.
            pool.pipelining_broken = self.breaks_pipelining(route.key)
            takes = self._requests_per_connection.get(route.key)
            if self.budget is not None:  # (budget) what any worker heard last
                takes = self.budget.requests_per_connection(route.key) or takes
            pool.requests_per_connection = takes
        self._routes[pool] = route
        return pool

    def _peer_filter(self, route: Route) -> PeerFilter | None:
        """The check of a new connection's peer address under the route's policy."""
        check = route.peer_check
        if check is None:
            return None

        def refused(peer: tuple[str, int]) -> str | None:
            found = check.refusal(peer, route.key.host, route.policy)
            if found is None:
                return None
            self.observer.destination_refused(route.labels, found.reason)
            return found.message

        return refused

    def _remember_protocol(self, key: PoolKey, proto: Proto) -> None:
        _remember(self._protocols, key, proto)
        if self.budget is not None:  # (budget) the other workers learn it too
            self.budget.protocol_learned(key, proto)

    def _spawn(self, coroutine: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coroutine, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _connections_changed(self) -> None:
        per_host = self._per_host.values()
        self.observer.connections_changed(sum(per_host), max(per_host, default=0))

    def _schedule(self, pool: HostPool) -> None:
        """Set the pool's timer at its next deadline (a queue or idle timeout), if it has one;
        drop a pool with nothing left in it (what it learned of its origin is remembered
        apart: `_protocols`, `_pipelining_broken`, `_requests_per_connection`, `sessions`)."""
        deadline = pool.next_deadline()
        scheduled = self._timers.get(pool)
        if scheduled is not None and scheduled[0] == deadline:
            return
        if scheduled is not None:
            scheduled[1].cancel()
            del self._timers[pool]
        if deadline is not None:
            # A hair late: the loop may wake a timer early, and at the deadline itself the
            # pool's comparisons still find nothing due.
            when = deadline + TIMER_SLACK
            handle = asyncio.get_running_loop().call_at(when, self._deadline_passed, pool)
            self._timers[pool] = (deadline, handle)
            return
        if pool.active_connections or pool.queued or pool.in_flight:
            return
        route = self._routes.get(pool)
        if route is not None and self.pools.get(route.pool_id) is pool:
            del self.pools[route.pool_id]
            del self._routes[pool]

    def _deadline_passed(self, pool: HostPool) -> None:
        self._timers.pop(pool, None)
        self.run(pool, pool.tick(self.now()))


def _remember[V](table: OrderedDict[PoolKey, V], key: PoolKey, value: V) -> None:
    """Put `key` last in `table`, forgetting the first beyond REMEMBERED_ORIGINS."""
    table[key] = value
    table.move_to_end(key)
    while len(table) > REMEMBERED_ORIGINS:
        table.popitem(last=False)


def session_key(pool: HostPool) -> tuple[PoolKey, bool]:
    """TLS sessions belong to the SSL context that made them, one per `http2` setting: a session
    from the other context raises ValueError when offered (two policies, one origin)."""
    return (pool.key, pool.limits.http2)


def _describe(key: PoolKey) -> str:
    return f"{key.scheme}://{key.host}:{key.port}"


def _failure(key: PoolKey, fail: Fail, attempts: int, unanswered: str | None) -> str:
    """Why a request the pool gave up on gets a 502: the pool's reason, how often it went if
    that is the reason, and what became of its last attempt ("http://o:80: retries exhausted
    after 2 attempts (the last attempt: connection closed by the origin)")."""
    text = f"{_describe(key)}: {fail.message}"
    if fail.reason is FailReason.RETRIES_EXHAUSTED:
        text += f" after {attempts} attempts"
    if unanswered:
        text += f" (the last attempt: {unanswered})"
    return text


def _renew(timer: asyncio.Timeout, seconds: float) -> None:
    """Start `timer` again, `seconds` from now, if it runs: one stopped while the connection
    waits for the client's next body chunk stays stopped (that time is the client's)."""
    if not timer.expired() and timer.when() is not None:
        timer.reschedule(asyncio.get_running_loop().time() + seconds)


def _restart(timer: asyncio.Timeout, seconds: float, stopped: bool) -> None:
    """Stop `timer` (`stopped`), or start it again: `seconds` from now. A timer that has
    fired is left as it is: its exchange is being cancelled."""
    if not timer.expired():
        timer.reschedule(None if stopped else asyncio.get_running_loop().time() + seconds)
