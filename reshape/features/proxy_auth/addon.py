"""Basic proxy authentication against a users file: reshape's own scrypt format, an Apache
htpasswd file of bcrypt entries, or an LDAP directory the file names (reshape/features/proxy_auth/
users.py and ldap.py hold the formats and the verification; this addon only reads headers and
answers).

A request without valid `Proxy-Authorization: Basic` credentials gets `407` with
`Proxy-Authenticate: Basic realm="reshape"` — plain HTTP requests and CONNECT alike. Valid
credentials are removed from the request, so an origin never sees them.

scrypt is slow on purpose, so a verification runs in a thread, off the event loop, and its success
is remembered for the client connection: a CONNECT's credentials cover every request in its tunnel
(the requests inside carry none), and a plain-HTTP connection that sends the same header again is
not verified again. mitmproxy's own `proxyauth` addon works the same way and reads the same
htpasswd files (it also takes unsalted SHA-1, which reshape refuses).

The file is read again when it changes (checked at most once a second, on a request), so
`reshape users add|remove` takes effect without a restart (tunnels already open stay open); a file
that turns invalid or exposed is refused and the users read before stay in force.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import logging
import time
from pathlib import Path
from typing import Literal
from weakref import WeakKeyDictionary

from mitmproxy import connection, http

from reshape.base.flowstate import state_of
from reshape.base.own_answers import answer_to
from reshape.features.proxy_auth.users import FileStamp, Users, UsersFileError, load_users, stamp_of
from reshape.features.telemetry import metrics

log = logging.getLogger("reshape.auth")

REALM = "reshape"
HEADER = "proxy-authorization"
RELOAD_CHECK_SECONDS = 1.0

# With authentication on and no --allow-clients, any client address may connect (and must then
# authenticate): the networks given to ClientAccess.
EVERY_CLIENT = (ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0"))

Failure = Literal["missing", "malformed", "rejected"]
FAILURES: tuple[Failure, ...] = ("missing", "malformed", "rejected")


def parse_basic(value: str) -> tuple[str, str] | None:
    """(user, password) from a `Basic <base64 user:password>` header value, or None."""
    scheme, _, encoded = value.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep else None


def proxy_auth_required() -> http.Response:
    return http.Response.make(
        407,
        "reshape: proxy authentication required\n",
        {
            "Proxy-Authenticate": f'Basic realm="{REALM}", charset="UTF-8"',
            "Content-Type": "text/plain; charset=utf-8",
        },
    )


class ProxyAuthentication:
    def __init__(self, path: Path | None, users: Users | None = None) -> None:
        """`path` None: authentication off. `users`: the file's content, already read and
        checked at start-up (reshape/app/runtime.py), so a bad file stops reshape before it
        listens."""
        self.path = path
        self.users = users if users is not None or path is None else load_users(path)
        self._stamp: FileStamp | None = stamp_of(path) if path else None
        self._next_check = time.monotonic() + RELOAD_CHECK_SECONDS
        # Clients whose CONNECT was authenticated: every request in the tunnel is theirs.
        self._tunnels: WeakKeyDictionary[connection.Client, str] = WeakKeyDictionary()
        # The header value last verified on a plain-HTTP client connection, and its user.
        self._verified: WeakKeyDictionary[connection.Client, tuple[str, str]] = WeakKeyDictionary()

    @property
    def enabled(self) -> bool:
        return self.path is not None

    async def http_connect(self, flow: http.HTTPFlow) -> None:
        if not self.enabled:
            return
        user = await self._authenticate(flow)
        if user is not None:
            self._tunnels[flow.client_conn] = user

    async def requestheaders(self, flow: http.HTTPFlow) -> None:
        if not self.enabled:
            return
        user = self._tunnels.get(flow.client_conn)
        if user is not None:
            flow.request.headers.pop(HEADER, None)
            state_of(flow).proxy_user = user
            return
        await self._authenticate(flow)

    async def _authenticate(self, flow: http.HTTPFlow) -> str | None:
        """The user, with the credentials removed from the request; or None, with a 407 set."""
        users = self._current_users()
        value = flow.request.headers.get(HEADER)
        if value is None:
            self._fail(flow, "missing")
            return None
        cached = self._verified.get(flow.client_conn)
        if cached is not None and cached[0] == value:
            user = cached[1]
        else:
            credentials = parse_basic(value)
            if credentials is None:
                self._fail(flow, "malformed")
                return None
            user, password = credentials
            if not await asyncio.to_thread(users.verify, user, password):
                log.warning("proxy authentication failed for user %r from %s", user, _client(flow))
                self._fail(flow, "rejected")
                return None
            self._verified[flow.client_conn] = (value, user)
        del flow.request.headers[HEADER]
        state_of(flow).proxy_user = user
        return user

    def _fail(self, flow: http.HTTPFlow, failure: Failure) -> None:
        metrics.proxy_auth_failures_total.labels(failure).inc()
        flow.response = answer_to(flow.request, proxy_auth_required())
        state_of(flow).outcome = "rejected"
        # A body that would have streamed to the origin is read and dropped instead: mitmproxy
        # cannot stream a request body and answer it locally at once.
        flow.request.stream = False

    def _current_users(self) -> Users:
        """The users, read again if the file changed since (checked at most once a second)."""
        assert self.path is not None and self.users is not None
        now = time.monotonic()
        if now < self._next_check:
            return self.users
        self._next_check = now + RELOAD_CHECK_SECONDS
        stamp = stamp_of(self.path)
        if stamp == self._stamp:
            return self.users
        self._stamp = stamp
        try:
            users = load_users(self.path)
        except UsersFileError as e:
            log.error("users file not reloaded, the users read before stay in force: %s", e)
            return self.users
        previous, self.users = self.users, users
        if previous.directory is not None:
            # Its connection is closed in a thread: a verification may still hold it.
            asyncio.get_running_loop().run_in_executor(None, previous.directory.close)
        # Remembered verifications may be of removed users or changed passwords.
        self._verified.clear()
        log.info("users file %s reloaded: %s", self.path, self.users.describe())
        return self.users


def _client(flow: http.HTTPFlow) -> str:
    return flow.client_conn.peername[0] if flow.client_conn.peername else "?"
