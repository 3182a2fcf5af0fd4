"""The HTTP/1.1 client codec: request encoding, response framing, pipelining, EOF, fuzzing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import h11
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reshape.upstream.http1 import (
    MAX_INTERIM_RESPONSES,
    BodyData,
    Event,
    Http1Error,
    InformationalResponse,
    InvalidRequestError,
    ProtocolError,
    ResponseEnd,
    ResponseHead,
    ResponseReader,
    Trailers,
    encode_chunk,
    encode_last_chunk,
    encode_request,
    ends_before_body_sent,
)

# -- helpers --------------------------------------------------------------------------------------


def coalesce(events: Sequence[Event]) -> list[Event]:
    """Adjacent BodyData merged: how data is split must not change what a response says."""
    merged: list[Event] = []
    for event in events:
        if isinstance(event, BodyData) and merged and isinstance(merged[-1], BodyData):
            merged[-1] = BodyData(merged[-1].data + event.data)
        else:
            merged.append(event)
    return merged


def reader_for(*methods: bytes, **limits: int) -> ResponseReader:
    reader = ResponseReader(**limits)
    for method in methods:
        reader.expect(method)
    return reader


def feed(reader: ResponseReader, *pieces: bytes) -> list[Event]:
    """Events for `pieces` fed in turn, coalesced; b"" is EOF."""
    events: list[Event] = []
    for piece in pieces:
        events += reader.receive_data(piece)
    return coalesce(events)


def parse(data: bytes, *methods: bytes, eof: bool = False) -> list[Event]:
    """Events for `data` answering `methods` (GET if none), fed whole, then EOF if asked."""
    reader = reader_for(*(methods or (b"GET",)))
    return feed(reader, data, *([b""] if eof else []))


def head(status: int = 200, *headers: tuple[bytes, bytes], reason: bytes = b"OK") -> ResponseHead:
    return ResponseHead(status, reason, headers, b"HTTP/1.1")


CL5 = (b"Content-Length", b"5")
CHUNKED = (b"Transfer-Encoding", b"chunked")
END = ResponseEnd(keep_alive=True)
END_CLOSE = ResponseEnd(keep_alive=False)


# -- framing: responses that parse ----------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    data: bytes
    events: list[Event]
    methods: tuple[bytes, ...] = (b"GET",)
    eof: bool = False


FRAMING_CASES = [
    Case(
        "content-length",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
        [head(200, CL5), BodyData(b"hello"), END],
    ),
    Case(
        "content-length zero",
        b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
        [head(200, (b"Content-Length", b"0")), END],
    ),
    Case(
        "identical duplicate content-length headers",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\ncontent-length: 5\r\n\r\nhello",
        [head(200, CL5, (b"content-length", b"5")), BodyData(b"hello"), END],
    ),
    Case(
        "identical content-length list",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello",
        [head(200, (b"Content-Length", b"5, 5")), BodyData(b"hello"), END],
    ),
    Case(
        "content-length with leading zeros",
        b"HTTP/1.1 200 OK\r\nContent-Length: 005\r\n\r\nhello",
        [head(200, (b"Content-Length", b"005")), BodyData(b"hello"), END],
    ),
    Case(
        "chunked",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n1\r\n!\r\n0\r\n\r\n",
        [head(200, CHUNKED), BodyData(b"hello!"), END],
    ),
    Case(
        "chunked: upper-case hex, leading zeros, extensions, space before them",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b'00A;name=value;flag\r\n0123456789\r\n1 ;x="q"\r\n!\r\n000\r\n\r\n',
        [head(200, CHUNKED), BodyData(b"0123456789!"), END],
    ),
    Case(
        "chunked: coding names are case-insensitive, empty list elements ignored",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: , Chunked\r\n\r\n0\r\n\r\n",
        [head(200, (b"Transfer-Encoding", b", Chunked")), END],
    ),
    Case(
        "chunked with trailers",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"2\r\nhi\r\n0\r\nServer-Timing: db;dur=53\r\nX-Checksum:  abc \r\n\r\n",
        [
            head(200, CHUNKED),
            BodyData(b"hi"),
            Trailers(((b"Server-Timing", b"db;dur=53"), (b"X-Checksum", b"abc"))),
            END,
        ],
    ),
    Case(
        "chunked, empty body, no trailers: no Trailers event",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        [head(200, CHUNKED), END],
    ),
    Case(
        "close-delimited",
        b"HTTP/1.1 200 OK\r\n\r\nuntil the end",
        [head(200), BodyData(b"until the end"), END_CLOSE],
        eof=True,
    ),
    Case(
        "close-delimited and empty",
        b"HTTP/1.1 200 OK\r\n\r\n",
        [head(200), END_CLOSE],
        eof=True,
    ),
    Case(
        "HEAD: content-length describes the GET body",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n",
        [head(200, (b"Content-Length", b"1000")), END],
        methods=(b"HEAD",),
    ),
    Case(
        "HEAD: chunked means nothing either",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        [head(200, CHUNKED), END],
        methods=(b"HEAD",),
    ),
    Case(
        "HEAD: no framing is not close-delimited",
        b"HTTP/1.1 200 OK\r\n\r\n",
        [head(200), END],
        methods=(b"HEAD",),
    ),
    Case(
        "204 ignores content-length",
        b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n",
        [head(204, CL5, reason=b"No Content"), END],
    ),
    Case(
        "304 ignores transfer-encoding",
        b"HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n",
        [head(304, CHUNKED, reason=b"Not Modified"), END],
    ),
    Case(
        "1xx responses come before the final one",
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
        [
            InformationalResponse(100, ()),
            InformationalResponse(103, ((b"Link", b"</a.css>; rel=preload"),)),
            head(200, CL5),
            BodyData(b"hello"),
            END,
        ],
    ),
    Case(
        "1xx for a HEAD request",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
        [InformationalResponse(100, ()), head(200, CL5), END],
        methods=(b"HEAD",),
    ),
    Case(
        "missing space before an empty reason",
        b"HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n",
        [head(200, (b"Content-Length", b"0"), reason=b""), END],
    ),
    Case(
        "empty reason",
        b"HTTP/1.1 200 \r\nContent-Length: 0\r\n\r\n",
        [head(200, (b"Content-Length", b"0"), reason=b""), END],
    ),
    Case(
        "reason with spaces, tab and obs-text",
        b"HTTP/1.1 404 Not\tFound \xe9 \r\nContent-Length: 0\r\n\r\n",
        [head(404, (b"Content-Length", b"0"), reason=b"Not\tFound \xe9 "), END],
    ),
    Case(
        "optional whitespace around values is stripped, inner kept; empty values allowed",
        b"HTTP/1.1 200 OK\r\nX-A:\t a  b \t\r\nX-Empty:\r\nContent-Length: 0\r\n\r\n",
        [head(200, (b"X-A", b"a  b"), (b"X-Empty", b""), (b"Content-Length", b"0")), END],
    ),
    Case(
        "bare LF line endings in the head (RFC 9112 §2.2)",
        b"HTTP/1.1 200 OK\nContent-Length: 5\n\nhello",
        [head(200, CL5), BodyData(b"hello"), END],
    ),
    Case(
        "other HTTP/1.x minor versions",
        b"HTTP/1.2 200 OK\r\nContent-Length: 0\r\n\r\n",
        [ResponseHead(200, b"OK", ((b"Content-Length", b"0"),), b"HTTP/1.2"), END],
    ),
]


@pytest.mark.parametrize("case", FRAMING_CASES, ids=lambda case: case.name)
def test_framing(case: Case) -> None:
    assert parse(case.data, *case.methods, eof=case.eof) == case.events


@pytest.mark.parametrize("case", FRAMING_CASES, ids=lambda case: case.name)
def test_framing_byte_by_byte(case: Case) -> None:
    reader = reader_for(*case.methods)
    pieces = [case.data[i : i + 1] for i in range(len(case.data))]
    assert feed(reader, *pieces, *([b""] if case.eof else [])) == case.events


# -- keep-alive -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status_line", "headers", "keep_alive"),
    [
        (b"HTTP/1.1 200 OK", b"", True),
        (b"HTTP/1.1 200 OK", b"Connection: keep-alive\r\n", True),
        (b"HTTP/1.1 200 OK", b"Connection: close\r\n", False),
        (b"HTTP/1.1 200 OK", b"Connection: Upgrade, CLOSE\r\n", False),
        (b"HTTP/1.1 200 OK", b"Connection: keep-alive\r\nConnection: close\r\n", False),
        (b"HTTP/1.0 200 OK", b"", False),
        (b"HTTP/1.0 200 OK", b"Connection: Keep-Alive\r\n", True),
        (b"HTTP/1.0 200 OK", b"Connection: keep-alive, close\r\n", False),
    ],
)
def test_keep_alive(status_line: bytes, headers: bytes, keep_alive: bool) -> None:
    data = status_line + b"\r\n" + headers + b"Content-Length: 2\r\n\r\nok"
    assert parse(data)[-1] == ResponseEnd(keep_alive)


@pytest.mark.parametrize("version", [b"HTTP/1.0", b"HTTP/1.1"])
def test_close_delimited_body_never_keeps_alive(version: bytes) -> None:
    data = version + b" 200 OK\r\nConnection: keep-alive\r\n\r\nbody"
    assert parse(data, eof=True)[-2:] == [BodyData(b"body"), END_CLOSE]


def test_data_after_a_closing_response_is_an_error_and_leaves_the_next_request_unanswered() -> None:
    reader = reader_for(b"GET", b"GET")
    closing = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    assert reader.receive_data(closing)[-1] == END_CLOSE
    with pytest.raises(ProtocolError, match="closes the connection"):
        reader.receive_data(b"HTTP/1.1 200 OK\r\n\r\n")
    assert (reader.pending, reader.response_started) == (1, False)


def test_eof_after_a_closing_response_leaves_the_rest_unanswered() -> None:
    reader = reader_for(b"GET", b"GET")
    closing = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    assert reader.receive_data(closing)[-1] == END_CLOSE
    assert reader.receive_data(b"") == []
    assert (reader.pending, reader.response_started) == (1, False)


# -- errors ---------------------------------------------------------------------------------------

OK = b"HTTP/1.1 200 OK\r\n"

ERROR_CASES = [
    ("TE and CL", OK + b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n", "both"),
    ("CL and TE", OK + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", "both"),
    ("TE not chunked", OK + b"Transfer-Encoding: gzip\r\n\r\n", "transfer coding"),
    ("TE gzip, chunked", OK + b"Transfer-Encoding: gzip, chunked\r\n\r\n", "transfer coding"),
    (
        "TE chunked twice",
        OK + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
        "transfer coding",
    ),
    ("TE chunked, gzip", OK + b"Transfer-Encoding: chunked, gzip\r\n\r\n", "transfer coding"),
    ("TE with parameters", OK + b"Transfer-Encoding: chunked;x=1\r\n\r\n", "transfer coding"),
    ("TE empty", OK + b"Transfer-Encoding: \r\n\r\n", "transfer coding"),
    ("TE in HTTP/1.0", b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", "HTTP/1.0"),
    ("CL differing headers", OK + b"Content-Length: 5\r\nContent-Length: 6\r\n\r\n", "conflicting"),
    ("CL differing list", OK + b"Content-Length: 5, 6\r\n\r\n", "conflicting"),
    ("CL not a number", OK + b"Content-Length: five\r\n\r\n", "invalid Content-Length"),
    ("CL negative", OK + b"Content-Length: -1\r\n\r\n", "invalid Content-Length"),
    ("CL with sign", OK + b"Content-Length: +5\r\n\r\n", "invalid Content-Length"),
    ("CL hex", OK + b"Content-Length: 0x5\r\n\r\n", "invalid Content-Length"),
    ("CL empty", OK + b"Content-Length: \r\n\r\n", "invalid Content-Length"),
    ("CL empty list element", OK + b"Content-Length: 5,\r\n\r\n", "invalid Content-Length"),
    ("CL inner space", OK + b"Content-Length: 5 5\r\n\r\n", "invalid Content-Length"),
    ("CL 2^63", OK + b"Content-Length: 9223372036854775808\r\n\r\n", "invalid Content-Length"),
    (
        "CL 5000 digits",
        OK + b"Content-Length: " + b"9" * 5000 + b"\r\n\r\n",
        "invalid Content-Length",
    ),
    ("CL unicode digits", OK + "Content-Length: ５\r\n\r\n".encode(), "invalid Content-Length"),
    ("obs-fold", OK + b"X-A: a\r\n b\r\nContent-Length: 0\r\n\r\n", "folding"),
    ("obs-fold with tab", OK + b"X-A: a\r\n\tb\r\n\r\n", "folding"),
    ("whitespace before the first field", OK + b" X-A: a\r\n\r\n", "folding"),
    ("no colon", OK + b"X-A a\r\n\r\n", "invalid header line"),
    ("space before colon", OK + b"X-A : a\r\n\r\n", "invalid header line"),
    ("empty name", OK + b": a\r\n\r\n", "invalid header line"),
    ("name not a token", OK + b"X(A): a\r\n\r\n", "invalid header line"),
    ("NUL in value", OK + b"X-A: a\x00b\r\n\r\n", "NUL"),
    ("bare CR in value", OK + b"X-A: a\rb\r\n\r\n", "bare CR"),
    ("bare CR ending a line", OK + b"X-A: a\r\r\n\r\n", "bare CR"),
    ("NUL in reason", b"HTTP/1.1 200 O\x00K\r\n\r\n", "NUL"),
    ("HTTP/2 status line", b"HTTP/2 200 OK\r\n\r\n", "status line"),
    ("HTTP/2.0 status line", b"HTTP/2.0 200 OK\r\n\r\n", "status line"),
    ("lower-case protocol", b"http/1.1 200 OK\r\n\r\n", "status line"),
    ("ICY", b"ICY 200 OK\r\n\r\n", "status line"),
    ("two-digit status", b"HTTP/1.1 20 OK\r\n\r\n", "status line"),
    ("four-digit status", b"HTTP/1.1 2000 OK\r\n\r\n", "status line"),
    ("status below 100", b"HTTP/1.1 099 Odd\r\n\r\n", "status code"),
    ("double space", b"HTTP/1.1  200 OK\r\n\r\n", "status line"),
    ("no space before reason", b"HTTP/1.1 200OK\r\n\r\n", "status line"),
    ("empty status line", b"\r\nHTTP/1.1 200 OK\r\n\r\n", "status line"),
    ("not HTTP at all", b"SSH-2.0-OpenSSH_9.6\r\n", "status line"),
    ("101", b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n", "upgrade"),
    ("chunk size not hex", OK + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n", "chunk size"),
    ("chunk size empty", OK + b"Transfer-Encoding: chunked\r\n\r\n\r\n", "chunk size"),
    ("chunk size negative", OK + b"Transfer-Encoding: chunked\r\n\r\n-1\r\n", "chunk size"),
    ("chunk size 0x prefix", OK + b"Transfer-Encoding: chunked\r\n\r\n0x5\r\n", "chunk size"),
    ("chunk size with junk", OK + b"Transfer-Encoding: chunked\r\n\r\n5 5\r\n", "chunk size"),
    ("chunk size leading space", OK + b"Transfer-Encoding: chunked\r\n\r\n 5\r\n", "chunk size"),
    ("chunk size LF only", OK + b"Transfer-Encoding: chunked\r\n\r\n5\nhello\r\n", "chunk size"),
    ("chunk size bare CR", OK + b"Transfer-Encoding: chunked\r\n\r\n5\r\r\n", "chunk size"),
    (
        "chunk extension with control",
        OK + b"Transfer-Encoding: chunked\r\n\r\n5;a\x01\r\n",
        "chunk size",
    ),
    (
        "chunk size 2^63",
        OK + b"Transfer-Encoding: chunked\r\n\r\n8000000000000000\r\n",
        "too large",
    ),
    (
        "chunk size line too long",
        OK + b"Transfer-Encoding: chunked\r\n\r\n" + b"0" * 5000 + b"1\r\n",
        "longer than",
    ),
    ("chunk data without CRLF", OK + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n", "CRLF"),
    (
        "chunk data with LF only",
        OK + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\n0\r\n\r\n",
        "CRLF",
    ),
    ("chunk data too long", OK + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabcd\r\n", "CRLF"),
    (
        "trailer obs-fold",
        OK + b"Transfer-Encoding: chunked\r\n\r\n0\r\nA: b\r\n c\r\n\r\n",
        "folding",
    ),
    (
        "trailer without colon",
        OK + b"Transfer-Encoding: chunked\r\n\r\n0\r\nA\r\n\r\n",
        "invalid header line",
    ),
    ("trailer NUL", OK + b"Transfer-Encoding: chunked\r\n\r\n0\r\nA: \x00\r\n\r\n", "NUL"),
    (
        "bytes after a complete content-length body",
        OK + b"Content-Length: 1\r\n\r\nab",
        "unsolicited",
    ),
]


@pytest.mark.parametrize(("name", "data", "message"), ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_protocol_errors(name: str, data: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        parse(data)
    reader = reader_for(b"GET")
    with pytest.raises(ProtocolError, match=message):
        feed(reader, *(data[i : i + 1] for i in range(len(data))))


def test_protocol_error_is_an_http1_error() -> None:
    assert issubclass(ProtocolError, Http1Error)
    assert issubclass(InvalidRequestError, Http1Error)
    assert issubclass(InvalidRequestError, ValueError)


def test_head_size_limit() -> None:
    data = b"HTTP/1.1 200 OK\r\nX-A: " + b"a" * 60 + b"\r\nContent-Length: 0\r\n\r\n"
    assert parse(data)[-1] == END
    exact = reader_for(b"GET", max_head_size=len(data))
    assert feed(exact, data)[-1] == END
    for pieces in ([data], [data[i : i + 1] for i in range(len(data))]):
        small = reader_for(b"GET", max_head_size=len(data) - 1)
        with pytest.raises(ProtocolError, match="response head larger than"):
            feed(small, *pieces)


def test_head_size_limit_stops_a_head_that_never_ends() -> None:
    reader = reader_for(b"GET", max_head_size=1024)
    reader.receive_data(b"HTTP/1.1 200 OK\r\nX-A: ")
    with pytest.raises(ProtocolError, match="larger than 1024"):
        for _ in range(100):
            reader.receive_data(b"a" * 100)


def test_head_size_limit_applies_to_each_head_and_to_trailers() -> None:
    # The informational heads share one budget (below); the final head and the trailers have
    # one each.
    informational = b"HTTP/1.1 103 Early Hints\r\n\r\n"
    final = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    reader = reader_for(b"GET", max_head_size=len(final))
    assert len(feed(reader, informational, final)) == 2
    with pytest.raises(ProtocolError, match="trailer section larger than"):
        reader.receive_data(b"0\r\nX-Trailer: " + b"a" * len(final) + b"\r\n\r\n")


EARLY_HINTS = b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"
FINAL = OK + b"Content-Length: 0\r\n\r\n"


@pytest.mark.parametrize("pieces", ["whole", "byte by byte"])
def test_informational_responses_to_one_request_are_bounded_in_number(pieces: str) -> None:
    """An origin may not make the proxy parse and hand on 1xx responses without end (200,000
    103s cost 4.1 s of CPU): past MAX_INTERIM_RESPONSES, 100 Continue counted, the response is
    invalid and the connection done for. Those before the error are still handed on."""
    allowed = b"HTTP/1.1 100 Continue\r\n\r\n" + EARLY_HINTS * (MAX_INTERIM_RESPONSES - 1)
    events = parse(allowed + FINAL)
    assert len(events) == MAX_INTERIM_RESPONSES + 2
    assert events[-2:] == [head(200, (b"Content-Length", b"0")), END]
    data = allowed + EARLY_HINTS + FINAL
    split = [data] if pieces == "whole" else [data[i : i + 1] for i in range(len(data))]
    reader = reader_for(b"GET")
    handed_on: list[Event] = []
    with pytest.raises(ProtocolError, match="more than 100 informational") as raised:
        for piece in split:
            handed_on += reader.receive_data(piece)
    handed_on += raised.value.events
    assert len(handed_on) == MAX_INTERIM_RESPONSES
    assert all(isinstance(event, InformationalResponse) for event in handed_on)
    with pytest.raises(ProtocolError, match="closed"):
        reader.receive_data(FINAL)


def test_the_bound_on_informational_responses_is_each_requests() -> None:
    one = EARLY_HINTS * MAX_INTERIM_RESPONSES + FINAL
    events = parse(one * 3, b"GET", b"GET", b"GET")
    assert events.count(END) == 3 and len(events) == 3 * (MAX_INTERIM_RESPONSES + 2)


def test_informational_responses_to_one_request_are_bounded_in_bytes_together() -> None:
    """Each 1xx head is under the head size limit by itself, but many add up: together they
    may have as many bytes as one head (as in Go's transport), and the final head has its own."""
    limit = 4 * len(EARLY_HINTS)
    reader = reader_for(b"GET", b"GET", max_head_size=limit)
    big_final = OK + b"X-A: " + b"a" * (limit - 60) + b"\r\nContent-Length: 0\r\n\r\n"
    assert limit - 20 < len(big_final) <= limit
    assert feed(reader, EARLY_HINTS * 4, big_final)[-1] == END
    with pytest.raises(ProtocolError, match=f"larger than {limit} bytes together"):
        reader.receive_data(EARLY_HINTS * 5 + FINAL)


def test_header_line_limit() -> None:
    fields = b"".join(b"X-%d: v\r\n" % i for i in range(199))
    ok = OK + fields + b"Content-Length: 0\r\n\r\n"
    first = parse(ok)[0]
    assert isinstance(first, ResponseHead) and len(first.headers) == 200
    with pytest.raises(ProtocolError, match="more than 200 header lines"):
        parse(OK + fields + b"X-A: a\r\nContent-Length: 0\r\n\r\n")
    with pytest.raises(ProtocolError, match="more than 3 header lines"):
        feed(reader_for(b"GET", max_header_lines=3), OK + fields)


def test_chunk_size_up_to_2_63_minus_1_is_accepted() -> None:
    reader = reader_for(b"GET")
    events = reader.receive_data(OK + b"Transfer-Encoding: chunked\r\n\r\n7fffffffffffffff\r\nab")
    assert events[-1] == BodyData(b"ab")
    assert reader.response_started


def test_content_length_up_to_2_63_minus_1_is_accepted() -> None:
    events = parse(OK + b"Content-Length: 9223372036854775807\r\n\r\nab")
    assert events[-1] == BodyData(b"ab")


def test_chunk_extension_may_carry_obs_text_and_tabs() -> None:
    data = OK + b'Transfer-Encoding: chunked\r\n\r\n1;a="\xff\tb"\r\nx\r\n0\r\n\r\n'
    assert parse(data)[1:] == [BodyData(b"x"), END]


def test_constructor_rejects_bad_limits() -> None:
    with pytest.raises(ValueError):
        ResponseReader(max_head_size=0)
    with pytest.raises(ValueError):
        ResponseReader(max_header_lines=-1)


def test_connect_is_not_supported() -> None:
    with pytest.raises(ValueError, match="CONNECT"):
        ResponseReader().expect(b"CONNECT")


# -- unsolicited data, EOF, response_started ------------------------------------------------------


def test_bytes_with_nothing_expected_are_unsolicited() -> None:
    reader = ResponseReader()
    with pytest.raises(ProtocolError, match="unsolicited response"):
        reader.receive_data(b"H")


def test_bytes_after_the_last_expected_response_are_unsolicited() -> None:
    reader = reader_for(b"GET")
    response = OK + b"Content-Length: 0\r\n\r\n"
    with pytest.raises(ProtocolError, match="unsolicited response") as raised:
        reader.receive_data(response + b"HTTP/1.1 200 OK\r\n")
    # The complete response before the error is valid and handed over with the error.
    assert raised.value.events == [head(200, (b"Content-Length", b"0")), END]
    assert reader.pending == 0


def test_protocol_error_carries_the_events_parsed_before_it() -> None:
    reader = reader_for(b"GET", b"GET")
    good = OK + b"Content-Length: 2\r\n\r\nok"
    with pytest.raises(ProtocolError) as raised:
        reader.receive_data(good + b"HTTP/9 nope\r\n")
    assert coalesce(raised.value.events) == [
        head(200, (b"Content-Length", b"2")),
        BodyData(b"ok"),
        END,
    ]
    assert (reader.pending, reader.response_started) == (1, True)


def test_reader_stays_closed_after_an_error() -> None:
    reader = reader_for(b"GET", b"GET")
    with pytest.raises(ProtocolError):
        reader.receive_data(b"garbage\r\n")
    with pytest.raises(ProtocolError, match="closed"):
        reader.receive_data(OK + b"Content-Length: 0\r\n\r\n")
    assert reader.receive_data(b"") == []


def test_data_after_eof_is_an_error() -> None:
    reader = reader_for(b"GET")
    assert reader.receive_data(b"") == []
    assert reader.receive_data(b"") == []
    with pytest.raises(ProtocolError, match="closed"):
        reader.receive_data(b"HTTP/1.1 200 OK\r\n")


def test_eof_with_nothing_started_leaves_requests_unanswered() -> None:
    reader = reader_for(b"GET", b"POST")
    assert reader.receive_data(b"") == []
    assert (reader.pending, reader.response_started) == (2, False)


def test_eof_with_nothing_expected_is_quiet() -> None:
    assert ResponseReader().receive_data(b"") == []


@pytest.mark.parametrize(
    "partial",
    [
        b"H",
        b"HTTP/1.1 200 OK\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhel",
        b"HTTP/1.1 100 Continue\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX: y\r\n",
    ],
)
def test_eof_mid_response(partial: bytes) -> None:
    reader = reader_for(b"GET", b"GET")
    reader.receive_data(partial)
    assert reader.response_started
    with pytest.raises(ProtocolError, match="connection closed mid-response"):
        reader.receive_data(b"")
    assert (reader.pending, reader.response_started) == (2, True)


def test_eof_ends_a_close_delimited_body_and_leaves_the_rest_unanswered() -> None:
    reader = reader_for(b"GET", b"GET", b"GET")
    assert reader.receive_data(b"HTTP/1.1 200 OK\r\n\r\nabc") == [head(200), BodyData(b"abc")]
    assert (reader.pending, reader.response_started) == (3, True)
    assert reader.receive_data(b"") == [END_CLOSE]
    assert (reader.pending, reader.response_started) == (2, False)


def test_response_started_follows_the_front_response() -> None:
    reader = reader_for(b"GET", b"GET")
    assert not reader.response_started
    reader.receive_data(b"HTTP/1.1 100 Continue\r\n\r\n")
    assert reader.response_started  # a 1xx means the server has the request
    reader.receive_data(OK + b"Content-Length: 1\r\n\r\n")
    assert reader.response_started
    reader.receive_data(b"x")
    assert (reader.pending, reader.response_started) == (1, False)
    reader.receive_data(b"H")
    assert (reader.pending, reader.response_started) == (1, True)


def test_response_started_when_the_next_response_arrives_with_the_end_of_one() -> None:
    reader = reader_for(b"GET", b"GET")
    events = reader.receive_data(OK + b"Content-Length: 1\r\n\r\nxHTTP/1.1 2")
    assert events[-1] == END
    assert (reader.pending, reader.response_started) == (1, True)


def test_repr_shows_state() -> None:
    reader = reader_for(b"GET")
    assert repr(reader) == "<ResponseReader head pending=1 started=False>"


# -- pipelining -----------------------------------------------------------------------------------

PIPELINE = (
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"  # HEAD: no body
    b"HTTP/1.1 100 Continue\r\n\r\n"
    b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"3\r\nabc\r\n2;ext\r\nde\r\n0\r\nX-T: 1\r\n\r\n"
    b'HTTP/1.1 304 Not Modified\r\nETag: "x"\r\n\r\n'
)
PIPELINE_METHODS = (b"GET", b"HEAD", b"POST", b"GET")
PIPELINE_EVENTS: list[Event] = [
    head(200, CL5),
    BodyData(b"hello"),
    END,
    head(200, CL5),
    END,
    InformationalResponse(100, ()),
    head(201, CHUNKED, reason=b"Created"),
    BodyData(b"abcde"),
    Trailers(((b"X-T", b"1"),)),
    END,
    head(304, (b"ETag", b'"x"'), reason=b"Not Modified"),
    END,
]


def test_pipelined_responses_in_one_buffer() -> None:
    reader = reader_for(*PIPELINE_METHODS)
    assert reader.pending == 4
    assert feed(reader, PIPELINE) == PIPELINE_EVENTS
    assert (reader.pending, reader.response_started) == (0, False)


def test_pipelined_responses_split_at_every_byte_boundary() -> None:
    for i in range(len(PIPELINE) + 1):
        reader = reader_for(*PIPELINE_METHODS)
        pieces = [p for p in (PIPELINE[:i], PIPELINE[i:]) if p]  # b"" would be EOF
        assert feed(reader, *pieces) == PIPELINE_EVENTS, i


def test_pipelined_responses_split_at_every_pair_of_boundaries() -> None:
    n = len(PIPELINE)
    for i in range(0, n + 1, 3):
        for j in range(i, n + 1):
            reader = reader_for(*PIPELINE_METHODS)
            pieces = [p for p in (PIPELINE[:i], PIPELINE[i:j], PIPELINE[j:]) if p]
            events = feed(reader, *pieces)
            assert events == PIPELINE_EVENTS, (i, j)


def test_pipelined_responses_byte_by_byte() -> None:
    reader = reader_for(*PIPELINE_METHODS)
    assert feed(reader, *(PIPELINE[i : i + 1] for i in range(len(PIPELINE)))) == PIPELINE_EVENTS


def test_expect_can_follow_the_bytes_of_earlier_responses() -> None:
    reader = reader_for(b"GET")
    one = OK + b"Content-Length: 1\r\n\r\nx"
    assert reader.receive_data(one)[-1] == END
    reader.expect(b"GET")
    assert reader.receive_data(one)[-1] == END
    assert reader.pending == 0


# -- bodies stream, never gather ------------------------------------------------------------------


def test_a_100_mb_body_passes_through_as_the_pieces_fed() -> None:
    piece = bytes(64 * 1024)
    count = 1600  # 100 MiB
    reader = reader_for(b"GET")
    events = reader.receive_data(OK + b"Content-Length: %d\r\n\r\n" % (len(piece) * count))
    assert events == [head(200, (b"Content-Length", b"%d" % (len(piece) * count)))]
    for _ in range(count - 1):
        (event,) = reader.receive_data(piece)
        # The very object fed: no copy, nothing kept.
        assert isinstance(event, BodyData) and event.data is piece
    assert reader.receive_data(piece) == [BodyData(piece), END]


def test_chunked_body_pieces_are_sized_like_the_input() -> None:
    piece = bytes(64 * 1024)
    reader = reader_for(b"GET")
    reader.receive_data(OK + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n" % (len(piece) * 10))
    for _ in range(10):
        (event,) = reader.receive_data(piece)
        assert isinstance(event, BodyData) and event.data is piece
    assert reader.receive_data(b"\r\n0\r\n\r\n") == [END]


# -- encoding requests ----------------------------------------------------------------------------


def test_encode_request_without_body() -> None:
    assert encode_request(b"GET", b"/a?b=c", [(b"Host", b"example.com"), (b"Accept", b"*/*")]) == (
        b"GET /a?b=c HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\n\r\n"
    )


def test_encode_request_head_and_body_come_out_as_one_bytes_object() -> None:
    data = encode_request(
        b"POST", b"/upload", [(b"Host", b"h"), (b"Content-Length", b"5")], b"hello"
    )
    assert type(data) is bytes
    assert data == b"POST /upload HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello"


def test_encode_request_chunked() -> None:
    headers = [(b"Host", b"h"), (b"Transfer-Encoding", b"chunked")]
    data = encode_request(b"POST", b"/", headers, b"hello", chunked=True)
    assert data == b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"
    assert encode_request(b"POST", b"/", headers, b"", chunked=True).endswith(b"chunked\r\n\r\n")
    assert encode_request(b"POST", b"/", headers, chunked=True).endswith(b"chunked\r\n\r\n")


def test_encode_request_body_may_be_the_first_part_of_a_content_length_body() -> None:
    data = encode_request(b"PUT", b"/", [(b"Content-Length", b"10")], b"hello")
    assert data.endswith(b"\r\n\r\nhello")


def test_encode_request_empty_body_needs_no_framing() -> None:
    assert encode_request(b"GET", b"/", [], b"") == b"GET / HTTP/1.1\r\n\r\n"


def test_encode_request_accepts_asterisk_absolute_and_authority_forms() -> None:
    for target in (b"*", b"http://example.com/", b"example.com:443"):
        assert encode_request(b"OPTIONS", target, []).startswith(b"OPTIONS " + target + b" ")


@pytest.mark.parametrize(
    ("method", "target", "headers", "body", "chunked", "message"),
    [
        (b"", b"/", [], None, False, "method"),
        (b"GE T", b"/", [], None, False, "method"),
        (b"GET\r\n", b"/", [], None, False, "method"),
        (b"G(T", b"/", [], None, False, "method"),
        (b"GET", b"", [], None, False, "target"),
        (b"GET", b"/a b", [], None, False, "target"),
        (b"GET", b"/a\tb", [], None, False, "target"),
        (b"GET", b"/\r\nX-Injected: 1", [], None, False, "target"),
        (b"GET", b"/\n", [], None, False, "target"),
        (b"GET", b"/\x00", [], None, False, "target"),
        (b"GET", b"/\x7f", [], None, False, "target"),
        (b"GET", b"/", [(b"", b"v")], None, False, "header name"),
        (b"GET", b"/", [(b"X A", b"v")], None, False, "header name"),
        (b"GET", b"/", [(b"X-A:", b"v")], None, False, "header name"),
        (b"GET", b"/", [(b"X-A\r\n", b"v")], None, False, "header name"),
        (b"GET", b"/", [(b"X-A", b"a\r\nX-Injected: 1")], None, False, "CR, LF or NUL"),
        (b"GET", b"/", [(b"X-A", b"a\nb")], None, False, "CR, LF or NUL"),
        (b"GET", b"/", [(b"X-A", b"a\rb")], None, False, "CR, LF or NUL"),
        (b"GET", b"/", [(b"X-A", b"a\x00b")], None, False, "CR, LF or NUL"),
        (b"POST", b"/", [], b"body", False, "Content-Length header or chunked"),
        (b"POST", b"/", [(b"Content-Length", b"2")], b"body", False, "exceeds"),
        (
            b"POST",
            b"/",
            [(b"Content-Length", b"4"), (b"Content-Length", b"4")],
            b"body",
            False,
            "more than one",
        ),
        (b"POST", b"/", [(b"Content-Length", b"-4")], b"body", False, "invalid Content-Length"),
        (b"POST", b"/", [(b"Content-Length", b"4x")], b"body", False, "invalid Content-Length"),
        (
            b"POST",
            b"/",
            [(b"Transfer-Encoding", b"chunked")],
            b"body",
            False,
            "without chunked=True",
        ),
        (b"POST", b"/", [], b"body", True, "chunked=True needs"),
        (b"POST", b"/", [(b"Transfer-Encoding", b"gzip")], b"body", True, "chunked=True needs"),
        (
            b"POST",
            b"/",
            [(b"Transfer-Encoding", b"chunked"), (b"Content-Length", b"4")],
            b"body",
            True,
            "chunked=True needs",
        ),
        (
            b"POST",
            b"/",
            [(b"Transfer-Encoding", b"chunked")] * 2,
            b"body",
            True,
            "chunked=True needs",
        ),
    ],
)
def test_encode_request_rejects(
    method: bytes,
    target: bytes,
    headers: list[tuple[bytes, bytes]],
    body: bytes | None,
    chunked: bool,
    message: str,
) -> None:
    with pytest.raises(ValueError, match=message) as raised:
        encode_request(method, target, headers, body, chunked=chunked)
    assert isinstance(raised.value, InvalidRequestError)


def test_encode_chunk() -> None:
    assert encode_chunk(b"") == b""
    assert encode_chunk(b"hello") == b"5\r\nhello\r\n"
    assert encode_chunk(bytes(255)) == b"ff\r\n" + bytes(255) + b"\r\n"


def test_encode_last_chunk() -> None:
    assert encode_last_chunk() == b"0\r\n\r\n"
    trailers = [(b"Server-Timing", b"total;dur=1"), (b"X-B", b"")]
    assert encode_last_chunk(trailers) == b"0\r\nServer-Timing: total;dur=1\r\nX-B: \r\n\r\n"
    with pytest.raises(InvalidRequestError, match="trailer"):
        encode_last_chunk([(b"X-A", b"a\r\nb")])
    with pytest.raises(InvalidRequestError, match="trailer"):
        encode_last_chunk([(b"X A", b"a")])


# -- property-based tests -------------------------------------------------------------------------

TCHARS = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
# Names the generators add themselves (framing, persistence), or that h11 insists on owning.
RESERVED_NAMES = {b"content-length", b"transfer-encoding", b"connection", b"host"}
# field-vchar and obs-text; SP and HTAB may also appear inside a value, not at its ends.
VCHARS = bytes(range(0x21, 0x7F)) + bytes(range(0x80, 0x100))


def from_alphabet(alphabet: bytes, *, min_size: int = 0, max_size: int) -> st.SearchStrategy[bytes]:
    return st.lists(st.sampled_from(alphabet), min_size=min_size, max_size=max_size).map(bytes)


tokens = from_alphabet(TCHARS, min_size=1, max_size=12)
field_names = tokens.filter(lambda name: name.lower() not in RESERVED_NAMES)
field_values = st.one_of(
    st.just(b""),
    st.builds(
        lambda first, middle, last: bytes([first]) + middle + bytes([last]),
        st.sampled_from(VCHARS),
        from_alphabet(VCHARS + b" \t", max_size=20),
        st.sampled_from(VCHARS),
    ),
)
fields = st.lists(st.tuples(field_names, field_values), max_size=6).map(tuple)
reasons = from_alphabet(VCHARS + b" \t", max_size=20)
targets = from_alphabet(bytes(range(0x21, 0x7F)), max_size=30).map(lambda path: b"/" + path)


@dataclass
class GeneratedResponse:
    method: bytes
    data: bytes
    events: list[Event]  # what the reader must produce, bodies coalesced
    keep_alive: bool
    close_delimited: bool


@st.composite
def responses(draw: st.DrawFn, *, last: bool) -> GeneratedResponse:
    """A valid response, its encoding and the events it must parse into.

    Only the `last` response of a pipeline may run until close.
    """
    method = draw(st.sampled_from([b"GET", b"HEAD", b"POST"]))
    version = draw(st.sampled_from([b"HTTP/1.1", b"HTTP/1.0"]))
    data = b""
    events: list[Event] = []
    for status in draw(st.lists(st.sampled_from([100, 102, 103, 199]), max_size=2)):
        informational_fields = draw(fields)
        data += b"%s %d Info\r\n%s\r\n" % (version, status, _fields(informational_fields))
        events.append(InformationalResponse(status, informational_fields))
    status = draw(st.one_of(st.sampled_from([200, 204, 206, 304, 404]), st.integers(200, 999)))
    bodiless = method == b"HEAD" or status in (204, 304)
    framings = ["length"] + (["chunked"] if version == b"HTTP/1.1" else [])
    if last and not bodiless:
        framings.append("close")
    framing = draw(st.sampled_from(framings))
    connection = draw(st.sampled_from([None, b"close", b"keep-alive", b"Keep-Alive, x-other"]))
    body = b"" if bodiless else draw(st.binary(max_size=300))
    head_fields = list(draw(fields))
    if connection is not None:
        head_fields.insert(draw(st.integers(0, len(head_fields))), (b"Connection", connection))
    framing_field = {
        "length": (
            b"Content-Length",
            b"%d" % (draw(st.integers(0, 10**6)) if bodiless else len(body)),
        ),
        "chunked": (b"Transfer-Encoding", b"chunked"),
    }.get(framing)
    if framing_field is not None:
        head_fields.insert(draw(st.integers(0, len(head_fields))), framing_field)
    reason = draw(reasons)
    reason_part = b" " + reason if reason or draw(st.booleans()) else b""
    data += b"%s %d%s\r\n%s\r\n" % (version, status, reason_part, _fields(head_fields))
    events.append(ResponseHead(status, reason, tuple(head_fields), version))
    if body:
        events.append(BodyData(body))
    if framing == "chunked" and not bodiless:
        offsets = sorted(draw(st.sets(st.integers(1, max(1, len(body) - 1)), max_size=5)))
        cuts = [0, *(o for o in offsets if o < len(body)), len(body)]
        for start, stop in zip(cuts, cuts[1:], strict=False):
            if start < stop:
                extension = draw(st.sampled_from([b"", b";a=b", b" ;x", b';q="1 2"']))
                size = draw(st.sampled_from([b"%x", b"%X", b"00%x"])) % (stop - start)
                data += size + extension + b"\r\n" + body[start:stop] + b"\r\n"
        trailers = draw(fields)
        data += encode_last_chunk(trailers)
        if trailers:
            events.append(Trailers(trailers))
    else:
        data += body
    options = {o.strip().lower() for o in (connection or b"").split(b",")}
    keep_alive = (
        framing != "close"
        and b"close" not in options
        and (version == b"HTTP/1.1" or b"keep-alive" in options)
    )
    events.append(ResponseEnd(keep_alive))
    return GeneratedResponse(method, data, events, keep_alive, framing == "close")


def _fields(pairs: Sequence[tuple[bytes, bytes]]) -> bytes:
    return b"".join(name + b": " + value + b"\r\n" for name, value in pairs)


@st.composite
def pipelines(draw: st.DrawFn) -> list[GeneratedResponse]:
    """1–3 responses on one connection; a response that closes the connection is the last."""
    count = draw(st.integers(1, 3))
    pipeline: list[GeneratedResponse] = []
    for i in range(count):
        response = draw(responses(last=i == count - 1))
        pipeline.append(response)
        if not response.keep_alive:
            break
    return pipeline


def split(data: st.DataObject, wire: bytes) -> list[bytes]:
    """`wire` cut at up to 8 random places into non-empty pieces (b"" would mean EOF)."""
    cuts = sorted(data.draw(st.sets(st.integers(0, len(wire)), max_size=8)))
    bounds = [0, *cuts, len(wire)]
    return [wire[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if a < b]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pipeline=pipelines(), data=st.data())
def test_generated_responses_parse_into_what_was_encoded(
    pipeline: list[GeneratedResponse], data: st.DataObject
) -> None:
    wire = b"".join(response.data for response in pipeline)
    reader = reader_for(*(response.method for response in pipeline))
    events: list[Event] = []
    for piece in split(data, wire):
        events += reader.receive_data(piece)
        assert all(not isinstance(e, BodyData) or e.data for e in events)
    if pipeline[-1].close_delimited:
        assert reader.pending == 1
    events += reader.receive_data(b"")
    assert coalesce(events) == [e for response in pipeline for e in response.events]
    assert (reader.pending, reader.response_started) == (0, False)


def check_grammar(events: Sequence[Event]) -> None:
    """Each response is 1xx* ResponseHead BodyData* Trailers? ResponseEnd (the last may be cut)."""
    expected: tuple[type, ...] = (InformationalResponse, ResponseHead)
    for event in events:
        assert isinstance(event, expected), (event, expected)
        if isinstance(event, BodyData):
            assert event.data
        if isinstance(event, ResponseEnd):
            expected = (InformationalResponse, ResponseHead)
        elif isinstance(event, ResponseHead | BodyData):
            expected = (BodyData, Trailers, ResponseEnd)
        elif isinstance(event, Trailers):
            expected = (ResponseEnd,)


def feed_fuzz(methods: Sequence[bytes], pieces: Sequence[bytes], max_head_size: int) -> None:
    reader = reader_for(*methods, max_head_size=max_head_size)
    events: list[Event] = []
    try:
        for piece in pieces:
            events += reader.receive_data(piece)
        events += reader.receive_data(b"")
    except ProtocolError as e:
        events += e.events
    check_grammar(events)
    assert 0 <= reader.pending <= len(methods)
    assert sum(isinstance(e, ResponseEnd) for e in events) == len(methods) - reader.pending


methods = st.lists(st.sampled_from([b"GET", b"HEAD", b"POST"]), max_size=3)
head_limits = st.sampled_from([64 * 1024, 64, 200])


@settings(max_examples=300, deadline=None)
@given(methods=methods, pieces=st.lists(st.binary(max_size=64), max_size=6), limit=head_limits)
def test_fuzz_arbitrary_bytes_only_raise_protocol_error(
    methods: list[bytes], pieces: list[bytes], limit: int
) -> None:
    feed_fuzz(methods, pieces, limit)


# Fragments of real responses, so that fuzzing gets past the status line.
FRAGMENTS = [
    b"HTTP/1.1 200 OK\r\n",
    b"HTTP/1.0 204 x\r\n",
    b"HTTP/1.1 100 Continue\r\n",
    b"HTTP/1.1 304",
    b"HTTP/1.1 101 Switching\r\n",
    b"Content-Length: 3\r\n",
    b"Content-Length: 3, 4\r\n",
    b"Transfer-Encoding: chunked\r\n",
    b"Connection: close\r\n",
    b"X-A: b\r\n",
    b" folded\r\n",
    b"\r\n",
    b"\n",
    b"\r",
    b"3\r\nabc\r\n",
    b"0\r\n",
    b"ffffffffffffffff\r\n",
    b"5;e=1\r\n",
    b"abc",
    b"\x00",
    b":",
    b" ",
    b"0" * 70,
]


@settings(max_examples=400, deadline=None)
@given(
    methods=methods,
    fragments=st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.binary(max_size=8)), max_size=14),
    data=st.data(),
    limit=head_limits,
)
def test_fuzz_response_fragments_only_raise_protocol_error(
    methods: list[bytes], fragments: list[bytes], data: st.DataObject, limit: int
) -> None:
    feed_fuzz(methods, split(data, b"".join(fragments)), limit)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pipeline=pipelines(), data=st.data())
def test_fuzz_mutated_responses_only_raise_protocol_error(
    pipeline: list[GeneratedResponse], data: st.DataObject
) -> None:
    wire = bytearray(b"".join(response.data for response in pipeline))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(wire)))
        action = data.draw(st.sampled_from(["flip", "insert", "delete"]))
        if action == "insert" or at == len(wire):
            wire[at:at] = data.draw(st.binary(min_size=1, max_size=4))
        elif action == "delete":
            del wire[at : at + data.draw(st.integers(1, 8))]
        else:
            wire[at] = data.draw(st.integers(0, 255))
    feed_fuzz([r.method for r in pipeline], split(data, bytes(wire)), 64 * 1024)


# An independent parser agrees with what encode_request writes.


@settings(max_examples=200, deadline=None)
@given(
    method=tokens,
    target=targets,
    headers=fields,
    body=st.binary(max_size=100),
    chunks=st.lists(st.binary(max_size=20), max_size=3),
    chunked=st.booleans(),
    trailers=fields,
)
def test_h11_reads_what_encode_request_writes(
    method: bytes,
    target: bytes,
    headers: tuple[tuple[bytes, bytes], ...],
    body: bytes,
    chunks: list[bytes],
    chunked: bool,
    trailers: tuple[tuple[bytes, bytes], ...],
) -> None:
    all_headers = [(b"Host", b"example.com"), *headers]
    if chunked:
        all_headers.append((b"Transfer-Encoding", b"chunked"))
        wire = encode_request(method, target, all_headers, body, chunked=True)
        wire += b"".join(encode_chunk(c) for c in chunks) + encode_last_chunk(trailers)
        sent_body = body + b"".join(chunks)
    else:
        all_headers.append((b"Content-Length", b"%d" % len(body)))
        wire = encode_request(method, target, all_headers, body)
        sent_body, trailers = body, ()
    server = h11.Connection(h11.SERVER)
    server.receive_data(wire)
    request = server.next_event()
    assert isinstance(request, h11.Request)
    assert (request.method, request.target) == (method, target)
    assert [(n.lower(), v) for n, v in request.headers] == [(n.lower(), v) for n, v in all_headers]
    received = b""
    event = server.next_event()
    while isinstance(event, h11.Data):
        received += event.data
        event = server.next_event()
    assert isinstance(event, h11.EndOfMessage)
    assert received == sent_body
    assert [(n.lower(), v) for n, v in event.headers] == [(n.lower(), v) for n, v in trailers]


@pytest.mark.parametrize(
    ("data", "ends"),
    [
        (b"HTTP/1.1 413 Too Large\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", True),
        (b"HTTP/1.1 413 Too Large\r\nConnection: keep-alive, Close\r\n\r\n", True),
        (b"HTTP/1.0 413 Too Large\r\nContent-Length: 0\r\n\r\n", True),
        (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 413 No\r\nConnection: close\r\n\r\n", True),
        (b"HTTP/1.1 100 Continue\r\n\r\n", False),  # interim: the body is wanted
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", False),  # answers, reads on
        (b"HTTP/1.1 200 OK\r\n\r\n", False),  # body until close: not a refusal by itself
        (b"HTTP/1.1 413 Too Large\r\nConnection: close\r\n", False),  # head not complete
        (b"HTTP/1.1 41", False),
        (b"garbage\r\n\r\n", False),
        (b"", False),
    ],
)
def test_ends_before_body_sent(data: bytes, ends: bool) -> None:
    assert ends_before_body_sent(data, b"PUT") is ends
