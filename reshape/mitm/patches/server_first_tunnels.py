"""A CONNECT tunnel to a service that speaks first (SMTP, IMAP, FTP) gets its greeting; a tunnel
in which nobody speaks ends at the header timeout.

Why a patch: reshape runs mitmproxy 12.2.3 with `connection_strategy=lazy` (the engine carries
requests over its own connections, so one opened at CONNECT time would go unused and delay every
tunnel's 200 by a connect). Lazily, `HttpStream.handle_connect_regular`
(proxy/layers/http/__init__.py) answers 200 at once and leaves the tunnel to a `NextLayer` that
decides what runs inside (TLS, HTTP, raw TCP) from the client's first bytes. A client of a
protocol in which the server speaks first waits for the greeting and sends nothing, the origin
was never connected, so both waited until mitmproxy's idle timeout (600 s). mitmdump, eager by
default, relays the greeting. No hook runs while a tunnel is silent.

The replacement keeps the lazy answer for web traffic and adds:
- to a port of a service that speaks first (`SERVER_FIRST_PORTS`), the tunnel is opened as
  mitmproxy's eager strategy opens it: the origin connected before the answer, a 502 when it
  cannot be (not a 200 and a closed tunnel);
- on any other port but the web's (`WEB_PORTS`, where the client speaks first by protocol), a
  tunnel whose client has sent nothing within `silence` seconds of its 200 gets its origin
  connection then. Whatever the origin says first decides the layer (mitmproxy's `next_layer`
  relays it as raw TCP, as it does when a server greets first). If the connect fails, the tunnel
  is closed: its 200 has gone;
- a tunnel still undecided `header_timeout` seconds after its 200 (neither side has said
  anything) is closed and reported as a `silent_connection`, as a connection that
  sends nothing at all is (features/client_errors/silent_clients.py): it used to hold its
  socket, and now its origin connection too, for 600 s.

A browser sends its TLS ClientHello within milliseconds of the 200, so its tunnels never wait
for the timer, and a silent tunnel to a web port costs no origin connection. The timer is a
`RequestWakeup` of the tunnel's `HttpStream`: until the tunnel's layer is decided the stream's
events pass through one more generator; once it is, the stream is left as mitmproxy made it and
the pending wakeup, which mitmproxy cannot cancel, is pointed at a sink (as the first-byte
timeout's spare timers are).
"""

from __future__ import annotations

import logging
import typing
from collections.abc import Callable, Generator, Iterable
from typing import Any

from mitmproxy import http
from mitmproxy.proxy import commands, events, layer
from mitmproxy.proxy.layers.http import HttpLayer, HttpStream, SendHttp
from mitmproxy.proxy.layers.http._events import (
    ErrorCode,
    RequestEndOfMessage,
    RequestProtocolError,
    ResponseProtocolError,
)
from mitmproxy.utils import human

from reshape.mitm.patches.base import Patch, Replacement
from reshape.mitm.patches.http1_head_guard import ClientErrorReport

# FTP, SMTP, POP3, NNTP, IMAP, SMTP submission, MySQL: the server sends the first bytes.
SERVER_FIRST_PORTS = frozenset({21, 25, 110, 119, 143, 587, 3306})
# HTTP and HTTPS: the client speaks first; a silent tunnel there never gets an origin connection.
WEB_PORTS = frozenset({80, 443})
# How long a tunnel's client may stay silent before its origin is connected for it.
SILENCE = 1.0

# What a tunnel's stream gets when its client leaves (HTTP/1: the close; HTTP/2: a reset).
_TUNNEL_ENDS = (RequestEndOfMessage, RequestProtocolError)

Handler = Callable[[events.Event], Generator[Any, Any, None]]


class _TunnelTimer(commands.RequestWakeup):
    """A silent tunnel's timer: to connect its origin (`greet`) or to end it."""

    def __init__(self, delay: float, greet: bool) -> None:
        super().__init__(delay)
        self.greet = greet


class _Sink:
    """Where a tunnel timer's wakeup goes once its tunnel no longer needs it."""

    def handle_event(self, event: events.Event) -> Generator[Any, Any, None]:
        yield from ()


_SINK: Any = _Sink()  # stands where HttpLayer.command_sources expects a layer


class OpenSilentTunnels(Patch):
    """Replace `HttpStream.handle_connect_regular` with one that connects the origin of a
    tunnel whose client does not speak first, and ends a tunnel in which nobody speaks."""

    def __init__(
        self,
        report: ClientErrorReport,
        *,
        header_timeout: float,
        silence: float = SILENCE,
        server_first_ports: frozenset[int] = SERVER_FIRST_PORTS,
        web_ports: frozenset[int] = WEB_PORTS,
    ) -> None:
        super().__init__()
        self.report = report
        self.header_timeout = header_timeout
        self.silence = min(silence, header_timeout)
        self.server_first_ports = server_first_ports
        self.web_ports = web_ports

    def replacements(self) -> Iterable[Replacement]:
        original = HttpStream.handle_connect_regular
        patch = self

        def handle_connect_regular(self: HttpStream) -> Generator[Any, Any, None]:
            if self.flow.response or self.context.options.connection_strategy != "lazy":
                return (yield from original(self))
            address = self.context.server.address
            port = address[1] if address is not None else None
            if port in patch.server_first_ports:
                yield from _connect_then_answer(self)
            else:
                yield from original(self)
            response = self.flow.response
            if response is None or not 200 <= response.status_code < 300:
                return
            greet = port not in patch.web_ports and port not in patch.server_first_ports
            timer = _TunnelTimer(patch.silence if greet else patch.header_timeout, greet)
            self._handle_event = _Watch(patch, self, timer).handle
            yield timer

        yield HttpStream, "handle_connect_regular", handle_connect_regular


def _connect_then_answer(stream: HttpStream) -> Generator[Any, Any, None]:
    """mitmproxy's eager branch of `handle_connect_regular`, without its advice on `lazy`."""
    err = yield commands.OpenConnection(stream.context.server)
    if err:
        stream.flow.response = http.Response.make(
            502, f"Cannot connect to {_address(stream)}: {err}"
        )
    stream.child_layer = layer.NextLayer(stream.context)
    yield from stream.handle_connect_finish()


class _Watch:
    """A tunnel's event handler until its layer is decided: mitmproxy's own (`passthrough`),
    and its timer's wakeups."""

    def __init__(self, patch: OpenSilentTunnels, stream: HttpStream, timer: _TunnelTimer) -> None:
        self.patch = patch
        self.stream = stream
        self.timer = timer
        self.passthrough: Handler = stream._handle_event

    def handle(self, event: events.Event) -> Generator[Any, Any, None]:
        if type(event) is events.Wakeup and event.command is self.timer:
            if self.timer.greet:
                yield from self._greet()
            else:
                yield from self._end()
            return
        yield from self.passthrough(event)
        if type(event) in _TUNNEL_ENDS or not self._undecided():
            self._stop()

    def _undecided(self) -> bool:
        tunnel = self.stream.child_layer
        return isinstance(tunnel, layer.NextLayer) and tunnel.layer is None

    def _stop(self) -> None:
        """Leave the stream as mitmproxy made it; a pending wakeup goes to the sink."""
        self.stream._handle_event = self.passthrough
        parent = _http_layer_of(self.stream)
        if parent is not None and self.timer in parent.command_sources:
            parent.command_sources[self.timer] = _SINK

    def _greet(self) -> Generator[Any, Any, None]:
        if not self._undecided():
            self._stop()
            return
        stream, server = self.stream, self.stream.context.server
        tunnel = typing.cast(layer.NextLayer, stream.child_layer)
        if not tunnel.data_client() and server.timestamp_start is None:
            yield commands.Log(
                f"tunnel to {_address(stream)}: the client sent nothing in "
                f"{self.patch.silence:g} s, connecting for a greeting",
                logging.DEBUG,
            )
            err = yield commands.OpenConnection(server)
            if err:
                self._stop()
                yield from _close(stream, f"Cannot connect to {_address(stream)}: {err}")
                return
        if not self._undecided():  # the greeting came while connecting
            self._stop()
            return
        # The origin has `silence` to greet at least, whatever the header timeout.
        left = max(self.patch.header_timeout - self.patch.silence, self.patch.silence)
        self.timer = _TunnelTimer(left, greet=False)
        yield self.timer

    def _end(self) -> Generator[Any, Any, None]:
        self._stop()
        if not self._undecided():
            return
        self.patch.report("silent_connection")
        message = (
            f"tunnel to {_address(self.stream)}: nothing said in "
            f"{self.patch.header_timeout:g} s, closed"
        )
        yield commands.Log(message, logging.INFO)
        if self.stream.context.server.connected:
            yield commands.CloseConnection(self.stream.context.server)
        yield from _close(self.stream, message)


def _http_layer_of(stream: HttpStream) -> HttpLayer | None:
    layers = stream.context.layers
    parent = layers[layers.index(stream) - 1] if stream in layers else None
    return parent if isinstance(parent, HttpLayer) else None


def _address(stream: HttpStream) -> str:
    return human.format_address(stream.context.server.address)


def _close(stream: HttpStream, message: str) -> Generator[Any, Any, None]:
    """End the tunnel towards its client: HTTP/1 closes the connection, HTTP/2 the stream."""
    yield SendHttp(
        ResponseProtocolError(stream.stream_id, message, ErrorCode.CONNECT_FAILED),
        stream.context.client,
    )
