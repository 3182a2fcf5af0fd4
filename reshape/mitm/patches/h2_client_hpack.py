"""HTTP/2 client connections encode and decode header blocks with reshape's HPACK coders."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from mitmproxy.proxy.layers.http import _http2

from reshape.mitm.patches.base import Patch, Replacement
from reshape.upstream.hpack_decoder import HeadDecoder
from reshape.upstream.hpack_encoder import IndexedEncoder


class ClientHpackCoders(Patch):
    """Give each HTTP/2 client connection an `IndexedEncoder` and a `HeadDecoder` in place of
    hpack's `Encoder` and `Decoder`.

    Why: mitmproxy 12.2.3's `Http2Server` sends every response head through h2 to hpack 4.2's
    `Encoder`, whose `add` works out each field in Python (a walk of the dynamic table, a debug
    log call, the integer encoding) even when the table holds the field exactly, as it does most
    of a browser's responses' fields after the first few (server, content type, date, cache
    fields); and it reads every request head through hpack's `Decoder`, which takes a chain of
    Python calls for each one-byte index, most of a browser's request fields. In the lab's app
    page loads through the pool: encoding 2.9% of the proxy's CPU (cProfile), decoding (both
    ends) ~6.5% (py-spy); bench/RESULTS.md. No hook or option reaches a connection's coders.
    `IndexedEncoder` (reshape/upstream/hpack_encoder.py) sends the same bytes, tested against
    hpack's block by block: an nginx response head 27.7 us against 13.4. `HeadDecoder`
    (reshape/upstream/hpack_decoder.py) gives the same headers and errors, tested against hpack's
    on well-formed and arbitrary blocks (but for a list over the size limit, decoded to its
    block's end before the same error, where hpack stops at the field that passes it; h2 closes
    the client's connection for it either way): a Chromium request head 32.7 us against 14.0. Set in
    `Http2Server.__init__`, before the connection encodes or decodes anything; h2 then gives
    them the client's and its own settings as it would hpack's. mitmproxy's own connections to
    origins keep hpack's coders: the engine's have reshape's too (reshape/upstream/h2.py).
    """

    def replacements(self) -> Iterable[Replacement]:
        original = _http2.Http2Server.__init__

        def __init__(self: _http2.Http2Server, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            conn = self.h2_conn
            conn.encoder = IndexedEncoder()
            conn.decoder = HeadDecoder.replacing(conn.decoder)

        yield _http2.Http2Server, "__init__", __init__
