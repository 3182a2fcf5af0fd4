"""A sans-IO HTTP/1.1 client codec: requests out as bytes, pipelined responses in as events.

reshape's upstream engine speaks HTTP/1.1 to origins itself, because mitmproxy's client cannot
pipeline, cannot read trailers and writes a request's head and body separately. This module does
no I/O: `encode_request`, `encode_chunk` and `encode_last_chunk` return the bytes to write, and a
`ResponseReader` turns the bytes read back into events, one response after another, in the order
the requests were written.

Origins can be hostile, so parsing is strict (RFC 9112): anything that could make two parsers
disagree about where a response ends raises `ProtocolError`, and the connection must be closed.
"""

from __future__ import annotations

import collections
import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass

Fields = tuple[tuple[bytes, bytes], ...]

DEFAULT_MAX_HEAD_SIZE = 64 * 1024
DEFAULT_MAX_HEADER_LINES = 200
# A size line is a hex number and extensions we ignore; nothing legitimate comes near this.
MAX_CHUNK_SIZE_LINE = 4096
# Body lengths must fit a signed 64-bit integer, as they do in every other HTTP implementation.
MAX_BODY_LENGTH = 2**63 - 1
# Informational (1xx) responses one request may get before its final one, 100 Continue included
# as in Go (http2.py takes the same bound). Each is parsed and handed on to the client: unbounded,
# an origin's 200,000 103s cost the proxy 4.1 s of CPU (~20 us each) and held up other clients.
# Go's transport allowed 5 (`max1xxResponses`) until that broke servers reporting an upload's
# progress in 104s (golang/go#65035; it bounds their bytes instead now, as `max_head_size` does
# here too); CPython's http.client (`_MAXINTERIMRESPONSES`) and Ruby's net/http allow 100. A
# proxy must forward 1xx responses (RFC 9110 §15.2), so the bound leaves room (a few 103s and a
# 100) and costs ~2 ms of CPU at most. Each 1xx starts the read timeout again (the origin said
# it is at work: reshape/upstream/engine.py `_renew`), so this bound is also what ends an origin
# that says so for ever: 100 × `read_timeout` at most. What it refuses: a server's 102 every 30
# s through an upload of over 50 minutes (neon's bound, 128, met one), a price for keeping each
# request's cost small.
MAX_INTERIM_RESPONSES = 100

# RFC 9110 §5.6.2: tchar.
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# RFC 9112 §4: HTTP-version SP status-code SP reason-phrase; the SP before an empty reason is
# often missing in the wild, so it is optional.
_STATUS_LINE = re.compile(rb"(HTTP/1\.[0-9]) ([0-9]{3})(?: (.*))?", re.DOTALL)
# RFC 9112 §7.1: chunk-size [ chunk-ext ] CRLF. Extensions are ignored, but must not hide
# control characters; whitespace after the size is tolerated like most parsers do.
_CHUNK_SIZE_LINE = re.compile(rb"([0-9A-Fa-f]+)[ \t]*(?:;[^\x00-\x08\x0a-\x1f\x7f]*)?\r\n")
# Control characters and space: none may appear in a request-target.
_TARGET_FORBIDDEN = re.compile(rb"[\x00-\x20\x7f]")
# RFC 9110 §5.5: CR, LF and NUL in a field value are invalid and dangerous.
_VALUE_FORBIDDEN = re.compile(rb"[\x00\r\n]")


class Http1Error(Exception):
    """Base of every error this module raises."""


class ProtocolError(Http1Error):
    """The server sent something invalid: the connection must be closed.

    `events` holds what the failing `receive_data` call parsed before the error; complete
    responses among them (those with a `ResponseEnd`) are valid and may be delivered.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.events: list[Event] = []


class InvalidRequestError(Http1Error, ValueError):
    """A request (or chunk trailer) that cannot be written safely; nothing was encoded."""


@dataclass(frozen=True, slots=True)
class ResponseHead:
    """The head of a final (non-1xx) response; body events follow, then `ResponseEnd`."""

    status: int
    reason: bytes
    headers: Fields
    http_version: bytes  # b"HTTP/1.1" or b"HTTP/1.0"


@dataclass(frozen=True, slots=True)
class InformationalResponse:
    """A 1xx response (other than 101); the final response to the same request follows."""

    status: int
    headers: Fields


@dataclass(frozen=True, slots=True)
class BodyData:
    """A piece of the response body, never empty; pieces are sized like the input fed."""

    data: bytes


@dataclass(frozen=True, slots=True)
class Trailers:
    """The trailer fields of a chunked body; only sent when there was at least one."""

    headers: Fields


@dataclass(frozen=True, slots=True)
class ResponseEnd:
    """The response is complete.

    `keep_alive` False: the server closes the connection after this response (it said
    `Connection: close`, it is HTTP/1.0 without keep-alive, or the body ran until close), so no
    further request on it will be answered.
    """

    keep_alive: bool


Event = ResponseHead | InformationalResponse | BodyData | Trailers | ResponseEnd


def encode_request(
    method: bytes,
    target: bytes,
    headers: Sequence[tuple[bytes, bytes]],
    body: bytes | None = None,
    *,
    chunked: bool = False,
) -> bytes:
    """The request head and, if given, the body, as one bytes object for a single write.

    The caller frames the body with its headers: `Content-Length` (the body, or its first part,
    follows as is) or `Transfer-Encoding: chunked` with `chunked=True` (the body, if any, is the
    first chunk; `encode_chunk` and `encode_last_chunk` write the rest). Everything is checked
    first, because a stray CR/LF or inconsistent framing would let the origin read part of this
    request as another one: raises `InvalidRequestError` (a `ValueError`) with the reason.
    """
    if _TOKEN.fullmatch(method) is None:
        raise InvalidRequestError(f"method is not a token: {method!r}")
    if not target or _TARGET_FORBIDDEN.search(target):
        raise InvalidRequestError(f"request target is empty or has whitespace/controls: {target!r}")
    _check_fields(headers, "header")
    _check_request_framing(headers, body, chunked)
    parts = [method, b" ", target, b" HTTP/1.1\r\n"]
    for name, value in headers:
        parts += (name, b": ", value, b"\r\n")
    parts.append(b"\r\n")
    if body:
        parts.append(encode_chunk(body) if chunked else body)
    return b"".join(parts)


def encode_chunk(data: bytes) -> bytes:
    """One chunk of a chunked body; b"" for no data, since an empty chunk would end the body."""
    if not data:
        return b""
    return b"%x\r\n%s\r\n" % (len(data), data)


def encode_last_chunk(trailers: Sequence[tuple[bytes, bytes]] = ()) -> bytes:
    """The end of a chunked body: the zero-size chunk, the trailer fields, the final CRLF."""
    _check_fields(trailers, "trailer")
    return b"0\r\n" + b"".join(name + b": " + value + b"\r\n" for name, value in trailers) + b"\r\n"


def _check_fields(fields: Sequence[tuple[bytes, bytes]], kind: str) -> None:
    for name, value in fields:
        if _TOKEN.fullmatch(name) is None:
            raise InvalidRequestError(f"{kind} name is not a token: {name!r}")
        if _VALUE_FORBIDDEN.search(value):
            raise InvalidRequestError(f"{kind} {name!r} has CR, LF or NUL in its value")


def _check_request_framing(
    headers: Sequence[tuple[bytes, bytes]], body: bytes | None, chunked: bool
) -> None:
    # RFC 9112 §6: exactly one way to find the end of the body. Anything else lets the origin
    # (or a proxy in front of it) disagree with us and read the rest as another request.
    lengths = [v for n, v in headers if n.lower() == b"content-length"]
    codings = [v for n, v in headers if n.lower() == b"transfer-encoding"]
    if chunked:
        if lengths or len(codings) != 1 or codings[0].strip(b" \t").lower() != b"chunked":
            raise InvalidRequestError(
                "chunked=True needs exactly one 'Transfer-Encoding: chunked' header "
                "and no Content-Length"
            )
        return
    if codings:
        raise InvalidRequestError("Transfer-Encoding header without chunked=True")
    if len(lengths) > 1:
        raise InvalidRequestError("more than one Content-Length header")
    if lengths:
        length = _parse_length(lengths[0].strip(b" \t"))
        if length is None:
            raise InvalidRequestError(f"invalid Content-Length {lengths[0]!r}")
        if body is not None and len(body) > length:
            raise InvalidRequestError(f"body of {len(body)} bytes exceeds Content-Length {length}")
    elif body:
        raise InvalidRequestError("a body needs a Content-Length header or chunked=True")


def declared_length(headers: Sequence[tuple[bytes, bytes]]) -> int | None:
    """The body length a message's `Content-Length` gives, as a response's is read
    (`_body_framing`): None if it gives none, or none that holds (values that disagree, one
    that is not a number, a transfer coding beside it)."""
    try:
        state, length = _body_framing(b"HTTP/1.1", headers)
    except ProtocolError:
        return None
    return length if state is _State.LENGTH_BODY else None


def _parse_length(text: bytes) -> int | None:
    """1*DIGIT that fits MAX_BODY_LENGTH → int; anything else (sign, space, hex) → None."""
    # Length first: int() of thousands of digits is slow and, past 4300, raises ValueError.
    if not text.isdigit() or len(text.lstrip(b"0")) > 19:
        return None
    value = int(text)
    return value if value <= MAX_BODY_LENGTH else None


class _State(enum.Enum):
    HEAD = enum.auto()  # waiting for, or reading, a status line and header fields
    LENGTH_BODY = enum.auto()  # `_remaining` body bytes to go
    CLOSE_BODY = enum.auto()  # body until the server closes
    CHUNK_SIZE = enum.auto()  # a chunk size line
    CHUNK_DATA = enum.auto()  # `_remaining` bytes of chunk data to go
    CHUNK_DATA_END = enum.auto()  # the CRLF after chunk data
    TRAILERS = enum.auto()  # trailer fields, up to an empty line
    DONE = enum.auto()  # a response said the server closes: nothing more may arrive
    CLOSED = enum.auto()  # EOF seen, or a ProtocolError raised


# States that consume whole lines; the others take body bytes or none.
_LINE_STATES = frozenset({_State.HEAD, _State.CHUNK_SIZE, _State.CHUNK_DATA_END, _State.TRAILERS})


class ResponseReader:
    """Parses the responses to pipelined requests, in order.

    Call `expect(method)` once per request written, in write order, and feed every byte read
    from the connection to `receive_data` (b"" at EOF). Body bytes are passed on as they arrive,
    never gathered; only an incomplete line (of a head, a chunk size, trailers) is kept between
    calls, and its size is bounded. So are the informational responses before a final one: at
    most MAX_INTERIM_RESPONSES, and `max_head_size` bytes all together (each is a head of its
    own, under the limit by itself, but many add up: Go's transport bounds their sum the same
    way since golang/go#65035).
    """

    def __init__(
        self,
        *,
        max_head_size: int = DEFAULT_MAX_HEAD_SIZE,
        max_header_lines: int = DEFAULT_MAX_HEADER_LINES,
    ) -> None:
        if max_head_size < 1 or max_header_lines < 0:
            raise ValueError("max_head_size must be positive and max_header_lines not negative")
        self._max_head_size = max_head_size
        self._max_header_lines = max_header_lines
        self._expected: collections.deque[bytes] = collections.deque()
        self._state = _State.HEAD
        self._started = False
        self._partial = bytearray()  # an incomplete line, carried to the next call
        self._remaining = 0
        self._keep_alive = True
        # The head (or trailer section) being read.
        self._head_size = 0
        self._version = b""
        self._status = 0  # 0: no status line yet
        self._reason = b""
        self._fields: list[tuple[bytes, bytes]] = []
        # The informational responses before the front response's final head, and their bytes.
        self._interims = 0
        self._interim_bytes = 0

    def __repr__(self) -> str:
        return (
            f"<ResponseReader {self._state.name.lower()} pending={self.pending}"
            f" started={self._started}>"
        )

    @property
    def pending(self) -> int:
        """Requests expected whose `ResponseEnd` has not been returned yet."""
        return len(self._expected)

    @property
    def response_started(self) -> bool:
        """Whether any byte of the front response has arrived (1xx responses included).

        When the connection breaks, the requests behind the front one got no byte of a response
        (responses come in order), and the front one got none unless this is True: those are
        the unanswered requests, which may go again (if idempotent) on another connection.
        """
        return self._started

    def expect(self, method: bytes) -> None:
        """Register the next request written; its method decides whether the response has a body."""
        if method == b"CONNECT":
            raise ValueError("responses to CONNECT are not supported")
        self._expected.append(method)

    def receive_data(self, data: bytes) -> list[Event]:
        """Parse `data` (b"" at EOF) and return the events it completes, in order.

        Raises `ProtocolError` when the server breaks the protocol; the reader is closed after
        that, as it is after EOF, and further bytes raise `ProtocolError` too.
        """
        events: list[Event] = []
        try:
            if data:
                self._receive(data, events)
            else:
                self._receive_eof(events)
        except ProtocolError as e:
            e.events = events
            self._state = _State.CLOSED
            self._partial.clear()
            raise
        return events

    def _receive(self, data: bytes, events: list[Event]) -> None:
        end = len(data)
        pos = 0
        if self._partial:
            # Only a line state leaves a partial line behind, so the state is still one.
            newline = data.find(b"\n")
            if newline < 0:
                self._partial += data
                self._check_partial_line()
                return
            pos = newline + 1
            self._partial += memoryview(data)[:pos]
            line = bytes(self._partial)
            self._partial.clear()
            self._on_line(line, events)
        while pos < end:
            state = self._state
            if state in _LINE_STATES:
                if state is _State.HEAD:
                    self._start_response()
                newline = data.find(b"\n", pos)
                if newline < 0:
                    self._partial += memoryview(data)[pos:]
                    self._check_partial_line()
                    return
                line = data[pos : newline + 1]
                pos = newline + 1
                self._on_line(line, events)
            elif state is _State.LENGTH_BODY or state is _State.CHUNK_DATA:
                size = min(self._remaining, end - pos)
                # A slice of the whole of `data` is `data` itself: no copy in the common case.
                events.append(BodyData(data[pos : pos + size]))
                pos += size
                self._remaining -= size
                if self._remaining == 0:
                    if state is _State.LENGTH_BODY:
                        self._end(events)
                    else:
                        self._state = _State.CHUNK_DATA_END
            elif state is _State.CLOSE_BODY:
                events.append(BodyData(data[pos:]))
                return
            elif state is _State.DONE:
                raise ProtocolError("data after a response that closes the connection")
            else:
                raise ProtocolError("data after the connection closed")

    def _receive_eof(self, events: list[Event]) -> None:
        state = self._state
        if state is _State.CLOSE_BODY:
            self._end(events)
        elif state is _State.HEAD:
            if self._started:
                raise ProtocolError("connection closed mid-response")
        elif state is not _State.DONE and state is not _State.CLOSED:
            raise ProtocolError("connection closed mid-response")
        self._state = _State.CLOSED

    def _start_response(self) -> None:
        if not self._expected:
            raise ProtocolError("unsolicited response")
        self._started = True

    # -- lines --------------------------------------------------------------------------------

    def _line_limit(self) -> int:
        state = self._state
        if state is _State.CHUNK_SIZE:
            return MAX_CHUNK_SIZE_LINE
        if state is _State.CHUNK_DATA_END:
            return 2
        return self._max_head_size - self._head_size

    def _check_partial_line(self) -> None:
        # A line still missing its LF is at least one byte longer than what has arrived.
        if len(self._partial) >= self._line_limit():
            raise self._line_too_long()

    def _line_too_long(self) -> ProtocolError:
        state = self._state
        if state is _State.CHUNK_SIZE:
            return ProtocolError(f"chunk size line longer than {MAX_CHUNK_SIZE_LINE} bytes")
        if state is _State.CHUNK_DATA_END:
            return ProtocolError("missing CRLF after chunk data")
        section = "trailer section" if state is _State.TRAILERS else "response head"
        return ProtocolError(f"{section} larger than {self._max_head_size} bytes")

    def _on_line(self, line: bytes, events: list[Event]) -> None:
        """Handle one complete line, LF included."""
        if len(line) > self._line_limit():
            raise self._line_too_long()
        state = self._state
        if state is _State.HEAD:
            self._head_size += len(line)
            content = _line_content(line)
            if not self._status:
                self._parse_status_line(content)
            elif content:
                self._add_field(content)
            else:
                self._finish_head(events)
        elif state is _State.CHUNK_SIZE:
            self._parse_chunk_size(line)
        elif state is _State.CHUNK_DATA_END:
            if line != b"\r\n":
                raise ProtocolError("missing CRLF after chunk data")
            self._state = _State.CHUNK_SIZE
        else:
            self._head_size += len(line)
            content = _line_content(line)
            if content:
                self._add_field(content)
                return
            if self._fields:
                events.append(Trailers(tuple(self._fields)))
            self._end(events)

    def _parse_status_line(self, content: bytes) -> None:
        match = _STATUS_LINE.fullmatch(content)
        if match is None:
            raise ProtocolError(f"invalid status line {content[:100]!r}")
        status = int(match[2])
        if status < 100:
            raise ProtocolError(f"invalid status code {status:03d}")
        reason = match[3] or b""
        if b"\x00" in reason:
            raise ProtocolError("NUL in reason phrase")
        self._version = match[1]
        self._status = status
        self._reason = reason

    def _add_field(self, content: bytes) -> None:
        if content[0] in b" \t":
            # RFC 9112 §5.2: obs-fold (and whitespace before the first field) must be rejected
            # by a client that does not unfold, and unfolding is where parsers disagree.
            raise ProtocolError("obsolete line folding in header section")
        if len(self._fields) >= self._max_header_lines:
            raise ProtocolError(f"more than {self._max_header_lines} header lines")
        name, colon, value = content.partition(b":")
        if not colon or _TOKEN.fullmatch(name) is None:
            raise ProtocolError(f"invalid header line {content[:100]!r}")
        value = value.strip(b" \t")
        if b"\x00" in value:
            raise ProtocolError(f"NUL in header {name!r}")
        self._fields.append((name, value))

    def _finish_head(self, events: list[Event]) -> None:
        status = self._status
        headers = tuple(self._fields)
        if status < 200:
            if status == 101:
                raise ProtocolError("upgrade not supported")
            self._interims += 1
            self._interim_bytes += self._head_size
            if self._interims > MAX_INTERIM_RESPONSES:
                raise ProtocolError(
                    f"more than {MAX_INTERIM_RESPONSES} informational (1xx) responses to one "
                    "request"
                )
            if self._interim_bytes > self._max_head_size:
                raise ProtocolError(
                    "informational (1xx) responses to one request larger than "
                    f"{self._max_head_size} bytes together"
                )
            events.append(InformationalResponse(status, headers))
            self._reset_head()
            return
        if self._interims:
            self._interims = self._interim_bytes = 0
        # RFC 9112 §6.3: responses to HEAD, and 204 and 304, end with their head whatever their
        # framing fields say (those describe the body a GET would have had).
        if self._expected[0] == b"HEAD" or status == 204 or status == 304:
            body_state, length = _State.LENGTH_BODY, 0
        else:
            body_state, length = _body_framing(self._version, headers)
        self._keep_alive = body_state is not _State.CLOSE_BODY and _keep_alive(
            self._version, headers
        )
        events.append(ResponseHead(status, self._reason, headers, self._version))
        self._reset_head()
        self._state = body_state
        self._remaining = length
        if body_state is _State.LENGTH_BODY and length == 0:
            self._end(events)

    def _parse_chunk_size(self, line: bytes) -> None:
        match = _CHUNK_SIZE_LINE.fullmatch(line)
        if match is None:
            raise ProtocolError(f"invalid chunk size line {line[:100]!r}")
        # Hex conversion has no digit limit and the line length is bounded: int() is cheap.
        size = int(match[1], 16)
        if size > MAX_BODY_LENGTH:
            raise ProtocolError("chunk size too large")
        if size:
            self._state = _State.CHUNK_DATA
            self._remaining = size
        else:
            self._state = _State.TRAILERS

    def _end(self, events: list[Event]) -> None:
        events.append(ResponseEnd(self._keep_alive))
        self._expected.popleft()
        self._started = False
        self._state = _State.HEAD if self._keep_alive else _State.DONE
        self._reset_head()

    def _reset_head(self) -> None:
        self._head_size = 0
        self._version = b""
        self._status = 0
        self._reason = b""
        self._fields = []


def ends_before_body_sent(data: bytes, method: bytes) -> bool:
    """Whether `data`, what an origin has sent while the body of its request (`method`) is
    still going out, begins with a final response whose head says the connection ends
    (`Connection: close`, or HTTP/1.0 without keep-alive: RFC 9112 §9.3): the origin refuses the
    rest of the body, and §9.5 asks the client to stop sending it (nginx's 413 to an upload past
    its limit). Interim responses are passed over, and a response that keeps the connection, or
    whose body merely runs until close, does not count (an origin may answer while it reads
    on). False while no final head is complete, and for bytes that do not parse (the reader of
    the response proper reports those)."""
    reader = ResponseReader()
    reader.expect(method)
    try:
        events = reader.receive_data(data)
    except ProtocolError:
        return False
    head = next((event for event in events if isinstance(event, ResponseHead)), None)
    return head is not None and not _keep_alive(head.http_version, head.headers)


def _line_content(line: bytes) -> bytes:
    """A head or trailer line without its terminator: CRLF, or a bare LF (RFC 9112 §2.2 MAY)."""
    content = line[:-2] if line.endswith(b"\r\n") else line[:-1]
    if b"\r" in content:
        raise ProtocolError("bare CR in header section")
    return content


def _keep_alive(version: bytes, headers: Fields) -> bool:
    """RFC 9112 §9.3: whether the connection persists after this response."""
    options = {
        option.strip(b" \t").lower()
        for name, value in headers
        if name.lower() == b"connection"
        for option in value.split(b",")
    }
    if b"close" in options:
        return False
    if version == b"HTTP/1.0":
        return b"keep-alive" in options
    return True


def _body_framing(version: bytes, headers: Sequence[tuple[bytes, bytes]]) -> tuple[_State, int]:
    """RFC 9112 §6.3: how the body of a response that has one ends → (body state, length)."""
    codings = [v for n, v in headers if n.lower() == b"transfer-encoding"]
    lengths = [v for n, v in headers if n.lower() == b"content-length"]
    if codings:
        if lengths:
            raise ProtocolError("both Transfer-Encoding and Content-Length (smuggling attempt?)")
        if version == b"HTTP/1.0":
            # §6.1: the sender may have framed it differently; treat the framing as faulty.
            raise ProtocolError("Transfer-Encoding in an HTTP/1.0 response")
        names = [c.strip(b" \t").lower() for v in codings for c in v.split(b",")]
        if [c for c in names if c] != [b"chunked"]:
            raise ProtocolError(f"unsupported transfer coding {b', '.join(codings)!r}")
        return _State.CHUNK_SIZE, 0
    if lengths:
        values = set()
        for text in (c.strip(b" \t") for v in lengths for c in v.split(b",")):
            length = _parse_length(text)
            if length is None:
                raise ProtocolError(f"invalid Content-Length {text[:100]!r}")
            values.add(length)
        if len(values) > 1:
            raise ProtocolError("conflicting Content-Length values")
        return _State.LENGTH_BODY, values.pop()
    return _State.CLOSE_BODY, 0
