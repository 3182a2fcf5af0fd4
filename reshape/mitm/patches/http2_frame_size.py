"""HTTP/2 clients get the protocol's default frame size limit, and a frame above it is a
FRAME_SIZE_ERROR."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import h2.settings
from mitmproxy.proxy.layers.http import _http2

from reshape.mitm.patches.base import Patch, Replacement

# RFC 9113 §6.5.2: SETTINGS_MAX_FRAME_SIZE starts at 2^14.
DEFAULT_MAX_FRAME_SIZE = 2**14


class DefaultFrameSizeForClients(Patch):
    """Advertise and enforce SETTINGS_MAX_FRAME_SIZE 16,384 on client connections.

    Why: mitmproxy 12.2.3's `BufferedH2Connection` (proxy/layers/http/_http_h2.py) advertises and
    accepts frames of up to 2^17 bytes on every HTTP/2 connection, and no option changes it. Peers
    that assume the protocol's default (h2spec http2/4.2/3 sends a 20 KB HEADERS frame and
    expects a FRAME_SIZE_ERROR) get their frame processed instead. Clients send 16 KB frames
    anyway (browsers do, whatever a server allows), so the default costs them nothing. In
    `Http2Server.__init__`, before the connection's first SETTINGS frame is written: the limit
    goes back to 2^14; h2 then refuses a larger frame with FrameTooLargeError, which the flood
    guard's `handle_h2_event` (reshape/mitm/patches/http2_flood_guard.py) turns into GOAWAY
    FRAME_SIZE_ERROR. Connections to origins keep mitmproxy's value.
    """

    def replacements(self) -> Iterable[Replacement]:
        original = _http2.Http2Server.__init__

        def __init__(self: _http2.Http2Server, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            conn = self.h2_conn
            conn.local_settings[h2.settings.SettingCodes.MAX_FRAME_SIZE] = DEFAULT_MAX_FRAME_SIZE
            conn.local_settings.acknowledge()  # as mitmproxy does: sent as the initial value
            conn.max_inbound_frame_size = DEFAULT_MAX_FRAME_SIZE

        yield _http2.Http2Server, "__init__", __init__
