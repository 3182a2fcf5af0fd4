"""What an HTTP/1.1 connection to an origin (reshape/upstream/h1.py) tells the pool when the
origin's bytes do not frame as the answers asked for. The origin is the test, writing into the
connection's wire; its socket is a transport that keeps what is written."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from reshape.upstream.h1 import H1Response, H1Upstream
from reshape.upstream.types import Unanswered, UpstreamError, UpstreamRequest
from reshape.upstream.wire import Wire
from tests.support.kept_writes import KeptWrites


class Books:
    """The pool's side: what the connection told it, in order (an HTTP/1.1 connection reports
    neither a stream limit nor a GOAWAY)."""

    def __init__(self) -> None:
        self.told: list[tuple[object, ...]] = []
        self.terms: list[tuple[float | None, int | None]] = []  # each request_done's

    def out_of_turn(self, *, pipelined: bool) -> None:
        self.told.append(("out of turn",))

    def unanswered(self, waiter_ids: list[int], *, never_sent: bool = False) -> None:
        self.told.append(("unanswered", list(waiter_ids), never_sent))

    def request_done(
        self,
        waiter_id: int,
        reusable: bool,
        *,
        idle_timeout: float | None = None,
        takes: int | None = None,
    ) -> None:
        self.told.append(("done", waiter_id, reusable))
        self.terms.append((idle_timeout, takes))

    def lost(self, answered: list[int], **kwargs: object) -> None:
        self.told.append(("lost", list(answered)))


class Link:
    """The engine's HTTP/1.1 connection, the test playing the origin."""

    def __init__(self) -> None:
        self.books = Books()
        self.transport = KeptWrites()
        self.wire = Wire(tls=None)
        self.wire.connection_made(self.transport)  # type: ignore[arg-type]
        self.upstream = H1Upstream(self.wire, self.books)  # type: ignore[arg-type]

    def exchange(self, waiter_id: int, request: UpstreamRequest) -> asyncio.Task[H1Response]:
        return asyncio.create_task(self.upstream.exchange(waiter_id, request))

    async def answer(self, data: bytes) -> None:
        """The origin sends `data`, which arrives in one read."""
        await asyncio.sleep(0)  # the requests handed over are written
        self.wire.data_received(data)


def request(method: bytes, path: bytes = b"/", body: bytes = b"") -> UpstreamRequest:
    return UpstreamRequest(method, b"http", b"origin.test", path, [], body=body)


async def body_of(response: H1Response) -> bytes:
    parts = []
    for _ in range(100):
        chunk = await response.read()
        if not chunk:
            return b"".join(parts)
        parts.append(chunk)
    raise AssertionError("the body never ended")


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


@pytest.mark.parametrize(
    ("method", "answer", "status", "body"),
    [
        (b"GET", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA", 200, b"ok"),
        (b"DELETE", b"HTTP/1.1 204 No Content\r\nContent-Length: 2\r\n\r\n{}", 204, b""),
        (b"HEAD", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", 200, b""),
        (
            b"GET",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\nEXTRA",
            200,
            b"ok",
        ),
    ],
    ids=["longer than its length", "204 with a body", "HEAD with a body", "after the last chunk"],
)
async def test_bytes_past_a_response_in_the_read_that_ends_it_close_its_connection(
    method: bytes, answer: bytes, status: int, body: bytes
) -> None:
    """RFC 9112 §6.3: a response ends where its framing says; what follows in the same read
    answers nothing. The connection closes as for any unsolicited data (counted out of turn),
    and the pool never gets it back: the next request, a POST, was written to it and failed."""
    link = Link()
    first = link.exchange(1, request(method, b"/first"))
    await link.answer(answer)
    response = await first
    assert (response.status, await body_of(response)) == (status, body)
    assert link.books.told == [("out of turn",), ("done", 1, False), ("lost", [])]
    assert link.transport.closed
    with pytest.raises(Unanswered):
        await link.exchange(2, request(b"POST", b"/orders", b"{}"))
    assert len(link.transport.writes) == 1  # the POST never left


async def test_bytes_past_the_last_pipelined_response_close_its_connection() -> None:
    link = Link()
    first, second = link.exchange(1, request(b"GET")), link.exchange(2, request(b"GET"))
    await link.answer(OK + OK + b"EXTRA")
    assert await body_of(await first) == b"ok"
    assert await body_of(await second) == b"ok"
    # The connection takes nothing more from the read that broke its parser on.
    assert link.books.told == [
        ("done", 1, False),
        ("out of turn",),
        ("done", 2, False),
        ("lost", []),
    ]


@pytest.mark.parametrize(
    ("behind", "closes", "error", "reusable"),
    [
        (b"THIS IS NOT HTTP\r\n\r\n", False, "invalid response", False),  # garbage
        (b"HTTP/1.1 20", True, "closed mid-response", True),  # a head the close cut off
    ],
    ids=["garbage", "cut-off head"],
)
async def test_an_answer_begun_behind_a_good_one_in_the_same_read_is_an_answer(
    behind: bytes, closes: bool, error: str, reusable: bool
) -> None:
    """Any byte of an answer marks its request answered, pipelined or not: the request whose
    answer began in the front response's read gets an error and is not sent again (it was: only
    the front response was marked, and the pool took the loss of the others for a close before
    they were answered). The request behind it, whose turn no byte reached, still may go
    again."""
    link = Link()
    first, second, third = (link.exchange(i, request(b"GET")) for i in (1, 2, 3))
    await link.answer(OK + behind)
    if closes:
        link.wire.eof_received()
    assert await body_of(await first) == b"ok"
    with pytest.raises(UpstreamError, match=error) as raised:
        await second
    assert not isinstance(raised.value, Unanswered)
    with pytest.raises(Unanswered):
        await third
    assert link.books.told == [("done", 1, reusable), ("lost", [2])]


async def test_pipelined_requests_no_byte_of_whose_answer_came_are_unanswered() -> None:
    link = Link()
    first, second, third = (link.exchange(i, request(b"GET")) for i in (1, 2, 3))
    await link.answer(OK)
    link.wire.eof_received()
    assert await body_of(await first) == b"ok"
    for later in (second, third):
        with pytest.raises(Unanswered):
            await later
    assert link.books.told == [("done", 1, True), ("lost", [])]


async def test_an_http2_clients_cookie_crumbs_reach_an_http1_origin_as_one_field() -> None:
    # An HTTP/2 client may split its cookies into fields of their own (RFC 9113 §8.2.3, as
    # Firefox does); to HTTP/1.1 they go as one field joined with "; ", which that section
    # requires. They went as several `Cookie` fields, which servers that fold repeated fields
    # with "," (WSGI) misread. mitmproxy's own HTTP/1.1 client joins them; the engine did not.
    link = Link()
    crumbs = UpstreamRequest(
        b"GET",
        b"http",
        b"origin.test",
        b"/",
        [(b"cookie", b"a=1"), (b"accept", b"*/*"), (b"cookie", b"b=2"), (b"cookie", b"c=3")],
    )
    task = link.exchange(1, crumbs)
    await link.answer(OK)
    await body_of(await task)
    head = b"".join(link.transport.writes).split(b"\r\n\r\n")[0].split(b"\r\n")
    assert [line for line in head if line.lower().startswith(b"cookie:")] == [
        b"cookie: a=1; b=2; c=3"
    ]
    assert b"accept: */*" in head


async def test_the_origins_keep_alive_terms_reach_the_pool_with_each_response() -> None:
    """What an origin says of the connection (reshape/upstream/keep_alive.py) goes to the pool
    with each response that keeps it; and each request says `Connection: keep-alive`, as
    browsers do, without which Apache states no terms."""
    link = Link()
    first, second = link.exchange(1, request(b"GET")), link.exchange(2, request(b"POST"))
    await asyncio.sleep(0)
    assert all(b"\r\nConnection: keep-alive\r\n" in write for write in link.transport.writes)
    apache = b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5, max=%d\r\nContent-Length: 2\r\n\r\nok"
    await link.answer(apache % 100 + apache % 99)
    assert await body_of(await first) == b"ok"
    assert await body_of(await second) == b"ok"
    assert link.books.told == [("done", 1, True), ("done", 2, True)]
    assert link.books.terms == [(4.0, 99), (4.0, 99)]
    third = link.exchange(3, request(b"GET"))
    await link.answer(OK)  # no terms: nothing said
    assert await body_of(await third) == b"ok"
    assert link.books.terms[-1] == (None, None)


def streamed(parts: list[bytes], headers: list[tuple[bytes, bytes]]) -> UpstreamRequest:
    async def body() -> AsyncIterator[bytes]:
        for part in parts:
            yield part

    return UpstreamRequest(b"PUT", b"http", b"origin.test", b"/up", headers, body_stream=body())


@pytest.mark.parametrize(
    ("headers", "framing", "sent"),
    [
        ([(b"content-length", b"7")], b"Content-Length: 7", b"abcdefg"),
        ([(b"Content-Length", b"7, 7")], b"Content-Length: 7", b"abcdefg"),
        ([], b"Transfer-Encoding: chunked", b"3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n"),
        (
            [(b"content-length", b"7"), (b"content-length", b"8")],
            b"Transfer-Encoding: chunked",
            None,
        ),
    ],
    ids=["its length", "its length repeated", "no length", "lengths that disagree"],
)
async def test_a_streamed_body_goes_with_the_length_its_client_gave(
    headers: list[tuple[bytes, bytes]], framing: bytes, sent: bytes | None
) -> None:
    # A body over mitmproxy's `stream_large_bodies` (1 MiB) streams; it went chunked, with the
    # client's Content-Length dropped, and origins that want a length (S3's PUT) answered 411
    # to every upload over 1 MiB. A body of no known length still goes chunked.
    link = Link()
    task = link.exchange(1, streamed([b"abc", b"defg"], headers))
    for _ in range(10):
        await asyncio.sleep(0)
    written = b"".join(link.transport.writes)
    head, body = written.split(b"\r\n\r\n", 1)
    assert framing in head.split(b"\r\n")
    assert sum(line.lower().startswith(b"content-length") for line in head.split(b"\r\n")) == (
        framing.startswith(b"Content-Length")
    )
    if sent is not None:
        assert body == sent
    await link.answer(OK)
    assert await body_of(await task) == b"ok"
    assert link.books.told == [("done", 1, True)]


@pytest.mark.parametrize(
    ("parts", "how"),
    [
        ([b"abc", b"defgh"], "more than its Content-Length of 7"),
        ([b"abc"], "4 bytes short of its Content-Length of 7"),
    ],
    ids=["longer", "shorter"],
)
async def test_a_streamed_body_that_is_not_the_length_its_client_gave_ends_the_connection(
    parts: list[bytes], how: str
) -> None:
    # The client's own hop refuses such a body, so this does not happen; if it did, the origin
    # would have part of a request (or wait for the rest): the connection cannot carry on.
    link = Link()
    with pytest.raises(UpstreamError, match=f"the request body was {how}"):
        await link.exchange(1, streamed(parts, [(b"content-length", b"7")]))
    assert link.books.told == [("lost", [])]
    assert link.upstream.closed
