"""The layer that stands where mitmproxy's Http1Client / Http2Client would: requests to the engine.

mitmproxy's `HttpStream` sends each request to a server connection as HTTP events (`SendHttp` of
RequestHeaders, RequestData, RequestTrailers, RequestEndOfMessage) and waits for the response as
HTTP events (`ReceiveHttp` of ResponseHeaders, ResponseData, ResponseTrailers,
ResponseEndOfMessage, or ResponseProtocolError). For a request reshape's engine carries, the
server connection is an `EngineServer`: no socket, one per destination per `HttpLayer`, and this
layer is its whole stack. It turns the request events into an `Exchange` for the engine and the
engine's answers, which arrive as `EngineResponses` events injected by the exchange's driver
(reshape/mitm/engine_channel.py), back into response events. No bytes are encoded or parsed here:
the engine speaks HTTP/1.1 or HTTP/2 to the origin, mitmproxy to the client.

Sans-IO like every mitmproxy layer: events in, commands out; what must happen outside the layer
(starting an exchange, feeding a streamed body, cancelling) goes to the `ExchangeStarter` it was
given.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from mitmproxy import connection, http
from mitmproxy.proxy import commands, events, layer
from mitmproxy.proxy.layers.http import RegisterHttpConnection
from mitmproxy.proxy.layers.http._base import ReceiveHttp
from mitmproxy.proxy.layers.http._events import (
    ErrorCode,
    HttpEvent,
    RequestData,
    RequestEndOfMessage,
    RequestHeaders,
    RequestProtocolError,
    RequestTrailers,
    ResponseEndOfMessage,
    ResponseProtocolError,
)


class EngineServer(connection.Server):
    """A server connection carried by reshape's engine: the address says where requests go, but
    no socket exists; the engine's pooled connections carry them.

    `open_in_place(handler)`, set by the engine join, opens it at once for mitmproxy's
    `ConnectionHandler`: there is nothing to wait for (reshape/mitm/patches/inline_hooks.py)."""

    open_in_place: Callable[[Any], None] | None = None
    # Its EngineChannel (reshape/mitm/engine_channel.py), set by the engine join.
    channel: Any = None


@dataclass
class Exchange:
    """One request on its way through the engine, as the layer knows it."""

    stream_id: int
    flow: http.HTTPFlow
    request: http.Request
    # The body, once complete (None while it streams: see `streamed`).
    body: bytes | None = None
    trailers: http.Headers | None = None
    # The body goes to the origin as it arrives (mitmproxy decided to stream it).
    streamed: bool = False
    ended: bool = False  # the request's end has been seen
    started: bool = False  # handed to the engine


class ExchangeStarter(Protocol):
    """What the layer needs done outside itself (reshape/mitm/engine_channel.py)."""

    def start(self, exchange: Exchange) -> None:
        """Hand the exchange to the engine (its body may still be streaming)."""

    def body_data(self, exchange: Exchange, data: bytes) -> None:
        """More of a streamed request body."""

    def body_end(self, exchange: Exchange) -> None:
        """The streamed request body has ended (its trailers, if any, are on the exchange)."""

    def cancel(self, exchange: Exchange, reason: str) -> None:
        """The client side gave up on the exchange."""


@dataclass
class InterimResponse(HttpEvent):
    """An informational (1xx) response the origin sent ahead of the final one, for the
    stream's client (reshape/mitm/patches/early_hints.py sends it on to an HTTP/2 client)."""

    response: http.Response


@dataclass
class StreamResponse:
    """What the engine has for one stream: HTTP events in order."""

    stream_id: int
    http_events: Sequence[HttpEvent]
    # Called when the events have been handed to the stream: whether the stream still wants
    # more (False: it is gone, e.g. its client reset it; the driver stops reading).
    delivered: Callable[[bool], None] | None = None


@dataclass
class EngineResponses(events.ConnectionEvent):
    """What the engine has for streams of the connection, injected by the driver: the answers
    that arrived in one turn of the event loop (an origin's packet often completes several),
    handed to their streams in order in one pass through the layers."""

    responses: Sequence[StreamResponse] = ()
    # The writes it causes may wait for the end of the event loop's turn, to leave in one
    # system call with those of other passes of that turn (reshape/mitm/patches/inline_hooks.py).
    writes_may_wait: ClassVar[bool] = True

    def __repr__(self) -> str:
        return f"EngineResponses({self.responses!r})"


class HeldOutput(Protocol):
    """The client connection's output, held while an `EngineResponses` passes to the streams
    (reshape/mitm/patches/h2_held_output.py)."""

    def hold(self) -> None:
        """From now on the connection's layer keeps what it would send."""

    def end_hold(self) -> None:
        """It sends again; what it kept waits for `take` (or for its next send)."""

    def take(self) -> bytes:
        """Everything the connection has to send, for one `SendData`."""


class EngineClient(layer.Layer):
    """The only layer of an `EngineServer` connection. `flows` tells which streams of the
    HttpLayer still exist, so that answers for a stream that is gone are dropped and stop the
    exchange. `client_output`, if given, returns the client connection's output to hold while
    answers pass (None: nothing to hold), so that what they make the client's layer send leaves
    in one `SendData` rather than one per event."""

    def __init__(
        self,
        context: layer.Context,
        starter: ExchangeStarter,
        flows: Callable[[int], http.HTTPFlow | None],
        client_output: Callable[[], HeldOutput | None] = lambda: None,
    ) -> None:
        super().__init__(context)
        self.starter = starter
        # The flow of a stream of the HttpLayer, or None once the stream is gone.
        self.flow_of = flows
        self.client_output = client_output
        self.exchanges: dict[int, Exchange] = {}

    def _handle_event(self, event: events.Event) -> layer.CommandGenerator[None]:
        if isinstance(event, events.Start):
            err = yield commands.OpenConnection(self.context.server)
            yield RegisterHttpConnection(self.context.server, err)
        elif isinstance(event, RequestHeaders):
            flow = self.flow_of(event.stream_id)
            if flow is None:
                return
            # mitmproxy streams a request body it does not hold whole (`request.stream`): it
            # sends the head first and the body as it arrives. Otherwise head, whole body and
            # end come together.
            streamed = not event.end_stream and bool(event.request.stream)
            exchange = Exchange(event.stream_id, flow, event.request, streamed=streamed)
            self.exchanges[event.stream_id] = exchange
            if event.end_stream:
                exchange.body, exchange.ended = b"", True
                self._start(exchange)
            elif streamed:
                self._start(exchange)
        elif isinstance(event, RequestData):
            receiving = self.exchanges.get(event.stream_id)
            if receiving is None:
                return
            if receiving.streamed:
                self.starter.body_data(receiving, event.data)
            else:
                receiving.body = (receiving.body or b"") + event.data
        elif isinstance(event, RequestTrailers):
            receiving = self.exchanges.get(event.stream_id)
            if receiving is not None:
                receiving.trailers = event.trailers
        elif isinstance(event, RequestEndOfMessage):
            receiving = self.exchanges.get(event.stream_id)
            if receiving is None:
                return
            receiving.ended = True
            if receiving.streamed:
                self.starter.body_end(receiving)
            else:
                receiving.body = receiving.body or b""
                self._start(receiving)
        elif isinstance(event, RequestProtocolError):
            abandoned = self.exchanges.pop(event.stream_id, None)
            if abandoned is not None:
                self.starter.cancel(abandoned, event.message)
        elif isinstance(event, EngineResponses):
            yield from self._deliver(event)
        elif isinstance(event, events.ConnectionClosed):
            # The driver ended (the client connection is going away): nothing more comes.
            for stream_id in list(self.exchanges):
                self.starter.cancel(self.exchanges.pop(stream_id), "connection closed")
                yield ReceiveHttp(
                    ResponseProtocolError(
                        stream_id, "reshape's upstream engine stopped", ErrorCode.CONNECT_FAILED
                    )
                )
        else:
            raise AssertionError(f"unexpected event for the engine connection: {event!r}")

    def _start(self, exchange: Exchange) -> None:
        if not exchange.started:
            exchange.started = True
            self.starter.start(exchange)

    def _deliver(self, event: EngineResponses) -> layer.CommandGenerator[None]:
        output = self.client_output()
        held: HeldOutput | None = None  # the output, once the first answer a stream wants holds it
        try:
            for response in event.responses:
                stream_id = response.stream_id
                wanted = stream_id in self.exchanges and self.flow_of(stream_id) is not None
                if wanted:
                    if output is not None and held is None:
                        output.hold()
                        held = output
                    for http_event in response.http_events:
                        yield ReceiveHttp(http_event)
                        if isinstance(http_event, (ResponseEndOfMessage, ResponseProtocolError)):
                            self.exchanges.pop(stream_id, None)
                else:
                    self.exchanges.pop(stream_id, None)  # the driver stops when told below
                if response.delivered is not None:
                    response.delivered(wanted and stream_id in self.exchanges)
        finally:
            if held is not None:
                held.end_hold()
        sending = held.take() if held is not None else b""
        if sending:
            yield commands.SendData(self.context.client, sending)
