"""What counts as bad input from a client, and how much HTTP/2 control traffic is too much.

Sans-IO: the mitmproxy patches (reshape/mitm/patches.py `guard_client_input`) and the ClientErrors
addon hand in what they saw — a head's size, an error message mitmproxy produced, an HTTP/2
control frame and the time — and get back a decision: which bounded `kind` of client error it is
(the label of `reshape_client_errors_total`), and whether a connection must be closed.

Kinds, and who answers them (docs/robustness.md has the whole table):

- `malformed`: a request line or header field mitmproxy cannot parse, an invalid header name, a
  control character in a header value (400, close);
- `header_too_large`: a request head over the limit, complete or not (431, close);
- `header_timeout`: a head not complete within `--client-header-timeout` (408, close);
- `smuggling`: ambiguous framing — Content-Length with Transfer-Encoding, several or invalid
  Content-Length values, a Transfer-Encoding other than chunked (400, close; never forwarded);
- `bad_chunked`: a chunked request body that breaks the chunk syntax (close);
- `incomplete_body`: the client ended its connection before the body it announced (close);
- `h2_flood`: too many RST_STREAM, SETTINGS or PING frames (GOAWAY ENHANCE_YOUR_CALM, close);
- `h2_protocol`: any other HTTP/2 protocol error by the client (GOAWAY PROTOCOL_ERROR, close).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

CLIENT_ERROR_KINDS: Final = (
    "malformed",
    "header_too_large",
    "header_timeout",
    "silent_connection",
    "smuggling",
    "bad_chunked",
    "incomplete_body",
    "h2_flood",
    "h2_protocol",
)

# A request head (request line and header fields) larger than this is refused with 431. Browsers
# send 1-8 KB; nginx's default large_client_header_buffers allows 4 x 8 KB lines.
DEFAULT_MAX_HEAD_BYTES = 64 * 1024
# A client must finish a request head within this many seconds (nginx: client_header_timeout 60).
DEFAULT_HEADER_TIMEOUT = 30.0
# An exchange whose client sends none of its request body and takes none of its response for
# this long ends (Envoy's stream_idle_timeout; nginx's client_body_timeout and send_timeout are
# 60 s, short for gRPC streams that idle between messages): a stalled client must not hold a
# connection of the shared pool for good.
DEFAULT_CLIENT_IDLE_TIMEOUT = 300.0

# The messages mitmproxy 12.2.3 puts into flow.error (proxy/layers/http/__init__.py
# `validate_request`, net/http/validate.py, net/http/http1/read.py, _http1.py `read_body`).
_SMUGGLING_MARKERS = ("transfer-encoding", "content-length")
_VALIDATION_MARKER = "refusing to prevent request smuggling"
_HTTP1_BODY_MARKER = "HTTP/1 protocol error"
_INCOMPLETE_MARKER = "without sending complete message body"


def classify_flow_error(message: str, request_complete: bool) -> str | None:
    """The kind of client error behind a flow's error `message`, or None if the client is not
    to blame (an origin failure, a client that went away after its request was whole).

    `request_complete`: mitmproxy had the whole request from the client (its end timestamp is
    set); a body framing error can then only have come from the origin's response.
    """
    lowered = message.lower()
    if _VALIDATION_MARKER in lowered:
        if " from server," in lowered:
            return None  # the origin's response failed the same check: a 502, not a client error
        return "smuggling" if any(m in lowered for m in _SMUGGLING_MARKERS) else "malformed"
    if request_complete:
        return None
    if lowered.startswith(_HTTP1_BODY_MARKER.lower()):
        if _INCOMPLETE_MARKER in lowered:
            return "incomplete_body"
        return "bad_chunked"
    if lowered.startswith(("invalid content-length", "unknown transfer-encoding")):
        return "smuggling"  # raised while sizing the body: mitmproxy answered 400 already
    return None


# Put before the message of every HTTP/2 protocol error a client's connection is closed for
# (reshape/mitm/patches/http2_flood_guard.py): the flows still open on it end with that message,
# and are the client's doing, not the origin's.
CLIENT_CONNECTION_CLOSED = "Client connection closed: "
# mitmproxy 12.2.3's message for a flow whose HTTP/2 stream the client reset (_http2.py).
_STREAM_RESET_BY_CLIENT = "stream reset by client"
# The start of the error of an exchange ended for its client's idleness (mitm/engine_channel.py).
CLIENT_IDLE = "client idle"


def outcome_by_client(message: str) -> str | None:
    """The request outcome of a flow ended by the client without a client error of its own:
    `client_aborted` when the client reset its stream, `client_error` when the client's
    connection was closed for a flood or protocol error (counted once per connection, in
    reshape_client_errors_total) or its exchange ended for the client's idleness (not counted
    there: no bad input); None when the message says neither."""
    if message.startswith(_STREAM_RESET_BY_CLIENT):
        return "client_aborted"
    if message.startswith(CLIENT_CONNECTION_CLOSED) or message.startswith(CLIENT_IDLE):
        return "client_error"
    return None


def bad_header_value(fields: tuple[tuple[bytes, bytes], ...]) -> bytes | None:
    """The name of the first header field whose value holds a control character other than tab
    (NUL, CR, LF, DEL...), or None. mitmproxy 12.2.3 forwards such values as they came; an origin
    or a cache behind reshape might cut the field there and read the rest differently."""
    for name, value in fields:
        if any((b < 0x20 and b != 0x09) or b == 0x7F for b in value):
            return name
    return None


def head_too_large(buffered: int, head_end: int | None, limit: int) -> bool:
    """Whether a request head is over `limit` bytes: `head_end` is the length of the complete head
    in the buffer (None while it is incomplete), `buffered` the bytes buffered so far."""
    return (head_end if head_end is not None else buffered) > limit


@dataclass(frozen=True)
class FloodLimits:
    """Per-connection budgets of HTTP/2 control frames: `burst` at once, refilled at `per_second`.

    Browsers send a SETTINGS frame or two per connection, a PING now and then, and reset streams
    they no longer need (navigations cancel dozens). An attacker sends thousands per second:
    CVE-2023-44487 (rapid reset) opens and resets streams so the proxy starts work for each and
    never hits the concurrent-stream limit; SETTINGS and PING floods make the proxy queue an ACK
    for each frame. The budgets sit far above the first and far below the second.
    """

    reset_burst: float = 200
    reset_per_second: float = 100
    settings_burst: float = 50
    settings_per_second: float = 5
    ping_burst: float = 50
    ping_per_second: float = 5

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not value > 0:
                raise ValueError(f"FloodLimits.{name} must be positive, got {value!r}")


FRAME_KINDS: Final = ("reset", "settings", "ping")


@dataclass
class FloodMeter:
    """Token buckets for one HTTP/2 client connection, one per frame kind in FRAME_KINDS.

    `allow(kind, now)` takes one token; False means the connection is over its budget and must be
    closed. Time comes from the caller (monotonic seconds) so the meter is testable without
    sleeping; time going backwards refills nothing.
    """

    limits: FloodLimits = field(default_factory=FloodLimits)
    _tokens: dict[str, float] = field(default_factory=dict)
    _last: dict[str, float] = field(default_factory=dict)

    def allow(self, kind: str, now: float) -> bool:
        burst, rate = self._budget(kind)
        last = self._last.get(kind)
        tokens = burst if last is None else self._tokens[kind]
        if last is not None and now > last:
            tokens = min(burst, tokens + (now - last) * rate)
        self._last[kind] = now if last is None else max(last, now)
        if tokens < 1:
            self._tokens[kind] = tokens
            return False
        self._tokens[kind] = tokens - 1
        return True

    def _budget(self, kind: str) -> tuple[float, float]:
        limits = self.limits
        if kind == "reset":
            return limits.reset_burst, limits.reset_per_second
        if kind == "settings":
            return limits.settings_burst, limits.settings_per_second
        if kind == "ping":
            return limits.ping_burst, limits.ping_per_second
        raise ValueError(f"unknown HTTP/2 frame kind {kind!r}; one of {', '.join(FRAME_KINDS)}")
