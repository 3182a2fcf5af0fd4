"""reshape/mitm/engine_channel.py's translations between mitmproxy's messages and the engine's."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
from mitmproxy import http
from mitmproxy.proxy.layers.http._events import ResponseData, ResponseEndOfMessage, ResponseHeaders
from mitmproxy.test import tflow

from reshape.mitm.engine_channel import (
    EngineChannel,
    _BodyStream,
    mitmproxy_response,
    trailer_fields,
    upstream_request,
)
from reshape.mitm.engine_client import EngineResponses, EngineServer, Exchange, InterimResponse
from reshape.upstream.types import Headers, UpstreamError


@dataclass
class Answer:
    """An UpstreamResponse's head, as the engine hands it over."""

    status: int = 200
    reason: bytes = b"OK"
    headers: Headers = field(default_factory=list)
    http_version: str = "HTTP/1.1"
    trailers: Headers = field(default_factory=list)


def test_hop_by_hop_fields_go_and_a_body_without_length_is_marked_chunked() -> None:
    head = mitmproxy_response(
        Answer(headers=[(b"Connection", b"close, x-hop"), (b"X-Hop", b"1"), (b"X-Kept", b"2")]),
        b"GET",
    )
    assert head.http_version == "HTTP/1.1" and head.status_code == 200
    assert list(head.headers.fields) == [(b"X-Kept", b"2"), (b"transfer-encoding", b"chunked")]


@pytest.mark.parametrize(
    ("method", "status"), [(b"HEAD", 200), (b"GET", 204), (b"GET", 304), (b"GET", 103)]
)
def test_a_response_without_a_body_gets_no_framing(method: bytes, status: int) -> None:
    head = mitmproxy_response(Answer(status=status, reason=b""), method)
    assert "transfer-encoding" not in head.headers and head.reason


def test_a_length_the_connection_field_names_is_hop_by_hop_and_the_body_is_chunked() -> None:
    head = mitmproxy_response(
        Answer(headers=[(b"Content-Length", b"4"), (b"Connection", b"Content-Length")]), b"GET"
    )
    assert list(head.headers.fields) == [(b"transfer-encoding", b"chunked")]
    kept = mitmproxy_response(
        Answer(headers=[(b"Content-Length", b"4"), (b"Trailer", b"x")], http_version="HTTP/1.1"),
        b"GET",
    )
    assert list(kept.headers.fields) == [(b"Content-Length", b"4")]  # only h2's gives way


def test_an_http10_client_gets_a_body_without_a_length_as_it_is() -> None:
    # HTTP/1.0 has no chunked coding (RFC 9112 §6.1): such a client read the chunks' framing as
    # part of the body. Unframed, mitmproxy's HTTP/1 server closes the connection at its end.
    plain = mitmproxy_response(Answer(headers=[(b"X", b"1")]), b"GET", chunked=False)
    assert list(plain.headers.fields) == [(b"X", b"1")]
    # An HTTP/2 origin's length goes when it announces trailers, unframed: they cannot follow,
    # but the trailers feature may hold the body and promote them into the head.
    announced = Answer(
        headers=[(b"content-length", b"4"), (b"trailer", b"digest")], http_version="HTTP/2"
    )
    held = mitmproxy_response(announced, b"GET", chunked=False)
    assert list(held.headers.fields) == []  # `Trailer` is this hop's own too


def test_an_h2_length_gives_way_to_announced_trailers_and_stays_otherwise() -> None:
    announced = Answer(
        headers=[(b"content-length", b"4"), (b"trailer", b"digest")], http_version="HTTP/2"
    )
    assert mitmproxy_response(announced, b"GET").headers.get("transfer-encoding") == "chunked"
    plain = Answer(headers=[(b"content-length", b"4")], http_version="HTTP/2")
    assert mitmproxy_response(plain, b"GET").headers.get("content-length") == "4"


def test_only_valid_end_to_end_trailer_fields_pass() -> None:
    fields = [
        (b"digest", b" sha-256=abc "),
        (b"content-length", b"3"),
        (b"connection", b"close"),
        (b"bad name", b"x"),
        (b"x-ctl", b"a\x01b"),
    ]
    assert trailer_fields(fields) == [(b"digest", b"sha-256=abc")]


def exchange_for(url: str, headers: list[tuple[bytes, bytes]]) -> Exchange:
    flow = tflow.tflow()
    flow.request.url = url
    flow.request.headers = http.Headers(headers)
    return Exchange(1, flow, flow.request, body=b"data")


def test_the_authority_is_the_host_field_or_else_the_destination() -> None:
    with_host = exchange_for("http://origin.test:8080/a?b", [(b"Host", b"named.test:8080")])
    request = upstream_request(with_host, None)
    assert (request.method, request.scheme, request.target) == (b"GET", b"http", b"/a?b")
    assert request.authority == b"named.test:8080" and request.body == b"data"
    assert request.idempotent
    without = exchange_for("https://origin.test/a", [])
    assert upstream_request(without, None).authority == b"origin.test"
    on_port = exchange_for("https://origin.test:8443/a", [])
    assert upstream_request(on_port, None).authority == b"origin.test:8443"


def test_the_host_field_and_hop_by_hop_fields_do_not_travel_as_fields() -> None:
    exchange = exchange_for(
        "http://origin.test/",
        [(b"Host", b"origin.test"), (b"Keep-Alive", b"5"), (b"TE", b"trailers"), (b"X-A", b"1")],
    )
    assert upstream_request(exchange, None).headers == [(b"X-A", b"1")]


class Layers:
    """The client connection's handler as the channel sees it: every pass it is given."""

    def __init__(self, unwanted: frozenset[int] = frozenset(), reached: int = 99) -> None:
        self.passes: list[EngineResponses] = []
        self.unwanted = unwanted
        self.reached = reached  # how many of a pass's responses reach their stream

    async def server_event(self, event: EngineResponses) -> None:
        self.passes.append(event)
        for response in event.responses[: self.reached]:
            if response.delivered is not None:  # an interim response's is None: nobody waits
                response.delivered(response.stream_id not in self.unwanted)


def channel_to(layers: Layers) -> EngineChannel:
    channel = EngineChannel(engine=None, server=EngineServer(address=("example.com", 443)))  # type: ignore[arg-type]
    channel.handler = layers
    return channel


def test_what_the_exchanges_hand_over_in_one_turn_goes_in_one_pass_in_order() -> None:
    layers = Layers(unwanted=frozenset({3}))
    channel = channel_to(layers)

    async def exchanges() -> list[bool]:
        first = await asyncio.gather(
            *(channel._inject(n, [ResponseData(n, b"x")]) for n in (1, 3, 5))
        )
        later = await channel._inject(7, [ResponseData(7, b"y")])
        return [*first, later]

    assert asyncio.run(exchanges()) == [True, False, True, True]
    assert [[r.stream_id for r in p.responses] for p in layers.passes] == [[1, 3, 5], [7]]
    assert [r.http_events for r in layers.passes[0].responses] == [
        [ResponseData(n, b"x")] for n in (1, 3, 5)
    ]


def test_a_response_its_pass_never_reached_wants_nothing_more() -> None:
    layers = Layers(reached=1)  # the pass broke off after the first
    channel = channel_to(layers)

    async def exchanges() -> list[bool]:
        return await asyncio.gather(*(channel._inject(n, []) for n in (1, 3)))

    assert asyncio.run(exchanges()) == [True, False]


def test_nothing_is_handed_over_once_the_channel_is_closed() -> None:
    layers = Layers()
    channel = channel_to(layers)
    channel.closed.set()
    assert asyncio.run(channel._inject(1, [])) is False
    assert layers.passes == []


def test_an_interim_response_goes_in_the_next_pass_ahead_of_its_final_head() -> None:
    layers = Layers()
    channel = channel_to(layers)

    async def exchange() -> bool:
        channel._interim(1, 103, [(b"Link", b"</a.css>; rel=preload")])
        return await channel._inject(1, [ResponseData(1, b"x")])

    assert asyncio.run(exchange()) is True
    [only] = layers.passes
    interim, final = only.responses
    [hint] = interim.http_events
    assert isinstance(hint, InterimResponse) and hint.response.status_code == 103
    assert list(hint.response.headers.fields) == [(b"link", b"</a.css>; rel=preload")]
    assert interim.delivered is None and final.http_events == [ResponseData(1, b"x")]


async def test_a_body_the_engine_stops_reading_drops_what_the_client_still_sends() -> None:
    # The origin reset the stream (or answered early): nothing more of the body will be sent,
    # so nothing more is kept, and the client is not held back for it (`drain`).
    told: list[int] = []
    body = _BodyStream(lambda: told.append(body.buffered))
    body.put(b"a")
    body.put(b"bb")
    chunks = aiter(body)
    assert await anext(chunks) == b"a"
    assert body.buffered == 2
    await chunks.aclose()
    assert body.buffered == 0 and told[-1] == 0
    body.put(b"c" * 1000)
    assert body.buffered == 0 and not body.chunks


@dataclass
class Arrived(Answer):
    """A response whose body has arrived whole by the time its head is handed over."""

    body: list[bytes] = field(default_factory=list)

    def read_nowait(self) -> bytes | None:
        return self.body.pop(0) if self.body else b""

    async def read(self) -> bytes:
        return self.read_nowait() or b""

    def abort(self) -> None:
        pass


@pytest.mark.parametrize(
    ("body", "trailers", "complete_in_head"),
    [([], [], True), ([b"x"], [], False), ([], [(b"grpc-status", b"0")], False)],
)
async def test_a_response_complete_in_its_head_ends_the_clients_stream_there(
    body: list[bytes], trailers: Headers, complete_in_head: bool
) -> None:
    # A gRPC error is a head with END_STREAM and its status among its fields ("Trailers-Only"):
    # an empty DATA frame ending the stream after it would leave the client without a status.
    layers = Layers()
    channel = channel_to(layers)
    exchange = exchange_for("https://origin.test/t.Echo/Refuse", [(b"Host", b"origin.test")])
    answer = Arrived(headers=[(b"grpc-status", b"5")], trailers=trailers, body=body)
    await channel._relay(exchange, answer, read_timeout=1)  # type: ignore[arg-type]
    [only] = layers.passes
    head, *rest = only.responses[0].http_events
    assert isinstance(head, ResponseHeaders) and head.end_stream is complete_in_head
    assert isinstance(rest[-1], ResponseEndOfMessage)


class Silent(Answer):
    """A response whose next piece of body comes when `more` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.more = asyncio.Event()

    async def read(self) -> bytes:
        await self.more.wait()
        return b"late"


@pytest.mark.parametrize("body_state", ["awaited", "stalled", "ended"])
async def test_an_origin_is_timed_for_silence_unless_the_engine_waits_for_the_client(
    body_state: str,
) -> None:
    # While the engine waits for the client's next body chunk, the origin may be waiting for
    # it too (a gRPC stream): its silence is not its fault. An origin that takes no more of
    # the body (a chunk waits for its window) and says nothing, or is silent after the body's
    # end, is cut off.
    channel = channel_to(Layers())
    body = channel._bodies[1] = _BodyStream(lambda: None)
    reading = asyncio.ensure_future(anext(body))
    await asyncio.sleep(0)
    assert body.awaited
    if body_state == "stalled":
        body.put(b"chunk for a shut window")
        await reading  # the engine took it and waits for the origin, not for the client
        body.put(b"the client's next")
    elif body_state == "ended":
        body.end()
        with pytest.raises(StopAsyncIteration):
            await reading
    answer = Silent()
    asyncio.get_running_loop().call_later(0.2, answer.more.set)
    piece = channel._next_piece(1, answer, read_timeout=0.05)  # type: ignore[arg-type]
    if body_state == "awaited":
        assert await piece == b"late"
        reading.cancel()
    else:
        assert not body.awaited
        with pytest.raises(UpstreamError, match="origin silent for 0.05 s"):
            await piece


def test_a_204s_length_goes_and_a_304s_and_a_heads_stay() -> None:
    # A server must not send Content-Length in a 204 (RFC 9110 §8.6); relayed, an HTTP/2
    # client (curl, nghttp2) refused the stream (PROTOCOL_ERROR). A 304's and a HEAD's say
    # the representation's length, which they may.
    answer = Answer(status=204, reason=b"", headers=[(b"Content-Length", b"5"), (b"X", b"1")])
    assert list(mitmproxy_response(answer, b"GET").headers.fields) == [(b"X", b"1")]
    for status, method in ((304, b"GET"), (200, b"HEAD")):
        kept = Answer(status=status, headers=[(b"Content-Length", b"5")])
        assert mitmproxy_response(kept, method).headers.get("content-length") == "5"


def test_a_response_field_with_a_control_character_does_not_pass() -> None:
    # A field value with a control character (RFC 9110 §5.5) from an HTTP/1.1 origin: an
    # HTTP/2 client refused the whole response (PROTOCOL_ERROR), an HTTP/1.1 client got the raw
    # byte. It goes, as such trailer fields do; the others, tabs inside values too, stay.
    answer = Answer(headers=[(b"X-Ctl", b"a\x01b"), (b"X-Del", b"a\x7fb"), (b"X-Tab", b"a\tb")])
    fields = mitmproxy_response(answer, b"GET").headers.fields
    assert [name for name, _ in fields] == [b"X-Tab", b"transfer-encoding"]
