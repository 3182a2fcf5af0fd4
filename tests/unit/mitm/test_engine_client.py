"""reshape/mitm/engine_client.py: the layer that turns mitmproxy's request events into engine
exchanges and the engine's answers back into response events — driven by hand, without sockets."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from mitmproxy import connection, http, options
from mitmproxy.connection import ConnectionState
from mitmproxy.proxy import commands, events
from mitmproxy.proxy.context import Context
from mitmproxy.proxy.layers.http import RegisterHttpConnection
from mitmproxy.proxy.layers.http._base import ReceiveHttp
from mitmproxy.proxy.layers.http._events import (
    ErrorCode,
    RequestData,
    RequestEndOfMessage,
    RequestHeaders,
    RequestProtocolError,
    RequestTrailers,
    ResponseData,
    ResponseEndOfMessage,
    ResponseHeaders,
    ResponseProtocolError,
)
from mitmproxy.test import tflow

from reshape.mitm.engine_client import (
    EngineClient,
    EngineResponses,
    EngineServer,
    Exchange,
    StreamResponse,
)


@dataclass
class Recorder:
    """An ExchangeStarter that writes down what the layer asked of it."""

    calls: list[tuple[str, int, object]] = field(default_factory=list)

    def start(self, exchange: Exchange) -> None:
        self.calls.append(("start", exchange.stream_id, exchange.body))

    def body_data(self, exchange: Exchange, data: bytes) -> None:
        self.calls.append(("data", exchange.stream_id, data))

    def body_end(self, exchange: Exchange) -> None:
        trailers = list(exchange.trailers.fields) if exchange.trailers else []
        self.calls.append(("end", exchange.stream_id, trailers))

    def cancel(self, exchange: Exchange, reason: str) -> None:
        self.calls.append(("cancel", exchange.stream_id, reason))


def opened_layer() -> tuple[EngineClient, Recorder, dict[int, http.HTTPFlow]]:
    client = connection.Client(
        peername=("127.0.0.1", 50000),
        sockname=("127.0.0.1", 8080),
        timestamp_start=time.time(),
        state=ConnectionState.OPEN,
    )
    context = Context(client, options.Options())
    context.server = EngineServer(address=("origin.test", 80))
    flows: dict[int, http.HTTPFlow] = {}
    recorder = Recorder()
    layer = EngineClient(context, recorder, flows.get)
    start = list(layer.handle_event(events.Start()))
    assert len(start) == 1 and isinstance(start[0], commands.OpenConnection)
    done = list(layer.handle_event(events.OpenConnectionCompleted(start[0], None)))
    assert len(done) == 1 and isinstance(done[0], RegisterHttpConnection) and not done[0].err
    return layer, recorder, flows


def request_on(flows: dict[int, http.HTTPFlow], stream_id: int, *, stream: bool = False):  # type: ignore[no-untyped-def]
    flow = tflow.tflow()
    flow.request.stream = stream
    flows[stream_id] = flow
    return flow.request


def test_a_whole_request_goes_to_the_engine_at_its_end_with_body_and_trailers() -> None:
    layer, recorder, flows = opened_layer()
    request = request_on(flows, 1)
    for event in (
        RequestHeaders(1, request, end_stream=False),
        RequestData(1, b"part one, "),
        RequestData(1, b"part two"),
        RequestTrailers(1, http.Headers([(b"checksum", b"42")])),
    ):
        assert list(layer.handle_event(event)) == []
    assert recorder.calls == []  # nothing leaves before the request is whole
    list(layer.handle_event(RequestEndOfMessage(1)))
    assert recorder.calls == [("start", 1, b"part one, part two")]
    assert layer.exchanges[1].trailers == http.Headers([(b"checksum", b"42")])


def test_a_streamed_request_starts_at_its_head_and_flows_on() -> None:
    layer, recorder, flows = opened_layer()
    request = request_on(flows, 3, stream=True)
    list(layer.handle_event(RequestHeaders(3, request, end_stream=False)))
    list(layer.handle_event(RequestData(3, b"chunk")))
    list(layer.handle_event(RequestTrailers(3, http.Headers([(b"x", b"1")]))))
    list(layer.handle_event(RequestEndOfMessage(3)))
    assert recorder.calls == [
        ("start", 3, None),
        ("data", 3, b"chunk"),
        ("end", 3, [(b"x", b"1")]),
    ]


def test_a_request_without_a_body_starts_at_once() -> None:
    layer, recorder, flows = opened_layer()
    list(layer.handle_event(RequestHeaders(5, request_on(flows, 5), end_stream=True)))
    assert recorder.calls == [("start", 5, b"")]


def test_a_client_that_gives_up_cancels_its_exchange() -> None:
    layer, recorder, flows = opened_layer()
    list(layer.handle_event(RequestHeaders(1, request_on(flows, 1), end_stream=True)))
    error = RequestProtocolError(1, "client disconnected", ErrorCode.CLIENT_DISCONNECTED)
    list(layer.handle_event(error))
    assert recorder.calls[-1] == ("cancel", 1, "client disconnected")
    assert layer.exchanges == {}


def answers(layer: EngineClient, *responses: StreamResponse) -> EngineResponses:
    return EngineResponses(layer.context.server, list(responses))


def test_the_engines_answer_becomes_response_events_for_its_stream() -> None:
    layer, recorder, flows = opened_layer()
    list(layer.handle_event(RequestHeaders(1, request_on(flows, 1), end_stream=True)))
    response = http.Response.make(200, b"")
    told: list[bool] = []
    answer = [
        ResponseHeaders(1, response, end_stream=False),
        ResponseData(1, b"body"),
        ResponseEndOfMessage(1),
    ]
    produced = list(layer.handle_event(answers(layer, StreamResponse(1, answer, told.append))))
    assert [command.event for command in produced if isinstance(command, ReceiveHttp)] == answer
    assert told == [False]  # the response ended: the driver reads no more
    assert layer.exchanges == {}


def test_an_answer_for_a_stream_that_is_gone_is_dropped_and_stops_the_driver() -> None:
    layer, recorder, flows = opened_layer()
    list(layer.handle_event(RequestHeaders(1, request_on(flows, 1), end_stream=True)))
    del flows[1]  # the HttpLayer dropped the stream (its client reset it)
    told: list[bool] = []
    event = answers(layer, StreamResponse(1, [ResponseData(1, b"late")], told.append))
    assert list(layer.handle_event(event)) == []
    assert told == [False]


def test_the_connection_closing_ends_every_open_exchange_with_an_error() -> None:
    layer, recorder, flows = opened_layer()
    list(layer.handle_event(RequestHeaders(1, request_on(flows, 1), end_stream=True)))
    list(layer.handle_event(RequestHeaders(3, request_on(flows, 3), end_stream=True)))
    produced = list(layer.handle_event(events.ConnectionClosed(layer.context.server)))
    errors = [c.event for c in produced if isinstance(c, ReceiveHttp)]
    assert [e.stream_id for e in errors] == [1, 3]
    assert all(isinstance(e, ResponseProtocolError) for e in errors)
    assert [c[0] for c in recorder.calls[-2:]] == ["cancel", "cancel"]


@dataclass
class Output:
    """A HeldOutput that writes down when it was held and what the layer did meanwhile."""

    log: list[str] = field(default_factory=list)
    kept: bytes = b""

    def hold(self) -> None:
        self.log.append("hold")

    def end_hold(self) -> None:
        self.log.append("end_hold")

    def take(self) -> bytes:
        self.log.append("take")
        kept, self.kept = self.kept, b""
        return kept


def held_layer(output: Output) -> tuple[EngineClient, dict[int, http.HTTPFlow]]:
    layer, recorder, flows = opened_layer()
    held = EngineClient(layer.context, recorder, flows.get, lambda: output)
    held.exchanges = layer.exchanges
    return held, flows


def deliver_while_holding(
    layer: EngineClient, output: Output, *responses: StreamResponse
) -> list[Any]:
    """The layer's commands for `responses`; what the client's layer sends for each event it is
    handed stays with `output` (logged as "<stream> <event>") until it is taken."""
    produced = []
    for command in layer.handle_event(answers(layer, *responses)):
        produced.append(command)
        if isinstance(command, ReceiveHttp):
            output.log.append(f"{command.event.stream_id} {type(command.event).__name__}")
            output.kept += b"<frames>"
    return produced


def test_the_client_output_is_held_while_an_answer_passes_then_sent_in_one_piece() -> None:
    output = Output()
    layer, flows = held_layer(output)
    list(layer.handle_event(RequestHeaders(1, request_on(flows, 1), end_stream=True)))
    answer = [
        ResponseHeaders(1, http.Response.make(200, b""), end_stream=False),
        ResponseData(1, b"body"),
        ResponseEndOfMessage(1),
    ]
    produced = deliver_while_holding(layer, output, StreamResponse(1, answer))
    assert output.log == [
        "hold",
        "1 ResponseHeaders",
        "1 ResponseData",
        "1 ResponseEndOfMessage",
        "end_hold",
        "take",
    ]
    sends = [c for c in produced if isinstance(c, commands.SendData)]
    assert len(sends) == 1 and produced[-1] is sends[0]
    assert sends[0].connection is layer.context.client
    assert sends[0].data == b"<frames>" * 3


def test_nothing_is_sent_when_nothing_was_kept_and_an_answer_nobody_wants_holds_nothing() -> None:
    output = Output()
    layer, flows = held_layer(output)
    list(layer.handle_event(RequestHeaders(1, request_on(flows, 1), end_stream=True)))
    answer = [ResponseHeaders(1, http.Response.make(204, b""), end_stream=True)]
    produced = list(layer.handle_event(answers(layer, StreamResponse(1, answer))))
    assert not any(isinstance(c, commands.SendData) for c in produced)
    assert output.log == ["hold", "end_hold", "take"]
    output.log.clear()
    list(layer.handle_event(answers(layer, StreamResponse(7, answer))))  # no such stream
    assert output.log == []


def test_the_hold_ends_even_when_the_pass_breaks_off() -> None:
    output = Output()
    layer, flows = held_layer(output)
    list(layer.handle_event(RequestHeaders(1, request_on(flows, 1), end_stream=True)))
    answer = [ResponseData(1, b"a"), ResponseData(1, b"b")]
    passing = layer.handle_event(answers(layer, StreamResponse(1, answer)))
    next(passing)
    passing.close()  # the pass crashed above the layer
    assert output.log == ["hold", "end_hold"]  # what was kept waits for the connection's next send


def test_answers_for_several_streams_pass_in_order_under_one_hold_and_leave_as_one_send() -> None:
    output = Output()
    layer, flows = held_layer(output)
    for stream_id in (1, 3, 5):
        list(layer.handle_event(RequestHeaders(stream_id, request_on(flows, stream_id), True)))
    del flows[3]  # its client reset it meanwhile
    told: list[tuple[int, bool]] = []

    def answer(stream_id: int, ended: bool) -> StreamResponse:
        events_ = [
            ResponseHeaders(stream_id, http.Response.make(200, b""), end_stream=False),
            ResponseData(stream_id, b"body"),
        ]
        if ended:
            events_.append(ResponseEndOfMessage(stream_id))
        return StreamResponse(stream_id, events_, lambda wanted: told.append((stream_id, wanted)))

    produced = deliver_while_holding(
        layer, output, answer(1, ended=True), answer(3, ended=True), answer(5, ended=False)
    )
    assert output.log == [
        "hold",
        "1 ResponseHeaders",
        "1 ResponseData",
        "1 ResponseEndOfMessage",
        "5 ResponseHeaders",
        "5 ResponseData",
        "end_hold",
        "take",
    ]
    # 1 ended, 3 is gone (dropped, its driver stops), 5 wants the rest of its body.
    assert told == [(1, False), (3, False), (5, True)]
    assert list(layer.exchanges) == [5]
    sends = [c for c in produced if isinstance(c, commands.SendData)]
    assert len(sends) == 1 and produced[-1] is sends[0] and sends[0].data == b"<frames>" * 5
