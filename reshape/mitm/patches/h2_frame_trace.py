"""HTTP/2 frames received by mitmproxy's connections without an unused trace message."""

from __future__ import annotations

from collections.abc import Iterable

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import hyperframe.frame
from h2.errors import ErrorCodes
from mitmproxy.proxy.layers.http import _http_h2

from reshape.mitm.patches.base import Patch, Replacement

# The h2 releases `receive_frame_untraced` was read against and tested on: it is h2's private
# `H2Connection._receive_frame`, so the patch refuses any other release.
H2_CHECKED_ON = ("4.3.0",)


def receive_frame_untraced(
    self: h2.connection.H2Connection, frame: hyperframe.frame.Frame
) -> list[h2.events.Event]:
    """h2 4.3.0's `H2Connection._receive_frame`, but its trace log call's message (the frame's
    `repr`, made whether anything logs it or not) is made only for a logger that is not
    h2's `DummyLogger`, which drops it. The rest is h2's, line for line; see H2_CHECKED_ON."""
    logger = self.config.logger
    if type(logger) is not h2.config.DummyLogger:
        logger.trace("Received frame: %s", repr(frame))
    events: list[h2.events.Event]
    try:
        frames, events = self._frame_dispatch_table[frame.__class__](frame)
    except h2.exceptions.StreamClosedError as e:
        # Closed by RST_STREAM: a stream error, answered with RST_STREAM; otherwise raised as a
        # connection error.
        if self._stream_is_closed_by_reset(e.stream_id):
            f = hyperframe.frame.RstStreamFrame(e.stream_id)
            f.error_code = e.error_code
            self._prepare_for_sending([f])
            events = e._events
        else:
            raise
    except h2.exceptions.StreamIDTooLowError as e:
        # A stream already cleaned up, or closed implicitly by a higher stream ID: a stream
        # error if it was closed by RST_STREAM, a connection error otherwise.
        if self._stream_is_closed_by_reset(e.stream_id):
            f = hyperframe.frame.RstStreamFrame(e.stream_id)
            f.error_code = ErrorCodes.STREAM_CLOSED
            self._prepare_for_sending([f])
            events = []
        elif self._stream_is_closed_by_end(e.stream_id):
            raise h2.exceptions.StreamClosedError(e.stream_id) from e
        else:
            raise
    else:
        self._prepare_for_sending(frames)
    return events


class ReceiveFramesUntraced(Patch):
    """`BufferedH2Connection._receive_frame` as h2's, but the trace message made only when
    something logs it.

    Why: h2 4.3.0 formats every received frame (`repr(frame)`, which renders its flags and the
    start of its data) for a trace log call that h2's `DummyLogger`, the logger of mitmproxy
    12.2.3's connections unless `proxy_debug` is on, drops. That was 1.9% of the pooled proxy's
    CPU in py-spy's profile of the lab's app page loads (over both ends then: the engine's own
    connections no longer use h2, reshape/upstream/http2.py). No hook or option reaches it.
    `receive_frame_untraced` is h2's method, line for line, with the message made only for
    another logger (mitmproxy's `H2ConnectionLogger` with `proxy_debug`); the patch refuses h2
    releases other than H2_CHECKED_ON.
    """

    libraries_checked_on = {"h2": H2_CHECKED_ON}

    def replacements(self) -> Iterable[Replacement]:
        yield _http_h2.BufferedH2Connection, "_receive_frame", receive_frame_untraced
