"""Requests go to reshape's engine inside the process, instead of through a socket of their own.

Why a patch: mitmproxy 12.2.3 has no hook that carries a request to an origin. An addon can only
answer a request whole (`flow.response` in the `request` hook: no streaming) or point it at
another address, which is how reshape used to reach its engine: an internal HTTP/1.1 listener,
costing a second HTTP/1.1 encoding and parse each way and mitmproxy's server-side layers for the
hop (13% of the proxy's CPU in the lab's page loads). Server connections are made per client
connection by `HttpLayer.get_connection` (proxy/layers/http/__init__.py) and opened by
`ConnectionHandler.open_connection` (proxy/server.py); nothing else decides where a request's
bytes go. This patch:

- `HttpLayer.get_connection`: asks `router(flow)` for the flow's `Route`; for a routed flow the
  stream gets an `EngineServer` connection (reshape/mitm/engine_client.py) instead of one of
  mitmproxy's own — one per destination per HttpLayer, whose only layer is an `EngineClient`.
  Requests the router leaves alone (upgrades such as WebSocket, upstream-proxy modes) keep
  mitmproxy's connections; an `EngineServer` is never handed to them (its `via` matches no
  request's).
- `ConnectionHandler.open_connection`: opens an `EngineServer` without a socket: its
  `EngineChannel` (reshape/mitm/engine_channel.py) becomes the transport, and the handler's task
  for it lives until the client connection ends (then everything the channel runs is cancelled).
  No server-connection hooks run: the engine's pool reports its own connections. In a pass of
  reshape's `server_event` (reshape/mitm/patches/inline_hooks.py) the connection opens in that
  pass (`EngineServer.open_in_place`), so a new client connection's first requests go on
  without waiting for a turn of the event loop; the handler task then only waits for the end.
- `ConnectionHandler.close_connection`: closing an `EngineServer` (mitmproxy does so after an
  invalid response) ends nothing shared: its streams are ended one by one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Generator, Iterable
from typing import Any

from mitmproxy import http
from mitmproxy.connection import ConnectionState
from mitmproxy.net import server_spec
from mitmproxy.proxy import events, server
from mitmproxy.proxy.layers.http import (
    GetHttpConnection,
    GetHttpConnectionCompleted,
    HttpLayer,
)
from mitmproxy.proxy.layers.http._http_h2 import BufferedH2Connection

from reshape.base.flowstate import state_of
from reshape.features.client_errors.rules import DEFAULT_CLIENT_IDLE_TIMEOUT
from reshape.mitm.engine_channel import EngineChannel
from reshape.mitm.engine_client import EngineClient, EngineServer
from reshape.mitm.patches.base import Patch, Replacement
from reshape.mitm.patches.h2_held_output import HeldHttp2Output
from reshape.upstream.engine import Engine, Route

# The flow's route through the engine, or None for mitmproxy's own connection. Provided by the
# pool feature (reshape/features/pool/addon.py).
Router = Callable[[http.HTTPFlow], Route | None]

# Never equal to a request's `via` (None, or an upstream proxy's spec), so mitmproxy's own
# connection reuse never picks an EngineServer.
ENGINE_VIA: server_spec.ServerSpec = ("http", ("reshape-engine.invalid", 0))
# An HttpLayer's EngineServers by (address, tls), in the layer's own __dict__.
_SERVERS = "_reshape_engine_servers"


class JoinEngine(Patch):
    """Carry the requests `router` routes through `engine`, in process."""

    def __init__(
        self,
        engine: Engine,
        router: Router,
        client_idle_timeout: float = DEFAULT_CLIENT_IDLE_TIMEOUT,
    ) -> None:
        super().__init__()
        self.engine = engine
        self.router = router
        self.client_idle_timeout = client_idle_timeout

    def replacements(self) -> Iterable[Replacement]:
        yield from self._get_connection()
        yield from self._open_connection()
        yield from self._close_connection()

    def _get_connection(self) -> Iterable[Replacement]:
        original = HttpLayer.get_connection
        join = self

        def get_connection(
            self: HttpLayer, event: GetHttpConnection, *, reuse: bool = True
        ) -> Generator[Any, Any, None]:
            stream = self.command_sources.get(event)
            flow = getattr(stream, "flow", None)
            route = join.router(flow) if flow is not None and event.via is None else None
            if route is None or flow is None or stream is None:
                return (yield from original(self, event, reuse=reuse))
            state = state_of(flow)
            state.route, state.pooled = route, True
            # Kept on the layer, as the channel on its server: they live as long as the client
            # connection. (They were in weak-keyed dictionaries whose values held their keys,
            # so nothing of a client connection was ever freed: ~100 KB per HTTPS client.)
            servers: dict[tuple[Any, bool], EngineServer] = self.__dict__.setdefault(_SERVERS, {})
            key = (event.address, event.tls)
            engine_server = servers.get(key)
            if engine_server is not None and engine_server.connected:
                self.command_sources.pop(event)
                reply = GetHttpConnectionCompleted(event, (engine_server, None))
                yield from self.event_to_child(stream, reply)
                return
            if engine_server is not None and engine_server in self.waiting_for_establishment:
                self.waiting_for_establishment[engine_server].append(event)
                return
            engine_server = EngineServer(address=event.address, transport_protocol="tcp")
            engine_server.tls = event.tls
            engine_server.via = ENGINE_VIA
            servers[key] = engine_server
            context = self.context.fork()
            context.server = engine_server
            channel = engine_server.channel = EngineChannel(
                join.engine,
                engine_server,
                lambda stream_id: _client_backlog(self, stream_id),
                join.client_idle_timeout,
            )
            engine_server.open_in_place = lambda handler: _open(engine_server, channel, handler)
            layer = EngineClient(
                context, channel, lambda sid: _flow_of(self, sid), lambda: _client_output(self)
            )
            self.connections[engine_server] = layer
            self.waiting_for_establishment[engine_server].append(event)
            yield from self.event_to_child(layer, events.Start())

        yield HttpLayer, "get_connection", get_connection

    def _open_connection(self) -> Iterable[Replacement]:
        original = server.ConnectionHandler.open_connection

        async def open_connection(self: server.ConnectionHandler, command: Any) -> None:
            engine_server = command.connection
            channel = getattr(engine_server, "channel", None)
            if not isinstance(engine_server, EngineServer) or channel is None:
                return await original(self, command)
            cancelled: asyncio.CancelledError | None = None
            try:
                if channel.handler is None:
                    # The pass that asked for the connection opens it once this task exists
                    # (mitmproxy's tasks start eagerly: this runs first); give it its turn.
                    await asyncio.sleep(0)
                if channel.handler is None:  # not opened in place: a pass without InlineHooks
                    _open(engine_server, channel, self)
                    await self.server_event(events.OpenConnectionCompleted(command, None))
                await channel.closed.wait()
            except asyncio.CancelledError as e:
                cancelled = e
            channel.close()
            engine_server.state = ConnectionState.CLOSED
            engine_server.timestamp_end = time.time()
            await self.server_event(events.ConnectionClosed(engine_server))
            self.transports.pop(engine_server, None)
            if cancelled is not None:
                raise cancelled

        yield server.ConnectionHandler, "open_connection", open_connection

    def _close_connection(self) -> Iterable[Replacement]:
        original = server.ConnectionHandler.close_connection

        def close_connection(
            self: server.ConnectionHandler, connection: Any, half_close: bool = False
        ) -> None:
            if isinstance(connection, EngineServer):
                return
            original(self, connection, half_close)

        yield server.ConnectionHandler, "close_connection", close_connection


def _open(
    engine_server: EngineServer, channel: EngineChannel, handler: server.ConnectionHandler
) -> None:
    """The engine connection is open: its channel is its writer and answers through `handler`.
    Whenever its handler task ends, the channel closes (its exchanges stop, a client's own pools
    go), also if the task was cancelled before it ever ran: opened in place, nothing waits for
    the task to start, and a client can send its requests and go at once."""
    channel.handler = handler
    engine_server.timestamp_start = time.time()
    engine_server.state = ConnectionState.OPEN
    io = handler.transports[engine_server]
    io.writer = channel  # type: ignore[assignment]
    if io.handler is not None:
        io.handler.add_done_callback(lambda _: channel.close())


def _client_h2(layer: HttpLayer) -> BufferedH2Connection | None:
    """The h2 connection of the HttpLayer's client, or None for an HTTP/1 client."""
    h2_conn = getattr(layer.connections.get(layer.context.client), "h2_conn", None)
    return h2_conn if isinstance(h2_conn, BufferedH2Connection) else None


def _client_backlog(layer: HttpLayer, stream_id: int) -> int:
    """Bytes of the stream's response in the HTTP/2 client connection's send buffer
    (mitmproxy's BufferedH2Connection holds what the client's window does not admit yet)."""
    h2_conn = _client_h2(layer)
    buffers = h2_conn.stream_buffers if h2_conn is not None else None
    if not buffers or stream_id not in buffers:
        return 0
    return sum(len(chunk.data) for chunk in buffers[stream_id])


def _client_output(layer: HttpLayer) -> HeldHttp2Output | None:
    """The HTTP/2 client connection's output, to hold while an engine answer passes
    (reshape/mitm/patches/h2_held_output.py); None for an HTTP/1 client, whose layer keeps
    nothing back to hold: it sends a response's head and its body as they come."""
    h2_conn = _client_h2(layer)
    return HeldHttp2Output(h2_conn) if h2_conn is not None else None


def _flow_of(layer: HttpLayer, stream_id: int) -> http.HTTPFlow | None:
    stream = layer.streams.get(stream_id)
    return getattr(stream, "flow", None) if stream is not None else None
