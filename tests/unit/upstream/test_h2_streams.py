"""What becomes of a request when its stream or its connection ends early (reshape/upstream/h2.py).

An origin may reset a stream, refuse it, send GOAWAY or break the protocol while a request's
body waits for the flow-control window, after the response has come whole, or before the
request leaves at all. Whatever it does, the request's exchange ends at once, the pool is told
the truth about it (answered, or unanswered and whether any of it left), and a complete
response is never thrown away. The origin here is h2's server end, over a transport that keeps
what is written.
"""

from __future__ import annotations

import asyncio
import gc
import struct
from collections.abc import AsyncIterator

import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest

import reshape.upstream.h2 as upstream_h2
from reshape.upstream.h2 import H2Response, H2Upstream
from reshape.upstream.types import Unanswered, UpstreamError, UpstreamRequest
from reshape.upstream.wire import Wire
from tests.support.kept_writes import KeptWrites

NO_ERROR, INTERNAL_ERROR, REFUSED_STREAM, CANCEL = 0x0, 0x2, 0x7, 0x8


class Books:
    """The pool's side: what the connection told it, in order."""

    def __init__(self) -> None:
        self.told: list[tuple[object, ...]] = []

    def request_done(self, waiter_id: int, reusable: bool) -> None:
        self.told.append(("done", waiter_id, reusable))

    def unanswered(self, waiter_ids: list[int], *, never_sent: bool = False) -> None:
        self.told.append(("unanswered", list(waiter_ids), never_sent))

    def max_streams_changed(self, max_streams: int) -> None:
        pass

    def out_of_turn(self, *, pipelined: bool) -> None:
        pass

    def goaway(self) -> None:
        self.told.append(("goaway",))

    def lost(self, answered: list[int], **kwargs: object) -> None:
        self.told.append(("lost", list(answered)))


class Link:
    """The engine's connection with h2's server end on the other side of the wire."""

    def __init__(self, **settings: int) -> None:
        self.transport = KeptWrites()
        self.wire = Wire(tls=None)
        self.wire.connection_made(self.transport)  # type: ignore[arg-type]
        self.books = Books()
        self.upstream = H2Upstream(self.wire, self.books)  # type: ignore[arg-type]
        self.server = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding=None)
        )
        self.server.initiate_connection()
        if settings:
            self.server.update_settings(
                {getattr(h2.settings.SettingCodes, name): v for name, v in settings.items()}
            )
        self.upstream.start()

    async def settle(self) -> list[h2.events.Event]:
        """Let both ends exchange what they have until neither has more; the origin's events."""
        events: list[h2.events.Event] = []
        for _ in range(8):
            for _ in range(4):
                await asyncio.sleep(0)
            data = b"".join(self.transport.writes)
            self.transport.writes.clear()
            if data:
                events += self.server.receive_data(data)
            back = self.server.data_to_send()
            if back:
                self.wire.data_received(back)
        return events

    def exchange(self, waiter_id: int, request: UpstreamRequest) -> asyncio.Task[H2Response]:
        return asyncio.create_task(self.upstream.exchange(waiter_id, request))


def get(path: bytes = b"/") -> UpstreamRequest:
    return UpstreamRequest(b"GET", b"https", b"origin.test", path, [])


def post(body: bytes) -> UpstreamRequest:
    return UpstreamRequest(b"POST", b"https", b"origin.test", b"/upload", [], body=body)


async def upload_waiting_for_window() -> tuple[Link, asyncio.Task[H2Response]]:
    """A 1,000-byte POST to an origin that lets 16 bytes per stream through: its exchange
    waits for a window."""
    link = Link(INITIAL_WINDOW_SIZE=16)
    await link.settle()
    task = link.exchange(1, post(b"b" * 1000))
    events = await link.settle()
    assert any(isinstance(e, h2.events.RequestReceived) for e in events)
    assert not task.done()
    return link, task


async def a_get_at_the_origin() -> tuple[Link, asyncio.Task[H2Response]]:
    """A GET that has reached the origin, which has not answered yet."""
    link = Link()
    await link.settle()
    task = link.exchange(1, get())
    await link.settle()
    return link, task


def answer_in_full(server: h2.connection.H2Connection, body: bytes) -> None:
    """The origin's whole response to stream 1, with its length."""
    server.send_headers(1, [(b":status", b"200"), (b"content-length", str(len(body)).encode())])
    server.send_data(1, body, end_stream=True)


async def the_connection_serves_the_next_request(link: Link) -> None:
    """A stream error left the connection serving: a GET on stream 3 gets its answer."""
    second = link.exchange(2, get(b"/next"))
    await link.settle()
    link.server.send_headers(3, [(b":status", b"200"), (b"content-length", b"2")])
    link.server.send_data(3, b"ok", end_stream=True)
    await link.settle()
    assert await body_of(second.result()) == b"ok"


async def body_of(response: H2Response) -> bytes:
    body = b""
    while chunk := await response.read():
        body += chunk
    return body


@pytest.mark.parametrize("code", [INTERNAL_ERROR, CANCEL])
async def test_a_reset_under_a_request_body_ends_the_exchange(code: int) -> None:
    link, task = await upload_waiting_for_window()
    link.server.reset_stream(1, code)
    await link.settle()
    # At once, not at the next window update or the read timeout; and as the pool was told.
    assert task.done()
    with pytest.raises(UpstreamError, match="origin reset the stream"):
        task.result()
    assert link.books.told == [("done", 1, True)]


async def test_an_answer_complete_while_a_held_body_waits_for_a_window_stands() -> None:
    # A POST held whole (not streamed) to an origin that answers in full (a 413) without
    # opening the window or resetting the stream: the answer is the exchange's, the rest of
    # the body stops with RST_STREAM CANCEL (RFC 9113 §8.1); it waited for a window that never
    # opened, until the read timeout's 504.
    link, task = await upload_waiting_for_window()
    answer_in_full(link.server, b"too large")
    events = await link.settle()
    assert task.done()
    assert await body_of(task.result()) == b"too large"
    events += await link.settle()
    assert [e.error_code for e in events if isinstance(e, h2.events.StreamReset)] == [CANCEL]
    assert link.books.told == [("done", 1, True)]
    await the_connection_serves_the_next_request(link)


async def test_a_complete_response_then_a_reset_stands() -> None:
    # RFC 9113 §8.1: an origin may answer before the request's end, then reset the stream with
    # NO_ERROR to stop the upload; the client must not throw the response away.
    link, task = await upload_waiting_for_window()
    link.server.send_headers(1, [(b":status", b"413"), (b"content-length", b"4")])
    link.server.send_data(1, b"nope", end_stream=True)
    link.server.reset_stream(1, NO_ERROR)
    await link.settle()
    assert task.done()
    response = task.result()
    assert response.status == 413
    assert await body_of(response) == b"nope"
    assert link.books.told == [("done", 1, True)]


async def test_a_refused_stream_under_a_body_goes_back_to_the_pool() -> None:
    link, task = await upload_waiting_for_window()
    link.server.reset_stream(1, REFUSED_STREAM)
    await link.settle()
    assert task.done()
    with pytest.raises(Unanswered):
        task.result()  # the engine waits for the pool's decision, which this report brings
    assert link.books.told == [("unanswered", [1], False)]


async def test_a_goaway_under_a_body_sends_the_request_elsewhere() -> None:
    link, task = await upload_waiting_for_window()
    link.server.close_connection(error_code=NO_ERROR, last_stream_id=0)
    events = await link.settle()
    assert task.done()
    with pytest.raises(Unanswered, match="GOAWAY"):
        task.result()
    assert link.books.told[:2] == [("goaway",), ("unanswered", [1], False)]
    assert link.upstream.h2.open_streams == 0  # closed on this side too,
    assert not any(isinstance(e, h2.events.StreamReset) for e in events)  # without a word


async def test_a_goaway_spares_a_stream_already_answered() -> None:
    # Its response head says the origin processed it, whatever the GOAWAY's last stream id:
    # sent again, an idempotent request would reach it twice.
    link, task = await a_get_at_the_origin()
    link.server.send_headers(1, [(b":status", b"200")])
    link.server.send_data(1, b"part")
    await link.settle()
    response = task.result()
    link.server.close_connection(error_code=NO_ERROR, last_stream_id=0)
    await link.settle()
    assert ("unanswered", [1], False) not in link.books.told
    assert await response.read() == b"part"


async def test_a_stream_past_the_origins_limit_is_never_sent() -> None:
    # The limit came (or was lowered) after the request was handed here: it goes elsewhere,
    # whatever its method, for not a byte of it left.
    link = Link(MAX_CONCURRENT_STREAMS=1)
    await link.settle()
    first = link.exchange(1, get())
    await link.settle()
    second = link.exchange(2, post(b"x"))
    events = await link.settle()
    assert second.done()
    with pytest.raises(Unanswered, match="limit"):
        second.result()
    assert link.books.told == [("unanswered", [2], True)]
    assert not any(isinstance(e, h2.events.RequestReceived) for e in events)
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)


async def test_a_request_that_breaks_after_its_head_is_reset() -> None:
    # A streamed body's trailers are checked only once it has ended, long after the head left:
    # the stream is reset, not left open at the origin for ever.
    link = Link()
    await link.settle()
    request = post(b"")

    async def body() -> AsyncIterator[bytes]:
        yield b"abc"
        request.trailers = [(b"x-t", b"a\r\nb")]

    request.body_stream = body()
    task = link.exchange(1, request)
    events = await link.settle()
    with pytest.raises(UpstreamError, match="line break"):
        task.result()
    assert link.upstream.h2.open_streams == 0
    assert any(isinstance(e, h2.events.StreamReset) for e in events)
    assert link.books.told == [("done", 1, True)]


async def test_a_malformed_response_fails_its_request_alone() -> None:
    # RFC 9113 §8.1.1: a stream error. The request was answered (badly): it is not sent again,
    # and the connection, which other clients' streams share, carries on.
    link, task = await a_get_at_the_origin()
    link.server.config.validate_outbound_headers = False
    link.server.config.normalize_outbound_headers = False
    link.server.send_headers(1, [(b":status", b"200"), (b"connection", b"close")])
    events = await link.settle()
    with pytest.raises(UpstreamError, match="malformed response from the origin: a connection"):
        task.result()
    assert [e.error_code for e in events if isinstance(e, h2.events.StreamReset)] == [0x1]
    assert link.books.told == [("done", 1, True)]
    await the_connection_serves_the_next_request(link)


async def test_a_window_update_of_0_under_a_body_fails_that_request_alone() -> None:
    # RFC 9113 §6.9: the stream's error. The origin has the request's head: never sent again;
    # the connection, which other clients' streams share, carries on.
    link, task = await upload_waiting_for_window()
    link.wire.data_received(struct.pack(">I B I I", 4 << 8 | 0x8, 0, 1, 0))
    events = await link.settle()
    with pytest.raises(UpstreamError, match="a WINDOW_UPDATE of 0 from the origin on stream 1"):
        task.result()
    assert [e.error_code for e in events if isinstance(e, h2.events.StreamReset)] == [0x1]
    assert link.books.told == [("done", 1, True)]
    await the_connection_serves_the_next_request(link)


async def test_a_head_that_breaks_in_its_own_read_never_reaches_the_client() -> None:
    # The head ends the stream but announces a body: malformed, found in the same read, so the
    # exchange fails rather than hand over a head whose response is already broken.
    link, task = await a_get_at_the_origin()
    link.server.config.validate_outbound_headers = False
    link.server.send_headers(1, [(b":status", b"200"), (b"content-length", b"5")], end_stream=True)
    await link.settle()
    with pytest.raises(UpstreamError, match="malformed response .* against a content-length"):
        task.result()
    assert link.books.told == [("done", 1, True)]


async def test_a_body_beyond_its_length_cuts_the_response_off() -> None:
    link, task = await a_get_at_the_origin()
    link.server.config.validate_outbound_headers = False
    link.server.send_headers(1, [(b":status", b"200"), (b"content-length", b"2")])
    await link.settle()
    response = task.result()  # the head has gone on to the client
    link.server.send_data(1, b"okay")
    await link.settle()
    with pytest.raises(UpstreamError, match="more body than its content-length"):
        await body_of(response)
    assert link.books.told == [("done", 1, True)]
    assert not link.upstream.closed


async def test_a_body_on_a_204_cuts_the_response_off() -> None:
    # RFC 9110 §6.4.1: a 204 has no content. Its head has gone on to the client; what the
    # origin sends after it must not: to an HTTP/1.1 client it would be the next response.
    link, task = await a_get_at_the_origin()
    link.server.send_headers(1, [(b":status", b"204")])
    await link.settle()
    response = task.result()
    forged = b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nEVIL"
    link.server.send_data(1, forged, end_stream=True)
    await link.settle()
    with pytest.raises(UpstreamError, match="a body in a 204 response, which has none"):
        await body_of(response)
    assert link.books.told == [("done", 1, True)]
    await the_connection_serves_the_next_request(link)


async def test_a_head_over_the_limit_fails_its_request_alone() -> None:
    # RFC 9113 §10.5.1: larger than the 64 KB this side announced. The origin answered: the
    # request is not sent again; the connection, which other clients' streams share, carries
    # on (it was closed, the request sent again and other streams on it cut off).
    link, task = await a_get_at_the_origin()
    big = [(b":status", b"200"), *((b"x-h%d" % n, b"v" * 700) for n in range(100))]
    link.server.send_headers(1, big)
    events = await link.settle()
    with pytest.raises(UpstreamError, match="a response head larger than 65536 bytes"):
        task.result()
    assert [e.error_code for e in events if isinstance(e, h2.events.StreamReset)] == [0x1]
    assert link.books.told == [("done", 1, True)]
    await the_connection_serves_the_next_request(link)


async def test_a_complete_response_outlives_its_connection() -> None:
    # The origin answered in full, then closed (nginx after keepalive_requests): the response,
    # not yet read, is delivered whole and ends cleanly.
    link, task = await a_get_at_the_origin()
    answer_in_full(link.server, b"whole")
    await link.settle()
    response = task.result()
    link.wire.eof_received()
    await link.settle()
    assert await body_of(response) == b"whole"
    assert link.books.told == [("done", 1, False), ("lost", [])]


async def test_a_response_completed_before_a_protocol_error_is_delivered() -> None:
    link, task = await a_get_at_the_origin()
    answer_in_full(link.server, b"ok")
    complete = link.server.data_to_send()
    bad_ping = b"\x00\x00\x05\x06\x00\x00\x00\x00\x00short"  # a PING must be 8 bytes long
    link.wire.data_received(complete + bad_ping)
    await link.settle()
    response = task.result()
    assert await body_of(response) == b"ok"
    assert ("done", 1, False) in link.books.told


def fill_windows(server: h2.connection.H2Connection, stream_ids: tuple[int, ...]) -> int:
    """The origin sends each stream as much as the windows let it; the bytes sent."""
    sent = 0
    for stream_id in stream_ids:
        while (room := server.local_flow_control_window(stream_id)) > 0:
            size = min(room, server.max_outbound_frame_size)
            server.send_data(stream_id, b"x" * size)
            sent += size
    return sent


async def four_responses_begun(link: Link) -> list[H2Response]:
    """Four GETs on the connection, each answered with a head (streams 1, 3, 5 and 7)."""
    await link.settle()
    tasks = [link.exchange(i, get(f"/{i}".encode())) for i in range(4)]
    await link.settle()
    for stream_id in (1, 3, 5, 7):
        link.server.send_headers(stream_id, [(b":status", b"200")])
    await link.settle()
    return [task.result() for task in tasks]


async def send_what_the_windows_allow(link: Link, stream_ids: tuple[int, ...]) -> None:
    """The origin sends the streams data until the windows let it send no more."""
    for _ in range(40):
        if not fill_windows(link.server, stream_ids):
            break
        await link.settle()


async def test_slow_readers_do_not_stall_the_other_streams() -> None:
    # Three clients read nothing of their large responses: each stream's window fills (6 MB),
    # 18 MB in all, more than the connection's window (16 MB). The connection's window came
    # back as the data arrived, so a fourth client's response still flows.
    link = Link()
    responses = await four_responses_begun(link)
    await send_what_the_windows_allow(link, (1, 3, 5))
    assert all(link.server.local_flow_control_window(s) == 0 for s in (1, 3, 5))
    assert link.server.local_flow_control_window(7) > 0
    link.server.send_data(7, b"still flowing", end_stream=True)
    await link.settle()
    assert await body_of(responses[3]) == b"still flowing"
    # What the slow readers left unread is theirs to take, whole.
    first = b""
    while len(first) < 6 << 20:
        first += await responses[0].read()
    assert len(first) == 6 << 20


async def test_what_a_connection_holds_unread_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    # Past UNREAD_HARD_LIMIT the connection's window waits for the readers too (here the
    # origin has sent what the windows allowed before it read that they shrank): slow readers
    # make it buffer at most that plus one connection window.
    monkeypatch.setattr(upstream_h2, "UNREAD_HARD_LIMIT", 1 << 20)
    link = Link()
    responses = await four_responses_begun(link)
    await send_what_the_windows_allow(link, (1, 3, 5, 7))
    unread = link.upstream._unread
    assert unread <= (1 << 20) + (16 << 20) + link.server.max_outbound_frame_size
    assert link.server.outbound_flow_control_window == 0  # the connection waits for readers
    for response in responses:
        response.abort()
    await link.settle()
    assert link.upstream._unread == 0
    assert link.server.outbound_flow_control_window > 0  # what nobody read came back


async def test_many_slow_readers_shrink_the_windows_and_the_others_still_flow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A dozen clients that stopped reading large downloads (a stream window each, 72 MB) took
    # the connection past UNREAD_LIMIT, and then its window stopped coming back: every other
    # client of the origin waited out the read timeout for a 502. Past the limit the streams'
    # windows shrink (SETTINGS_INITIAL_WINDOW_SIZE): the slow readers get nothing more, the
    # connection's window keeps coming back, the others flow.
    monkeypatch.setattr(upstream_h2, "UNREAD_LIMIT", 4 << 20)
    link = Link()
    responses = await four_responses_begun(link)
    fill_windows(link.server, (1,))  # one slow reader: 6 MB unread, past the limit
    await link.settle()
    assert link.upstream.h2.stream_window == upstream_h2.SQUEEZED_STREAM_WINDOW
    assert link.server.remote_settings.initial_window_size == upstream_h2.SQUEEZED_STREAM_WINDOW
    await send_what_the_windows_allow(link, (3, 5))  # two more: a squeezed window each
    unread = link.upstream._unread
    assert unread <= (6 << 20) + 2 * upstream_h2.SQUEEZED_STREAM_WINDOW
    assert link.server.outbound_flow_control_window > 0  # the connection's window came back
    # The fourth stream flows, a squeezed window at a time as its reader takes it.
    body = b"y" * (1 << 20)
    sent = 0
    got = b""
    for _ in range(40):
        room = min(link.server.local_flow_control_window(7), len(body) - sent)
        for at in range(sent, sent + room, link.server.max_outbound_frame_size):
            size = min(link.server.max_outbound_frame_size, sent + room - at)
            link.server.send_data(7, body[at : at + size], end_stream=at + size == len(body))
        sent += room
        await link.settle()
        while len(got) < sent:
            got += await responses[3].read()
        if sent == len(body):
            break
    assert got == body
    # The slow readers take theirs: once the connection holds less than half the limit
    # unread, the streams get their full windows back.
    for response in responses[:3]:
        response.abort()
    await link.settle()
    assert link.upstream._unread == 0
    assert link.upstream.h2.stream_window == upstream_h2.STREAM_WINDOW
    assert link.server.remote_settings.initial_window_size == upstream_h2.STREAM_WINDOW


async def test_a_stream_refused_between_the_chunks_of_a_body_goes_back_to_the_pool() -> None:
    # The body's source is between chunks (not waiting for a window) when the origin refuses
    # the stream, and the body ends after that: the pool was told "unanswered", and the
    # exchange says the same (any other error would fail a request the pool is sending again).
    link = Link()
    await link.settle()
    request = post(b"")
    more = asyncio.Event()

    async def body() -> AsyncIterator[bytes]:
        yield b"first"
        await more.wait()  # then the body ends: only END_STREAM is left to send

    request.body_stream = body()
    task = link.exchange(1, request)
    await link.settle()
    link.server.reset_stream(1, REFUSED_STREAM)
    await link.settle()
    more.set()
    await link.settle()
    with pytest.raises(Unanswered):
        task.result()
    assert link.books.told == [("unanswered", [1], False)]


@pytest.mark.parametrize("how", ["origin reset", "connection lost"])
async def test_a_streamed_body_stops_at_once_when_its_stream_is_gone(how: str) -> None:
    # The client pauses its upload; the stream goes meanwhile: the exchange ends then, not
    # when (if ever) the client sends its next chunk, and the body is closed.
    link = Link()
    await link.settle()
    request = post(b"")
    paused = asyncio.Event()
    closed = []

    async def body() -> AsyncIterator[bytes]:
        try:
            yield b"first"
            await paused.wait()  # never set
            yield b"second"
        finally:
            closed.append(True)

    request.body_stream = body()
    task = link.exchange(1, request)
    await link.settle()
    assert not task.done()
    if how == "origin reset":
        link.server.reset_stream(1, INTERNAL_ERROR)
    else:
        link.wire.connection_lost(None)
    await link.settle()
    assert task.done() and closed == [True]
    with pytest.raises(UpstreamError):
        task.result()


async def test_a_kept_response_its_reader_abandons_gives_the_window_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(upstream_h2, "UNREAD_HARD_LIMIT", 0)  # every byte owed to the connection
    link, task = await upload_waiting_for_window()
    link.server.send_headers(1, [(b":status", b"413"), (b"content-length", b"4")])
    link.server.send_data(1, b"nope", end_stream=True)
    link.server.reset_stream(1, NO_ERROR)
    await link.settle()
    response = task.result()
    assert link.upstream._unread == 4
    owed_before = link.upstream.h2._connection_unacknowledged
    response.abort()  # the client left before reading it
    await link.settle()
    assert link.upstream._unread == 0
    assert link.upstream.h2._connection_unacknowledged == owed_before + 4
    assert link.books.told == [("done", 1, True)]  # reported once


def streamed_post(
    more: asyncio.Event, closed: list[bool], *, broken: bool = False
) -> UpstreamRequest:
    """A POST whose body sends "first", then waits for `more`, then sends "second" (or breaks,
    if `broken`); `closed` gets True when the body is closed."""
    request = post(b"")

    async def body() -> AsyncIterator[bytes]:
        try:
            yield b"first"
            await more.wait()
            if broken:
                raise RuntimeError("the client's body broke")
            yield b"second"
        finally:
            closed.append(True)

    request.body_stream = body()
    return request


def data_of(events: list[h2.events.Event]) -> bytes:
    return b"".join(e.data for e in events if isinstance(e, h2.events.DataReceived))


async def test_a_streamed_bodys_answer_is_handed_over_while_the_body_still_goes() -> None:
    # Full duplex (a gRPC stream): the head goes to the client at once, the body goes on, and
    # the wait for the answer is timed only from the body's end (`sent`).
    link = Link()
    await link.settle()
    more, closed, sent = asyncio.Event(), [], []
    request = streamed_post(more, closed)
    request.on_sent = lambda: sent.append(True)
    task = link.exchange(1, request)
    assert data_of(await link.settle()) == b"first"
    link.server.send_headers(1, [(b":status", b"200")])
    await link.settle()
    assert task.done()
    response = task.result()
    assert response.status == 200 and sent == []
    more.set()
    events = await link.settle()
    assert data_of(events) == b"second"
    assert any(isinstance(e, h2.events.StreamEnded) for e in events)
    assert sent == [True] and closed == [True]
    link.server.send_data(1, b"done", end_stream=True)
    await link.settle()
    assert await body_of(response) == b"done"
    assert link.books.told == [("done", 1, True)]


async def test_an_answer_complete_before_the_bodys_end_stops_the_body() -> None:
    # The origin ends its response (a gRPC status) while the client's stream is open: the rest
    # of the body can change nothing; the stream is reset (CANCEL), not left half-open at the
    # origin, the body is closed, and the connection goes on.
    link = Link()
    await link.settle()
    more, closed = asyncio.Event(), []
    task = link.exchange(1, streamed_post(more, closed))
    await link.settle()
    answer_in_full(link.server, b"ok")
    await link.settle()
    assert await body_of(task.result()) == b"ok"
    events = await link.settle()
    assert [e.error_code for e in events if isinstance(e, h2.events.StreamReset)] == [CANCEL]
    assert closed == [True]
    assert link.books.told == [("done", 1, True)]
    await the_connection_serves_the_next_request(link)


async def streamed_upload_waiting_for_window() -> tuple[Link, asyncio.Task[H2Response]]:
    """A streamed 1,000-byte POST to an origin that lets 16 bytes per stream through: its
    head handed over to the origin, its body's sender waits for a window."""
    link = Link(INITIAL_WINDOW_SIZE=16)
    await link.settle()
    request = post(b"")

    async def body() -> AsyncIterator[bytes]:
        yield b"b" * 1000

    request.body_stream = body()
    task = link.exchange(1, request)
    assert data_of(await link.settle()) == b"b" * 16
    return link, task


async def test_an_answer_complete_while_the_body_waits_for_a_window_stops_the_body() -> None:
    # The origin lets 16 bytes through and answers in full (a gRPC status) without reading
    # more: the body's sender, waiting for a window that will never open, ends with the
    # stream, not whenever an unrelated frame happens to open a window.
    link, task = await streamed_upload_waiting_for_window()
    answer_in_full(link.server, b"ok")
    await link.settle()
    response = task.result()
    assert await body_of(response) == b"ok"
    await link.settle()
    assert response._sender is not None and response._sender.done()
    assert link.books.told == [("done", 1, True)]


async def test_a_reset_while_the_body_waits_for_a_window_leaves_no_error_unread() -> None:
    # The reset wakes the body's sender first; the exchange fails with the reset, and the
    # head's failure, which says the same, is looked at too (no "Future exception was never
    # retrieved" in the log when it is collected).
    unread: list[dict[str, object]] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: unread.append(context))
    link, task = await streamed_upload_waiting_for_window()
    link.server.reset_stream(1, 2)  # INTERNAL_ERROR
    await link.settle()
    with pytest.raises(UpstreamError):
        await task
    del task
    gc.collect()
    await asyncio.sleep(0)
    assert unread == []


async def test_a_body_that_breaks_after_the_head_cuts_the_response_off() -> None:
    link = Link()
    await link.settle()
    more, closed = asyncio.Event(), []
    task = link.exchange(1, streamed_post(more, closed, broken=True))
    await link.settle()
    link.server.send_headers(1, [(b":status", b"200")])
    await link.settle()
    response = task.result()
    more.set()
    events = await link.settle()
    assert [e.error_code for e in events if isinstance(e, h2.events.StreamReset)] == [CANCEL]
    with pytest.raises(UpstreamError, match="error sending the request body: the client's"):
        await response.read()
    assert closed == [True]
    assert link.books.told == [("done", 1, True)]
    await the_connection_serves_the_next_request(link)
