"""The response heads of HTTP/2 client connections encoded through an indexed HPACK table."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from mitmproxy.proxy.layers.http import _http2

from reshape.mitm.patches.base import Patch, Replacement
from reshape.upstream.hpack_encoder import IndexedEncoder


class EncodeClientHeadsThroughIndex(Patch):
    """Give each HTTP/2 client connection an `IndexedEncoder` in place of hpack's `Encoder`.

    Why: mitmproxy 12.2.3's `Http2Server` sends every response head through h2 to hpack 4.2's
    `Encoder`, whose `add` works out each field in Python (a walk of the dynamic table, a debug
    log call, the integer encoding) even when the table holds the field exactly, as it does most
    of a browser's responses' fields after the first few (server, content type, date, cache
    fields): 2.9% of the pooled proxy's CPU in the lab's app page loads (cProfile,
    bench/RESULTS.md). No hook or option reaches a connection's encoder. `IndexedEncoder`
    (reshape/upstream/hpack_encoder.py) sends the same bytes, tested against hpack's field by
    field, and finds a field the table holds through a dictionary: an nginx response head
    27.7 us against 13.4. Set in `Http2Server.__init__`, before the connection encodes anything
    (h2 gives it the client's SETTINGS_HEADER_TABLE_SIZE as it would hpack's). mitmproxy's own
    connections to origins keep hpack's encoder: the engine has its own.
    """

    def replacements(self) -> Iterable[Replacement]:
        original = _http2.Http2Server.__init__

        def __init__(self: _http2.Http2Server, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            self.h2_conn.encoder = IndexedEncoder()

        yield _http2.Http2Server, "__init__", __init__
