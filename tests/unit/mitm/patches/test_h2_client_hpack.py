"""reshape/mitm/patches/h2_client_hpack.py: a client connection's response heads through
`IndexedEncoder`, the same bytes as hpack's encoder sends, and its request heads through
`HeadDecoder`, the same headers as hpack's decoder reads."""

from __future__ import annotations

import h2.config
import h2.connection
import h2.events
from hpack import Decoder, Encoder
from mitmproxy import connection, options
from mitmproxy.addons.proxyserver import Proxyserver
from mitmproxy.proxy.context import Context
from mitmproxy.proxy.layers.http import _http2

from reshape.mitm.patches import Patches
from reshape.mitm.patches.h2_client_hpack import ClientHpackCoders
from reshape.upstream.hpack_decoder import HeadDecoder
from reshape.upstream.hpack_encoder import IndexedEncoder


def _server() -> _http2.Http2Server:
    client = connection.Client(
        peername=("127.0.0.1", 50000), sockname=("127.0.0.1", 8080), timestamp_start=0
    )
    opts = options.Options()
    Proxyserver().load(opts)  # the layers' options, as mitmproxy's own tests load them
    return _http2.Http2Server(Context(client, opts))


def _browser() -> h2.connection.H2Connection:
    browser = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    browser.initiate_connection()
    return browser


def _responses(server: _http2.Http2Server, browser: h2.connection.H2Connection) -> list[bytes]:
    """What the server's connection sends for 30 responses of a page (and what the browser
    reads back), as mitmproxy's layer drives it; the requests it reads are the browser's."""
    conn = server.h2_conn
    conn.initiate_connection()
    conn.receive_data(browser.data_to_send())
    browser.receive_data(conn.data_to_send())
    conn.receive_data(browser.data_to_send())  # the SETTINGS acknowledgement
    sent = []
    for n in range(30):
        stream_id = browser.get_next_available_stream_id()
        browser.send_headers(
            stream_id,
            [
                (":method", "GET"),
                (":scheme", "https"),
                (":authority", "a.example"),
                (":path", f"/tile-{n}.png"),
            ],
            end_stream=True,
        )
        requests = [
            e
            for e in conn.receive_data(browser.data_to_send())
            if isinstance(e, h2.events.RequestReceived)
        ]
        assert requests[0].headers[3] == (b":path", b"/tile-%d.png" % n)
        assert [bytes(k) for k, _ in requests[0].headers[:3]] == [
            b":method",
            b":scheme",
            b":authority",
        ]
        head = [
            (b":status", b"200"),
            (b"server", b"nginx/1.22.1"),
            (b"date", b"Sat, 28 Nov 2026 03:00:%02d GMT" % (n // 10)),
            (b"content-type", b"image/png"),
            (b"content-length", b"%d" % (1000 + n)),
            (b"etag", b'"6551-%x"' % n),
        ]
        conn.send_headers(stream_id, head, end_stream=True)
        data = conn.data_to_send()
        sent.append(data)
        received = [
            e for e in browser.receive_data(data) if isinstance(e, h2.events.ResponseReceived)
        ]
        assert [(bytes(k), bytes(v)) for k, v in received[0].headers] == head
    return sent


def test_client_connections_get_reshapes_coders_and_send_and_read_the_same() -> None:
    plain = _server()
    assert type(plain.h2_conn.encoder) is Encoder
    expected = _responses(plain, _browser())
    with Patches([ClientHpackCoders()]):
        server = _server()
        assert isinstance(server.h2_conn.encoder, IndexedEncoder)
        assert isinstance(server.h2_conn.decoder, HeadDecoder)
        assert (
            server.h2_conn.decoder.max_header_list_size
            == plain.h2_conn.decoder.max_header_list_size
        )
        assert _responses(server, _browser()) == expected
    assert type(_server().h2_conn.encoder) is Encoder
    assert type(_server().h2_conn.decoder) is Decoder
