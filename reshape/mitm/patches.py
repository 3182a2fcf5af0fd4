"""The one place where reshape changes mitmproxy's internals (mitmproxy 12.2.3).

Each patch says why hooks are not enough. Re-check every one when the mitmproxy pin moves.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Collection, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

from mitmproxy import connection, http
from mitmproxy.proxy import mode_servers

from reshape.features.client_errors.rules import (
    FloodLimits,
    FloodMeter,
    bad_header_value,
    head_too_large,
)
from reshape.features.tls_records.rules import slices


def _relay(
    commands_: Generator[Any, Any, Any], change: Callable[[Any], Sequence[Any]]
) -> Generator[Any, Any, Any]:
    """Pass on the commands of a wrapped layer method, and each reply back to it, as `change`
    has them: `change(command)` returns what to yield in the command's place — the command
    itself, a replacement, or extra commands before it (the reply to the last goes back).
    Returns what the wrapped method returns."""
    reply = None
    while True:
        try:
            command = commands_.send(reply)
        except StopIteration as stop:
            return stop.value
        *extra, last = change(command)
        for before in extra:  # noqa: UP028 (`yield from` a list would choke on replies)
            yield before
        reply = yield last


_reuse_port_installed = False


def listen_with_reuse_port() -> None:
    """Make the regular proxy listener bind with SO_REUSEPORT.

    Why: `reshape run --workers N` runs N processes on one port and lets the kernel spread
    connections among them. mitmproxy 12.2.3 binds in `AsyncioServerInstance.listen` with a bare
    `asyncio.start_server(handler, host, port)` and offers no option or hook for socket flags.
    Only the TCP listener of the regular (forward proxy) mode is changed.
    """
    global _reuse_port_installed
    if _reuse_port_installed:
        return
    original = mode_servers.RegularInstance.listen

    async def listen(self: mode_servers.RegularInstance, host: str, port: int) -> list[Any]:
        if self.mode.transport_protocol != "tcp":
            return await original(self, host, port)
        return [await asyncio.start_server(self.handle_stream, host, port, reuse_port=True)]

    mode_servers.RegularInstance.listen = listen  # type: ignore[method-assign,assignment]
    _reuse_port_installed = True


_connection_limits: dict[tuple[str, int], int] = {}


def allow_connections(address: tuple[str, int], limit: int) -> None:
    """Let each client connection open up to `limit` server connections to `address`.

    Why: mitmproxy 12.2.3 caps every client connection at 5 concurrent server connections per
    address (`ConnectionHandler.max_conns`, a hard-coded `Semaphore(5)` held for a connection's
    whole life, no option). Towards reshape's internal gateway that would let an HTTP/2 browser
    connection have only 5 requests in flight, however many it multiplexes; the real per-origin
    limits are enforced by the upstream pool instead.
    """
    from mitmproxy.proxy import server

    if not _connection_limits:
        original_init = server.ConnectionHandler.__init__

        def __init__(self: server.ConnectionHandler, *args: Any, **kwargs: Any) -> None:
            original_init(self, *args, **kwargs)
            for limited, count in _connection_limits.items():
                self.max_conns[limited] = asyncio.Semaphore(count)

        server.ConnectionHandler.__init__ = __init__  # type: ignore[method-assign]
    _connection_limits[address] = limit


class PreferH2ToClients:
    """An addon: negotiate HTTP/2 with every client that offers it, whatever its preference order.

    Why: with `connection_strategy=lazy` (which the shared upstream pool needs) mitmproxy 12.2.3
    cannot mirror the origin's ALPN, so `tlsconfig.alpn_select_callback` takes the client's first
    offer — `http/1.1` for clients that list it first (httpx does). HTTP/2 towards the client costs
    nothing here: mitmproxy converts to whatever the origin speaks, and multiplexing on the client
    connection is what reshape wants. The callback reads a `client_alpn` override from the
    connection's app data, which is set here, after tlsconfig's own `tls_start_client`.
    """

    def tls_start_client(self, data: Any) -> None:
        from mitmproxy import ctx

        if ctx.options.connection_strategy != "lazy":
            # Eager: mitmproxy has the origin's ALPN and mirrors it, which is right without the
            # pool: an HTTP/2 client of an HTTP/1.1-only origin would make mitmproxy open an
            # origin connection (TCP and TLS handshakes) per request (bench/lab plt, h1 origins).
            return
        offers = data.context.client.alpn_offers or ()
        if ctx.options.http2 and b"h2" in offers and data.ssl_conn is not None:
            app_data = data.ssl_conn.get_app_data()
            if isinstance(app_data, dict) and app_data.get("client_alpn") is None:
                app_data["client_alpn"] = b"h2"


RecordPlanner = Callable[[connection.Connection, connection.Client, int], Sequence[int] | None]
_record_planner: RecordPlanner | None = None


def size_tls_records(planner: RecordPlanner) -> None:
    """Let `planner(conn, client, n_bytes)` choose the TLS records mitmproxy writes on `conn`.

    Why: mitmproxy 12.2.3's `TLSLayer.send_data` (proxy/layers/tls.py, inherited by the client and
    the server TLS layers) hands all the plaintext of a write to one `SSL.Connection.sendall`, so
    OpenSSL cuts it into 16 KB records; no hook sees the write, and `SSL_set_max_send_fragment` is
    reachable neither through pyOpenSSL nor through `cryptography` (whose OpenSSL is linked in
    statically). Every SSL write of at most 16 KB becomes one record, so writing the plaintext in
    the slices the planner returns sets the record sizes. `client` is the client connection
    `conn` belongs to (`conn` itself on the client side); a planner returning None leaves the write
    to mitmproxy as before. One planner per process: a second call replaces the first.
    """
    global _record_planner
    from mitmproxy.proxy.layers import tls
    from OpenSSL import SSL

    if _record_planner is None:
        original = tls.TLSLayer.send_data

        def send_data(self: tls.TLSLayer, data: bytes) -> Generator[Any, Any, None]:
            planner = _record_planner
            sizes = planner(self.conn, self.context.client, len(data)) if planner else None
            if sizes is None or len(sizes) < 2:
                return (yield from original(self, data))
            try:
                for piece in slices(data, sizes):
                    self.tls.sendall(piece)
            except (SSL.ZeroReturnError, SSL.SysCallError):
                pass  # as in mitmproxy's own send_data: the peer is gone
            yield from self.tls_interact()

        tls.TLSLayer.send_data = send_data  # type: ignore[method-assign]
    _record_planner = planner


SplitListener = Callable[[http.Request], None]
_split_listener: SplitListener | None = None


@dataclass
class _Http2Reads:
    """What `report_split_requests` knows about one HTTP/2 client connection."""

    reads: int = 0  # DataReceived events so far
    # Requests whose body has not begun yet: stream id → (request, read its head came in).
    waiting: dict[int, tuple[http.Request, int]] = field(default_factory=dict)


_http2_reads: weakref.WeakKeyDictionary[Any, _Http2Reads] = weakref.WeakKeyDictionary()


def report_split_requests(listener: SplitListener) -> None:
    """Call `listener(request)` for each client request whose body came in a later read than the
    end of its head (as most browsers send a POST: head and body in two TCP segments).

    Why: no mitmproxy 12.2.3 hook sees reads. `ConnectionHandler` passes each read from the client
    socket down as one `DataReceived` event (for a TLS client: everything decrypted from that
    read). HTTP/1: `Http1Server.read_headers` parses a head out of its buffer, and what is left in
    the buffer then came with the head; a request that expects a body and has none of it buffered
    is split. HTTP/2: `Http2Server` turns each read into h2 events; a request whose first non-empty
    DATA frame comes in a later read than its HEADERS is split. Requests without a body are never
    reported. The listener runs inside mitmproxy's protocol code and must not raise. One listener
    per process: a second call replaces the first.
    """
    global _split_listener
    if _split_listener is None:
        _install_http1_split_check()
        _install_http2_split_check()
    _split_listener = listener


def _report_split(request: http.Request) -> None:
    if _split_listener is not None:
        _split_listener(request)


def _install_http1_split_check() -> None:
    from mitmproxy.proxy import commands
    from mitmproxy.proxy.layers.http import _http1
    from mitmproxy.proxy.layers.http._base import ReceiveHttp
    from mitmproxy.proxy.layers.http._events import RequestHeaders

    original = _http1.Http1Server.read_headers

    def read_headers(self: _http1.Http1Server, event: Any) -> Generator[Any, Any, None]:
        rejected = False  # a malformed head: answered 400 and closed before it is passed on

        def check(command: Any) -> list[Any]:
            nonlocal rejected
            if isinstance(command, commands.CloseConnection):
                rejected = True
            elif (
                isinstance(command, ReceiveHttp)
                and isinstance(command.event, RequestHeaders)
                and not command.event.end_stream
                and not rejected
                and not self.buf  # checked before the body reader consumes the buffer
            ):
                _report_split(command.event.request)
            return [command]

        yield from _relay(original(self, event), check)

    _http1.Http1Server.read_headers = read_headers  # type: ignore[method-assign]


def _install_http2_split_check() -> None:
    import h2.events
    from mitmproxy.proxy import events
    from mitmproxy.proxy.layers.http import _http2
    from mitmproxy.proxy.layers.http._base import ReceiveHttp
    from mitmproxy.proxy.layers.http._events import RequestHeaders

    original_handle_event = _http2.Http2Server._handle_event
    original_handle_h2_event = _http2.Http2Server.handle_h2_event

    def _handle_event(self: _http2.Http2Server, event: Any) -> Generator[Any, Any, None]:
        if isinstance(event, events.DataReceived):
            state = _http2_reads.setdefault(self, _Http2Reads())
            state.reads += 1
        return (yield from original_handle_event(self, event))

    def handle_h2_event(self: _http2.Http2Server, event: Any) -> Generator[Any, Any, bool]:
        state = _http2_reads.setdefault(self, _Http2Reads())
        if isinstance(event, h2.events.DataReceived) and event.data:
            head = state.waiting.pop(event.stream_id, None)
            if head is not None and head[1] != state.reads:
                _report_split(head[0])
        elif isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)):
            state.waiting.pop(event.stream_id, None)

        def note_head(command: Any) -> list[Any]:
            if (
                isinstance(event, h2.events.RequestReceived)
                and not event.stream_ended
                and isinstance(command, ReceiveHttp)
                and isinstance(command.event, RequestHeaders)
            ):
                state.waiting[event.stream_id] = (command.event.request, state.reads)
            return [command]

        return bool((yield from _relay(original_handle_h2_event(self, event), note_head)))

    _http2.Http2Server._handle_event = _handle_event  # type: ignore[method-assign]
    _http2.Http2Server.handle_h2_event = handle_h2_event  # type: ignore[method-assign]


_http1_trailers_installed = False


def carry_http1_trailers() -> None:
    """Read and write trailer fields of HTTP/1 chunked messages, in both directions.

    Why: mitmproxy 12.2.3 handles trailers only on HTTP/2 and HTTP/3. `Http1Connection.read_body`
    (proxy/layers/http/_http1.py) raises NotImplementedError when h11's chunked reader returns
    trailers, and `Http1Server.send` / `Http1Client.send` fail an assertion on a
    ResponseTrailers / RequestTrailers event — either way the whole client connection dies. No
    hook sees those bytes. This patch:

    - wraps the chunked body reader `make_body_reader` returns, so h11's end of message comes
      back without its fields; `read_body` then passes them up as a RequestTrailers /
      ResponseTrailers event just before the end of message, as the HTTP/2 layer does;
    - makes `send` keep a trailers event and write the fields in place of the bare last chunk
      (`0\\r\\n\\r\\n`) when the message is chunked; a message that is not chunked (or the
      response to a HEAD) has no room for them, and they are dropped.

    Everything else stays mitmproxy's own code: the patch only adds and replaces events and
    SendData commands around it. Field values come from h11, h2 or an addon, all of which refuse
    CR and LF in them.
    """
    global _http1_trailers_installed
    if _http1_trailers_installed:
        return
    import h11
    from mitmproxy.proxy import commands
    from mitmproxy.proxy.layers.http import _http1
    from mitmproxy.proxy.layers.http._base import ReceiveHttp
    from mitmproxy.proxy.layers.http._events import (
        RequestEndOfMessage,
        RequestTrailers,
        ResponseEndOfMessage,
        ResponseTrailers,
    )

    class TrailerKeepingReader:
        """h11's ChunkedReader, with the trailer fields of the end of message set aside."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner
            self.trailers: http.Headers | None = None

        def __call__(self, buf: Any) -> Any:
            event = self.inner(buf)
            if isinstance(event, h11.EndOfMessage) and event.headers:
                self.trailers = http.Headers(list(event.headers.raw_items()))
                return h11.EndOfMessage()
            return event

        def read_eof(self) -> Any:
            return self.inner.read_eof()

    original_make_body_reader = _http1.make_body_reader

    def make_body_reader(expected_size: int | None) -> Any:
        reader = original_make_body_reader(expected_size)
        return TrailerKeepingReader(reader) if expected_size is None else reader

    original_read_body = _http1.Http1Connection.read_body

    def read_body(self: _http1.Http1Connection, event: Any) -> Generator[Any, Any, None]:
        def trailers_first(command: Any) -> list[Any]:
            reader = self.body_reader
            if (
                isinstance(command, ReceiveHttp)
                and isinstance(command.event, (RequestEndOfMessage, ResponseEndOfMessage))
                and isinstance(reader, TrailerKeepingReader)
                and reader.trailers is not None
            ):
                trailers, reader.trailers = reader.trailers, None
                kind = (
                    RequestTrailers
                    if isinstance(command.event, RequestEndOfMessage)
                    else ResponseTrailers
                )
                return [ReceiveHttp(kind(command.event.stream_id, trailers)), command]
            return [command]

        yield from _relay(original_read_body(self, event), trailers_first)

    pending: weakref.WeakKeyDictionary[Any, http.Headers] = weakref.WeakKeyDictionary()

    def with_trailers(
        original_send: Any,
        trailers_event: type[RequestTrailers | ResponseTrailers],
        end_event: type[RequestEndOfMessage | ResponseEndOfMessage],
    ) -> Any:
        def send(self: _http1.Http1Connection, event: Any) -> Generator[Any, Any, None]:
            if isinstance(event, trailers_event):
                pending[self] = event.trailers  # sent with the end of message, if it is chunked
                return
            trailers = pending.pop(self, None) if isinstance(event, end_event) else None

            def with_last_chunk(command: Any) -> list[Any]:
                if (
                    trailers
                    and isinstance(command, commands.SendData)
                    and command.data == b"0\r\n\r\n"
                ):
                    last_chunk = b"0\r\n%s\r\n" % bytes(trailers)
                    return [commands.SendData(command.connection, last_chunk)]
                return [command]

            yield from _relay(original_send(self, event), with_last_chunk)

        return send

    _http1.make_body_reader = make_body_reader
    _http1.Http1Connection.read_body = read_body  # type: ignore[method-assign]
    _http1.Http1Server.send = with_trailers(  # type: ignore[method-assign]
        _http1.Http1Server.send, ResponseTrailers, ResponseEndOfMessage
    )
    _http1.Http1Client.send = with_trailers(  # type: ignore[method-assign]
        _http1.Http1Client.send, RequestTrailers, RequestEndOfMessage
    )
    _http1_trailers_installed = True


ClientErrorListener = Callable[[str], None]


@dataclass
class _ClientGuard:
    """What `guard_client_input` enforces; replaced by a later call."""

    report: ClientErrorListener
    max_head_bytes: int
    header_timeout: float
    flood_limits: FloodLimits


_client_guard: _ClientGuard | None = None
# Per HTTP/1 client connection: the header timer armed now (stale wakeups are ignored).
_head_timers: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_flood_meters: weakref.WeakKeyDictionary[Any, FloodMeter] = weakref.WeakKeyDictionary()


def guard_client_input(
    report: ClientErrorListener,
    *,
    max_head_bytes: int,
    header_timeout: float,
    flood_limits: FloodLimits | None = None,
) -> None:
    """Refuse request heads that are too large, too slow or carry control characters, close
    HTTP/2 connections that flood control frames, and call `report(kind)` for each (the kinds of
    reshape/features/client_errors/rules.py) — for the client errors no mitmproxy 12.2.3 hook sees.

    Why a patch: in mitmproxy 12.2.3 `Http1Server.read_headers` (proxy/layers/http/_http1.py)
    buffers a head without any limit ("FIXME: protect against header size DoS") and has no
    timeout (only the 10-minute idle `tcp_timeout`, which a client sending a byte now and then
    never reaches); header values with NUL, CR or DEL pass through to the origin; and the HTTP/2
    layer answers every PING and SETTINGS and starts a flow for every stream a client opens and
    resets at once (CVE-2023-44487), with no budget. A malformed head that mitmproxy rejects
    before a flow exists produces only a log line, so it is counted here too. This patch:

    - HTTP/1 (`Http1Server._handle_event`): before mitmproxy parses, a head (complete or not) over
      `max_head_bytes` gets 431 and a close; a head not complete `header_timeout` seconds after
      the connection started or after its first byte arrived gets 408 and a close (a
      `RequestWakeup` timer, mitmproxy's own mechanism for layer timers); a parsed head with a
      control character in a value gets 400 and a close, before any addon or origin sees it;
      mitmproxy's own 400 for a head it cannot parse is counted as `malformed`.
    - HTTP/2 (`Http2Server.handle_h2_event`, `protocol_error`): RST_STREAM, SETTINGS and PING
      frames from the client draw on a `FloodMeter`; over budget, the connection gets GOAWAY
      ENHANCE_YOUR_CALM and is closed; every protocol error mitmproxy closes a client connection
      for is counted.
    """
    global _client_guard
    if _client_guard is None:
        _install_http1_head_guard()
        _install_http2_flood_guard()
    _client_guard = _ClientGuard(
        report, max_head_bytes, header_timeout, flood_limits or FloodLimits()
    )


def _install_http1_head_guard() -> None:
    import re

    from mitmproxy.proxy import commands, events
    from mitmproxy.proxy.layers.http import _http1
    from mitmproxy.proxy.layers.http._base import ReceiveHttp
    from mitmproxy.proxy.layers.http._events import RequestHeaders

    # h11's ReceiveBuffer ends a head at the first blank line, CRLF or bare LF.
    blank_line = re.compile(rb"\n\r?\n")
    original_handle_event = _http1.Http1Server._handle_event

    def reading_head(self: _http1.Http1Server) -> bool:
        # By name: `state` is a bound method, and read_headers may be a wrapper of another patch
        # (report_split_requests keeps the name).
        return getattr(self.state, "__name__", "") == "read_headers"

    def refuse(
        self: _http1.Http1Server, status: int, kind: str, message: str
    ) -> Generator[Any, Any, None]:
        _head_timers.pop(self, None)
        self.state = self.done
        yield commands.SendData(self.conn, _http1.make_error_response(status, message))
        yield commands.CloseConnection(self.conn)
        if _client_guard is not None:
            _client_guard.report(kind)

    def _handle_event(self: _http1.Http1Server, event: Any) -> Generator[Any, Any, None]:
        guard = _client_guard
        if guard is None:
            return (yield from original_handle_event(self, event))
        if isinstance(event, events.Wakeup):
            if event.command is _head_timers.get(self) and reading_head(self):
                yield from refuse(
                    self,
                    408,
                    "header_timeout",
                    f"Request head not complete within {guard.header_timeout:g} seconds.",
                )
            return  # a timer for a head that has since completed
        if isinstance(event, events.DataReceived) and reading_head(self):
            buffered = len(self.buf) + len(event.data)
            if buffered > guard.max_head_bytes:
                data = bytes(self.buf) + event.data
                match = blank_line.search(data)
                if head_too_large(buffered, match.end() if match else None, guard.max_head_bytes):
                    yield from refuse(
                        self,
                        431,
                        "header_too_large",
                        f"Request head larger than {guard.max_head_bytes} bytes.",
                    )
                    return
        parsing = reading_head(self) and isinstance(event, events.DataReceived)
        commands_ = original_handle_event(self, event)
        reply = None
        rejected = False
        while True:
            try:
                command = commands_.send(reply)
            except StopIteration:
                break
            if (
                isinstance(command, ReceiveHttp)
                and isinstance(command.event, RequestHeaders)
                and (name := bad_header_value(command.event.request.headers.fields))
            ):
                commands_.close()
                yield from refuse(
                    self, 400, "malformed", f"Control character in header field {name!r}."
                )
                return
            if isinstance(command, commands.CloseConnection) and parsing:
                rejected = True  # mitmproxy's 400 for a head it could not parse
            reply = yield command
        if rejected and self.request is None:
            # With a parsed request the error hook sees it
            # (reshape/features/client_errors/addon.py).
            guard.report("malformed")
        if isinstance(event, events.Start) or (
            reading_head(self) and self.buf and self not in _head_timers
        ):
            timer = commands.RequestWakeup(guard.header_timeout)
            _head_timers[self] = timer
            yield timer
        elif not reading_head(self):
            _head_timers.pop(self, None)

    _http1.Http1Server._handle_event = _handle_event  # type: ignore[method-assign,assignment]


def _install_http2_flood_guard() -> None:
    import time

    import h2.errors
    import h2.events
    from mitmproxy.proxy.layers.http import _http2

    frame_kinds = {
        h2.events.StreamReset: "reset",
        h2.events.RemoteSettingsChanged: "settings",
        h2.events.PingReceived: "ping",
    }
    original_handle_h2_event = _http2.Http2Server.handle_h2_event
    original_protocol_error = _http2.Http2Server.protocol_error

    def handle_h2_event(self: _http2.Http2Server, event: Any) -> Generator[Any, Any, bool]:
        guard = _client_guard
        kind = frame_kinds.get(type(event))
        if guard is not None and kind is not None:
            meter = _flood_meters.get(self)
            if meter is None:
                meter = _flood_meters[self] = FloodMeter(guard.flood_limits)
            if not meter.allow(kind, time.monotonic()):
                yield from self.protocol_error(
                    f"HTTP/2 {kind} flood", h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
                )
                return True
        return (yield from original_handle_h2_event(self, event))

    def protocol_error(
        self: _http2.Http2Server,
        message: str,
        error_code: int = h2.errors.ErrorCodes.PROTOCOL_ERROR,
    ) -> Generator[Any, Any, None]:
        if _client_guard is not None:
            calm = error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
            _client_guard.report("h2_flood" if calm else "h2_protocol")
        return (yield from original_protocol_error(self, message, error_code))

    _http2.Http2Server.handle_h2_event = handle_h2_event  # type: ignore[method-assign]
    _http2.Http2Server.protocol_error = protocol_error  # type: ignore[method-assign,assignment]


def close_server_connection(client: connection.Client, server: connection.Server) -> None:
    """Close `server`'s socket now, from a `server_connected` hook, before anything is written.

    Why: a hook can refuse a connection before it is opened (`server.error` in `server_connect`)
    but not after — and only after connecting is the peer address known (a name may resolve to a
    refused address: reshape/features/destinations/addon.py). mitmproxy 12.2.3 keeps the socket in
    the client's
    `ConnectionHandler.transports`, reachable through the proxyserver addon's `connections`
    (keyed by client id). Closing the writer makes mitmproxy skip every later write to it
    (`SendData` checks `is_closing()`) and read EOF: the request fails as if the server hung up,
    and the `error` the hook set keeps the connection from being reused.
    """
    writer = _writer_of(client, server)
    if writer is not None:
        writer.close()


def close_client_connection(client: connection.Client) -> bool:
    """Close `client`'s socket from outside mitmproxy's layers (a timer of an addon's); False if
    it is not open (any more).

    Why: no hook or command closes a client connection on an addon's schedule. As for
    `close_server_connection`, mitmproxy 12.2.3 keeps the socket in the client's
    `ConnectionHandler.transports`, reachable through the proxyserver addon's `connections`.
    Closing the writer ends the connection as a client that hung up would: mitmproxy reads EOF
    and runs its usual teardown (`client_disconnected` included).
    """
    writer = _writer_of(client, client)
    if writer is None or writer.is_closing():
        return False
    writer.close()
    return True


def _writer_of(client: connection.Client, conn: connection.Connection) -> Any:
    """The asyncio writer of `conn` (the client itself or one of its server connections), from
    the client's `ConnectionHandler.transports`; None if there is none (any more), or outside a
    running master (unit tests)."""
    from mitmproxy import ctx

    master = getattr(ctx, "master", None)
    proxyserver: Any = master.addons.get("proxyserver") if master else None
    handler = proxyserver.connections.get(client.id) if proxyserver else None
    io = handler.transports.get(conn) if handler else None
    return io.writer if io is not None else None


_listen_backlog: int | None = None


def listen_with_backlog(backlog: int) -> None:
    """Give the proxy's listening sockets an accept queue of `backlog` connections.

    Why: mitmproxy 12.2.3 binds with `asyncio.start_server`, whose backlog is 100, with no option.
    When hundreds of clients connect at once (bench/soak: 1,000 connections opening together) and
    the proxy is busy, the kernel's accept queue overflows; a connection the kernel could not
    queue is reset later, after the client already sent its CONNECT ("connection reset by peer").
    Calling listen() again on a listening socket changes its backlog (the kernel caps it at
    net.core.somaxconn), so the sockets mitmproxy created are updated after the fact. Applies to
    every listener of the regular mode, SO_REUSEPORT ones included.
    """
    global _listen_backlog
    import os
    import socket

    if _listen_backlog is None:
        original = mode_servers.RegularInstance.listen

        async def listen(self: mode_servers.RegularInstance, host: str, port: int) -> list[Any]:
            servers = await original(self, host, port)
            for server in servers:
                for listening in getattr(server, "sockets", ()):
                    if listening.type != socket.SOCK_STREAM:
                        continue
                    with socket.socket(fileno=os.dup(listening.fileno())) as same:
                        same.listen(_listen_backlog or socket.SOMAXCONN)
            return servers

        mode_servers.RegularInstance.listen = listen  # type: ignore[method-assign,assignment]
    _listen_backlog = backlog


@dataclass(frozen=True)
class _OriginTimeouts:
    """What `time_out_origins` enforces; replaced by a later call."""

    connect: float
    first_byte: float
    exempt: Collection[tuple[str, int]]


_origin_timeouts: _OriginTimeouts | None = None  # None: mitmproxy's own behaviour
_origin_timeouts_installed = False


def time_out_origins(
    connect_timeout: float,
    read_timeout: float,
    *,
    exempt: Collection[tuple[str, int]] = (),
) -> None:
    """Give mitmproxy's own origin connections a connect timeout (then 502) and a first-byte
    timeout (then 504), as the shared pool has (`upstream: connect_timeout, read_timeout`).

    Why a patch: mitmproxy 12.2.3 opens origin connections with a bare `asyncio.open_connection`
    (`ConnectionHandler.open_connection`, proxy/server.py), so a connect that nobody answers
    lasts as long as the kernel's SYN retries (about two minutes); and `HttpStream`
    (proxy/layers/http/__init__.py) waits for a response head with no timer at all: only the idle
    `tcp_timeout` (600 s) ends the wait, and the client then gets no answer. No hook runs during
    either wait. This patch:

    - gives proxy/server.py an `asyncio` whose `open_connection` gives up after
      `connect_timeout` (TCP only: a TLS handshake that stalls is not timed) with a
      `TimeoutError`, an OSError, which mitmproxy handles as any failed connect: the client gets
      502 with the message;
    - arms a timer on each request once its end has gone to the origin (a `RequestWakeup`,
      mitmproxy's own mechanism for layer timers). Any event for the request — its response
      head, an error, the client leaving — disarms it. When it fires, the flow gets an error
      (the `error` hook runs), the request is cancelled at the origin (HTTP/1: the connection
      closes; HTTP/2: RST_STREAM CANCEL) and the client gets 504. The timer lives in the
      per-request `HttpStream`, so HTTP/1 and HTTP/2 clients are treated alike; requests that
      legitimately wait longer (long polls) get the 504 too, as with the pool.

    Connections to the `exempt` addresses (reshape's internal gateway: the pool times its own
    requests, per policy) are left alone; the collection is read each time, so it may grow later.
    mitmproxy cannot cancel a timer: a disarmed one stays pending until it is due, its wakeup
    pointed away from the request (which then keeps neither the stream nor its flow alive, and
    a stream that became a WebSocket after a 101 never sees it), and the next request of the
    same client connection takes it over instead of arming another.
    """
    global _origin_timeouts, _origin_timeouts_installed
    if not _origin_timeouts_installed:
        _install_connect_timeout()
        _install_first_byte_timeout()
        _origin_timeouts_installed = True
    _origin_timeouts = _OriginTimeouts(connect_timeout, read_timeout, exempt)


def _install_connect_timeout() -> None:
    import types

    from mitmproxy.proxy import server
    from mitmproxy.utils import human

    async def open_connection(
        host: str, port: int, **kwargs: Any
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        timeouts = _origin_timeouts
        if timeouts is None or (host, port) in timeouts.exempt:
            return await asyncio.open_connection(host, port, **kwargs)
        deadline = asyncio.timeout(timeouts.connect)
        try:
            async with deadline:
                return await asyncio.open_connection(host, port, **kwargs)
        except TimeoutError:
            if not deadline.expired():
                raise  # the kernel's own ETIMEDOUT
            raise TimeoutError(
                f"no connection to {human.format_address((host, port))} within "
                f"{timeouts.connect:g} s (connect timeout)"
            ) from None

    class AsyncioWithConnectTimeout(types.ModuleType):
        """asyncio as proxy/server.py sees it: the module itself, but for `open_connection`."""

        def __getattr__(self, name: str) -> Any:
            return getattr(asyncio, name)

    shim = AsyncioWithConnectTimeout("asyncio")
    shim.open_connection = open_connection  # type: ignore[attr-defined]
    server.asyncio = shim


@dataclass
class _FirstByteTimer:
    """A request waiting for its response head: the pending timer it holds, when that timer is
    due, and when the request times out (later than `due` if it took over an older timer)."""

    timer: Any  # mitmproxy's commands.RequestWakeup
    due: float
    deadline: float


class _SpareTimers:
    """The pending first-byte timers of one `HttpLayer` that no request holds, by when they are
    due. The layer delivers a spare timer's wakeup here (its `command_sources` entry points
    here), which only forgets it."""

    def __init__(self) -> None:
        self.due: dict[Any, float] = {}

    def handle_event(self, event: Any) -> Generator[Any, Any, None]:
        self.due.pop(event.command, None)
        yield from ()


# Per HttpStream waiting for its response head; per HttpLayer, its spare timers.
_first_byte_timers: weakref.WeakKeyDictionary[Any, _FirstByteTimer] = weakref.WeakKeyDictionary()
_spare_timers: weakref.WeakKeyDictionary[Any, _SpareTimers] = weakref.WeakKeyDictionary()
# A wakeup up to this early still counts as due (the event loop may run a timer a hair early).
_TIMER_SLACK = 0.001


def _install_first_byte_timeout() -> None:
    import time

    from mitmproxy import flow, version
    from mitmproxy.proxy import commands, events
    from mitmproxy.proxy.layers import http as http_layers
    from mitmproxy.proxy.layers.http._base import format_error
    from mitmproxy.proxy.layers.http._events import (
        ErrorCode,
        RequestEndOfMessage,
        RequestProtocolError,
        ResponseData,
        ResponseEndOfMessage,
        ResponseHeaders,
    )
    from mitmproxy.proxy.layers.http._hooks import HttpErrorHook
    from mitmproxy.utils import human

    HttpStream = http_layers.HttpStream
    SendHttp = http_layers.SendHttp
    original_handle_event = HttpStream._handle_event

    def parent_layer(stream: Any) -> Any:
        # As HttpStream.mode finds it: the HttpLayer right before the stream.
        layers = stream.context.layers
        return layers[layers.index(stream) - 1]

    def waiting_for_head(stream: Any) -> bool:
        return (
            stream.flow.response is None
            and stream.flow.error is None
            and stream.server_state == stream.state_wait_for_response_headers
        )

    def arm(stream: Any, delay: float) -> Generator[Any, Any, None]:
        deadline = time.monotonic() + delay
        layer = parent_layer(stream)
        spares = _spare_timers.get(layer)
        spare = (
            next((t for t, due in spares.due.items() if due <= deadline), None) if spares else None
        )
        if spares is not None and spare is not None:
            layer.command_sources[spare] = stream
            _first_byte_timers[stream] = _FirstByteTimer(spare, spares.due.pop(spare), deadline)
            return
        timer = commands.RequestWakeup(delay)
        _first_byte_timers[stream] = _FirstByteTimer(timer, deadline, deadline)
        yield timer  # the HttpLayer notes the stream as the timer's source

    def disarm(stream: Any) -> None:
        armed = _first_byte_timers.pop(stream)
        layer = parent_layer(stream)
        spares = _spare_timers.get(layer)
        if spares is None:
            spares = _spare_timers[layer] = _SpareTimers()
        layer.command_sources[armed.timer] = spares
        spares.due[armed.timer] = armed.due

    def time_out(stream: Any, timeouts: _OriginTimeouts) -> Generator[Any, Any, None]:
        address = human.format_address(stream.context.server.address)
        message = f"{address} sent no response within {timeouts.first_byte:g} s (read timeout)"
        stream.flow.error = flow.Error(message)
        stream.client_state = stream.server_state = stream.state_errored
        cancel = RequestProtocolError(stream.stream_id, message, ErrorCode.CANCEL)
        yield SendHttp(cancel, stream.context.server)
        yield HttpErrorHook(stream.flow)
        stream.flow.live = False
        if not (yield from stream.check_killed(False)):
            body = format_error(504, message)
            headers = http.Headers(Server=version.MITMPROXY, Content_Type="text/html")
            response = http.Response.make(504, body, headers)
            client = stream.context.client
            yield SendHttp(ResponseHeaders(stream.stream_id, response), client)
            if stream.flow.request.method != "HEAD":
                yield SendHttp(ResponseData(stream.stream_id, body), client)
            yield SendHttp(ResponseEndOfMessage(stream.stream_id), client)
        yield http_layers.DropStream(stream.stream_id)

    def woken(stream: Any, event: Any) -> Generator[Any, Any, None]:
        armed = _first_byte_timers.get(stream)
        timeouts = _origin_timeouts
        if armed is None or armed.timer is not event.command or timeouts is None:
            return  # not a timer this stream holds (disarmed ones go to the spares)
        del _first_byte_timers[stream]
        if not waiting_for_head(stream):
            return
        left = armed.deadline - time.monotonic()
        if left > _TIMER_SLACK:  # a timer taken over from an earlier request: due before ours
            timer = commands.RequestWakeup(left)
            _first_byte_timers[stream] = _FirstByteTimer(timer, armed.deadline, armed.deadline)
            yield timer
            return
        yield from time_out(stream, timeouts)

    def _handle_event(self: Any, event: Any) -> Generator[Any, Any, None]:
        if isinstance(event, events.Wakeup):
            return (yield from woken(self, event))
        if self in _first_byte_timers:
            disarm(self)  # a head, an error or a client that left: no longer waiting for the head
        sent_end = False

        def note_end(command: Any) -> list[Any]:
            nonlocal sent_end
            if (
                isinstance(command, SendHttp)
                and isinstance(command.event, RequestEndOfMessage)
                and command.connection is self.context.server
            ):
                sent_end = True
            return [command]

        yield from _relay(original_handle_event(self, event), note_end)
        timeouts = _origin_timeouts
        if (
            sent_end
            and timeouts is not None
            and waiting_for_head(self)
            and self.context.server.address not in timeouts.exempt
        ):
            yield from arm(self, timeouts.first_byte)

    HttpStream._handle_event = _handle_event  # type: ignore[method-assign]
