"""Preconnect: warm origin connections waiting before a page's requests arrive (issue 7).

Thin on purpose: it tells the navigation tracker about requests, learns finished page loads into
the table, and on a navigation asks the upstream engine to warm connections to the origins the
table predicts (reshape/features/preconnect/). Static mode is the engine's: it calls back here when
a
request reaches an origin it has no pool for (`Engine.first_sight`).

Only requests under a policy with `upstream:` and `preconnect.mode` other than off take part
(the loader refuses preconnect without upstream). Learning and preconnecting read the knobs of
the policy the document request runs under.

`shared` (the workers of `reshape run --workers N`): a browser's connections are spread over the
workers, so each worker announces the navigations it sees begin (board.py), follows those others
announced, and hands the parts of page loads it saw to the shared file, where they are put
together and learned once settled (assembly.py, store.py). Learning then lags a page load by
`SETTLE_SECONDS`; a single process learns when the load ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from urllib.parse import urlsplit

from mitmproxy import http

from reshape.base.flowstate import state_of
from reshape.features.pool.addon import PoolRouting
from reshape.features.pool.routes import Destination, knobs_of
from reshape.features.preconnect.assembly import Learned
from reshape.features.preconnect.board import DIRECTORY_NAME, NavigationBoard
from reshape.features.preconnect.navigations import NavigationOutcome, NavigationTracker
from reshape.features.preconnect.store import FILE_NAME, TableStore
from reshape.features.preconnect.table import OriginTable, connections_wanted
from reshape.policy.chooser import selection_of
from reshape.policy.reload import PolicyHolder
from reshape.policy.schema import Policy, PreconnectKnobs
from reshape.upstream.engine import Engine, Route

log = logging.getLogger("reshape.preconnect")

# How often open navigations are checked for their end, and the table merged with the file.
EXPIRE_SECONDS = 1.0
MERGE_SECONDS = 5.0
# Page loads learned but not yet merged; beyond this the oldest are dropped (a confdir that
# cannot be written must not grow memory without bound).
MAX_PENDING = 10_000
# A navigation lasts at most this long (then its requests no longer count towards it).
NAVIGATION_WINDOW = 20.0
# With workers: a navigation's parts have all reached the shared file this long after it began.
SETTLE_SECONDS = NAVIGATION_WINDOW + MERGE_SECONDS + 2 * EXPIRE_SECONDS
DEFAULT_MAX_MISSES = PreconnectKnobs().max_misses


def origin_of(scheme: str, host: str, port: int) -> str:
    host = host.lower()
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def is_navigation(request: http.Request) -> bool:
    """A document request: Fetch Metadata says so, or (from a client that sends none) a GET
    that accepts HTML."""
    dest = request.headers.get("sec-fetch-dest")
    if dest is not None:
        return dest == "document"
    return request.method == "GET" and "text/html" in request.headers.get("accept", "")


def referer_origin(request: http.Request) -> str | None:
    referer = request.headers.get("referer")
    if not referer:
        return None
    try:
        parts = urlsplit(referer)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    return origin_of(parts.scheme, parts.hostname, port)


class Preconnect:
    def __init__(
        self,
        engine: Engine,
        policy: PolicyHolder,
        routing: PoolRouting,
        confdir: Path,
        *,
        shared: bool = False,
    ) -> None:
        self.engine = engine
        self.policy = policy
        self.routing = routing
        self.store = TableStore(confdir / FILE_NAME)
        self.table: OriginTable = self.store.load()
        self.tracker = NavigationTracker(window=NAVIGATION_WINDOW)
        self.board = NavigationBoard(confdir / DIRECTORY_NAME) if shared else None
        # Single process: page loads learned here, to merge. Shared: parts of page loads.
        self.pending: list[Learned] = []
        # First party -> the miss rule of the policy its last document request ran under.
        self._max_misses: dict[str, int] = {}
        self._task: asyncio.Task[None] | None = None
        self._merging: asyncio.Task[None] | None = None  # the upkeep's merge, while it runs
        engine.first_sight = self._first_sight

    # mitmproxy hooks

    def running(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._maintain(), name="preconnect upkeep")

    async def done(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._merging is not None:
            # Its batch is written and learned before the last merge. Shielded: a stop cut short
            # does not cut the merge's write off either. Its failure does not cost the last
            # merge what was learned since.
            try:
                await asyncio.shield(self._merging)
            except Exception:
                log.exception("preconnect: the merge running at the stop failed")
        self._learn(self.tracker.expire(float("inf")))
        if self.pending or (self.board is not None and self._in_use()):
            self._merge_now()

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None or flow.request.method == "CONNECT":
            return
        selection = selection_of(flow)
        policy = selection.policy
        if policy.preconnect.mode == "off":
            return
        request = flow.request
        origin = origin_of(request.scheme, request.host, request.port)
        client = flow.client_conn.peername[0] if flow.client_conn.peername else "?"
        now = time.time()
        if is_navigation(request):
            if len(self._max_misses) >= MAX_PENDING:
                self._max_misses.clear()  # bounded; a forgotten entry means the default rule
            self._max_misses[origin] = policy.preconnect.max_misses
            self._learn(self.tracker.document(client, origin, now))
            if self.board is not None:
                self.board.publish(client, origin, now)
            if policy.preconnect.mode == "learned":
                self._warm(origin, policy, selection.policy_name, selection.arm)
            return
        if self.board is not None:
            self._follow(client, now)
        handle = self.tracker.subresource(client, origin, referer_origin(request), now)
        if handle is not None:
            state_of(flow).preconnect = handle

    def response(self, flow: http.HTTPFlow) -> None:
        self._finished(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self._finished(flow)

    # what the hooks do

    def _in_use(self) -> bool:
        return any(p.preconnect.mode != "off" for p in self.policy.current.policies.values())

    def _finished(self, flow: http.HTTPFlow) -> None:
        state = state_of(flow)
        handle, state.preconnect = state.preconnect, None
        if handle is not None:
            self.tracker.finished(handle)

    def _follow(self, client: str, now: float) -> None:
        """Follow the client's latest navigation if another worker saw it begin. Read on every
        request: a small file, cheap next to what mitmproxy spends on a request."""
        assert self.board is not None
        announced = self.board.lookup(client)
        if announced is None:
            return
        current = self.tracker.current(client)
        if current is None or current[1] < announced[1]:
            self._learn(self.tracker.adopt(client, *announced, now))

    def _learn(self, outcomes: list[NavigationOutcome]) -> None:
        for outcome in outcomes:
            max_misses = self._max_misses.get(outcome.first_party, DEFAULT_MAX_MISSES)
            if self.board is None:
                self.table.learn(outcome, max_misses=max_misses)
            self.pending.append(Learned(outcome, max_misses))
        if len(self.pending) > MAX_PENDING:
            del self.pending[: len(self.pending) - MAX_PENDING]

    def _warm(self, first_party: str, policy: Policy, policy_name: str, arm: str) -> None:
        knobs = policy.preconnect
        upstream = knobs_of(policy)
        if not upstream.share:
            return  # each client connection keeps its own connections: nothing to share
        # Warm connections are for one user's page: a per-client cap bounds them too.
        per_origin = upstream.max_connections_per_client or upstream.max_connections_per_host
        cap = min(knobs.max_connections_per_origin, per_origin)
        for prediction in self.table.predict(first_party, min_confidence=knobs.min_confidence):
            destination = Destination.of_origin(prediction.origin)
            if destination is None:
                continue
            count = connections_wanted(prediction, knobs.rule, cap)
            warm = self.routing.route_to(destination, policy, policy_name, arm)
            opened = self.engine.preconnect(warm, count, knobs.idle_timeout)
            log.debug(
                "preconnect %s for %s: %d of %d", prediction.origin, first_party, opened, count
            )

    def _first_sight(self, route: Route) -> tuple[int, float] | None:
        policy = self.policy.policy(route.policy)
        if policy is None or policy.preconnect.mode != "static":
            return None
        extra = policy.preconnect.static_connections - 1
        return (extra, policy.preconnect.idle_timeout) if extra > 0 else None

    async def _maintain(self) -> None:
        last_merge = time.monotonic()
        while True:
            await asyncio.sleep(EXPIRE_SECONDS)
            self._learn(self.tracker.expire(time.time()))
            if time.monotonic() - last_merge >= MERGE_SECONDS and self._in_use():
                last_merge = time.monotonic()
                # Not cancelled with the upkeep when the proxy stops: `done` waits for it. Cut
                # off in its thread, its batch was lost, and its write could land after the
                # last merge's and undo it (page loads learned before the stop, forgotten).
                self._merging = asyncio.create_task(self._merge(), name="preconnect merge")
                await asyncio.shield(self._merging)
                self._merging = None

    async def _merge(self) -> None:
        batch, self.pending = self.pending, []
        try:
            merged = await asyncio.to_thread(self._merge_batch, batch)
        except OSError as e:
            log.warning("preconnect: cannot write %s (%s); will try again", self.store.path, e)
            self.pending = batch + self.pending
            return
        if self.board is None:
            # Loads learned while the merge ran are in the old copy only: learn them again.
            for each in self.pending:
                merged.learn(each.outcome, max_misses=each.max_misses)
        self.table = merged

    def _merge_batch(self, batch: list[Learned]) -> OriginTable:
        if self.board is None:
            return self.store.merge(batch)
        self.board.sweep(2 * NAVIGATION_WINDOW)
        return self.store.merge([], batch, now=time.time(), settle_after=SETTLE_SECONDS)

    def _merge_now(self) -> None:
        try:
            self.table = self._merge_batch(self.pending)
            self.pending = []
        except OSError as e:
            log.warning(
                "preconnect: cannot write %s (%s); what was learned is lost", self.store.path, e
            )
