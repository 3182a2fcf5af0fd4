"""One HTTP/1.1 connection to an origin: keep-alive, and pipelining when the pool allows it.

Responses come back in request order, so the exchange at the front of the line is the only one
that reads from the socket; the others wait for their turn. Reading is pulled by the client side
(reshape/mitm/engine_channel.py), so a slow client holds back only its own connection to the origin.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
from typing import NoReturn

from reshape.upstream import http1, keep_alive
from reshape.upstream.body_reader import BodyAbandoned, BodyReader
from reshape.upstream.types import (
    ConnectionListener,
    Headers,
    Unanswered,
    UpstreamError,
    UpstreamRequest,
)
from reshape.upstream.wire import Wire, WireError

# How long a connection whose write failed may take to go down (its transport reports the
# loss a turn later); a bound, not a wait: it is normally over at once.
CLOSE_SETTLE_SECONDS = 1.0
# How much of what an origin sent early is parsed for a final response's head.
EARLY_HEAD_BYTES = 16 * 1024

log = logging.getLogger("reshape.upstream")


class H1Response:
    http_version = "HTTP/1.1"

    def __init__(self, connection: H1Upstream, waiter_id: int, method: bytes) -> None:
        self._connection = connection
        self.waiter_id = waiter_id
        self.method = method
        self.status = 0
        self.reason = b""
        self.headers: Headers = []
        self.trailers: Headers = []
        self.started = False  # a byte of this response has arrived
        self.ended = False
        self.abandoned = False  # its client left while it waited in a pipeline
        self.keep_alive = True
        self.error: Exception | None = None
        self.turn = asyncio.Event()  # set when this exchange is at the front of the line
        self.request: UpstreamRequest | None = None  # told of 1xx responses (`interim`)

    async def read(self) -> bytes:
        while not self.ended:
            data = self._take(await self._connection._next_event(self))
            if data is not None:
                return data
        return b""

    def read_nowait(self) -> bytes | None:
        """As `read`, but None at once when nothing more has arrived yet."""
        while not self.ended:
            if not self.turn.is_set():
                return None
            event = self._connection._poll(self)
            if event is None:
                return None
            data = self._take(event)
            if data is not None:
                return data
        return b""

    def _take(self, event: http1.Event) -> bytes | None:
        """Body bytes of `event`, b"" at the end, None for trailers (read on)."""
        if isinstance(event, http1.BodyData):
            return event.data
        if isinstance(event, http1.Trailers):
            self.trailers = list(event.headers)
            return None
        assert isinstance(event, http1.ResponseEnd), event
        self.ended = True
        self.keep_alive = event.keep_alive
        self._connection._finished(self)
        return b""

    def abort(self) -> None:
        if not self.ended:
            self._connection._abandon(self)


class H1Upstream:
    def __init__(
        self, wire: Wire, listener: ConnectionListener, *, stall_timeout: float = 2.0
    ) -> None:
        self.wire = wire
        self.listener = listener
        # Requests pipelined behind a response that makes no progress this long go elsewhere.
        self.stall_timeout = stall_timeout
        self._progress = 0  # reads that brought data, for the stall watch
        self._stall_watch: asyncio.TimerHandle | None = None
        # Requests were taken off this connection's pipeline: it closes after the front one.
        self._stalled = False
        self.reader = http1.ResponseReader()
        self.line: collections.deque[H1Response] = collections.deque()
        self._events: collections.deque[http1.Event] = collections.deque()
        self.closed = False
        self._lost_reported = False
        self.requests_sent = 0
        # Requests were in flight behind another here: an extra response from the origin may
        # have been read as the next request's (out of turn, below).
        self.pipelined = False
        self.first_sent: int | None = None  # the waiter whose request went out first
        self._terms = keep_alive.Terms()  # what the origin says of the connection's life
        self._broken: UpstreamError | None = None
        wire.on_close = self._closed_while_idle
        wire.on_idle_data = self._out_of_turn

    def _closed_while_idle(self) -> None:
        # The origin closed while nothing was in flight: never hand it out again.
        if not self.line:
            self._lost(UpstreamError("closed by the origin while idle"))

    def _out_of_turn(self) -> None:
        """The origin sent data while no request was outstanding (an unsolicited or duplicated
        response): the connection is out of step, and whatever it sends next could be handed to
        the wrong request. It closes; nothing it sent is delivered."""
        if not self.line and not self.closed:
            self.listener.out_of_turn(pipelined=self.pipelined)
            self._lost(UpstreamError("the origin sent data while no request was outstanding"))

    async def exchange(self, waiter_id: int, request: UpstreamRequest) -> H1Response:
        if self.closed or self.wire.has_data_or_eof and not self.line:
            # Found closed (the origin's keep-alive timeout, most often) before a byte left:
            # any request, a POST too, can go again on another connection.
            self.listener.unanswered([waiter_id], never_sent=True)
            self._lost(UpstreamError("closed by the origin while idle"))
            raise Unanswered("connection closed before the request was sent")
        response = H1Response(self, waiter_id, request.method)
        response.request = request
        # Framing is this hop's own: the client's Content-Length / Transfer-Encoding never pass.
        # An HTTP/2 client's cookie crumbs go as one field, joined with "; " (RFC 9113 §8.2.3).
        # `Connection: keep-alive`, as browsers send it: Apache states its keep-alive terms
        # (the `Keep-Alive` field, reshape/upstream/keep_alive.py) only to a request that does.
        headers: list[tuple[bytes, bytes]] = [
            (b"Host", request.authority),
            (b"Connection", b"keep-alive"),
        ]
        cookies: list[bytes] = []
        cookie_name = b""
        for name, value in request.headers:
            lowered = name.lower()
            if lowered == b"cookie":
                cookie_name = cookie_name or name
                cookies.append(value)
            elif lowered != b"content-length" and lowered != b"transfer-encoding":
                headers.append((name, value))
        if cookies:
            headers.append((cookie_name, b"; ".join(cookies)))
        streamed = request.body_stream is not None
        # A streamed body whose length the client gave goes with that length, as a held one
        # does: many origins answer a chunked request body 411 Length Required (S3's PUT).
        length = http1.declared_length(request.headers) if streamed else None
        chunked = streamed and length is None
        if chunked:
            headers.append((b"Transfer-Encoding", b"chunked"))
        elif streamed:
            headers.append((b"Content-Length", str(length).encode()))
        elif request.body or request.method in (b"POST", b"PUT", b"PATCH"):
            headers.append((b"Content-Length", str(len(request.body)).encode()))
        try:
            head_and_body = http1.encode_request(
                request.method, request.target, headers, request.body or None, chunked=chunked
            )
        except ValueError as e:
            raise UpstreamError(f"cannot forward the request: {e}") from None
        if self.closed or self.wire.is_closed:
            raise self._unanswered(
                response, "connection closed before the request was sent", never_sent=True
            )
        self.wire.on_idle_data = None  # from now on, data is this request's response
        if self.first_sent is None:
            self.first_sent = waiter_id
        self.line.append(response)
        if len(self.line) == 1:
            response.turn.set()
        else:
            self.pipelined = True
            if self._stall_watch is None:
                self._watch_stall(self._progress)
        self.reader.expect(request.method)
        self.requests_sent += 1
        try:
            if streamed:
                if not await self._send_streamed(head_and_body, request, response, length):
                    # The origin answered before the body was all sent (see _answered_early):
                    # the rest is not sent, so nothing else can go on this connection.
                    self.closed = True
                    return await self._response_head(response)
            else:
                # Head and body in one write: one segment (one TLS record) when they fit.
                self.wire.write(head_and_body)
                await self.wire.drain()
                request.sent()
        except asyncio.CancelledError:
            # The client left while its request was being sent: the origin may have part of
            # it, so the connection cannot carry on.
            self._abandon(response)
            raise
        except WireError as e:
            # The origin closed as we wrote. Responses it sent before are still in the buffer
            # for the requests ahead of this one; only this one is lost.
            self.closed = True
            # What arrived before the break is delivered when the connection has gone down
            # (Wire.connection_lost), which may be a turn after the write failed.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wire.readable(), CLOSE_SETTLE_SECONDS)
            if self.line and self.line[0] is response and self.wire.has_data:
                # Unless the origin answered this request before taking all of it, and closed
                # (a 413 to an upload it refuses): that answer is in the buffer, and is the
                # response, as RFC 9112 §9.5 asks of a client that sends a body. The rest of
                # the body is not sent; nothing else goes on this connection.
                return await self._response_head(response)
            if streamed:
                self._lost(UpstreamError(str(e)))
                raise UpstreamError(
                    f"connection lost while sending the request body: {e}"
                ) from None
            if response in self.line:
                self.line.remove(response)
            raise self._unanswered(response, str(e)) from None
        return await self._response_head(response)

    async def _response_head(self, response: H1Response) -> H1Response:
        try:
            event = await self._next_event(response)
            while isinstance(event, http1.InformationalResponse):
                if response.request is not None:
                    response.request.interim(event.status, list(event.headers))
                event = await self._next_event(response)
        except asyncio.CancelledError:
            # The client left while its response was due: nobody will read it, so the
            # connection cannot carry on (requests behind it go again elsewhere).
            self._abandon(response)
            raise
        assert isinstance(event, http1.ResponseHead), event
        response.status = event.status
        response.reason = event.reason
        response.headers = list(event.headers)
        return response

    def _unanswered(
        self, response: H1Response, reason: str, *, never_sent: bool = False
    ) -> Unanswered:
        """Report a request that got no answer (the pool sends it elsewhere if it may: any
        request `never_sent`, else idempotent ones); returns the error."""
        self.listener.unanswered([response.waiter_id], never_sent=never_sent)
        return Unanswered(reason)

    async def _send_streamed(
        self, head: bytes, request: UpstreamRequest, response: H1Response, length: int | None
    ) -> bool:
        """Send the head and the body as it comes, chunked, or as is if its `length` is known;
        False if the origin answered first and the rest was not sent."""
        assert request.body_stream is not None
        pending = head
        left = length
        abandoned = False
        reader = BodyReader(request.body_stream, request.waiting_for_client)

        def origin_spoke() -> bool:
            return self.wire.is_closed or self._answered_early(response)

        try:
            while True:
                # Once the head is out, whatever the origin sends or its close ends the wait
                # for the client's next chunk (reshape/upstream/body_reader.py).
                try:
                    chunk = await reader.next(
                        self.wire.arrival, _never if pending else origin_spoke
                    )
                except BodyAbandoned:
                    # Answered early (below), or closed: the write below fails.
                    abandoned = True
                    break
                if chunk is None:
                    break
                if not pending and self._answered_early(response):
                    return False
                if left is not None:
                    if len(chunk) > left:
                        self._body_length_broken(f"more than its Content-Length of {length}")
                    left -= len(chunk)
                # The head waits for the first body chunk so both leave in one write.
                self.wire.write(
                    pending + (chunk if left is not None else http1.encode_chunk(chunk))
                )
                pending = b""
                await self.wire.drain()
        finally:
            await reader.close()
        if not pending and self._answered_early(response):
            return False
        if left is None:
            self.wire.write(pending + http1.encode_last_chunk(request.trailers))
        elif left and abandoned:
            raise WireError("closed by the origin before the request body's end")
        elif left:
            self._body_length_broken(f"{left} bytes short of its Content-Length of {length}")
        elif pending:
            self.wire.write(pending)  # a body of no bytes
        # (Trailers of a body sent with its length have no place in HTTP/1.1: they go.)
        await self.wire.drain()
        request.sent()
        return True

    def _body_length_broken(self, how: str) -> NoReturn:
        """The client's streamed body is not the length it gave (its own hop should have
        refused it): the origin has part of a request, so the connection cannot carry on."""
        error = UpstreamError(f"the request body was {how}")
        self._lost(error)
        raise error

    def _answered_early(self, response: H1Response) -> bool:
        """Whether the origin has answered `response`'s request before taking its whole body,
        and ends the connection (http1.ends_before_body_sent)."""
        if not self.wire.has_data or not self.line or self.line[0] is not response:
            return False  # nothing yet, or what arrived answers the requests ahead of this one
        return http1.ends_before_body_sent(self.wire.peek(EARLY_HEAD_BYTES), response.method)

    async def _next_event(self, response: H1Response) -> http1.Event:
        if not response.turn.is_set():
            # Pipelined behind others: once its turn comes, its origin's time starts whole.
            await response.turn.wait()
            if response.request is not None:
                response.request.turn_came()
        while True:
            event = self._poll(response)
            if event is not None:
                return event
            await self.wire.readable()

    def _poll(self, response: H1Response) -> http1.Event | None:
        """The next event for `response` (whose turn it is), from what has arrived; None if
        nothing has."""
        if response.error is not None:
            raise response.error
        while not self._events:
            if self._broken is not None:
                self._lost(self._broken)
                raise response.error or self._broken
            try:
                data = self.wire.read_nowait()
            except WireError as e:
                data = b""
                self._broken = UpstreamError(str(e))
            if data is None:
                return None
            if data:
                # The origin answered: whatever happens next, this request reached it, so it is
                # never sent again (an invalid response is an answer, and a 502).
                response.started = True
                self._progress += 1
            try:
                events = self.reader.receive_data(data)
            except http1.ProtocolError as e:
                # What parsed before the error (a whole earlier response) is still delivered.
                events = e.events
                self._broken = UpstreamError(f"invalid response from the origin: {e}")
            self._events.extend(events)
            if len(self.line) > 1:
                self._mark_started(events)
            if not data and self._broken is None:
                self._broken = UpstreamError("connection closed by the origin")
        event = self._events.popleft()
        response.started = True
        return event

    def _mark_started(self, events: list[http1.Event]) -> None:
        """Mark answered the pipelined requests behind the front one that `events`, parsed from
        one read, reach: those whose response ended in it, and the one whose response it began
        (the reader's, if a byte of it came, however invalid). Only the front one reads, but
        the connection may be lost before the others' turn: any byte of an answer marks it
        answered, so it is never sent again."""
        ended = sum(isinstance(event, http1.ResponseEnd) for event in events)
        reached = ended + int(self.reader.response_started)
        for response in itertools.islice(self.line, 1, reached):
            response.started = True

    def _watch_stall(self, seen: int) -> None:
        loop = asyncio.get_running_loop()
        self._stall_watch = loop.call_later(self.stall_timeout, self._check_stall, seen)

    def _check_stall(self, seen: int) -> None:
        """Requests wait behind the front response: if the origin sent nothing for it since
        `seen` (and nothing it sent is still waiting to be read), they go again elsewhere (they
        are idempotent: only such requests are pipelined), and this connection, whose answers to
        them would still come, closes after the front one."""
        self._stall_watch = None
        if self.closed or len(self.line) < 2:
            return
        if self._progress != seen or self._events or self.wire.has_data:
            # The origin sent something since, or what it sent waits for a slow client: the
            # origin is not the one stalling.
            self._watch_stall(self._progress)
            return
        behind = [r for r in list(self.line)[1:] if not r.started and not r.abandoned]
        for response in behind:
            self.line.remove(response)
            response.error = Unanswered("pipelined behind a response that stalled")
            response.turn.set()
        self._stalled = True
        if behind:
            log.warning(
                "a pipelined response stalled for %g s: %d requests behind it go elsewhere",
                self.stall_timeout,
                len(behind),
            )
            self.listener.unanswered([r.waiter_id for r in behind])

    def _finished(self, response: H1Response) -> None:
        assert self.line and self.line[0] is response
        self.line.popleft()
        kept = response.keep_alive and not self.closed and not self._stalled
        # Bytes that came in the read that ended this response and broke the parser (more body
        # than its length said, a 204 with a body: RFC 9112 §6.3) leave the connection dead,
        # however well the response ended: no request may be written to it.
        reusable = kept and self._broken is None
        if self.line and self.line[0].abandoned:
            self.listener.request_done(response.waiter_id, reusable)
            self._lost(UpstreamError("a client abandoned its pipelined response"), graceful=True)
            return
        if self.line:
            self.line[0].turn.set()
        elif kept and (self._broken is not None or self._events or self.wire.has_data):
            # More than the response came before any other request was sent: out of turn. Told
            # first: the pool, told next that the response is done, closes the connection.
            self.listener.out_of_turn(pipelined=self.pipelined)
            self.listener.request_done(response.waiter_id, False)
            self._lost(UpstreamError("the origin sent more than the response"))
            return
        else:
            self.wire.on_idle_data = self._out_of_turn
        # What the origin says of the connection counts only while it lives on.
        idle_timeout, takes = self._terms.response(response.headers) if reusable else (None, None)
        self.listener.request_done(
            response.waiter_id, reusable, idle_timeout=idle_timeout, takes=takes
        )
        if kept and self._broken is not None:
            # The next response was invalid: those behind this one get what arrived before the
            # error, then the error (_poll), and the connection goes.
            return
        if not reusable:
            # Requests pipelined behind a response that said `Connection: close` were expected
            # to go unanswered: an announced close, not a broken pipeline.
            self._lost(
                UpstreamError("the origin closes the connection after this response"),
                graceful=not response.keep_alive,
            )

    def _abandon(self, response: H1Response) -> None:
        """Nobody will read `response`. A half-read (or half-sent) exchange leaves the connection
        in an unknown place: it closes. One still waiting behind others in a pipeline lets them
        finish first; the connection closes when its turn comes, and the requests behind it go
        again elsewhere."""
        if response.ended:
            return
        response.ended = True
        self.listener.request_done(response.waiter_id, False)
        if response in self.line and self.line[0] is not response and not self.closed:
            response.abandoned = True
            return
        if response in self.line:
            self.line.remove(response)
        self._lost(UpstreamError("a client abandoned its response"), graceful=True)

    def _lost(self, error: Exception, *, graceful: bool = False) -> None:
        """Report the connection gone, once. Responses that had begun end with `error`; the
        rest go back to the pool, which sends idempotent ones again."""
        if self._lost_reported:
            return
        self._lost_reported = True
        self.closed = True
        if self._stall_watch is not None:
            self._stall_watch.cancel()
            self._stall_watch = None
        answered = []
        for response in self.line:
            if response.started:
                response.error = UpstreamError(f"{error} (mid-response)")
                answered.append(response.waiter_id)
            else:
                response.error = Unanswered(str(error))
            response.turn.set()
        self.line.clear()
        self.wire.on_close = None
        self.wire.close()
        self.listener.lost(answered, graceful=graceful, first_sent=self.first_sent)

    def close(self) -> None:
        self._lost(UpstreamError("closed by the pool"))


def _never() -> bool:
    return False
