"""Users in an LDAP directory, named by a users file in mitmproxy's `proxyauth` syntax.

The file (mode 0600, like every users file: it holds the service account's password) has one
entry, as mitmproxy's `--proxyauth` option takes it:

    ldap[s]:HOST[:PORT]:BIND_DN:BIND_PASSWORD:SUBTREE[?search_filter_key=ATTRIBUTE]

A user is verified as mitmproxy verifies one: the service account searches SUBTREE for
`(ATTRIBUTE=NAME)` (`cn` unless given), then the entry found binds with the password given.

From mitmproxy this reuses the syntax (`Ldap.parse_spec`, so a spec that works there works here)
and the search filter (`Ldap.make_search_filter`, which escapes the name). Its validator itself is
not used, because a gateway needs what it does not do: it binds when it is created (reshape
checks the file without touching the network, and binds at start-up to fail in one line), has no
timeouts (a dead server would hold a verification for minutes), shares one search connection
between threads without a lock, takes the first of several matching entries, never unbinds the
user's connection, and raises on a wrong password instead of answering no. Here: connect and
receive timeouts, one lock around the search connection (reopened once if the server dropped
it), exactly one matching entry, every user connection unbound, and a wrong password or an
unreachable server is a refusal (logged).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import ldap3
from ldap3.core.exceptions import LDAPException
from mitmproxy import exceptions as mitmproxy_exceptions
from mitmproxy.addons.proxyauth import Ldap

log = logging.getLogger("reshape.auth")

TIMEOUT = 5  # seconds to connect, and to wait for each answer (ldap3 wants whole seconds)


class LdapSpecError(ValueError):
    """Not a spec in mitmproxy's proxyauth syntax."""


def is_ldap_spec(text: str) -> bool:
    return text.startswith(("ldap:", "ldaps:"))


@dataclass(frozen=True)
class LdapSpec:
    use_ssl: bool
    host: str
    port: int | None
    bind_dn: str
    bind_password: str
    subtree: str
    filter_key: str

    @classmethod
    def parse(cls, text: str) -> LdapSpec:
        try:
            return cls(*Ldap.parse_spec(text))
        except mitmproxy_exceptions.OptionsError:
            raise LdapSpecError(
                "expected ldap[s]:HOST[:PORT]:BIND_DN:BIND_PASSWORD:SUBTREE"
                "[?search_filter_key=ATTRIBUTE]"
            ) from None

    def __str__(self) -> str:
        """Where the directory is, never the password."""
        scheme = "ldaps" if self.use_ssl else "ldap"
        port = f":{self.port}" if self.port else ""
        return f"{scheme}://{self.host}{port} ({self.subtree})"

    def search_filter(self, name: str) -> str:
        # mitmproxy's method reads only the filter key from its instance.
        return Ldap.make_search_filter(self, name)  # type: ignore[arg-type]


class LdapDirectory:
    """Verifies names and passwords against the directory; safe to call from several threads."""

    def __init__(self, spec: LdapSpec) -> None:
        self.spec = spec
        self._server = self._new_server()
        self._lock = threading.Lock()
        self._search: ldap3.Connection | None = None

    def _new_server(self) -> ldap3.Server:
        return ldap3.Server(
            self.spec.host, port=self.spec.port, use_ssl=self.spec.use_ssl, connect_timeout=TIMEOUT
        )

    def check(self) -> None:
        """Bind the service account now: an LDAPException says why it cannot."""
        with self._lock:
            self._searcher()

    def verify(self, name: str, password: str) -> bool:
        if not name or not password:  # an empty password would be an anonymous bind: yes
            return False
        try:
            entry = self._find(name)
        except LDAPException as e:
            log.error("LDAP %s: cannot search for a user: %s", self.spec, e)
            return False
        if entry is None:
            return False
        user = ldap3.Connection(self._server, entry, password, receive_timeout=TIMEOUT)
        try:
            return bool(user.bind())
        except LDAPException as e:
            log.error("LDAP %s: cannot verify a password: %s", self.spec, e)
            return False
        finally:
            user.unbind()

    def close(self) -> None:
        with self._lock:
            if self._search is not None:
                self._search.unbind()
                self._search = None

    def _searcher(self) -> ldap3.Connection:
        if self._search is None:
            # A new Server too: ldap3 marks an address it failed to reach as unusable for good.
            self._server = self._new_server()
            self._search = ldap3.Connection(
                self._server,
                self.spec.bind_dn,
                self.spec.bind_password,
                auto_bind=True,
                receive_timeout=TIMEOUT,
            )
        return self._search

    def _find(self, name: str) -> str | None:
        """The DN of the one entry `name` names, or None (no entry, or several)."""
        with self._lock:
            for attempt in (1, 2):
                connection = self._searcher()
                try:
                    connection.search(
                        self.spec.subtree, self.spec.search_filter(name), attributes=[]
                    )
                    entries = [
                        e["dn"] for e in connection.response or [] if e["type"] == "searchResEntry"
                    ]
                    return entries[0] if len(entries) == 1 else None
                except LDAPException:
                    # The server may have closed an idle connection: open a new one, once.
                    self._search = None
                    if attempt == 2:
                        raise
        return None
