"""HTTP/2 clients that flood control frames (rapid reset, SETTINGS, PING), and protocol errors."""

from __future__ import annotations

import time
import weakref
from collections.abc import Generator, Iterable
from typing import Any

import h2.errors
import h2.events
import h2.exceptions
from mitmproxy.proxy.layers.http import _http2

from reshape.features.client_errors.rules import (
    CLIENT_CONNECTION_CLOSED,
    FloodLimits,
    FloodMeter,
)
from reshape.mitm.patches.base import Patch, Replacement
from reshape.mitm.patches.http1_head_guard import ClientErrorReport

_FRAME_KINDS = {
    h2.events.StreamReset: "reset",
    h2.events.RemoteSettingsChanged: "settings",
    h2.events.PingReceived: "ping",
}


class GuardHttp2Floods(Patch):
    """Close HTTP/2 client connections that flood control frames, and report every protocol
    error a client connection is closed for.

    Why: mitmproxy 12.2.3's HTTP/2 layer answers every PING and SETTINGS and starts a flow for
    every stream a client opens and resets at once (CVE-2023-44487), with no budget, and no hook
    sees frames. In `Http2Server.handle_h2_event`, RST_STREAM, SETTINGS and PING frames from the
    client draw on a `FloodMeter`; over budget, the connection gets GOAWAY ENHANCE_YOUR_CALM and
    is closed (`protocol_error`, which is also where every protocol error is counted, and where
    its message gets the CLIENT_CONNECTION_CLOSED prefix, so the flows it ends count as the
    client's doing); a protocol error h2 raises closes with the error code h2 gives it
    (FRAME_SIZE_ERROR...), not always PROTOCOL_ERROR. The close itself relies on
    reshape/mitm/patches/connection_teardown.py: without it, the socket of a flooding client
    could stay open with its flows unended.
    """

    def __init__(self, report: ClientErrorReport, limits: FloodLimits | None = None) -> None:
        super().__init__()
        self.report = report
        self.limits = limits or FloodLimits()
        self._meters: weakref.WeakKeyDictionary[Any, FloodMeter] = weakref.WeakKeyDictionary()

    def replacements(self) -> Iterable[Replacement]:
        original_handle_h2_event = _http2.Http2Server.handle_h2_event
        original_protocol_error = _http2.Http2Server.protocol_error
        guard = self
        meters = self._meters

        def handle_h2_event(self: _http2.Http2Server, event: Any) -> Generator[Any, Any, bool]:
            kind = _FRAME_KINDS.get(type(event))
            if kind is not None:
                meter = meters.get(self)
                if meter is None:
                    meter = meters[self] = FloodMeter(guard.limits)
                if not meter.allow(kind, time.monotonic()):
                    yield from self.protocol_error(
                        f"HTTP/2 {kind} flood", h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
                    )
                    return True
            if isinstance(event, h2.exceptions.ProtocolError):
                # mitmproxy answers every one with PROTOCOL_ERROR; RFC 9113 names the code
                # (FRAME_SIZE_ERROR, FLOW_CONTROL_ERROR, ...), which h2 puts on the exception.
                code = getattr(event, "error_code", None) or h2.errors.ErrorCodes.PROTOCOL_ERROR
                yield from self.protocol_error(f"HTTP/2 protocol error: {event}", code)
                return True
            return (yield from original_handle_h2_event(self, event))

        def protocol_error(
            self: _http2.Http2Server,
            message: str,
            error_code: int = h2.errors.ErrorCodes.PROTOCOL_ERROR,
        ) -> Generator[Any, Any, None]:
            calm = error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
            guard.report("h2_flood" if calm else "h2_protocol")
            # The flows still open end with this message: marked as the client's doing.
            message = CLIENT_CONNECTION_CLOSED + message
            return (yield from original_protocol_error(self, message, error_code))

        yield _http2.Http2Server, "handle_h2_event", handle_h2_event
        yield _http2.Http2Server, "protocol_error", protocol_error
