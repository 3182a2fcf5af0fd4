"""The asyncio side of an `EngineServer` connection: runs each exchange through the engine.

One `EngineChannel` per `EngineServer` (reshape/mitm/engine_client.py). It is the connection's
"transport" in mitmproxy's `ConnectionHandler`: the handler's task for the connection waits on it
(so a client that goes away cancels everything the channel runs) and its `writer` is the channel
(so mitmproxy's `drain_writers`, which runs after every read from the client, waits while a
streamed request body is backed up: backpressure towards the client).

Each exchange is a task, started eagerly: it runs at once, inside the layer's pass, until it
waits for the response, so a request is with its origin connection before mitmproxy turns the
next part of the client's read into the next request (a browser's burst of 48, read in one piece,
took ~20 ms of the proxy's work before the first of them left, and their responses then queued
behind one another; see reshape/upstream/h2.py's `_flush_soon`). Nothing it does there re-enters
the layers: whatever it hands back goes through `server_event`, whose lock the pass holds.

Then the task hands the response to the client connection's layers through
`ConnectionHandler.server_event`, mitmproxy's own way in. Whatever the origin has sent already
goes at once (the head and a small body); a larger body follows piece by piece, each only after
the client's socket has taken the last (backpressure towards the origin: the engine stops reading
its connection while nobody takes the data). What the exchanges of one client connection hand
over in one turn of the event loop goes in one `EngineResponses` event, one pass through the
layers, in the next turn: an origin's read often completes several responses at once (in the
lab's app page over HTTP/2 origins, 9 in 10 responses arrived with others, ~4 per read), and
each pass costs the descent through the client's TLS, the CONNECT tunnel and the proxy's own
layers and the way back up, a TLS record and a `SendData` of its own.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterable
from typing import Any

from mitmproxy import http
from mitmproxy.net.http import status_codes
from mitmproxy.proxy.layers.http._events import (
    ErrorCode,
    HttpEvent,
    ResponseData,
    ResponseEndOfMessage,
    ResponseHeaders,
    ResponseProtocolError,
    ResponseTrailers,
)

from reshape.base.flowstate import FlowState, state_of
from reshape.features.client_errors.rules import CLIENT_IDLE, DEFAULT_CLIENT_IDLE_TIMEOUT
from reshape.mitm.engine_client import (
    EngineResponses,
    EngineServer,
    Exchange,
    InterimResponse,
    StreamResponse,
)
from reshape.upstream.engine import (
    DestinationRefused,
    Engine,
    FirstByteTimeout,
    QueueRejected,
    Route,
)
from reshape.upstream.types import (
    Headers,
    UpstreamError,
    UpstreamRequest,
    UpstreamResponse,
    end_to_end,
    hop_by_hop,
)

log = logging.getLogger("reshape.upstream")

# A streamed request body backs up to this many bytes before mitmproxy stops reading the client.
BODY_HIGH_WATER = 1 << 20
# At most this much of a response body goes into one event.
BATCH_BYTES = 256 * 1024
# An HTTP/2 client's stream may hold this much of a response in mitmproxy's send buffer (its
# flow-control window is shut) before the engine stops reading the origin for it.
CLIENT_BACKLOG_HIGH = 1 << 20

# RFC 9110 §5.1, §5.5: a field name is a token; a value has no control characters but HTAB.
_FIELD_NAME = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_FIELD_VALUE_FORBIDDEN = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")


class ClientStalled(Exception):
    """The client has taken none of its response for the client idle timeout."""


class _BodyStream:
    """A streamed request body: filled by the layer, read by the engine as it sends (it is its
    own iterator); `taken` is called each time the engine has taken a piece, `waits` each time
    it has to wait for the client's next one. Once the engine stops reading (`aclose`: the
    origin reset the stream, or answered before the body's end), what is buffered and what the
    client still sends are dropped, so that the client is not held back
    (`EngineChannel.drain`) for a body nobody will send."""

    def __init__(self, taken: Callable[[], None], waits: Callable[[], None] = lambda: None) -> None:
        self.taken = taken
        self.waits = waits
        self.chunks: collections.deque[bytes] = collections.deque()
        self.buffered = 0
        self.ended = False
        self.abandoned = False
        # The engine waits for the client's next chunk: the origin may be waiting for it too.
        self.awaited = False
        self.ready = asyncio.Event()
        # When the exchange last moved: a chunk from the client, a piece of the response taken.
        self.last_progress = time.monotonic()

    def put(self, data: bytes) -> None:
        self.last_progress = time.monotonic()
        if data and not self.abandoned:
            self.chunks.append(data)
            self.buffered += len(data)
            self.ready.set()

    def end(self) -> None:
        self.ended = True
        self.ready.set()

    def __aiter__(self) -> _BodyStream:
        return self

    async def __anext__(self) -> bytes:
        while not self.chunks:
            if self.ended or self.abandoned:
                raise StopAsyncIteration
            self.ready.clear()
            self.awaited = True
            self.waits()
            try:
                await self.ready.wait()
            finally:
                self.awaited = False
        chunk = self.chunks.popleft()
        self.buffered -= len(chunk)
        self.taken()
        return chunk

    async def aclose(self) -> None:
        self.abandoned = True
        self.ready.set()  # a read still waiting ends
        if self.chunks:
            self.chunks.clear()
            self.buffered = 0
            self.taken()


class EngineChannel:
    """The exchanges of one `EngineServer` connection of one client connection."""

    def __init__(
        self,
        engine: Engine,
        server: EngineServer,
        client_backlog: Callable[[int], int] = lambda stream_id: 0,
        client_idle_timeout: float = DEFAULT_CLIENT_IDLE_TIMEOUT,
    ) -> None:
        self.engine = engine
        self.server = server
        # A client that sends none of its streamed body and takes none of its response this
        # long ends its exchange, which gives its origin connection (or stream) back.
        self.client_idle_timeout = client_idle_timeout
        self._idle_checks: dict[int, asyncio.TimerHandle] = {}
        # Bytes of a stream's response waiting in the client connection's send buffer (an
        # HTTP/2 client whose window is shut), which the client socket's drain does not see.
        self.client_backlog = client_backlog
        self.handler: Any = None  # mitmproxy's ConnectionHandler, once the connection is open
        self.closed = asyncio.Event()
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._bodies: dict[int, _BodyStream] = {}
        self._requests: dict[int, UpstreamRequest] = {}
        self._outbox: list[StreamResponse] = []  # answers for the next pass (`_inject`)
        self._passes: set[asyncio.Task[None]] = set()
        self._drained = asyncio.Event()
        self._drained.set()

    # ExchangeStarter (called by the layer, inside mitmproxy's event processing: never blocks)

    def start(self, exchange: Exchange) -> None:
        state = state_of(exchange.flow)
        route = state.route
        if route is None or self.closed.is_set():
            raise AssertionError("an engine exchange without a route, or on a closed channel")
        body_stream = None
        stream_id = exchange.stream_id
        if exchange.streamed:
            body_stream = self._bodies[stream_id] = _BodyStream(
                self._check_drained, lambda: self._watch_body(stream_id)
            )
        request = self._requests[stream_id] = upstream_request(exchange, body_stream)
        request.on_interim = lambda status, fields: self._interim(stream_id, status, fields)
        # Eager: see the module's docstring.
        task = asyncio.Task(
            self._run(exchange, state, route, request),
            loop=asyncio.get_running_loop(),
            name=f"engine exchange {exchange.stream_id}",
            eager_start=True,
        )
        self._tasks[exchange.stream_id] = task
        task.add_done_callback(lambda _: self._forget(exchange.stream_id, task))

    def body_data(self, exchange: Exchange, data: bytes) -> None:
        body = self._bodies.get(exchange.stream_id)
        if body is not None:
            body.put(data)
            if body.buffered > BODY_HIGH_WATER:
                self._drained.clear()

    def body_end(self, exchange: Exchange) -> None:
        body = self._bodies.get(exchange.stream_id)
        request = self._requests.get(exchange.stream_id)
        if body is None or request is None:
            return
        if exchange.trailers:
            request.trailers.extend(exchange.trailers.fields)  # read once the body has ended
        body.end()

    def cancel(self, exchange: Exchange, reason: str) -> None:
        task = self._tasks.get(exchange.stream_id)
        if task is not None and not task.done():
            log.debug("exchange %d cancelled: %s", exchange.stream_id, reason)
            task.cancel()

    # the writer mitmproxy keeps for the connection (ConnectionIO.writer)

    async def drain(self) -> None:
        """mitmproxy's drain_writers: wait while a streamed request body is backed up."""
        while not self._drained.is_set():
            await self._drained.wait()

    def is_closing(self) -> bool:
        return self.closed.is_set()

    def close(self) -> None:
        """The connection ends (its client went away, or the proxy stops): stop every exchange;
        the client's own pools (`share: false`) go too."""
        self.closed.set()
        self._drained.set()
        for task in [*self._tasks.values(), *self._passes]:
            task.cancel()
        if self.handler is not None:
            self.engine.release(self.handler.client.id)

    def write(self, data: bytes) -> None:
        raise AssertionError("nothing is written to an engine connection")

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    # running one exchange

    def _forget(self, stream_id: int, task: asyncio.Task[None]) -> None:
        if self._tasks.get(stream_id) is task:
            del self._tasks[stream_id]
        self._bodies.pop(stream_id, None)
        self._requests.pop(stream_id, None)
        check = self._idle_checks.pop(stream_id, None)
        if check is not None:
            check.cancel()
        self._check_drained()

    def _watch_body(self, stream_id: int) -> None:
        """The engine waits for the client's next body chunk: unless the exchange moves within
        the client idle timeout, it ends (`_body_idle`)."""
        if stream_id in self._idle_checks:
            return
        body = self._bodies.get(stream_id)
        if body is None:
            return
        delay = max(body.last_progress + self.client_idle_timeout - time.monotonic(), 0.0)
        loop = asyncio.get_running_loop()
        self._idle_checks[stream_id] = loop.call_later(delay, self._body_idle, stream_id)

    def _body_idle(self, stream_id: int) -> None:
        self._idle_checks.pop(stream_id, None)
        body, task = self._bodies.get(stream_id), self._tasks.get(stream_id)
        if body is None or task is None or task.done() or not body.awaited:
            return  # ended, or moving again (the next wait watches anew)
        if time.monotonic() - body.last_progress < self.client_idle_timeout:
            self._watch_body(stream_id)  # a piece of the response was taken meanwhile
            return
        # Its start makes the outcome the client's (client_errors.rules.outcome_by_client).
        message = (
            f"{CLIENT_IDLE} for {self.client_idle_timeout:g} s: none of the rest of its "
            "request body came"
        )
        log.info("%s: exchange ended", message)
        task.cancel()  # the engine ends its side: the origin connection or stream goes
        error = ResponseProtocolError(stream_id, message, ErrorCode.GENERIC_CLIENT_ERROR)
        self._hand_over(StreamResponse(stream_id, [error], lambda _: None))

    def _check_drained(self) -> None:
        if not self._drained.is_set() and all(
            body.buffered <= BODY_HIGH_WATER for body in self._bodies.values()
        ):
            self._drained.set()

    async def _run(
        self, exchange: Exchange, state: FlowState, route: Route, request: UpstreamRequest
    ) -> None:
        stream_id = exchange.stream_id
        try:
            response = await self.engine.exchange(route, request)
        except QueueRejected as e:
            await self._answer(exchange, state, 503, str(e), "rejected", e.retry_after)
            return
        except DestinationRefused as e:
            await self._answer(exchange, state, 403, str(e), "rejected")
            return
        except FirstByteTimeout as e:
            await self._answer(exchange, state, 504, str(e), "upstream_error")
            return
        except UpstreamError as e:
            await self._answer(exchange, state, 502, str(e), "upstream_error")
            return
        state.assignment = request.assignment
        try:
            await self._relay(exchange, response, route.read_timeout)
        except ClientStalled as e:
            response.abort()
            log.info("%s: response cut off", e)
            error = ResponseProtocolError(stream_id, str(e), ErrorCode.CLIENT_DISCONNECTED)
            await self._inject(stream_id, [error])
        except UpstreamError as e:
            response.abort()
            log.warning("response broken off: %s", e)
            error = ResponseProtocolError(stream_id, str(e), ErrorCode.GENERIC_SERVER_ERROR)
            await self._inject(stream_id, [error])
        except BaseException:
            response.abort()
            raise

    async def _relay(
        self, exchange: Exchange, response: UpstreamResponse, read_timeout: float
    ) -> None:
        """The response, as events: the head with whatever body has arrived, then the rest as
        it comes, each piece once the client has taken the one before."""
        stream_id = exchange.stream_id
        method = exchange.request.data.method
        bodiless = method == b"HEAD" or response.status in (204, 304)
        # HTTP/1.0 has no chunked coding (RFC 9112 §6.1): such a client reads to the close.
        chunked = exchange.request.data.http_version != b"HTTP/1.0"
        head = ResponseHeaders(
            stream_id, mitmproxy_response(response, method, chunked=chunked), end_stream=bodiless
        )
        batch: list[HttpEvent] = [head]
        ended = _take_arrived(response, stream_id, batch)
        if ended and len(batch) == 1 and not response.trailers:
            # Complete in its head: the client's HEADERS carry END_STREAM, as the origin's did
            # (a gRPC error is such a "Trailers-Only" response, its status in the head: a
            # client that gets an empty DATA frame with END_STREAM after it sees no status).
            head.end_stream = True
        while True:
            if ended:
                trailers = trailer_fields(response.trailers)
                if trailers and not bodiless:
                    batch.append(ResponseTrailers(stream_id, http.Headers(trailers)))
                batch.append(ResponseEndOfMessage(stream_id))
            wanted = await self._inject(stream_id, batch)
            if ended:
                return
            if not wanted:
                response.abort()  # the client side is gone
                return
            await self._client_drained(stream_id)
            body = self._bodies.get(stream_id)
            if body is not None:
                body.last_progress = time.monotonic()  # the client took a piece
            chunk = await self._next_piece(stream_id, response, read_timeout)
            if not chunk:
                batch, ended = [], True
                continue
            batch = [ResponseData(stream_id, chunk)]
            ended = _take_arrived(response, stream_id, batch)

    async def _next_piece(
        self, stream_id: int, response: UpstreamResponse, read_timeout: float
    ) -> bytes:
        """The response's next piece of body (b"" at its end). The origin may be silent for
        `read_timeout` at most, unless the engine is waiting for the client's next request body
        chunk when that time is up: the origin may be waiting for it too (a gRPC stream's
        answers follow its requests), and it gets another `read_timeout` (so a silence that
        starts during such a wait may last up to twice `read_timeout`). An origin that takes no
        more of the body and says nothing is cut off."""
        while True:
            try:
                async with asyncio.timeout(read_timeout):
                    return await response.read()
            except TimeoutError:
                body = self._bodies.get(stream_id)
                if body is None or not body.awaited:
                    raise UpstreamError(
                        f"origin silent for {read_timeout:g} s in the middle of a response"
                    ) from None

    async def _answer(
        self,
        exchange: Exchange,
        state: FlowState,
        status: int,
        message: str,
        outcome: str,
        retry_after: int | None = None,
    ) -> None:
        """Answer for the origin: the engine could not get a response (503, 403, 504, 502).
        To a HEAD request, the head alone (RFC 9110 §9.3.2): an HTTP/1.1 client would read the
        message as the start of its next response."""
        stream_id = exchange.stream_id
        state.outcome = outcome
        body = f"reshape: {message}\n".encode()
        headers = [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
        ]
        if retry_after is not None:
            headers.append((b"retry-after", str(retry_after).encode()))
        response = http.Response(
            b"HTTP/1.1",
            status,
            status_codes.RESPONSES.get(status, "").encode(),
            http.Headers(headers),
            None,
            None,
            time.time(),
            None,
        )
        if exchange.request.data.method == b"HEAD":
            answer: list[HttpEvent] = [ResponseHeaders(stream_id, response, end_stream=True)]
        else:
            answer = [ResponseHeaders(stream_id, response, end_stream=False)]
            answer.append(ResponseData(stream_id, body))
        answer.append(ResponseEndOfMessage(stream_id))
        await self._inject(stream_id, answer)

    async def _inject(self, stream_id: int, http_events: list[HttpEvent]) -> bool:
        """Hand events for the stream to the client connection's layers; False if the stream
        (or the whole connection) is gone and wants nothing more. They go in the next turn of
        the event loop, in one pass with those of every other exchange of the connection that
        has something by then (`_send_outbox`)."""
        if not self._takes_answers():
            return False
        loop = asyncio.get_running_loop()
        wanted: asyncio.Future[bool] = loop.create_future()

        def delivered(still_wanted: bool) -> None:
            if not wanted.done():
                wanted.set_result(still_wanted)

        self._hand_over(StreamResponse(stream_id, http_events, delivered))
        return await wanted

    def _takes_answers(self) -> bool:
        """Whether the client connection's layers are there for answers: open, and set."""
        return not self.closed.is_set() and self.handler is not None

    def _hand_over(self, response: StreamResponse) -> None:
        """Queue `response` for the next pass (`_send_outbox`), scheduled by the first one."""
        if not self._outbox:
            asyncio.get_running_loop().call_soon(self._send_outbox)
        self._outbox.append(response)

    def _send_outbox(self) -> None:
        """One pass for every answer waiting: the layers above the engine's (the client's TLS,
        the CONNECT tunnel, the proxy's own) route the event once, not once per response, and
        what the answers make the client's layer send leaves as one `SendData`."""
        responses, self._outbox = self._outbox, []
        task = asyncio.Task(
            self._pass(responses),
            loop=asyncio.get_running_loop(),
            name="engine responses",
            eager_start=True,
        )
        if not task.done():
            self._passes.add(task)
            task.add_done_callback(self._passes.discard)

    async def _pass(self, responses: list[StreamResponse]) -> None:
        try:
            if not self.closed.is_set() and self.handler is not None:
                await self.handler.server_event(EngineResponses(self.server, responses))
        finally:
            for response in responses:  # those the pass never reached want nothing more
                if response.delivered is not None:
                    response.delivered(False)

    def _interim(self, stream_id: int, status: int, fields: Headers) -> None:
        """The origin's informational response, to the client's layers in the next pass:
        ahead of the final head, which the exchange's task hands over a turn later at the
        earliest (passes keep the order of `_hand_over`)."""
        response = http.Response(
            b"HTTP/2.0",
            status,
            b"",
            # Names lowercased: an HTTP/1.1 origin's `Link` goes out on HTTP/2.
            http.Headers([(n.lower(), v) for n, v in trailer_fields(fields)]),
            None,
            None,
            time.time(),
            None,
        )
        if self._takes_answers():
            # Nobody waits for it: whether the stream still wants more is the final head's news.
            self._hand_over(StreamResponse(stream_id, [InterimResponse(stream_id, response)]))

    async def _client_drained(self, stream_id: int) -> None:
        """Wait until the client has taken what was written for it (mitmproxy writes without
        waiting; this keeps a slow client from piling up a response in memory): its socket has
        drained, and an HTTP/2 stream's send buffer is below CLIENT_BACKLOG_HIGH. The latter
        opens only when the client's WINDOW_UPDATE arrives, which no event here reports: it is
        looked at again every few milliseconds, and only while a slow HTTP/2 client holds a
        stream back. ClientStalled if the client takes nothing for the client idle timeout."""
        io = self.handler.transports.get(self.handler.client) if self.handler else None
        writer = io.writer if io is not None else None
        try:
            async with asyncio.timeout(self.client_idle_timeout):
                if writer is not None and not writer.is_closing():
                    with contextlib.suppress(ConnectionError):
                        await writer.drain()
                pause = 0.005
                while (
                    not self.closed.is_set()
                    and self.client_backlog(stream_id) > CLIENT_BACKLOG_HIGH
                ):
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, 0.1)
        except TimeoutError:
            raise ClientStalled(
                f"{CLIENT_IDLE} for {self.client_idle_timeout:g} s: it took none of its response"
            ) from None


def _take_arrived(response: UpstreamResponse, stream_id: int, batch: list[HttpEvent]) -> bool:
    """Add the body the origin has sent already (up to BATCH_BYTES) to `batch`; True if the
    response has ended."""
    taken = 0
    while taken < BATCH_BYTES:
        chunk = response.read_nowait()
        if chunk is None:
            return False
        if not chunk:
            return True
        batch.append(ResponseData(stream_id, chunk))
        taken += len(chunk)
    return False


def upstream_request(exchange: Exchange, body_stream: _BodyStream | None) -> UpstreamRequest:
    """The engine's view of the request mitmproxy parsed (and the addons shaped)."""
    request = exchange.request
    data = request.data
    authority = request.host_header
    if not authority:
        default_port = 443 if data.scheme == b"https" else 80
        authority = (
            request.host if request.port == default_port else f"{request.host}:{request.port}"
        )
    fields = [(name, value) for name, value in data.headers.fields if name.lower() != b"host"]
    return UpstreamRequest(
        method=data.method,
        scheme=data.scheme,
        authority=authority.encode("idna") if not authority.isascii() else authority.encode(),
        target=data.path,
        headers=end_to_end(fields),
        body=exchange.body or b"",
        body_stream=body_stream,
        trailers=list(exchange.trailers.fields) if exchange.trailers else [],
    )


def mitmproxy_response(
    response: UpstreamResponse, method: bytes, *, chunked: bool = True
) -> http.Response:
    """The origin's response head as mitmproxy's layers take one from an HTTP/1.1 server.

    Framing is the client side's business: hop-by-hop fields go; a body without a length is
    marked chunked, which mitmproxy's HTTP/1 server then uses (its HTTP/2 server drops the
    field), unless the client takes no chunked body (`chunked=False`: an HTTP/1.0 client, RFC
    9112 §6.1): then it goes as it is and mitmproxy's HTTP/1 server closes the connection at its
    end (before, such a client read the chunks' framing as part of the body). An HTTP/2 origin
    may send a length and trailers both; when its head announces them (a `Trailer` field) the
    length goes, so that they can follow the body to HTTP/1.1 clients (and, for an HTTP/1.0
    client, so that reshape/features/trailers holds the body to promote them into the head).
    A 204's length goes too (RFC 9110 §8.6: an HTTP/2 client refuses the stream), and so does a
    field whose value has a control character (§5.5), as in trailers: an HTTP/2 client refused
    the whole response for it."""
    fields = response.headers
    lowered = [name.lower() for name, _ in fields]  # each name lowered once: this runs per response
    drop = hop_by_hop(fields, lowered)
    if response.status == 204:
        drop = drop | {b"content-length"}
    headers = [
        field
        for field, name in zip(fields, lowered, strict=True)
        if name not in drop and not _FIELD_VALUE_FORBIDDEN.search(field[1])
    ]
    has_length = b"content-length" in lowered and b"content-length" not in drop
    if has_length and b"trailer" in lowered and response.http_version == "HTTP/2":
        headers = [(n, v) for n, v in headers if n.lower() != b"content-length"]
        has_length = False
    bodiless = method == b"HEAD" or response.status in (204, 304) or response.status < 200
    if chunked and not bodiless and not has_length:
        headers.append((b"transfer-encoding", b"chunked"))
    reason = response.reason or status_codes.RESPONSES.get(response.status, "").encode()
    return http.Response(
        b"HTTP/1.1",
        response.status,
        reason,
        http.Headers(headers),
        None,
        None,
        time.time(),
        None,
    )


def trailer_fields(fields: Iterable[tuple[bytes, bytes]]) -> Headers:
    """Trailer fields fit to pass on: end-to-end, not framing, and valid (mitmproxy and h11
    would otherwise fail the connection at the very end of a response already relayed)."""
    kept = []
    for name, value in end_to_end(list(fields)):
        value = value.strip(b" \t")
        if (
            name.lower() != b"content-length"
            and _FIELD_NAME.fullmatch(name)
            and not _FIELD_VALUE_FORBIDDEN.search(value)
        ):
            kept.append((name, value))
    return kept


def channel_factory(engine: Engine) -> Callable[[EngineServer], EngineChannel]:
    return lambda server: EngineChannel(engine, server)
