"""One HTTP/2 connection to an origin, carrying requests from any number of clients at once.

The protocol state is reshape/upstream/http2.py's (sans-IO); this module does the I/O around it:
one reader task per connection dispatches frames to per-stream queues, and senders wait for
flow-control windows. Received data gives the connection's window back as it arrives and the
stream's only when the client side has taken it, so a slow client throttles its own stream and
nothing else: its unread data (at most a stream window) does not hold the connection's window
that every other stream shares. What the connection keeps unread is bounded all the same: past
UNREAD_LIMIT the streams' windows shrink to SQUEEZED_STREAM_WINDOW (a SETTINGS frame), so that
streams whose readers have stopped get nothing more while the others flow, a window of that size
at a time; and past UNREAD_HARD_LIMIT the connection's window waits for the readers too.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import importlib.metadata
import logging
import time

from hpack import NeverIndexedHeaderTuple

from reshape.base.errors import ReshapeError
from reshape.upstream.body_reader import BodyAbandoned, BodyReader
from reshape.upstream.hpack_decoder import HeadDecoder
from reshape.upstream.hpack_encoder import RequestHeadEncoder
from reshape.upstream.http2 import (
    CANCEL,
    NO_ERROR,
    REFUSED_STREAM,
    ClientConnection,
    ConnectionTerminated,
    DataReceived,
    Event,
    InformationalResponse,
    ProtocolError,
    ResponseReceived,
    SettingsChanged,
    StreamEnded,
    StreamIdsExhausted,
    StreamReset,
    TrailersReceived,
    WindowUpdated,
    error_name,
)
from reshape.upstream.types import (
    HOP_BY_HOP,
    ConnectionListener,
    Headers,
    Unanswered,
    UpstreamError,
    UpstreamRequest,
    holds_line_break_or_nul,
)
from reshape.upstream.wire import Wire, WireError

log = logging.getLogger("reshape.upstream")

# Our receive windows: large enough that one stream can fill a fast link, small enough to bound
# what one slow client can make us buffer. Chromium's own (6 MB per stream, 15 MB per
# connection): with 1 MB a stream moved at most 1 MB per round trip, and at 200 ms RTT the lab
# (bench/lab run plt, large images over one HTTP/2 connection) took twice as long as direct.
STREAM_WINDOW = 6 << 20
CONNECTION_WINDOW = 16 << 20
# Unread bytes a connection holds (all its streams) before arriving data stops giving the
# connection's window back at once: with it, slow readers can make a connection buffer at most
# this plus one connection window, and below it they cannot stall the connection's other
# streams (three readers holding a stream window each would, with the connection's window
# given back on reads alone).
UNREAD_LIMIT = 2 * CONNECTION_WINDOW
# Past UNREAD_LIMIT each stream may receive this much beyond what its reader has taken (a
# SETTINGS_INITIAL_WINDOW_SIZE of it), until what the connection holds unread is down to half
# UNREAD_LIMIT. Without it, a dozen clients that stopped reading large downloads (each holding a
# stream window, 72 MB) took the connection past UNREAD_LIMIT and its window with it: every
# other client of the origin waited out the read timeout for a 502.
SQUEEZED_STREAM_WINDOW = 256 << 10
# Past this, arriving data no longer gives the connection's window back: what the origin sent
# before it read the smaller windows, or an origin that ignores them, is bounded too.
UNREAD_HARD_LIMIT = UNREAD_LIMIT + CONNECTION_WINDOW
# Servers that announce no limit get this many concurrent streams from us.
DEFAULT_MAX_STREAMS = 100
# A request handed over waits at most this long (of the proxy's own work on other requests) for
# others to share its write; then what has gathered leaves at once. See `H2Upstream._flush_soon`.
# Measured (bench/RESULTS.md, 2026-11-24): a write per request loaded the lab's app page no
# faster and cost ~3% more CPU per request under a steady load; 1 ms cost as much; 3 ms ~1%.
COALESCE_SECONDS = 0.003


class _StreamClosed(Exception):
    """A stream closed while its request body was going out (`H2Upstream._send_body`)."""


def _retrieved(task: asyncio.Future[None]) -> None:
    if not task.cancelled():
        task.exception()


class H2Response:
    """The response on one stream. Body chunks are acknowledged to the server as they are read."""

    http_version = "HTTP/2"

    def __init__(self, connection: H2Upstream, stream_id: int) -> None:
        self._connection = connection
        self.stream_id = stream_id
        self.status = 0
        self.reason = b""
        self.headers: Headers = []
        self.trailers: Headers = []
        self.head: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.request: UpstreamRequest | None = None  # told of 1xx responses (`interim`)
        # (data, its flow-controlled size, what of it the connection's window still owes)
        self._chunks: collections.deque[tuple[bytes, int, int]] = collections.deque()
        self._ended = False
        self._error: Exception | None = None
        # Made when a read has to wait: most responses have arrived whole by their first read.
        self._readable: asyncio.Event | None = None
        # Made by a streamed request body's pump (`_send_streamed_body`): set once the stream
        # is gone on this side.
        self._gone: asyncio.Event | None = None
        # A streamed body still going out after the head was handed over (full duplex).
        self._sender: asyncio.Future[None] | None = None
        self.finished = False

    async def read(self) -> bytes:
        while not self._chunks:
            if self._error is not None:
                raise self._error
            if self._ended:
                self._connection._stream_finished(self, reusable=True)
                return b""
            if self._readable is None:
                self._readable = asyncio.Event()
            self._readable.clear()
            await self._readable.wait()
        data, flow_controlled, owed = self._chunks.popleft()
        self._connection._taken(self.stream_id, flow_controlled, owed)
        return data

    def read_nowait(self) -> bytes | None:
        """As `read`, but None at once when nothing more has arrived yet."""
        if not self._chunks:
            if self._error is not None:
                raise self._error
            if not self._ended:
                return None
            self._connection._stream_finished(self, reusable=True)
            return b""
        data, flow_controlled, owed = self._chunks.popleft()
        self._connection._taken(self.stream_id, flow_controlled, owed)
        return data

    def abort(self) -> None:
        self._connection._cancel_stream(self)

    # called by the connection's reader

    def _fail(self, error: Exception) -> None:
        self._error = error
        if not self.head.done():
            self.head.set_exception(error)
        self._wake()

    def _wake(self) -> None:
        """Tell a waiting `read` that something has arrived or ended."""
        if self._readable is not None:
            self._readable.set()


# The hpack releases `IndexedHeaderTable` (reshape/upstream/hpack_table.py) extends the table
# of, `RequestHeadEncoder` (reshape/upstream/hpack_encoder.py) the encoder and `HeadDecoder`
# (reshape/upstream/hpack_decoder.py) the decoder: they override private methods, so any other
# release is refused at start-up (`check_hpack_version`).
HPACK_CHECKED_ON = ("4.2.0",)


class HpackVersionError(ReshapeError):
    """The installed hpack is not one the engine's HTTP/2 coders were checked on."""


def check_hpack_version() -> None:
    version = importlib.metadata.version("hpack")
    if version not in HPACK_CHECKED_ON:
        raise HpackVersionError(
            f"reshape's HTTP/2 upstream connection was checked on hpack "
            f"{', '.join(HPACK_CHECKED_ON)}, not {version}: pin hpack or re-check "
            "reshape/upstream/hpack_table.py, hpack_encoder.py, hpack_decoder.py"
        )


# Kept out of HPACK's dynamic table (RFC 7541 §7.1.3), as h2 and nghttp2 do: the table is shared
# by every client of the pooled connection, so one client must not learn another's credentials
# from the lengths of its own requests.
_SECRET = frozenset({b"authorization"})  # Proxy-Authorization is hop-by-hop: never sent
_SHORT_COOKIE = 20


def outbound_fields(fields: Headers) -> list[tuple[bytes, bytes]]:
    """Request fields as an HTTP/2 header block takes them: lower-case names, values without
    surrounding whitespace, no connection-specific or pseudo fields, credentials never indexed.
    What h2's outbound normalisation and validation do, in one pass over fields that came from
    a parser that already refused control characters. Plain tuples but for the never-indexed
    ones: hpack's HeaderTuple is built in Python, and h2 builds each one again on sending."""
    ready: list[tuple[bytes, bytes]] = []
    for name, value in fields:
        name = name.lower()
        # Connection-specific fields h2 would refuse (RFC 9113 §8.2.2) are hop-by-hop ones;
        # `te` is added by the engine itself, as `trailers`, the only value allowed.
        if name in HOP_BY_HOP or name.startswith(b":") or not name:
            continue
        value = value.strip(b" \t")
        if holds_line_break_or_nul(value) or holds_line_break_or_nul(name):
            raise ProtocolError(f"field {name!r} holds a line break or NUL")
        if name in _SECRET or (name == b"cookie" and len(value) < _SHORT_COOKIE):
            ready.append(NeverIndexedHeaderTuple(name, value))
        else:
            ready.append((name, value))
    return ready


def origin_connection() -> ClientConnection:
    """The protocol state of one connection to an origin, as `H2Upstream` uses it: reshape's
    HPACK coders, our windows and stream limit."""
    return ClientConnection(
        encoder=RequestHeadEncoder(),
        decoder=HeadDecoder(),
        stream_window=STREAM_WINDOW,
        connection_window=CONNECTION_WINDOW,
        max_concurrent_streams=1000,
    )


class H2Upstream:
    """A client-side HTTP/2 connection; `exchange()` opens one stream per request."""

    def __init__(self, wire: Wire, listener: ConnectionListener) -> None:
        self.wire = wire
        self.h2 = origin_connection()
        self._streams: dict[int, H2Response] = {}
        self._waiter_of: dict[int, int] = {}  # stream id → pool waiter id
        self._window_open = asyncio.Event()
        self._unread = 0  # flow-controlled bytes received and not yet read, all streams
        self.listener = listener
        self.goaway_received = False
        self._reader: asyncio.Task[None] | None = None
        self.closed = False
        self._flush_scheduled = False
        self._unsent_since: float | None = None  # when what h2 holds began to wait, if it does
        self._lost_reported = False
        self.settings_received = asyncio.Event()
        # The waiter of a stream opened before the origin's SETTINGS arrived: the one request
        # that a connection lost before the origin said anything may have been the cause of.
        # Once they have arrived the connection is proven (Chromium's SpdySession::IsReused).
        self.first_sent: int | None = None

    def start(self) -> None:
        self.h2.initiate()
        self._flush()
        self._reader = asyncio.create_task(self._read_loop(), name="h2 upstream reader")

    @property
    def max_streams(self) -> int:
        announced = self.h2.remote_max_concurrent_streams
        return DEFAULT_MAX_STREAMS if announced is None or announced > 2**20 else announced

    def _flush_soon(self) -> None:
        """Send what h2 has soon: at the end of this turn of the event loop, or at once if
        something has waited COALESCE_SECONDS already. Requests handed over close together leave
        in one write (one TLS record, one system call), yet a burst of them (a browser's 48 image
        requests, read in one piece and turned into requests one by one, ~0.5 ms each) does not
        wait for the whole turn: its first requests are on the way while the proxy works on the
        rest, and their responses come back while it works on those. Any `_flush` sends
        everything, in order: h2 keeps one outgoing buffer."""
        now = time.monotonic()
        if self._unsent_since is None:
            self._unsent_since = now
        elif now - self._unsent_since >= COALESCE_SECONDS:
            self._flush()
            return
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._scheduled_flush)

    def _scheduled_flush(self) -> None:
        self._flush_scheduled = False
        self._flush()

    def _flush(self) -> None:
        self._unsent_since = None
        data = self.h2.data_to_send()
        if data and not self.closed:
            # On failure the reader task sees the close and fails the streams.
            with contextlib.suppress(WireError):
                self.wire.write(data)

    async def exchange(self, waiter_id: int, request: UpstreamRequest) -> H2Response:
        if self.closed or self.goaway_received:
            # Nothing of it left: whatever its method, it can go on another connection.
            self.listener.unanswered([waiter_id], never_sent=True)
            raise Unanswered("connection closed before the request was sent")
        try:
            stream_id = self.h2.next_stream_id()
        except StreamIdsExhausted:
            # A connection's last stream: it takes no more, and this request goes elsewhere.
            self.goaway_received = True
            self.listener.goaway()
            self.listener.unanswered([waiter_id], never_sent=True)
            raise Unanswered("no stream ids left on the connection") from None
        if not self.h2.may_open_stream():
            # The origin's stream limit, announced (or lowered) after this request was handed
            # here: not a byte of it left, and the pool knows the limit now.
            self.listener.unanswered([waiter_id], never_sent=True)
            raise Unanswered("the origin's limit of concurrent streams is reached")
        response = H2Response(self, stream_id)
        response.request = request
        self._streams[stream_id] = response
        self._waiter_of[stream_id] = waiter_id
        if stream_id == 1 and not self.settings_received.is_set():
            self.first_sent = waiter_id
        try:
            headers = [
                (b":method", request.method),
                (b":scheme", request.scheme),
                (b":authority", request.authority),
                (b":path", request.target),
                *outbound_fields(request.headers),
                # The engine reads trailers, so it says so: some origins (gRPC, hypercorn) send
                # them only then.
                (b"te", b"trailers"),
            ]
            trailers = outbound_fields(request.trailers)
            has_body = bool(request.body) or request.body_stream is not None
            self.h2.send_headers(stream_id, headers, end_stream=not has_body and not trailers)
            if request.body_stream is None:
                if has_body or trailers:
                    await self._send_rest(response, request)
                else:
                    request.sent()
                # Head and body go out in one write when the windows allow it, with the
                # requests handed over close to it.
                self._flush_soon()
                await response.head
            else:
                await self._head_while_sending(response, request)
            if response._error is not None:
                # It broke in the read that brought its head (a malformed response, a reset):
                # nothing of it has gone to the client, which gets the error instead.
                raise response._error
        except _StreamClosed:
            # The stream closed under its body. The origin reset it or went away (the pool has
            # been told what became of the request; its error says the same), or it had
            # answered in full first: a complete response stands (RFC 9113 §8.1).
            if response.head.done() and not response.head.cancelled():
                response.head.exception()  # looked at: the error below says it
            if response._error is not None:
                raise response._error from None
            if not response._ended:
                raise UpstreamError("the stream closed while the request was sent") from None
        except ProtocolError as e:
            forgotten = self._forget(stream_id)
            if forgotten is None and response._error is not None:
                raise response._error from None  # it had ended, as the pool was told
            self._drop_unread(response)
            response.finished = True
            if forgotten is not None:
                self.listener.request_done(waiter_id, True)
            if not self.closed:
                self.h2.reset_stream(stream_id, CANCEL)  # its head may have gone out
                self._flush()
            raise UpstreamError(f"HTTP/2 error sending the request: {e}") from None
        except asyncio.CancelledError:
            self._cancel_stream(response)  # RST_STREAM, and the stream slot goes back
            raise
        return response

    async def _send_rest(self, response: H2Response, request: UpstreamRequest) -> None:
        """The request's body (whole, or streamed as the client sends it), then its trailers or
        END_STREAM; `request.sent()` once all of it is out. _StreamClosed if the stream closes
        first."""
        stream_id = response.stream_id
        if request.body:
            await self._send_body(response, request.body)
        if request.body_stream is not None:
            await self._send_streamed_body(response, request)
        if stream_id not in self._streams or self.closed:
            raise _StreamClosed  # it closed between the body's chunks, or after the last
        # A streamed body's trailers are known only once it has ended.
        trailers = outbound_fields(request.trailers)
        if trailers:
            self.h2.send_headers(stream_id, trailers, end_stream=True)
        else:
            self.h2.end_stream(stream_id)
        self._flush_soon()
        request.sent()

    async def _head_while_sending(self, response: H2Response, request: UpstreamRequest) -> None:
        """Full duplex, as HTTP/2 allows: a streamed body keeps going out in a task of its own
        while the exchange waits for the response head, and the head is handed over as soon as
        it arrives, the body still going. A gRPC stream's answers interleave with its requests,
        and a client that waits for an answer before it sends more would wait for ever if the
        head waited for the body's end. Errors of the body before the head are the exchange's
        (as if it had been sent inline); after it, `_body_sent` makes them the response's."""
        sender = asyncio.ensure_future(self._send_rest(response, request))
        # Whatever becomes of the exchange, the task's end is looked at (no "exception never
        # retrieved"): its failure counts below, or in `_body_sent`, or not at all once the
        # exchange has failed or been cancelled.
        sender.add_done_callback(_retrieved)
        try:
            await asyncio.wait((response.head, sender), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            sender.cancel()
            raise
        if sender.done():
            sender.result()  # its failure is the exchange's
            await response.head
            return
        if response.head.exception() is not None:
            # The stream failed before its head (reset, refused, lost, a GOAWAY): whatever
            # failed it told the body to stop (`_forget`); the exchange ends with the failure.
            sender.cancel()
            # Its end, whatever it is, is looked at by `_retrieved`; a cancellation of the
            # exchange itself meanwhile still ends the exchange.
            await asyncio.wait((sender,))
            await response.head
            return
        response._sender = sender
        sender.add_done_callback(lambda done: self._body_sent(response, done))

    def _body_sent(self, response: H2Response, sender: asyncio.Future[None]) -> None:
        """The end of a body that went on sending after its response head was handed over."""
        if sender.cancelled():
            return
        error = sender.exception()
        if error is None or isinstance(error, _StreamClosed):
            return  # the stream's own end (reset, lost, answered in full) says what became of it
        # The codec refused what was sent (or the body's source broke): the response is cut
        # off, as if the origin had broken it, and the stream goes.
        stream_id = response.stream_id
        waiter_id = self._forget(stream_id)
        self._drop_unread(response)
        response.finished = True
        if waiter_id is not None:
            self.listener.request_done(waiter_id, True)
        if not self.closed:
            self.h2.reset_stream(stream_id, CANCEL)
            self._flush()
        log.warning("HTTP/2 origin %s: the request body broke off: %s", self._peer(), error)
        response._fail(UpstreamError(f"error sending the request body: {error}"))

    async def _send_body(self, response: H2Response, data: bytes) -> None:
        """Send `data` on the response's stream as the windows allow; _StreamClosed if the
        stream closes first (whatever closes it sets `_window_open`, to wake the wait here)."""
        stream_id = response.stream_id
        view = memoryview(data)
        while view:
            if self.closed or stream_id not in self._streams:
                raise _StreamClosed
            if response._ended and response._gone is None:
                # A held body answered in full while it waited for a window (a 413 from an
                # origin that leaves the window shut): the rest can change nothing (RFC 9113
                # §8.1), so it stops with RST_STREAM CANCEL, and the answer stands. (A streamed
                # body's answer was handed over already; its sender stops with the stream.)
                self.h2.reset_stream(stream_id, CANCEL)
                self._flush()
                raise _StreamClosed
            window = self.h2.send_window_of(stream_id)
            if window <= 0:
                self._flush()
                self._window_open.clear()
                await self._window_open.wait()
                continue
            self.h2.send_data(stream_id, bytes(view[:window]))
            view = view[window:]
        # A streamed body's chunks leave as they come, not when the window or the body ends.
        self._flush_soon()

    async def _send_streamed_body(self, response: H2Response, request: UpstreamRequest) -> None:
        """A streamed body's chunks, sent as the client sends them; _StreamClosed as soon as
        the stream is gone on this side (reset, refused, its connection lost), without waiting
        for the client's next chunk (reshape/upstream/body_reader.py)."""
        assert request.body_stream is not None
        stream_id = response.stream_id
        gone = response._gone = asyncio.Event()
        # The head leaves in this turn of the event loop, whether or not a chunk is there to go
        # with it: an exchange whose origin speaks first (a gRPC subscription) waits for the
        # origin, and its client for the origin's first word, before the client sends a byte.
        # A chunk already buffered still leaves in the same write as the head.
        self._flush_soon()
        reader = BodyReader(request.body_stream, request.waiting_for_client)
        try:
            while (
                chunk := await reader.next(
                    gone, lambda: self.closed or stream_id not in self._streams
                )
            ) is not None:
                await self._send_body(response, chunk)
        except BodyAbandoned:
            raise _StreamClosed from None
        finally:
            await reader.close()

    def _acknowledge(self, stream_id: int, size: int) -> None:
        if size and not self.closed:
            self.h2.acknowledge_received_data(size, stream_id)
            self._flush()

    def _taken(self, stream_id: int, size: int, owed: int) -> None:
        """A reader took `size` bytes of the stream's: its window opens again (and the
        connection's, by what it still `owed`)."""
        self._unread -= size
        if not self.closed:
            self.h2.acknowledge_stream_data(size, stream_id)
            self.h2.acknowledge_connection_data(owed)
            self._unsqueeze()
            self._flush()

    def _drop_unread(self, response: H2Response) -> None:
        """Throw away what nobody will read: the connection's window gets back what it was
        still owed (the stream has ended or is reset: its own window no longer matters)."""
        owed = 0
        for _, size, owed_here in response._chunks:
            self._unread -= size
            owed += owed_here
        response._chunks.clear()
        if not self.closed and (owed or self._unsqueeze()):
            self.h2.acknowledge_connection_data(owed)
            self._flush()

    def _unsqueeze(self) -> bool:
        """Streams get their full windows back once the readers have taken what the connection
        held unread down to half UNREAD_LIMIT; True if they did now."""
        if self.h2.stream_window == STREAM_WINDOW or self._unread > UNREAD_LIMIT // 2:
            return False
        self.h2.set_stream_window(STREAM_WINDOW)
        return True

    def _cancel_stream(self, response: H2Response) -> None:
        if response.stream_id in self._streams and not self.closed:
            self.h2.reset_stream(response.stream_id, CANCEL)
            self._flush()
        self._stream_finished(response, reusable=True)

    def _stream_finished(self, response: H2Response, *, reusable: bool) -> None:
        sender = response._sender
        if sender is not None and not sender.done() and not self.closed:
            # The response is complete (or abandoned) while its request body still goes out:
            # the rest can change nothing (RFC 9113 §8.1), so it stops with RST_STREAM CANCEL
            # rather than leave the origin a half-open stream; the task ends when `_release`
            # tells it the stream is gone (`_forget`).
            self.h2.reset_stream(response.stream_id, CANCEL)
            self._flush()
        # Data nobody will read still counts against the connection's window: give it back,
        # or every abandoned stream would shrink the window until the connection stalls. Also
        # for a response already finished with the stream (one kept after a reset) that its
        # reader abandons.
        self._drop_unread(response)
        self._release(response, reusable=reusable)

    def _release(self, response: H2Response, *, reusable: bool) -> None:
        """The stream is done with (its response may still be read): its slot goes back to the
        pool, once, and a draining connection closes after its last stream."""
        if response.finished:
            return
        response.finished = True
        waiter_id = self._forget(response.stream_id)
        if waiter_id is not None:
            self.listener.request_done(waiter_id, reusable)
        if self.goaway_received and not self._streams:
            self.close()

    def _peer(self) -> str:
        peer = self.wire.transport.get_extra_info("peername") if self.wire.transport else None
        return f"{peer[0]}:{peer[1]}" if peer else "?"

    def _forget(self, stream_id: int) -> int | None:
        response = self._streams.pop(stream_id, None)
        if response is not None and response._gone is not None:
            # Its streamed body stops, whether it waits for the client's next chunk (`_gone`)
            # or for a window that may never open (`_window_open`; the others waiting for one
            # look again and wait on).
            response._gone.set()
            self._window_open.set()
        return self._waiter_of.pop(stream_id, None)

    async def _read_loop(self) -> None:
        error: Exception = UpstreamError("connection closed by the origin")
        try:
            while True:
                data = await self.wire.read()
                if not data:
                    break
                try:
                    events = self.h2.receive_data(data)
                except ProtocolError as e:
                    error = UpstreamError(f"HTTP/2 protocol error from the origin: {e}")
                    log.warning("HTTP/2 origin %s: %s; its connection is closed", self._peer(), e)
                    # What the frames before the broken one said still holds: a response
                    # they completed is delivered, a GOAWAY they carried is obeyed.
                    for event in e.events:
                        self._handle(event)
                    self._flush()
                    break
                for event in events:
                    self._handle(event)
                self._flush()
                if not self.wire.write_buffer_size():
                    self.h2.output_taken()  # it reads what it made us answer: no flood
        except WireError as e:
            error = UpstreamError(str(e))
        finally:
            self._lost(error)

    def _handle(self, event: Event) -> None:
        if type(event) is ResponseReceived:
            response = self._streams.get(event.stream_id)
            if response is None:
                return
            response.status = event.status
            response.headers = event.headers
            if not response.head.done():
                response.head.set_result(None)
        elif type(event) is InformationalResponse:
            response = self._streams.get(event.stream_id)
            if response is not None and response.request is not None:
                response.request.interim(event.status, event.headers)
        elif type(event) is DataReceived:
            response = self._streams.get(event.stream_id)
            if response is None or not event.data:
                # Nobody reads it, or nothing to read (an empty DATA frame ending the stream,
                # padding): give the window back now; b"" must never reach read()'s caller.
                self._acknowledge(event.stream_id, event.flow_controlled_length)
                return
            size = event.flow_controlled_length
            self._unread += size
            if self._unread <= UNREAD_HARD_LIMIT:
                self.h2.acknowledge_connection_data(size)  # sent with this read's other frames
                response._chunks.append((event.data, size, 0))
            else:
                response._chunks.append((event.data, size, size))
            if self._unread > UNREAD_LIMIT:
                self.h2.set_stream_window(SQUEEZED_STREAM_WINDOW)  # once: then a no-op
            response._wake()
        elif type(event) is TrailersReceived:
            response = self._streams.get(event.stream_id)
            if response is not None:
                response.trailers = event.headers
        elif type(event) is StreamEnded:
            response = self._streams.get(event.stream_id)
            if response is not None:
                response._ended = True
                response._wake()
                self._window_open.set()  # a body waiting for the window stops (`_send_body`)
        elif type(event) is StreamReset:
            response = self._streams.get(event.stream_id)
            if response is not None:
                self._window_open.set()  # a body waiting for the window stops (`_send_body`)
                if response._ended and response._error is None:
                    # After its response ended (RFC 9113 §8.1: NO_ERROR asks to stop sending
                    # the request): the response stands; the stream's slot goes back.
                    self._release(response, reusable=True)
                    return
                refused = event.error_code == REFUSED_STREAM and not response.head.done()
                if event.reset_here:
                    # This side reset it: an answer, if a broken one, so never sent again.
                    log.warning("HTTP/2 origin %s: %s", self._peer(), event.reset_here)
                    error = UpstreamError(event.reset_here)
                else:
                    error = (Unanswered if refused else UpstreamError)(
                        f"origin reset the stream ({error_name(event.error_code)})"
                    )
                response._fail(error)
                self._drop_unread(response)
                response.finished = True
                waiter_id = self._forget(event.stream_id)
                if waiter_id is not None:
                    if refused:
                        self.listener.unanswered([waiter_id])
                    else:
                        self.listener.request_done(waiter_id, True)
        elif type(event) is WindowUpdated:
            self._window_open.set()
        elif type(event) is SettingsChanged:
            self._window_open.set()
            self.settings_received.set()
            if event.max_concurrent_streams_changed:
                self.listener.max_streams_changed(self.max_streams)
        elif type(event) is ConnectionTerminated:
            self._goaway(event.last_stream_id, event.error_code)

    def _goaway(self, last_stream_id: int, error_code: int) -> None:
        """Streams above `last_stream_id` were never processed: they go again elsewhere."""
        self.goaway_received = True
        self.listener.goaway()
        # A stream with a response head was processed, whatever the GOAWAY says: its
        # response goes on (sent again, it could reach the origin twice).
        unprocessed = [
            sid
            for sid, response in self._streams.items()
            if sid > last_stream_id and not response.head.done()
        ]
        waiters = []
        if unprocessed:
            self._window_open.set()  # their bodies stop going out (`_send_body`)
        for stream_id in unprocessed:
            response = self._streams[stream_id]
            self.h2.forget_stream(stream_id)  # closed on this side too
            response._fail(Unanswered(f"origin sent GOAWAY ({error_name(error_code)})"))
            waiter_id = self._forget(stream_id)
            if waiter_id is not None:
                waiters.append(waiter_id)
        if waiters:
            self.listener.unanswered(waiters)
        if error_code != NO_ERROR:
            # An error GOAWAY: the server is tearing the connection down; do not wait for
            # streams it may never finish.
            self._lost(UpstreamError(f"origin sent GOAWAY ({error_name(error_code)})"))
        elif not self._streams:
            self.close()

    def _lost(self, error: Exception) -> None:
        """The connection is gone: streams with a response head end with an error, the rest
        go back to the pool as unanswered."""
        if self._lost_reported:
            return
        self._lost_reported = True
        self.closed = True
        self._window_open.set()
        answered = []
        for stream_id, response in list(self._streams.items()):
            if response._ended and response._error is None:
                # Complete: its reader takes what has arrived; the loss is not its.
                response.finished = True
                waiter_id = self._waiter_of.pop(stream_id, None)
                if waiter_id is not None:
                    self.listener.request_done(waiter_id, False)
            elif response.head.done():
                response._fail(UpstreamError(f"{error} (mid-response)"))
                waiter_id = self._waiter_of.get(stream_id)
                if waiter_id is not None:
                    answered.append(waiter_id)
            else:
                response._fail(Unanswered(str(error)))
            if response._gone is not None:
                response._gone.set()
        self._streams.clear()
        self._waiter_of.clear()
        # Closed before it is reported: the report gives the connection's budget slot back,
        # and another worker may open one at once (the cap holds at the origin only so).
        self.wire.close()
        self.listener.lost(answered, first_sent=self.first_sent)

    def close(self) -> None:
        """Close once idle (GOAWAY drained, or the pool's idle timeout); reported through `lost`."""
        if not self.closed:
            self.h2.close_connection()
            self._flush()
        self.wire.close()  # the reader sees EOF and reports the loss once
