"""Refuses requests to destinations the policy does not allow, and to the proxy itself
(reshape/features/destinations/rules.py decides; this addon only finds the addresses and answers).

Two checks, both on IP addresses:
- before connecting, on the request's host (resolved here when it is a name): a refused
  destination gets `403` with a one-line text/plain reason, and no connection is attempted —
  plain HTTP requests in `requestheaders` (before a streamed body opens a connection), CONNECT in
  `http_connect` (before mitmproxy connects eagerly);
- after connecting, on the peer address mitmproxy actually connected to (`server_connected`):
  a name that resolved to an allowed address for the first check and to a refused one for
  mitmproxy's own lookup (DNS rebinding) is cut off before a byte is sent; the client gets a 502.

Requests the upstream pool carries are checked here before they go to the pool; the pool's engine
resolves and connects itself and checks its peer with `reshape.features.destinations.rules.refusal`
(the runtime
hands it this addon's `own` addresses), answering 403.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import time
from collections import OrderedDict
from collections.abc import Callable
from weakref import WeakKeyDictionary

from mitmproxy import connection, http
from mitmproxy.proxy import server_hooks

from reshape.base.addresses import ListenAddress
from reshape.base.flowstate import state_of
from reshape.base.own_answers import answer_to
from reshape.features.destinations.rules import (
    IPAddress,
    OwnAddressBook,
    OwnAddresses,
    Reason,
    ip_of,
    refusal,
    refusal_message,
)
from reshape.features.telemetry import metrics
from reshape.features.telemetry.metrics import labelled
from reshape.policy.chooser import selection_of
from reshape.policy.reload import PolicyHolder
from reshape.policy.selection import NO_ARM, RequestFacts, Selection, select

log = logging.getLogger("reshape.destinations")

# Resolved names are remembered this long: a page's requests to one host cost one lookup. A stale
# answer cannot let a request through to a refused address: the connected peer is checked too.
RESOLVE_TTL = 10.0
RESOLVE_CACHE_SIZE = 4096
# Checked destinations remembered per client connection, for the check after connecting.
ALLOWED_PER_CLIENT = 64


def kernel_says_local(ip: IPAddress) -> bool:
    """Whether `ip` is one of this machine's addresses: binding to it succeeds only then. Asked
    only for destinations on a port the proxy listens on at a wildcard address."""
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((str(ip), 0))
    except OSError as e:
        return e.errno not in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT)
    return True


def forbidden(message: str) -> http.Response:
    return http.Response.make(
        403,
        message + "\n",
        {"Content-Type": "text/plain; charset=utf-8", "Cache-Control": "no-store"},
    )


class Resolver:
    """getaddrinfo off the event loop, with a small cache of recent answers."""

    def __init__(self) -> None:
        self._cache: OrderedDict[str, tuple[float, tuple[str, ...]]] = OrderedDict()

    def known(self, host: str) -> tuple[str, ...] | None:
        """The addresses of `host` if known without asking DNS (an address itself, or a recent
        answer); None otherwise."""
        try:
            return (str(ip_of(host)),)
        except ValueError:
            pass
        cached = self._cache.get(host)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        return None

    async def addresses(self, host: str) -> tuple[str, ...]:
        """The IP addresses `host` resolves to (itself if it is one); () if it does not resolve
        (the connection attempt then reports the error)."""
        known = self.known(host)
        if known is not None:
            return known
        now = time.monotonic()
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, None, type=socket.SOCK_STREAM
            )
        except (OSError, UnicodeError):
            return ()
        found = tuple(dict.fromkeys(str(info[4][0]) for info in infos))
        self._cache[host] = (now + RESOLVE_TTL, found)
        self._cache.move_to_end(host)
        while len(self._cache) > RESOLVE_CACHE_SIZE:
            self._cache.popitem(last=False)
        return found


class Destinations:
    def __init__(
        self,
        policy: PolicyHolder,
        own: OwnAddresses,
        resolver: Resolver | None = None,
        *,
        close_server: Callable[[connection.Client, connection.Server], None] | None = None,
    ) -> None:
        self.policy = policy
        # Closes a server connection's socket after connecting (mitm/connections.py; None in
        # tests without a running proxy).
        self.close_server = close_server
        # The proxy's own addresses, shared with the engine's routes (their peer checks).
        self.book = OwnAddressBook(own)
        self.resolver = resolver or Resolver()
        # What the last check on a client connection allowed, per destination: the policy whose
        # knobs the connected peer is then checked against.
        self._allowed: WeakKeyDictionary[connection.Client, dict[tuple[str, int], Selection]] = (
            WeakKeyDictionary()
        )
        self._lookups: set[asyncio.Task[None]] = set()

    @property
    def own(self) -> OwnAddresses:
        return self.book.current

    def listening_on(self, address: tuple[str, int]) -> None:
        """Add an address the proxy listens on that was not known at start (a port 0 resolved)."""
        self.book.add(ListenAddress(*address))

    def http_connect(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None:
            return  # e.g. 407 from proxy authentication
        # A CONNECT has no requestheaders hook, so no policy was chosen for it yet: choose one
        # from what it carries (client, User-Agent, destination); cookie units are not sent.
        request = flow.request
        facts = RequestFacts(
            client_ip=flow.client_conn.peername[0] if flow.client_conn.peername else "",
            user_agent=request.headers.get("user-agent", ""),
            destination=request.host,
            headers=request.headers,
        )
        self._check(flow, select(self.policy.current, facts))

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None:
            return
        self._check(flow, selection_of(flow))

    def _check(self, flow: http.HTTPFlow, selection: Selection) -> None:
        """Decide now when the addresses are known; otherwise hold the flow (mitmproxy's
        intercept) while they are looked up, off the event loop's critical path."""
        known = self.resolver.known(flow.request.host)
        if known is not None:
            self._decide(flow, selection, known)
            return
        flow.intercept()
        task = asyncio.get_running_loop().create_task(self._look_up(flow, selection))
        self._lookups.add(task)
        task.add_done_callback(self._lookups.discard)

    async def _look_up(self, flow: http.HTTPFlow, selection: Selection) -> None:
        try:
            self._decide(flow, selection, await self.resolver.addresses(flow.request.host))
        finally:
            flow.resume()

    def _decide(
        self, flow: http.HTTPFlow, selection: Selection, addresses: tuple[str, ...]
    ) -> None:
        host, port = flow.request.host, flow.request.port
        knobs = selection.policy.destinations
        for ip in addresses:
            reason = refusal((ip, port), knobs, self.own)
            if reason is not None:
                message = refusal_message(reason, ip, port, selection.policy_name, host)
                self._refused(selection, reason, message)
                flow.response = answer_to(flow.request, forbidden(message))
                state_of(flow).outcome = "rejected"
                # A body that would have streamed to the origin is read and dropped instead:
                # mitmproxy cannot stream a request body and answer it locally at once.
                flow.request.stream = False
                return
        allowed = self._allowed.setdefault(flow.client_conn, {})
        if len(allowed) >= ALLOWED_PER_CLIENT:
            allowed.clear()  # a long-lived plain-HTTP client connection to many hosts
        allowed[(host, port)] = selection

    def server_connected(self, data: server_hooks.ServerConnectionHookData) -> None:
        address, peer = data.server.address, data.server.peername
        if address is None or peer is None:
            return
        # The policy of the request this connection is for; the default policy's knobs for a
        # connection no request check saw (an addon changed the destination afterwards).
        selection = self._allowed.get(data.client, {}).get(address)
        current = self.policy.current
        policy = selection.policy_name if selection else current.default
        knobs = (selection.policy if selection else current.policies[policy]).destinations
        reason = refusal((peer[0], peer[1]), knobs, self.own)
        if reason is None:
            return
        message = refusal_message(reason, peer[0], peer[1], policy, str(address[0]))
        self._refused(selection, reason, message + " (after connecting)")
        # Marks the connection failed for every later request, and closes it before the request
        # is written: nothing reaches the refused address.
        data.server.error = message
        if self.close_server is not None:
            self.close_server(data.client, data.server)

    def _refused(self, selection: Selection | None, reason: Reason, message: str) -> None:
        policy = selection.policy_name if selection else self.policy.current.default
        arm = selection.arm if selection else NO_ARM
        labelled(metrics.destinations_refused_total, policy, arm, reason).inc()
        log.warning("%s", message.removeprefix("reshape: "))


def own_addresses(*listens: ListenAddress | None) -> OwnAddresses:
    """The proxy's own addresses from its listen addresses (those with port 0 come later, by
    `Destinations.listening_on`)."""
    return OwnAddresses.of([listen for listen in listens if listen], kernel_says_local)
