"""What a request's head must look like before it leaves for an origin: its Host, its hop-by-hop
fields, its Content-Length — decided without I/O, on the fields as they arrived.

mitmproxy 12.2.3 forwards the client's fields as they came: the client's Host for an
absolute-form request whose target names another authority, two Host fields, no Host at all, the
Connection field and the fields it names, and a Content-Length no origin can hold. Both paths
(mitmproxy's own origin connections and the shared pool) send what the flow's request holds, so
the request is put right once, before either path sees it.

The rules, from RFC 9112 §3.2 / §3.2.2 and RFC 9110 §7.2 / §7.6.1 / §8.6:

- `refusal`: the requests answered 400 (or 501) and never forwarded — more than one Host field; an
  HTTP/1.1 origin-form request without Host or with a Host that is no authority; a Content-Length
  beyond what any origin can count (2^63 - 1: a 64-bit origin would overflow, and read the body
  as another request); a Connection field that names Host, Content-Length or Transfer-Encoding
  (a hop that obeyed would drop the framing: the body would become a request of its own); and
  501, as RFC 9112 §6.1 has a server answer a transfer coding it does not implement, for a body
  sent with a coding before chunked (`gzip, chunked`): the engine frames bodies itself and would
  have sent the gzip bytes on as if they were the body (nginx and Apache answer 501 too).
- `with_host`: the Host an HTTP/1 request leaves with — the request-target's authority for an
  absolute-form request (the received Host is ignored), generated when missing (HTTP/1.0, or
  absolute-form), else the client's own.
- `end_to_end`: the fields without the hop-by-hop ones (Connection, the fields it names,
  Keep-Alive, Proxy-Connection, TE, Upgrade, Proxy-Authorization), with reshape's own Connection
  for the next hop: `close` when the client asked to close (mitmproxy closes both hops then),
  `keep-alive` for an HTTP/1.0 client that asked to keep alive (mitmproxy keeps both hops
  alive then), `upgrade` with the Upgrade field for an upgrade the proxy relays (WebSocket), and
  `TE: trailers` (with `te` in Connection) when the client takes trailers — reshape handles
  trailers from origins itself (reshape/features/trailers/), so it can say so on its own hop.
  Content-Length and Transfer-Encoding stay: they frame the body, and the layer that sends the
  body frames it by them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

Fields = Sequence[tuple[bytes, bytes]]

# The largest Content-Length forwarded: a signed 64-bit count, what origins store it in.
MAX_CONTENT_LENGTH: Final = 2**63 - 1

# Fields that describe one connection (RFC 9110 §7.6.1, and Proxy-Authorization: credentials
# meant for this proxy), removed whether or not Connection names them.
HOP_BY_HOP: Final = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"te", b"upgrade", b"proxy-authorization"}
)
# Fields no Connection option may remove: dropping them changes where a request goes or where
# its body ends.
_NEVER_HOP_BY_HOP: Final = frozenset({b"host", b"content-length", b"transfer-encoding"})

# RFC 3986 authority without userinfo: IP-literal, IPv4 or reg-name, then an optional port.
_AUTHORITY = re.compile(
    rb"(?:\[[0-9A-Za-z:.%_~-]+\]|[0-9A-Za-z._~!$&'()*+,;=%-]*)(?::[0-9]*)?",
)


@dataclass(frozen=True)
class RequestHead:
    """A request head as it arrived. `target_authority`: the authority the request-target names
    (absolute-form for HTTP/1, `:authority` for HTTP/2), None for an origin-form request."""

    http_version: str  # "HTTP/1.0", "HTTP/1.1", "HTTP/2.0"
    method: str
    target_authority: bytes | None
    fields: Fields

    @property
    def is_http1(self) -> bool:
        return self.http_version.startswith("HTTP/1")


def _values(fields: Fields, name: bytes) -> list[bytes]:
    return [value for field, value in fields if field.lower() == name]


def _tokens(fields: Fields, name: bytes) -> set[bytes]:
    return _tokens_of(_values(fields, name))


def _tokens_of(values: Iterable[bytes]) -> set[bytes]:
    """The comma-separated list members of field values, lower-case."""
    return {
        token.strip().lower() for value in values for token in value.split(b",") if token.strip()
    }


@dataclass(frozen=True)
class Refusal:
    """A request answered `status` and never forwarded: `kind` is its client error kind
    (reshape/features/client_errors/rules.py; None: not the client's error), `message` one
    line for the client."""

    kind: str | None
    message: str
    status: int = 400


_CHECKED = frozenset({b"host", b"content-length", b"connection", b"transfer-encoding"})
# The transfer codings mitmproxy 12.2.3 lets a request have before chunked (net/http/validate.py;
# it refuses every other list as smuggling). The engine frames bodies itself and would drop them.
_CODED_AND_CHUNKED: Final = frozenset({b"compress,chunked", b"deflate,chunked", b"gzip,chunked"})


def refusal(head: RequestHead) -> Refusal | None:
    """Why `head` must be answered 400 and not forwarded; None if it may go."""
    # One pass over the fields (every request is checked): the values of the checked ones.
    found: dict[bytes, list[bytes]] = {}
    for field, value in head.fields:
        name = field.lower()
        if name in _CHECKED:
            found.setdefault(name, []).append(value)
    hosts = found.get(b"host", [])
    if len(hosts) > 1:
        return Refusal("malformed", "More than one Host header field.")
    if head.is_http1 and head.method != "CONNECT" and head.target_authority is None:
        if not hosts and head.http_version == "HTTP/1.1":
            return Refusal("malformed", "HTTP/1.1 request without a Host header field.")
        if hosts and not _AUTHORITY.fullmatch(hosts[0]):
            return Refusal("malformed", "Host header field is not an authority.")
    for value in found.get(b"content-length", ()):
        for member in value.split(b","):
            digits = member.strip().lstrip(b"0")
            # Compared as text first: int() refuses numerals of more than 4,300 digits.
            if digits.isdigit() and (len(digits) > 19 or int(digits) > MAX_CONTENT_LENGTH):
                return Refusal("smuggling", f"Content-Length larger than {MAX_CONTENT_LENGTH}.")
    named = _tokens_of(found.get(b"connection", ())) & _NEVER_HOP_BY_HOP
    if named:
        names = b", ".join(sorted(named)).decode()
        return Refusal("smuggling", f"Connection header field names {names}.")
    codings = found.get(b"transfer-encoding", ())
    if len(codings) == 1 and b"content-length" not in found:
        listed = re.sub(rb"[\t ]*,[\t ]*", b",", codings[0].strip().lower())
        if listed in _CODED_AND_CHUNKED:
            coding = listed.split(b",")[0].decode()
            return Refusal(None, f"Transfer coding {coding} is not implemented.", 501)
    return None


def with_host(
    head: RequestHead, tunnel_authority: bytes | None = None
) -> list[tuple[bytes, bytes]]:
    """The fields of an HTTP/1 request with the Host it leaves with (call after `refusal`).
    `tunnel_authority`: where an origin-form request goes (the CONNECT target), for an HTTP/1.0
    request that has no Host."""
    fields = list(head.fields)
    if not head.is_http1 or head.method == "CONNECT":
        return fields
    host = head.target_authority
    if host is None:
        if _values(fields, b"host") or tunnel_authority is None:
            return fields
        host = tunnel_authority
    index = next((i for i, (name, _) in enumerate(fields) if name.lower() == b"host"), None)
    if index is None:
        fields.insert(0, (b"Host", host))
    else:
        fields[index] = (fields[index][0], host)
    return fields


def end_to_end(head: RequestHead) -> list[tuple[bytes, bytes]]:
    """The fields of `head` that go on to the origin, hop-by-hop ones replaced by reshape's own
    for the next hop (call after `refusal`)."""
    options = _tokens(head.fields, b"connection")
    drop = HOP_BY_HOP | (options - _NEVER_HOP_BY_HOP)
    fields = [(name, value) for name, value in head.fields if name.lower() not in drop]
    if not head.is_http1:
        return fields + _te_trailers(head)
    connection: list[bytes] = []
    if b"close" in options:
        connection.append(b"close")
    elif head.http_version == "HTTP/1.0" and b"keep-alive" in options:
        connection.append(b"keep-alive")
    upgrade = _values(head.fields, b"upgrade")
    if b"upgrade" in options and upgrade:
        connection.append(b"upgrade")
        fields.append((b"Upgrade", upgrade[0]))
    te = _te_trailers(head)
    if te:
        connection.append(b"te")
    if connection:
        fields.append((b"Connection", b", ".join(connection)))
    return fields + te


def _te_trailers(head: RequestHead) -> list[tuple[bytes, bytes]]:
    """`TE: trailers` if the client said it takes trailers (other transfer codings are not
    passed on: neither mitmproxy nor the pool decodes them)."""
    codings = {token.split(b";")[0].strip() for token in _tokens(head.fields, b"te")}
    return [(b"TE", b"trailers")] if b"trailers" in codings else []
