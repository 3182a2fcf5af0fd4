"""What passes between the engine and one upstream connection: a request, a streamed response."""

from __future__ import annotations

from collections.abc import AsyncIterable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

Headers = list[tuple[bytes, bytes]]

IDEMPOTENT_METHODS = frozenset({b"GET", b"HEAD", b"OPTIONS", b"TRACE", b"PUT", b"DELETE"})

# Connection-specific fields (RFC 9110 §7.6.1): they describe one hop and never travel further.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"transfer-encoding",
        b"te",
        b"upgrade",
        b"proxy-authorization",
        b"proxy-authenticate",
        b"trailer",
    }
)


class RecordSizer(Protocol):
    """Chooses the TLS records of one connection's writes (reshape/features/tls_records/)."""

    small_bytes: int

    def next_sizes(self, n_bytes: int, now: float) -> Sequence[int]:
        """The plaintext size of each record for a write of `n_bytes` (they add up to it)."""
        ...


class RecordPlan(Protocol):
    """How a route's connections size their TLS records. Hashable: equal plans share a pool."""

    def new_sizer(self) -> RecordSizer:
        """A sizer for one new connection."""
        ...


@dataclass(frozen=True)
class Refusal:
    """Why a connection must not be used: a metrics `reason` and a message for the client."""

    reason: str
    message: str


class PeerCheck(Protocol):
    """Which peers a route's connections may reach (reshape/features/destinations/): checked on
    the address actually connected to, before a byte is sent. Hashable: equal checks share a
    pool."""

    def refusal(self, peer: tuple[str, int], host: str, policy: str) -> Refusal | None:
        """Why `peer` (the connected address of a connection to `host`, for a request under
        `policy`) is refused, or None."""
        ...


class UpstreamError(Exception):
    """The origin could not be reached or broke the exchange; the client gets a 502."""


class Unanswered(UpstreamError):
    """The connection ended before any byte of this request's response arrived.

    Safe to send again for idempotent requests (and for HTTP/2 streams the server refused or
    never processed); the pool decides.
    """


@dataclass(frozen=True)
class Assignment:
    """How the pool served a request: the connection kind (`new`, `reused`, `pipelined`,
    `multiplexed`, `preconnected`), whether it had to wait, and for how long (ready → its
    connection assigned)."""

    kind: str
    queued: bool
    queue_seconds: float


@dataclass
class UpstreamRequest:
    method: bytes
    scheme: bytes
    authority: bytes  # host[:port] as the client wrote it (Host header / :authority)
    target: bytes  # path and query
    headers: Headers  # end-to-end fields only, no Host
    body: bytes = b""
    # A body still arriving from the client; such a request cannot be replayed, so it is never
    # pipelined or retried.
    body_stream: AsyncIterable[bytes] | None = None
    trailers: Headers = field(default_factory=list)
    # Filled in by the engine when the request goes out on a connection (the last one, if it
    # went again).
    assignment: Assignment | None = None
    # Told of the informational responses (1xx) the origin sends before the final one (see
    # `interim`): status and fields. Called from the connection's reader: must not raise or
    # block.
    on_interim: Callable[[int, Headers], None] | None = None
    # Told once the request has gone out whole, its body's end included (see `sent`).
    on_sent: Callable[[], None] | None = None
    # Told True when the connection starts waiting for the client's next body chunk, False
    # when that wait ends (see `waiting_for_client`).
    on_client_wait: Callable[[bool], None] | None = None
    # Told when a pipelined request's turn comes (see `turn_came`).
    on_turn: Callable[[], None] | None = None
    # Told of every informational response, 100 Continue included (see `interim`).
    on_at_work: Callable[[], None] | None = None

    def interim(self, status: int, fields: Headers) -> None:
        """The origin sent an informational response: `on_interim` is told of every 1xx but
        100 Continue and 101 (the hop's own business). A proxy forwards them (RFC 9110 §15.2);
        103 Early Hints is the one browsers act on. Any 1xx says the origin is at work, not
        silent (`on_at_work`: its read timeout starts again, as 102 Processing exists for)."""
        if self.on_at_work is not None:
            self.on_at_work()
        if self.on_interim is not None and status not in (100, 101):
            self.on_interim(status, fields)

    def sent(self) -> None:
        """The connection wrote the request's last byte: the wait for its answer starts (a
        streamed body can take longer than the origin's read timeout to arrive from the
        client; that time is the client's, not the origin's)."""
        if self.on_sent is not None:
            self.on_sent()

    def waiting_for_client(self, waiting: bool) -> None:
        """The connection waits for the client's next body chunk (True), or no more (False): an
        upload paused by its client, a gRPC stream waiting for the client's next message. That
        time is the client's; any other wait (for the origin's window, for the socket to take
        what was written, for the answer) is the origin's."""
        if self.on_client_wait is not None:
            self.on_client_wait(waiting)

    def turn_came(self) -> None:
        """The request, pipelined, has waited for the responses ahead of it on its connection,
        and its turn has come: the wait for its own answer starts whole. The wait in line is
        timed too, by the same timeout (a response ahead that never ends, a server-sent event
        stream, must not hold it for ever; one that stops coming moves it sooner, after
        `pipeline_stall_timeout`), but it no longer eats into the time its origin has."""
        if self.on_turn is not None:
            self.on_turn()

    @property
    def idempotent(self) -> bool:
        return self.method in IDEMPOTENT_METHODS and self.body_stream is None


class UpstreamResponse(Protocol):
    status: int
    reason: bytes
    headers: Headers
    http_version: str  # "HTTP/1.1" or "HTTP/2"
    trailers: Headers  # complete once read() has returned b""

    async def read(self) -> bytes:
        """The next piece of the body; b"" at its end. Raises UpstreamError if it broke."""
        ...

    def read_nowait(self) -> bytes | None:
        """As `read`, but None at once when nothing more has arrived yet."""
        ...

    def abort(self) -> None:
        """The client went away: stop this response (the connection may have to close)."""
        ...


class ConnectionListener(Protocol):
    """What an upstream connection reports, as it happens, to whoever keeps the books (the pool)."""

    def request_done(
        self,
        waiter_id: int,
        reusable: bool,
        *,
        idle_timeout: float | None = None,
        takes: int | None = None,
    ) -> None:
        """The response ended (or was abandoned); `reusable` False: take no more on this one.
        HTTP/1.1, what the origin said of the connection (reshape/upstream/keep_alive.py):
        `idle_timeout`, how long it may stay idle now; `takes`, how many more requests the
        origin takes on it (None: not said)."""

    def unanswered(self, waiter_ids: list[int], *, never_sent: bool = False) -> None:
        """These requests got no response byte and were not processed: send them elsewhere.
        `never_sent`: not a byte of them left (the connection was found closed first), so even
        a non-idempotent one may go again."""

    def max_streams_changed(self, max_streams: int) -> None:
        """HTTP/2: the server changed how many streams it takes at once."""

    def out_of_turn(self, *, pipelined: bool) -> None:
        """HTTP/1.1: the origin sent data while no request was outstanding; the connection
        closes (its loss is reported next). `pipelined`: requests were pipelined on it, so an
        extra response may have been taken for the next one's."""

    def goaway(self) -> None:
        """HTTP/2: the server takes no new streams on this connection."""

    def lost(
        self, answered: list[int], *, graceful: bool = False, first_sent: int | None = None
    ) -> None:
        """The connection is gone, reported exactly once. `answered`: requests whose response had
        begun (they end with an error); every other request assigned to it got no byte.
        `graceful`: the close is no fault of the origin's: it announced it (Connection: close),
        or a client abandoned its response; requests pipelined behind go again without counting
        an attempt or marking the origin as one that breaks pipelines. `first_sent`: the request
        that went out first, before the origin had sent anything (HTTP/1.1: the first request;
        HTTP/2: a stream opened before the origin's SETTINGS): if it went unanswered it most
        likely reached the origin, and is not sent again."""


_LINE_BREAK_OR_NUL = b"\r\n\x00"


def holds_line_break_or_nul(data: bytes) -> bool:
    """Whether a field name or value holds CR, LF or NUL, which no HTTP version lets through
    (RFC 9113 §8.2.1, RFC 9110 §5.5). `translate` deleting the three is one pass in C, several
    times faster than three `in` tests (each takes a buffer) or a regular expression."""
    return len(data.translate(None, _LINE_BREAK_OR_NUL)) != len(data)


def hop_by_hop(headers: Headers, lowered: list[bytes]) -> frozenset[bytes]:
    """The names that stop at this hop: HOP_BY_HOP and those the Connection fields name.
    `lowered`: the names of `headers` in lower case (callers lower each name once)."""
    if b"connection" not in lowered:
        return HOP_BY_HOP
    return HOP_BY_HOP | {
        token.strip().lower()
        for (_, value), name in zip(headers, lowered, strict=True)
        if name == b"connection"
        for token in value.split(b",")
    }


def end_to_end(headers: Headers) -> Headers:
    """`headers` without hop-by-hop fields, including those the Connection field names."""
    lowered = [name.lower() for name, _ in headers]
    drop = hop_by_hop(headers, lowered)
    return [field for field, name in zip(headers, lowered, strict=True) if name not in drop]
