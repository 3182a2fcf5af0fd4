"""HTTP/2 frames received by mitmproxy's connections without an unused trace message."""

from __future__ import annotations

from collections.abc import Iterable

from mitmproxy.proxy.layers.http import _http_h2

from reshape.mitm.patches.base import Patch, Replacement
from reshape.upstream.h2 import receive_frame_untraced


class ReceiveFramesUntraced(Patch):
    """`BufferedH2Connection._receive_frame` as h2's, but the trace message made only when
    something logs it.

    Why: h2 4.3.0 formats every received frame (`repr(frame)`, which renders its flags and the
    start of its data) for a trace log call that h2's `DummyLogger`, the logger of mitmproxy
    12.2.3's connections unless `proxy_debug` is on, drops. Over both ends of the pool (the
    engine's own connections take the same function, reshape/upstream/h2.py) that was 1.9% of
    the proxy's CPU in py-spy's profile of the lab's app page loads. No hook or option reaches
    it. `receive_frame_untraced` is h2's method, line for line, with the message made only for
    another logger (mitmproxy's `H2ConnectionLogger` with `proxy_debug`); it is checked on the h2
    releases of `reshape.upstream.h2.H2_CHECKED_ON`, which the engine refuses to start without.
    """

    def replacements(self) -> Iterable[Replacement]:
        yield _http_h2.BufferedH2Connection, "_receive_frame", receive_frame_untraced
