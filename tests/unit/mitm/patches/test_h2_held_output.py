"""An HTTP/2 connection's output held and sent at once (reshape/mitm/patches/h2_held_output.py),
sans-IO on mitmproxy's own BufferedH2Connection: nothing leaves while it is held, everything it
kept comes out in order at the end, and a connection nobody holds sends as before."""

from __future__ import annotations

import h2.config
import h2.connection
import h2.events
from mitmproxy.proxy.layers.http._http2 import Http2Server
from mitmproxy.proxy.layers.http._http_h2 import BufferedH2Connection

from reshape.mitm.patches import Patches
from reshape.mitm.patches.h2_held_output import HeldHttp2Output, HoldHttp2Output


def connected() -> tuple[BufferedH2Connection, h2.connection.H2Connection, int]:
    """mitmproxy's server side of a connection and a client with one request on it."""
    server = BufferedH2Connection(Http2Server.h2_conf)
    server.initiate_connection()
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    stream_id = client.get_next_available_stream_id()
    client.send_headers(
        stream_id,
        [(":method", "GET"), (":scheme", "https"), (":authority", "a.test"), (":path", "/")],
        end_stream=True,
    )
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    server.receive_data(client.data_to_send())  # the client's SETTINGS ack
    server.data_to_send()
    return server, client, stream_id


def respond(server: BufferedH2Connection, stream_id: int) -> list[bytes]:
    """A response as mitmproxy's HTTP/2 layer sends one: what it takes after each step."""
    taken = []
    server.send_headers(stream_id, [(b":status", b"200")])
    taken.append(server.data_to_send())
    server.send_data(stream_id, b"hello")
    taken.append(server.data_to_send())
    server.end_stream(stream_id)
    taken.append(server.data_to_send())
    return taken


def test_a_held_connection_sends_nothing_then_everything_in_order() -> None:
    with Patches([HoldHttp2Output()]):
        server, client, stream_id = connected()
        output = HeldHttp2Output(server)
        output.hold()
        assert respond(server, stream_id) == [b"", b"", b""]
        output.end_hold()
        kept = output.take()
    unheld, _, stream_id = connected()
    assert kept == b"".join(respond(unheld, stream_id))  # the same frames, in one piece
    received = client.receive_data(kept)
    assert [type(e) for e in received][:2] == [h2.events.ResponseReceived, h2.events.DataReceived]
    assert received[1].data == b"hello"
    assert isinstance(received[-1], h2.events.StreamEnded)


def test_a_connection_nobody_holds_sends_as_before() -> None:
    with Patches([HoldHttp2Output()]):
        server, _, stream_id = connected()
        taken = respond(server, stream_id)
    assert all(taken)
    unpatched, _, stream_id = connected()
    assert respond(unpatched, stream_id) == taken
