"""A CONNECT tunnel to a service that speaks first (SMTP, IMAP, FTP) gets its greeting.

Why a patch: reshape runs mitmproxy 12.2.3 with `connection_strategy=lazy` (the engine carries
requests over its own connections, so one opened at CONNECT time would go unused and delay every
tunnel's 200 by a connect). Lazily, `HttpStream.handle_connect_regular`
(proxy/layers/http/__init__.py) answers 200 at once and leaves the tunnel to a `NextLayer` that
decides what runs inside (TLS, HTTP, raw TCP) from the client's first bytes. A client of a
protocol in which the server speaks first waits for the greeting and sends nothing, the origin
was never connected, so both wait until mitmproxy's idle timeout (600 s). mitmdump, eager by
default, relays the greeting. No hook runs while a tunnel is silent.

The replacement keeps the lazy answer for web traffic and adds two things:
- to a port of a service that speaks first (`SERVER_FIRST_PORTS`), the tunnel is opened as
  mitmproxy's eager strategy opens it: the origin connected before the answer, a 502 when it
  cannot be (not a 200 and a closed tunnel);
- on any other port, a tunnel whose client has sent nothing within `silence` seconds of its 200
  gets its origin connection then. Whatever the origin says first decides the layer
  (mitmproxy's `next_layer` relays it as raw TCP, as it does when a server greets first). If the
  connect fails, the tunnel is closed: its 200 has gone.

A browser sends its TLS ClientHello within milliseconds of the 200, so its tunnels never wait
for the timer. A client that stays silent longer and then speaks HTTP or TLS finds an origin
connection of mitmproxy's own open beside the engine's; that costs one connection, not
correctness. The timer is a `RequestWakeup` of the tunnel's `HttpStream`; until it fires, the
stream's events pass through one more generator (mitmproxy cannot cancel a wakeup, so the stream
must be there to take it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Iterable
from typing import Any

from mitmproxy import http
from mitmproxy.proxy import commands, events, layer
from mitmproxy.proxy.layers.http import HttpStream, SendHttp
from mitmproxy.proxy.layers.http._events import ErrorCode, ResponseProtocolError
from mitmproxy.utils import human

from reshape.mitm.patches.base import Patch, Replacement

# FTP, SMTP, POP3, NNTP, IMAP, SMTP submission, MySQL: the server sends the first bytes.
SERVER_FIRST_PORTS = frozenset({21, 25, 110, 119, 143, 587, 3306})
# How long a tunnel's client may stay silent before its origin is connected for it.
SILENCE = 1.0

Handler = Callable[[events.Event], Generator[Any, Any, None]]


class OpenSilentTunnels(Patch):
    """Replace `HttpStream.handle_connect_regular` with one that connects the origin of a
    tunnel whose client does not speak first."""

    def __init__(
        self, silence: float = SILENCE, server_first_ports: frozenset[int] = SERVER_FIRST_PORTS
    ) -> None:
        super().__init__()
        self.silence = silence
        self.server_first_ports = server_first_ports

    def replacements(self) -> Iterable[Replacement]:
        original = HttpStream.handle_connect_regular
        patch = self

        def handle_connect_regular(self: HttpStream) -> Generator[Any, Any, None]:
            if self.flow.response or self.context.options.connection_strategy != "lazy":
                return (yield from original(self))
            server = self.context.server
            if server.address is not None and server.address[1] in patch.server_first_ports:
                return (yield from _connect_then_answer(self))
            yield from original(self)
            if self.flow.response is not None and 200 <= self.flow.response.status_code < 300:
                wakeup = commands.RequestWakeup(patch.silence)
                self._handle_event = _watching(self, wakeup, patch.silence)
                yield wakeup

        yield HttpStream, "handle_connect_regular", handle_connect_regular


def _connect_then_answer(stream: HttpStream) -> Generator[Any, Any, None]:
    """mitmproxy's eager branch of `handle_connect_regular`, without its advice on `lazy`."""
    server = stream.context.server
    err = yield commands.OpenConnection(server)
    if err:
        stream.flow.response = http.Response.make(
            502, f"Cannot connect to {human.format_address(server.address)}: {err}"
        )
    stream.child_layer = layer.NextLayer(stream.context)
    yield from stream.handle_connect_finish()


def _watching(stream: HttpStream, wakeup: commands.RequestWakeup, silence: float) -> Handler:
    """The stream's event handler until `wakeup` fires: the tunnel's own, and at the wakeup the
    origin connected if the client is still silent."""
    passthrough: Handler = stream._handle_event

    def watch(event: events.Event) -> Generator[Any, Any, None]:
        if type(event) is events.Wakeup and event.command is wakeup:
            stream._handle_event = passthrough
            yield from _open_if_silent(stream, silence)
        else:
            yield from passthrough(event)

    return watch


def _open_if_silent(stream: HttpStream, silence: float) -> Generator[Any, Any, None]:
    tunnel, server = stream.child_layer, stream.context.server
    if not isinstance(tunnel, layer.NextLayer) or tunnel.layer is not None:
        return  # the client spoke: its layer is decided
    if tunnel.data_client() or server.timestamp_start is not None:
        return
    yield commands.Log(
        f"tunnel to {human.format_address(server.address)}: the client sent nothing in "
        f"{silence:g} s, connecting for a greeting",
        logging.DEBUG,
    )
    err = yield commands.OpenConnection(server)
    if err:
        yield SendHttp(
            ResponseProtocolError(
                stream.stream_id,
                f"Cannot connect to {human.format_address(server.address)}: {err}",
                ErrorCode.CONNECT_FAILED,
            ),
            stream.context.client,
        )
