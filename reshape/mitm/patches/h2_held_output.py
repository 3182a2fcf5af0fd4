"""An HTTP/2 client connection's output held while one engine answer passes, then sent at once.

Why a patch: in mitmproxy 12.2.3 `Http2Connection._handle_event` (proxy/layers/http/_http2.py)
takes the h2 connection's bytes (`data_to_send`) after every HTTP event it is sent and hands them
on as a `SendData` of their own. A response relayed whole is three such events (its headers, its
body, and the end of the stream, an empty DATA frame), so three `SendData` commands, and under
TLS each is its own `sendall` into OpenSSL, its own TLS record and its own trip up through the
layers above the HTTP/2 one (the client's TLS layer, the CONNECT tunnel, the proxy's HTTP
layer). The TLS layer's part was ~17% of py-spy's samples in a response's pass in the lab's
page loads, and the responses' side of the proxy's work is what a page load waits for; one
`SendData` per answer saves ~1-3% of the pool's CPU per HTTP/2 request (bench/RESULTS.md). No
hook sees these commands.

While `HeldHttp2Output.hold()` is in force, `data_to_send` on that connection returns nothing:
h2 keeps the frames in its own buffer, in order. After `end_hold()`, `take()` returns them all,
for the caller to send as one `SendData` from where the HTTP/2 layer sits (the engine's
layer, reshape/mitm/engine_client.py, which holds the client's output while it hands an
`EngineResponses` to the streams). Nothing is reordered: every frame the connection writes goes
through the one buffer, and what was kept during the hold is still there at the end (also if the
pass broke off: the connection's next send takes it). Only mitmproxy's `BufferedH2Connection`
(its HTTP/2 client and server connections) is changed; a connection nobody holds behaves as
before.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from mitmproxy.proxy.layers.http._http_h2 import BufferedH2Connection

from reshape.mitm.patches.base import Patch, Replacement

_HELD = "_reshape_output_held"


class HeldHttp2Output:
    """Holds one h2 connection's output (see the module docstring)."""

    __slots__ = ("h2_conn",)

    def __init__(self, h2_conn: BufferedH2Connection) -> None:
        self.h2_conn = h2_conn

    def hold(self) -> None:
        self.h2_conn.__dict__[_HELD] = True

    def end_hold(self) -> None:
        self.h2_conn.__dict__.pop(_HELD, None)

    def take(self) -> bytes:
        """What the connection has to send, all of it."""
        return self.h2_conn.data_to_send()


class HoldHttp2Output(Patch):
    """`BufferedH2Connection.data_to_send` returns nothing while a `HeldHttp2Output` holds it."""

    def replacements(self) -> Iterable[Replacement]:
        original = BufferedH2Connection.data_to_send

        def data_to_send(self: BufferedH2Connection, amount: int | None = None) -> Any:
            if _HELD in self.__dict__:
                return b""
            return original(self, amount)

        yield BufferedH2Connection, "data_to_send", data_to_send
