"""reshape/upstream/http2.py: the engine's HTTP/2 client codec, against h2's server end (a peer
that speaks the protocol right) and against frames made by hand (an origin that does not)."""

from __future__ import annotations

import struct

import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest
from hpack import Encoder
from hypothesis import given, settings
from hypothesis import strategies as st

from reshape.upstream.h2 import origin_connection
from reshape.upstream.hpack_decoder import HeadDecoder
from reshape.upstream.hpack_encoder import RequestHeadEncoder
from reshape.upstream.http2 import (
    CANCEL,
    COMPRESSION_ERROR,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    MAX_CONTINUATIONS,
    MAX_EMPTY_FRAMES_IN_A_ROW,
    MAX_INTERIM_RESPONSES,
    MAX_OWED_CONTROL_FRAMES,
    PROTOCOL_ERROR,
    STREAM_CLOSED,
    ClientConnection,
    ConnectionTerminated,
    DataReceived,
    InformationalResponse,
    ProtocolError,
    ResponseReceived,
    SettingsChanged,
    StreamEnded,
    StreamIdsExhausted,
    StreamReset,
    TrailersReceived,
    WindowUpdated,
)

HEAD = [(b":method", b"GET"), (b":scheme", b"https"), (b":authority", b"a.test"), (b":path", b"/")]
POST = [(b":method", b"POST"), *HEAD[1:]]


def server_end(**settings: int) -> h2.connection.H2Connection:
    server = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=False, header_encoding=None)
    )
    server.initiate_connection()
    if settings:
        server.update_settings(
            {getattr(h2.settings.SettingCodes, k): v for k, v in settings.items()}
        )
    return server


def pump(client: ClientConnection, server: h2.connection.H2Connection) -> tuple[list, list]:
    """Bytes both ways until neither has any: (the client's events, the server's)."""
    client_events: list = []
    server_events: list = []
    for _ in range(10):
        out = client.data_to_send()
        if out:
            server_events += server.receive_data(out)
        back = server.data_to_send()
        if back:
            client_events += client.receive_data(back)
        if not out and not back:
            break
    return client_events, server_events


def connected(**settings: int) -> tuple[ClientConnection, h2.connection.H2Connection]:
    client = origin_connection()
    client.initiate()
    server = server_end(**settings)
    events, _ = pump(client, server)
    assert any(type(e) is SettingsChanged for e in events)
    return client, server


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I B I", len(payload) << 8 | kind, flags, stream_id) + payload


def block(fields: list[tuple[bytes, bytes]]) -> bytes:
    return Encoder().encode(fields)


def raw_client() -> ClientConnection:
    """A client that has received an empty SETTINGS, for frames made by hand (each test's
    header blocks come from a fresh encoder: no dynamic table is shared)."""
    client = ClientConnection(encoder=RequestHeadEncoder(), decoder=HeadDecoder())
    client.initiate()
    assert client.receive_data(frame(4, 0, 0)) == [SettingsChanged(False)]
    client.data_to_send()
    return client


def goaway_code(data: bytes) -> int:
    at = 0
    while at + 9 <= len(data):
        length_kind, _, _ = struct.unpack_from(">I B I", data, at)
        length, kind = length_kind >> 8, length_kind & 0xFF
        if kind == 7:
            return struct.unpack_from(">II", data, at + 9)[1]
        at += 9 + length
    raise AssertionError("no GOAWAY")


def has_goaway(data: bytes) -> bool:
    try:
        goaway_code(data)
    except AssertionError:
        return False
    return True


def test_a_request_and_its_response() -> None:
    client, server = connected()
    stream_id = client.next_stream_id()
    assert stream_id == 1
    client.send_headers(stream_id, [*HEAD, (b"accept", b"*/*")], end_stream=True)
    _, server_events = pump(client, server)
    (request,) = [e for e in server_events if isinstance(e, h2.events.RequestReceived)]
    assert request.headers == [*HEAD, (b"accept", b"*/*")]
    assert request.stream_ended is not None
    server.send_headers(1, [(b":status", b"200"), (b"content-length", b"5"), (b"x-a", b"b")])
    server.send_data(1, b"hello", end_stream=True)
    events, _ = pump(client, server)
    assert events == [
        ResponseReceived(1, 200, [(b"content-length", b"5"), (b"x-a", b"b")], False),
        DataReceived(1, b"hello", 5),
        StreamEnded(1),
    ]
    assert client.open_streams == 0
    assert client.next_stream_id() == 3


def test_the_preface_says_what_this_side_takes() -> None:
    client, server = connected()
    said = server.remote_settings
    assert said.enable_push == 0
    assert said.initial_window_size == 6 << 20
    assert said.max_header_list_size == client.decoder.max_header_list_size == 65_536


def test_a_body_waits_for_the_origins_windows() -> None:
    client, server = connected(INITIAL_WINDOW_SIZE=10)
    client.send_headers(1, POST, end_stream=False)
    assert client.send_window_of(1) == 10
    with pytest.raises(ProtocolError):
        client.send_data(1, b"x" * 11)
    client.send_data(1, b"x" * 10)
    assert client.send_window_of(1) == 0
    _, server_events = pump(client, server)
    (data,) = [e for e in server_events if isinstance(e, h2.events.DataReceived)]
    server.acknowledge_received_data(10, 1)
    server.increment_flow_control_window(100, stream_id=1)
    events, _ = pump(client, server)
    assert WindowUpdated(1) in events
    assert client.send_window_of(1) == 110
    client.send_data(1, b"y" * 5)
    client.end_stream(1)
    _, server_events = pump(client, server)
    assert [e.data for e in server_events if isinstance(e, h2.events.DataReceived) and e.data] == [
        b"y" * 5
    ]
    assert any(isinstance(e, h2.events.StreamEnded) for e in server_events)


def test_the_origins_initial_window_changes_open_streams() -> None:
    client, server = connected()
    client.send_headers(1, POST, end_stream=False)
    pump(client, server)
    assert client.send_window_of(1) == 16_384  # the frame size bounds it
    server.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 100})
    pump(client, server)
    assert client.send_window_of(1) == 100


def test_a_large_head_goes_in_continuation_frames() -> None:
    client, server = connected()
    big = [(b"x-big-%d" % n, b"v" * 1000) for n in range(40)]
    client.send_headers(1, [*HEAD, *big], end_stream=True)
    out = client.data_to_send()
    assert out.count(b"\x09\x00\x00\x00\x00\x01") or len(out) > 16_384  # CONTINUATION type
    events = server.receive_data(out)
    (request,) = [e for e in events if isinstance(e, h2.events.RequestReceived)]
    assert request.headers == [*HEAD, *big]


def test_trailers_both_ways() -> None:
    client, server = connected()
    client.send_headers(1, POST, end_stream=False)
    client.send_data(1, b"body")
    client.send_headers(1, [(b"x-checksum", b"1")], end_stream=True)
    _, server_events = pump(client, server)
    (trailers,) = [e for e in server_events if isinstance(e, h2.events.TrailersReceived)]
    assert trailers.headers == [(b"x-checksum", b"1")]
    server.send_headers(1, [(b":status", b"200")])
    server.send_data(1, b"ok")
    server.send_headers(1, [(b"grpc-status", b"0")], end_stream=True)
    events, _ = pump(client, server)
    assert events == [
        ResponseReceived(1, 200, [], False),
        DataReceived(1, b"ok", 2),
        TrailersReceived(1, [(b"grpc-status", b"0")]),
        StreamEnded(1),
    ]


def test_an_informational_response_comes_before_the_final_one() -> None:
    client, server = connected()
    client.send_headers(1, HEAD, end_stream=True)
    pump(client, server)
    server.send_headers(1, [(b":status", b"103"), (b"link", b"</a.css>; rel=preload")])
    server.send_headers(1, [(b":status", b"204")], end_stream=True)
    events, _ = pump(client, server)
    assert events == [
        InformationalResponse(1, 103, [(b"link", b"</a.css>; rel=preload")]),
        ResponseReceived(1, 204, [], True),
        StreamEnded(1),
    ]


EARLY_HINTS = [(b":status", b"103"), (b"link", b"</a.css>; rel=preload")]


@pytest.mark.parametrize("one_read", [True, False], ids=["in one read", "one read each"])
def test_informational_responses_past_the_bound_reset_their_stream_alone(one_read: bool) -> None:
    """Past MAX_INTERIM_RESPONSES 1xx responses on a stream (100 Continue counted), that stream
    is reset (ENHANCE_YOUR_CALM) and its request answered with the error; the connection and
    its other streams go on. Those before the bound are handed on."""
    client, server = connected()
    client.send_headers(1, HEAD, end_stream=True)
    client.send_headers(3, HEAD, end_stream=True)
    pump(client, server)
    server.send_headers(1, [(b":status", b"100")])
    sent = [server.data_to_send()]
    for _ in range(MAX_INTERIM_RESPONSES):
        server.send_headers(1, EARLY_HINTS)
        sent.append(server.data_to_send())
    events = []
    for data in [b"".join(sent)] if one_read else sent:
        events += client.receive_data(data)
    informational = [e for e in events if isinstance(e, InformationalResponse)]
    assert len(informational) == MAX_INTERIM_RESPONSES and informational[0].status == 100
    reset = events[-1]
    assert type(reset) is StreamReset
    assert (reset.stream_id, reset.error_code) == (1, ENHANCE_YOUR_CALM)
    assert "more than 100 informational (1xx) responses" in reset.reset_here
    assert "stream 1" in reset.reset_here
    out = client.data_to_send()
    assert frame(3, 0, 1, struct.pack(">I", ENHANCE_YOUR_CALM)) in out and not has_goaway(out)
    assert not client.closed and client.open_streams == 1
    # The stream's final answer, come too late, is dropped; the other stream is answered.
    server.send_headers(1, [(b":status", b"200")], end_stream=True)
    server.send_headers(3, [(b":status", b"204")], end_stream=True)
    assert client.receive_data(server.data_to_send()) == [
        ResponseReceived(3, 204, [], True),
        StreamEnded(3),
    ]


def test_the_bound_on_informational_responses_is_each_streams() -> None:
    client, server = connected()
    for stream_id in (1, 3):
        client.send_headers(stream_id, HEAD, end_stream=True)
    pump(client, server)
    for stream_id in (1, 3):
        for _ in range(MAX_INTERIM_RESPONSES):
            server.send_headers(stream_id, EARLY_HINTS)
        server.send_headers(stream_id, [(b":status", b"204")], end_stream=True)
    events, _ = pump(client, server)
    assert sum(isinstance(e, InformationalResponse) for e in events) == 2 * MAX_INTERIM_RESPONSES
    assert [e for e in events if type(e) is StreamEnded] == [StreamEnded(1), StreamEnded(3)]
    assert not any(type(e) is StreamReset for e in events)


def test_informational_responses_are_bounded_in_size_together() -> None:
    """Each 1xx head is under the decoder's limit (64 KB decoded) by itself, but many add up:
    together they may be as large as one head, as in Go's transport. Sized as HPACK counts a
    header list (RFC 7541 §4.1: name, value and 32 per field), so that a field sent once and
    then named by its index counts each time."""
    client = raw_client()
    client.send_headers(1, HEAD, end_stream=True)
    client.send_headers(3, HEAD, end_stream=True)
    client.data_to_send()
    encoder = Encoder()  # the origin's: after the first, each 103 names its field by its index
    hint = [(b":status", b"103"), (b"link", b"l" * 3_000)]
    per_head = sum(len(n) + len(v) + 32 for n, v in hint)
    fit = client.decoder.max_header_list_size // per_head
    assert 1 < fit < MAX_INTERIM_RESPONSES
    data = b"".join(frame(1, 0x4, 1, encoder.encode(hint)) for _ in range(fit + 1))
    assert len(data) < 5_000  # small on the wire
    events = client.receive_data(data)
    assert [type(e) for e in events] == [InformationalResponse] * fit + [StreamReset]
    assert events[-1].error_code == ENHANCE_YOUR_CALM
    assert "larger than 65536 bytes together" in events[-1].reset_here
    answer = frame(1, 0x5, 3, encoder.encode([(b":status", b"204")]))
    assert client.receive_data(answer) == [ResponseReceived(3, 204, [], True), StreamEnded(3)]


def test_data_taken_is_given_back_once_half_a_window_is() -> None:
    client = ClientConnection(
        encoder=RequestHeadEncoder(), decoder=HeadDecoder(), stream_window=1000
    )
    client.initiate()
    server = server_end()
    pump(client, server)
    client.send_headers(1, HEAD, end_stream=True)
    pump(client, server)
    server.send_headers(1, [(b":status", b"200")])
    server.send_data(1, b"x" * 400)
    events, _ = pump(client, server)
    assert server.local_flow_control_window(1) == 600
    client.acknowledge_received_data(400, 1)
    assert client.data_to_send() == b""  # less than half of the stream's window
    server.send_data(1, b"x" * 200)
    pump(client, server)
    client.acknowledge_received_data(200, 1)
    pump(client, server)
    assert server.local_flow_control_window(1) == 1000


def test_ping_settings_and_goaway() -> None:
    client, server = connected()
    server.ping(b"12345678")
    server.update_settings({h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 7})
    events, server_events = pump(client, server)
    assert any(isinstance(e, h2.events.PingAckReceived) for e in server_events)
    assert SettingsChanged(True) in events
    assert client.remote_max_concurrent_streams == 7
    client.send_headers(1, HEAD, end_stream=True)
    pump(client, server)
    server.close_connection(last_stream_id=1)
    events, _ = pump(client, server)
    assert events == [ConnectionTerminated(0, 1, b"")]


def test_a_table_size_the_origin_sets_is_told_to_its_decoder() -> None:
    client, server = connected(HEADER_TABLE_SIZE=0)
    for stream_id in (1, 3):
        client.send_headers(stream_id, [*HEAD, (b"x-repeated", b"v" * 50)], end_stream=True)
        _, server_events = pump(client, server)
        assert [e for e in server_events if isinstance(e, h2.events.RequestReceived)]
    assert client.encoder.header_table_size == 0


def test_the_origins_stream_limit_is_kept() -> None:
    client, server = connected(MAX_CONCURRENT_STREAMS=1)
    client.send_headers(1, HEAD, end_stream=True)
    with pytest.raises(ProtocolError, match="at most 1 streams"):
        client.send_headers(3, HEAD, end_stream=True)


def test_stream_ids_run_out() -> None:
    client, _ = connected()
    client._next_stream_id = 2**31 + 1
    with pytest.raises(StreamIdsExhausted):
        client.next_stream_id()


def test_a_reset_from_the_origin_and_its_late_frames() -> None:
    client = raw_client()
    client.send_headers(1, HEAD, end_stream=True)
    events = client.receive_data(frame(3, 0, 1, struct.pack(">I", 7)))
    assert events == [StreamReset(1, 7)]
    assert client.open_streams == 0
    # A late DATA frame is dropped; its bytes still count against the connection's window
    # and are given back.
    window = client.receive_window
    assert client.receive_data(frame(0, 0, 1, b"x" * 100)) == []
    assert client.receive_window == window - 100
    client.data_to_send()


def test_a_stream_this_side_resets_drops_what_follows() -> None:
    client = raw_client()
    client.send_headers(1, HEAD, end_stream=True)
    client.reset_stream(1, CANCEL)
    out = client.data_to_send()
    assert frame(3, 0, 1, struct.pack(">I", CANCEL)) in out
    response = frame(1, 0x4, 1, block([(b":status", b"200")]))
    assert client.receive_data(response + frame(0, 1, 1, b"late")) == []
    client.reset_stream(1)  # already gone: nothing more
    assert b"\x03\x00\x00\x00\x00\x01" not in client.data_to_send()


def test_padding_is_taken_off_and_counted() -> None:
    client = raw_client()
    client.send_headers(1, HEAD, end_stream=True)
    head = frame(1, 0x4 | 0x8, 1, b"\x02" + block([(b":status", b"200")]) + b"\x00\x00")
    data = frame(0, 0x1 | 0x8, 1, b"\x03abc\x00\x00\x00")
    assert client.receive_data(head + data) == [
        ResponseReceived(1, 200, [], False),
        DataReceived(1, b"abc", 7),
        StreamEnded(1),
    ]


def test_bytes_in_any_pieces_give_the_same_events() -> None:
    client = raw_client()
    client.send_headers(1, HEAD, end_stream=True)
    data = (
        frame(1, 0x4, 1, block([(b":status", b"200"), (b"content-length", b"3")]))
        + frame(6, 0, 0, b"abcdefgh")
        + frame(0, 0x1, 1, b"abc")
    )
    events = []
    for at in range(len(data)):
        events += client.receive_data(data[at : at + 1])
    assert events == [
        ResponseReceived(1, 200, [(b"content-length", b"3")], False),
        DataReceived(1, b"abc", 3),
        StreamEnded(1),
    ]
    assert frame(6, 1, 0, b"abcdefgh") in client.data_to_send()  # the PING's ACK


def test_a_response_to_head_has_no_body_whatever_its_length() -> None:
    client = raw_client()
    client.send_headers(1, [(b":method", b"HEAD"), *HEAD[1:]], end_stream=True)
    head = frame(1, 0x4 | 0x1, 1, block([(b":status", b"200"), (b"content-length", b"99")]))
    assert client.receive_data(head) == [
        ResponseReceived(1, 200, [(b"content-length", b"99")], True),
        StreamEnded(1),
    ]


def test_a_header_block_may_be_split_by_the_origin() -> None:
    client = raw_client()
    client.send_headers(1, HEAD, end_stream=True)
    whole = block([(b":status", b"200"), (b"x-long", b"y" * 100)])
    data = (
        frame(1, 0x1, 1, whole[:10]) + frame(9, 0, 1, whole[10:50]) + frame(9, 0x4, 1, whole[50:])
    )
    assert client.receive_data(data) == [
        ResponseReceived(1, 200, [(b"x-long", b"y" * 100)], True),
        StreamEnded(1),
    ]


def test_a_body_on_a_response_to_head_resets_its_stream() -> None:
    client = raw_client()
    client.send_headers(1, [(b":method", b"HEAD"), *HEAD[1:]], end_stream=True)
    head = frame(1, 0x4, 1, block([(b":status", b"200"), (b"content-length", b"3")]))
    events = client.receive_data(head + frame(0, 0x1, 1, b"abc"))
    assert events[0] == ResponseReceived(1, 200, [(b"content-length", b"3")], False)
    assert events[1] == StreamReset(
        1,
        PROTOCOL_ERROR,
        reset_here="malformed response from the origin: stream 1: a body in the response to "
        "HEAD, which has none",
    )
    assert not client.closed


def test_frames_on_a_stream_closed_both_ways_are_dropped_with_a_reset() -> None:
    # RFC 9113 §5.1: a stream error (RST_STREAM STREAM_CLOSED), not the connection's: the other
    # streams on the connection carry on.
    client = raw_client()
    client.send_headers(1, HEAD, end_stream=True)
    client.send_headers(3, HEAD, end_stream=True)
    client.data_to_send()
    assert client.receive_data(_head([(b":status", b"200")], 0x5))[-1] == StreamEnded(1)
    window = client.receive_window
    late = _head([(b":status", b"200")], 0x5) + frame(0, 0, 1, b"x" * 100)
    assert client.receive_data(late) == []
    assert client.receive_window == window - 100  # counted, and given back in time
    out = client.data_to_send()
    assert out.count(frame(3, 0, 1, struct.pack(">I", STREAM_CLOSED))) == 1  # told once
    assert not has_goaway(out) and not client.closed
    response = frame(1, 0x5, 3, Encoder().encode([(b":status", b"204")]))
    assert client.receive_data(response)[0] == ResponseReceived(3, 204, [], True)


def test_frames_on_a_stream_the_origin_has_ended_reset_only_that_stream() -> None:
    # Half-closed (remote): its response has ended, its request body is still going out. More
    # from the origin on it is a stream error (RFC 9113 §5.1): the stream is reset, its
    # response stands, and the connection carries on.
    client = raw_client()
    client.send_headers(1, POST, end_stream=False)
    client.data_to_send()
    assert client.receive_data(_head([(b":status", b"413")], 0x5))[-1] == StreamEnded(1)
    assert client.receive_data(frame(0, 0, 1, b"more")) == [StreamReset(1, STREAM_CLOSED)]
    out = client.data_to_send()
    assert frame(3, 0, 1, struct.pack(">I", STREAM_CLOSED)) in out
    assert not has_goaway(out) and client.open_streams == 0


def test_a_stream_reset_long_ago_does_not_take_the_connection_down() -> None:
    # Only the last RESET_MEMORY resets are remembered; a late frame on an older one is dropped
    # as for any closed stream.
    client = raw_client()
    for stream_id in range(1, 2 * 1_100, 2):
        client.send_headers(stream_id, HEAD, end_stream=True)
        client.reset_stream(stream_id)
    client.data_to_send()
    assert client.receive_data(frame(0, 0, 1, b"late")) == []
    assert not has_goaway(client.data_to_send()) and not client.closed


def test_the_frames_before_a_broken_one_are_kept_with_the_error() -> None:
    client = raw_client()
    client.send_headers(1, HEAD, end_stream=True)
    complete = _head([(b":status", b"200"), (b"content-length", b"2")]) + frame(0, 1, 1, b"ok")
    bad_ping = frame(6, 0, 0, b"short")
    with pytest.raises(ProtocolError) as caught:
        client.receive_data(complete + bad_ping)
    assert caught.value.events == [
        ResponseReceived(1, 200, [(b"content-length", b"2")], False),
        DataReceived(1, b"ok", 2),
        StreamEnded(1),
    ]


def test_an_empty_end_of_stream_needs_no_window() -> None:
    # The origin lowered its initial window below what the stream had sent: the stream's window
    # is negative, and END_STREAM alone still goes (RFC 9113 §6.9.1).
    client = raw_client()
    client.receive_data(frame(4, 0, 0, struct.pack(">HI", 4, 10)))  # INITIAL_WINDOW_SIZE 10
    client.send_headers(1, POST, end_stream=False)
    client.send_data(1, b"0123456789")
    client.receive_data(frame(4, 0, 0, struct.pack(">HI", 4, 4)))
    assert client.send_window_of(1) == -6
    client.data_to_send()
    client.end_stream(1)
    assert client.data_to_send().endswith(frame(0, 0x1, 1))


@pytest.mark.parametrize(("status", "length"), [(304, b"1234"), (204, b"12")])
def test_a_response_without_content_may_announce_a_length(status: int, length: bytes) -> None:
    # RFC 9113 §8.1.1: a response without content may announce a length (a 304 the unsent
    # representation's; a 204 by a server's mistake, on one stream, no reason to end the
    # connection's others).
    client = raw_client()
    client.send_headers(1, HEAD[:3] + [(b":path", b"/cached")], end_stream=True)
    head = frame(1, 0x5, 1, block([(b":status", b"%d" % status), (b"content-length", length)]))
    assert client.receive_data(head) == [
        ResponseReceived(1, status, [(b"content-length", length)], True),
        StreamEnded(1),
    ]


@pytest.mark.parametrize("status", [204, 304])
def test_a_response_without_content_may_end_with_an_empty_data_frame(status: int) -> None:
    # Nothing of content in it (padding is none): as a response ending in its head.
    client = raw_client()
    client.send_headers(1, HEAD, end_stream=True)
    head = _head([(b":status", b"%d" % status), (b"content-length", b"4")])
    padding = frame(0, 0x8, 1, b"\x02\x00\x00")
    assert client.receive_data(head + padding + frame(0, 0x1, 1)) == [
        ResponseReceived(1, status, [(b"content-length", b"4")], False),
        DataReceived(1, b"", 3),
        StreamEnded(1),
    ]
    assert not client.closed and client.open_streams == 0


def _head(fields: list[tuple[bytes, bytes]], flags: int = 0x4) -> bytes:
    return frame(1, flags, 1, block(fields))


_LONG_BLOCK = block([(b":status", b"200"), (b"x-long", b"y" * 100)])


def _in_continuations(count: int) -> bytes:
    """_LONG_BLOCK's response head (ending its stream) on stream 1: a HEADERS frame with its first
    byte, then `count` CONTINUATION frames, the last with the rest."""
    pieces = [_LONG_BLOCK[i : i + 1] for i in range(1, count)] + [_LONG_BLOCK[count:]]
    data = frame(1, 0x1, 1, _LONG_BLOCK[:1]) + b"".join(frame(9, 0, 1, p) for p in pieces[:-1])
    return data + frame(9, 0x4, 1, pieces[-1])


def expect_connection_error(client: ClientConnection, data: bytes, code: int) -> None:
    """`data` is a connection error `code`, and the GOAWAY that says so is queued."""
    with pytest.raises(ProtocolError) as caught:
        client.receive_data(data)
    assert caught.value.error_code == code
    assert goaway_code(client.data_to_send()) == code


BAD = {
    "first frame not SETTINGS": (frame(6, 0, 0, b"12345678"), PROTOCOL_ERROR, False),
    "frame too large": (frame(0, 0, 1, b"x" * 16_385), FRAME_SIZE_ERROR, True),
    "DATA on a stream never opened": (frame(0, 0, 5, b"x"), PROTOCOL_ERROR, True),
    "DATA on an even stream": (frame(0, 0, 2, b"x"), PROTOCOL_ERROR, True),
    "an interrupted header block": (
        frame(1, 0, 1, block([(b":status", b"200")])) + frame(6, 0, 0, b"12345678"),
        PROTOCOL_ERROR,
        True,
    ),
    "CONTINUATION alone": (frame(9, 0x4, 1, b""), PROTOCOL_ERROR, True),
    "PUSH_PROMISE": (frame(5, 0x4, 1, b"\x00\x00\x00\x02"), PROTOCOL_ERROR, True),
    "push enabled": (frame(4, 0, 0, struct.pack(">HI", 2, 1)), PROTOCOL_ERROR, True),
    "a frame size below the least": (
        frame(4, 0, 0, struct.pack(">HI", 5, 100)),
        PROTOCOL_ERROR,
        True,
    ),
    "SETTINGS of a bad length": (frame(4, 0, 0, b"\x00\x01\x00"), FRAME_SIZE_ERROR, True),
    "a window above 2^31-1": (
        frame(8, 0, 0, struct.pack(">I", 2**31 - 1)),
        FLOW_CONTROL_ERROR,
        True,
    ),
    "a WINDOW_UPDATE of 0": (frame(8, 0, 0, struct.pack(">I", 0)), PROTOCOL_ERROR, True),
    "a WINDOW_UPDATE on a stream never opened": (
        frame(8, 0, 9, struct.pack(">I", 1)),
        PROTOCOL_ERROR,
        True,
    ),
    "a WINDOW_UPDATE on a stream the origin cannot open": (
        frame(8, 0, 2, struct.pack(">I", 1)),
        PROTOCOL_ERROR,
        True,
    ),
    "a PING of 7 bytes": (frame(6, 0, 0, b"1234567"), FRAME_SIZE_ERROR, True),
    "RST_STREAM on stream 0": (frame(3, 0, 0, b"\x00\x00\x00\x00"), PROTOCOL_ERROR, True),
    "RST_STREAM on a stream never opened": (
        frame(3, 0, 9, b"\x00\x00\x00\x00"),
        PROTOCOL_ERROR,
        True,
    ),
    "empty DATA frames in a row": (
        _head([(b":status", b"200")]) + frame(0, 0, 1) * (MAX_EMPTY_FRAMES_IN_A_ROW + 1),
        ENHANCE_YOUR_CALM,
        True,
    ),
    "a header block in too many CONTINUATION frames": (
        _in_continuations(MAX_CONTINUATIONS + 1),
        ENHANCE_YOUR_CALM,
        True,
    ),
    "a block HPACK cannot decode": (
        frame(1, 0x4, 1, b"\xff\xff\xff\xff\x7f"),
        COMPRESSION_ERROR,
        True,
    ),
}


# Malformed responses (RFC 9113 §8.1.1): each the error of its stream, not the connection's.
MALFORMED = {
    "DATA before the head": frame(0, 0, 1, b"x"),
    "body short of its length": _head([(b":status", b"200"), (b"content-length", b"5")])
    + frame(0, 1, 1, b"abc"),
    "body beyond its length": _head([(b":status", b"200"), (b"content-length", b"1")])
    + frame(0, 0, 1, b"abc"),
    "two different lengths": _head(
        [(b":status", b"200"), (b"content-length", b"1"), (b"content-length", b"2")]
    ),
    "a length not a number": _head([(b":status", b"200"), (b"content-length", b"-1")]),
    "no :status": _head([(b"x-a", b"b")]),
    "a bad :status": _head([(b":status", b"20x")]),
    "a request pseudo-field": _head([(b":status", b"200"), (b":path", b"/")]),
    "an upper-case name": _head([(b":status", b"200"), (b"X-A", b"b")]),
    "a connection field": _head([(b":status", b"200"), (b"connection", b"close")]),
    "transfer-encoding": _head([(b":status", b"200"), (b"transfer-encoding", b"chunked")]),
    "a value with a line break": _head([(b":status", b"200"), (b"x-a", b"b\r\nx-b: c")]),
    "a value with surrounding space": _head([(b":status", b"200"), (b"x-a", b" b")]),
    "101": _head([(b":status", b"101")]),
    "a 1xx ending the stream": _head([(b":status", b"103")], 0x5),
    "trailers not ending the stream": _head([(b":status", b"200")]) + _head([(b"x-t", b"1")]),
    "a pseudo-field in trailers": _head([(b":status", b"200")])
    + frame(1, 0x5, 1, block([(b":status", b"200")])),
    "a content-length too long to be one": _head(
        [(b":status", b"200"), (b"content-length", b"9" * 4_400)]
    ),
    # RFC 9110 §6.4.1: no content, whatever the content-length says. Relayed to an HTTP/1.1
    # client, the body would be read as the answer to its next request.
    "a body on a 204": _head([(b":status", b"204"), (b"content-length", b"4")])
    + frame(0, 1, 1, b"EVIL"),
    "a body on a 304": _head([(b":status", b"304")]) + frame(0, 0, 1, b"x"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_response_resets_its_stream_and_the_connection_goes_on(case: str) -> None:
    client = raw_client()
    client.send_headers(1, HEAD, end_stream=True)
    client.send_headers(3, HEAD, end_stream=True)
    client.data_to_send()
    events = client.receive_data(MALFORMED[case])
    reset = events[-1]
    assert isinstance(reset, StreamReset) and reset.stream_id == 1, events
    assert reset.error_code == PROTOCOL_ERROR and "stream 1" in reset.reset_here
    assert not client.closed
    out = client.data_to_send()
    assert frame(3, 0, 1, struct.pack(">I", PROTOCOL_ERROR)) in out and not has_goaway(out)
    # The stream's late frames are dropped; the others go on.
    late = frame(0, 0x1, 1, b"late")
    answer = frame(1, 0x5, 3, block([(b":status", b"204")]))
    assert client.receive_data(late + answer) == [
        ResponseReceived(3, 204, [], True),
        StreamEnded(3),
    ]


# RFC 9113 §6.9, §6.9.1: on a stream, these are that stream's errors.
STREAM_WINDOW_ERRORS = {
    "a WINDOW_UPDATE of 0": (struct.pack(">I", 0), PROTOCOL_ERROR),
    "a window above 2^31-1": (struct.pack(">I", 2**31 - 1), FLOW_CONTROL_ERROR),
}


@pytest.mark.parametrize("case", list(STREAM_WINDOW_ERRORS))
@pytest.mark.parametrize("response_ended", [False, True])
def test_a_broken_window_update_on_a_stream_resets_that_stream_alone(
    case: str, response_ended: bool
) -> None:
    payload, code = STREAM_WINDOW_ERRORS[case]
    client = raw_client()
    client.send_headers(1, POST, end_stream=False)  # its body still to go
    client.send_headers(3, HEAD, end_stream=True)
    client.data_to_send()
    if response_ended:  # half-closed (remote): the origin may still update its window
        assert client.receive_data(_head([(b":status", b"200")], 0x5))[-1] == StreamEnded(1)
    events = client.receive_data(frame(8, 0, 1, payload))
    assert len(events) == 1 and events[0].stream_id == 1 and events[0].error_code == code
    assert "stream 1" in events[0].reset_here
    out = client.data_to_send()
    assert frame(3, 0, 1, struct.pack(">I", code)) in out and not has_goaway(out)
    assert not client.closed and client.open_streams == 1
    # Late frames on the reset stream are dropped; the other stream is answered.
    late = frame(8, 0, 1, struct.pack(">I", 1)) + frame(0, 0x1, 1, b"late")
    answer = frame(1, 0x5, 3, block([(b":status", b"204")]))
    assert client.receive_data(late + answer) == [
        ResponseReceived(3, 204, [], True),
        StreamEnded(3),
    ]


def test_data_beyond_a_streams_window_resets_that_stream_alone() -> None:
    client = ClientConnection(
        encoder=RequestHeadEncoder(), decoder=HeadDecoder(), stream_window=20_000
    )
    client.initiate()
    client.receive_data(frame(4, 0, 0))
    client.send_headers(1, HEAD, end_stream=True)
    client.send_headers(3, HEAD, end_stream=True)
    client.data_to_send()
    chunk = frame(0, 0, 1, b"x" * 16_384)
    events = client.receive_data(_head([(b":status", b"200")]) + chunk * 2)
    assert [type(e) for e in events] == [ResponseReceived, DataReceived, StreamReset]
    assert events[-1].error_code == FLOW_CONTROL_ERROR and "stream 1" in events[-1].reset_here
    out = client.data_to_send()
    assert frame(3, 0, 1, struct.pack(">I", FLOW_CONTROL_ERROR)) in out and not has_goaway(out)
    # Its later DATA is dropped and its bytes given back to the connection's window, which
    # takes 5 chunks (more than its 65,535 bytes) without a connection error: all but the one
    # chunk handed to a reader, which gives it back in its turn.
    assert client.receive_data(chunk * 3) == []
    assert client.receive_window == 65_535 - 16_384
    assert frame(8, 0, 0, struct.pack(">I", 32_768)) in client.data_to_send()
    answer = frame(1, 0x5, 3, block([(b":status", b"204")]))
    assert client.receive_data(answer) == [ResponseReceived(3, 204, [], True), StreamEnded(3)]
    assert not client.closed


def test_a_window_update_on_a_stream_that_has_ended_is_dropped() -> None:
    # RFC 9113 §6.9: the origin may send one after its END_STREAM, even once the stream is
    # closed both ways; no error, whatever its increment.
    client = raw_client()
    client.send_headers(1, HEAD, end_stream=True)
    client.data_to_send()
    assert client.receive_data(_head([(b":status", b"200")], 0x5))[-1] == StreamEnded(1)
    updates = frame(8, 0, 1, struct.pack(">I", 10)) + frame(8, 0, 1, struct.pack(">I", 0))
    assert client.receive_data(updates) == []
    assert client.data_to_send() == b"" and not client.closed


@pytest.mark.parametrize("case", list(BAD))
def test_what_an_origin_may_not_send_closes_the_connection(case: str) -> None:
    data, code, ready = BAD[case]
    if ready == "small window":
        client = ClientConnection(
            encoder=RequestHeadEncoder(), decoder=HeadDecoder(), stream_window=20_000
        )
        client.initiate()
        client.receive_data(frame(4, 0, 0))
        client.data_to_send()
    elif ready:
        client = raw_client()
    else:
        client = ClientConnection(encoder=RequestHeadEncoder(), decoder=HeadDecoder())
        client.initiate()
        client.data_to_send()
    client.send_headers(1, HEAD, end_stream=True)
    client.data_to_send()
    expect_connection_error(client, data, code)


def test_a_head_over_the_decoders_limit_resets_its_stream_alone() -> None:
    # RFC 9113 §10.5.1: a response head larger than the SETTINGS_MAX_HEADER_LIST_SIZE this side
    # announced (64 KB decoded) is discarded, its stream alone reset; the block is decoded to its
    # end all the same, so that the dynamic table stays the origin's encoder's.
    client = raw_client()
    client.send_headers(1, HEAD, end_stream=True)
    client.send_headers(3, HEAD, end_stream=True)
    client.data_to_send()
    encoder = Encoder()  # the origin's, for both responses: one dynamic table
    big = [(b":status", b"200"), *((b"x-h%d" % n, b"v" * 700) for n in range(100))]
    whole = encoder.encode(big)
    assert client.decoder.max_header_list_size < 70_000 and len(whole) < 9 * 16_384
    pieces = [whole[at : at + 16_384] for at in range(0, len(whole), 16_384)]
    data = frame(1, 0x1, 1, pieces[0]) + b"".join(frame(9, 0, 1, p) for p in pieces[1:-1])
    events = client.receive_data(data + frame(9, 0x4, 1, pieces[-1]))
    assert [(type(e), e.stream_id, e.error_code) for e in events] == [
        (StreamReset, 1, PROTOCOL_ERROR)
    ]
    assert "larger than 65536" in events[0].reset_here and "stream 1" in events[0].reset_here
    out = client.data_to_send()
    assert frame(3, 0, 1, struct.pack(">I", PROTOCOL_ERROR)) in out and not has_goaway(out)
    assert not client.closed and client.open_streams == 1
    # The last fields of the big head are in the table: the next head names them by index.
    answer = encoder.encode([(b":status", b"200"), (b"x-h99", b"v" * 700)])
    assert len(answer) < 10
    assert client.receive_data(frame(1, 0x5, 3, answer)) == [
        ResponseReceived(3, 200, [(b"x-h99", b"v" * 700)], True),
        StreamEnded(3),
    ]


def test_a_head_over_the_limit_on_a_stream_reset_here_is_dropped() -> None:
    client = raw_client()
    client.send_headers(1, HEAD, end_stream=True)
    client.reset_stream(1)
    client.data_to_send()
    # One field of 3 KB, then named by its index 29 times: 90 KB decoded from a small block.
    fields = [(b":status", b"200"), *[(b"x-big", b"v" * 3_000)] * 30]
    assert client.receive_data(frame(1, 0x5, 1, Encoder().encode(fields))) == []
    assert client.data_to_send() == b"" and not client.closed


def test_empty_frames_up_to_the_limit_or_ending_the_stream_are_no_flood() -> None:
    client = raw_client()
    client.send_headers(1, HEAD, end_stream=True)
    empties = frame(0, 0, 1) * MAX_EMPTY_FRAMES_IN_A_ROW  # as many in a row as allowed
    data = (
        _head([(b":status", b"200")])
        + empties
        + frame(0, 0, 1, b"ab")
        + empties  # again, after a frame with something in it
        + frame(0, 0x1, 1)  # empty, ending the stream
    )
    events = client.receive_data(data)
    assert events[-2:] == [DataReceived(1, b"ab", 2), StreamEnded(1)]


def test_a_header_block_in_as_many_continuation_frames_as_allowed() -> None:
    client = raw_client()
    client.send_headers(1, HEAD, end_stream=True)
    data = _in_continuations(MAX_CONTINUATIONS)
    assert client.receive_data(data)[0] == ResponseReceived(1, 200, [(b"x-long", b"y" * 100)], True)


@pytest.mark.parametrize("kind", ["PING", "SETTINGS"])
def test_acknowledgements_an_origin_does_not_read_are_a_flood(kind: str) -> None:
    client = raw_client()
    client.output_taken()  # the acknowledgement of raw_client's SETTINGS has been read
    one = frame(6, 0, 0, b"12345678") if kind == "PING" else frame(4, 0, 0)
    client.receive_data(one * MAX_OWED_CONTROL_FRAMES)
    expect_connection_error(client, one, ENHANCE_YOUR_CALM)


def test_acknowledgements_the_origin_reads_are_no_flood() -> None:
    client = raw_client()
    ping = frame(6, 0, 0, b"12345678")
    for _ in range(3):
        client.output_taken()
        client.receive_data(ping * MAX_OWED_CONTROL_FRAMES)
    assert not has_goaway(client.data_to_send())


def test_unknown_frames_and_priority_are_ignored() -> None:
    client = raw_client()
    client.send_headers(1, HEAD, end_stream=True)
    data = frame(0xFA, 0, 1, b"whatever") + frame(2, 0, 1, b"\x00\x00\x00\x00\x10")
    assert client.receive_data(data) == []


def test_a_priority_frame_of_a_bad_length_resets_its_stream_alone() -> None:
    # RFC 9113 §6.3: a stream error, FRAME_SIZE_ERROR; on a stream not open here, dropped.
    client = raw_client()
    client.send_headers(1, HEAD, end_stream=True)
    client.send_headers(3, HEAD, end_stream=True)
    client.data_to_send()
    assert client.receive_data(frame(2, 0, 7, b"\x00\x00\x00\x00")) == []
    assert client.data_to_send() == b""
    events = client.receive_data(frame(2, 0, 1, b"\x00\x00\x00\x00"))
    assert [(type(e), e.stream_id, e.error_code) for e in events] == [
        (StreamReset, 1, FRAME_SIZE_ERROR)
    ]
    out = client.data_to_send()
    assert frame(3, 0, 1, struct.pack(">I", FRAME_SIZE_ERROR)) in out and not has_goaway(out)
    answer = frame(1, 0x5, 3, block([(b":status", b"204")]))
    assert client.receive_data(answer) == [ResponseReceived(3, 204, [], True), StreamEnded(3)]


def _frames() -> st.SearchStrategy[bytes]:
    """Frames of every type with arbitrary flags and payloads, on the streams a client has open
    or not, some with valid header blocks: what a broken or hostile origin might send."""
    blocks = st.sampled_from(
        [
            block([(b":status", b"200")]),
            block([(b":status", b"200"), (b"content-length", b"3")]),
            block([(b":status", b"103"), (b"link", b"</a>")]),
            block([(b"x-trailer", b"1")]),
            b"",
        ]
    )
    payloads = st.one_of(st.binary(max_size=40), blocks)
    return st.builds(
        frame,
        st.integers(0, 11),
        st.integers(0, 255),
        st.sampled_from([0, 1, 2, 3, 5, 2**31 - 1]),
        payloads,
    )


@settings(max_examples=400, deadline=None)
@given(
    frames=st.lists(_frames(), max_size=12),
    cut=st.integers(0, 64),
    garbage=st.binary(max_size=32),
)
def test_anything_an_origin_sends_gives_events_or_a_protocol_error(
    frames: list[bytes], cut: int, garbage: bytes
) -> None:
    """Never another exception, whatever comes and however it is cut into reads."""
    client = raw_client()
    client.send_headers(1, HEAD, end_stream=True)
    client.send_headers(3, POST, end_stream=False)
    data = b"".join(frames) + garbage
    try:
        for at in range(0, len(data), cut or len(data) or 1):
            client.receive_data(data[at : at + (cut or len(data))])
    except ProtocolError as e:
        assert goaway_code(client.data_to_send()) == e.error_code
    else:
        client.data_to_send()
        assert client.open_streams <= 2


def test_a_cut_to_the_stream_window_counts_once_the_origin_has_it() -> None:
    # SETTINGS_INITIAL_WINDOW_SIZE sent mid-connection (reshape/upstream/h2.py, past
    # UNREAD_LIMIT): what the origin sent before reading it was within the old window and is
    # no error; after its acknowledgement the open streams' windows are smaller by the cut, and
    # streams opened after the setting start with the new window.
    client = ClientConnection(
        encoder=RequestHeadEncoder(), decoder=HeadDecoder(), stream_window=40_000
    )
    client.initiate()
    client.receive_data(frame(4, 0, 0) + frame(4, 1, 0))  # its SETTINGS, and the preface's ACK
    client.send_headers(1, HEAD, end_stream=True)
    client.receive_data(_head([(b":status", b"200")]))
    client.data_to_send()
    client.set_stream_window(10_000)
    assert frame(4, 0, 0, struct.pack(">HI", 0x4, 10_000)) in client.data_to_send()
    client.send_headers(3, HEAD, end_stream=True)  # after the setting: 10,000 from the start
    chunk = frame(0, 0, 1, b"x" * 16_000)
    assert [type(e) for e in client.receive_data(chunk)] == [DataReceived]  # the old window
    assert client.streams[1].receive_window == 24_000
    assert client.streams[3].receive_window == 10_000
    client.receive_data(frame(4, 1, 0))  # the origin has the setting
    assert client.streams[1].receive_window == -6_000  # nothing more until its reader takes
    assert client.streams[3].receive_window == 10_000
    events = client.receive_data(frame(0, 0, 1, b"x"))
    assert [type(e) for e in events] == [StreamReset] and events[0].error_code == FLOW_CONTROL_ERROR
    # A raise counts at once.
    client.set_stream_window(40_000)
    assert client.streams[3].receive_window == 40_000
    with pytest.raises(ValueError, match="stream window"):
        client.set_stream_window(-1)
