"""Where mitmproxy hands requests to the upstream engine: an internal HTTP/1.1 listener.

Why a listener (measured in bench/RESULTS.md, "Joining mitmproxy to the engine"): a response that
an addon sets in mitmproxy's `request` hook is always sent whole, so an engine answering there
could not stream. Pointed at this listener instead, mitmproxy relays our responses chunk by chunk
(`response.stream`), does the client side (TLS interception, HTTP/2, HTTP/1.1) as always, and we
own everything towards the origins: one shared pool, HTTP/2, pipelining, one-write requests. The
cost is one extra HTTP/1.1 hop over loopback per request.

Each request carries a `reshape-route` header set by reshape/features/pool/addon.py: a per-process
secret,
the real destination and the policy. Requests without the secret are refused, so the listener is
no open proxy for other local users.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass

import h11

from reshape.base.addresses import ListenAddress
from reshape.upstream.engine import (
    DestinationRefused,
    Engine,
    FirstByteTimeout,
    QueueRejected,
    Route,
)
from reshape.upstream.types import (
    Assignment,
    Headers,
    UpstreamError,
    UpstreamRequest,
    UpstreamResponse,
    end_to_end,
)

log = logging.getLogger("reshape.upstream")

ROUTE_HEADER = "reshape-route"
OUTCOME_HEADER = "reshape-outcome"
# On a response: how the pool served the request, `<kind> <queued 0|1> <queue seconds>` (for the
# request log; reshape/features/pool/addon.py takes it off before the client sees it).
ASSIGNMENT_HEADER = "reshape-assignment"
# Request bodies up to this size are held whole, so the request can be retried and its head and
# body leave in one write; larger ones stream to the origin (never retried, never pipelined).
BUFFERED_BODY_LIMIT = 1 << 20
_READ_SIZE = 256 * 1024


@dataclass(frozen=True)
class RouteHeader:
    """What the addon tells the gateway about a request, in one header."""

    scheme: str
    host: str
    port: int
    sni: str | None
    authority: str
    policy: str
    arm: str

    def encode(self, token: str) -> str:
        sni = self.sni or "-"
        return (
            f"{token} {self.scheme} {self.host} {self.port} {sni} {self.authority} "
            f"{self.policy} {self.arm}"
        )

    @classmethod
    def decode(cls, value: str, token: str) -> RouteHeader | None:
        parts = value.split(" ")
        if len(parts) != 8 or not secrets.compare_digest(parts[0], token):
            return None
        _, scheme, host, port, sni, authority, policy, arm = parts
        if scheme not in ("http", "https") or not port.isdigit():
            return None
        return cls(scheme, host, int(port), None if sni == "-" else sni, authority, policy, arm)


class Gateway:
    def __init__(self, engine: Engine, route_for: Callable[[RouteHeader], Route | None]) -> None:
        self.engine = engine
        self.route_for = route_for
        self.token = secrets.token_hex(16)
        self._server: asyncio.Server | None = None
        self.address: ListenAddress | None = None

    async def start(self, host: str = "127.0.0.1") -> ListenAddress:
        self._server = await asyncio.start_server(self._serve, host, 0, limit=_READ_SIZE)
        bound = self._server.sockets[0].getsockname()
        self.address = ListenAddress(bound[0], bound[1])
        return self.address

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = h11.Connection(h11.SERVER, max_incomplete_event_size=64 * 1024)
        try:
            while True:
                event = await _next_event(connection, reader)
                if isinstance(event, h11.ConnectionClosed):
                    return
                assert isinstance(event, h11.Request)
                await self._handle(connection, event, reader, writer)
                if (
                    connection.our_state is h11.MUST_CLOSE
                    or connection.their_state is h11.MUST_CLOSE
                ):
                    return
                connection.start_next_cycle()
        except UpstreamError as e:
            log.warning("response broken off: %s", e)
        except (h11.ProtocolError, ConnectionError, asyncio.IncompleteReadError) as e:
            log.debug("gateway connection ended: %s", e)
        except Exception:  # a bug of ours: end this connection, keep serving the others
            log.exception("internal error in the upstream gateway")
        finally:
            writer.close()

    async def _handle(
        self,
        connection: h11.Connection,
        request: h11.Request,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        route_value = None
        headers: list[tuple[bytes, bytes]] = []
        for name, value in request.headers:
            if name == ROUTE_HEADER.encode():
                route_value = value.decode("latin-1")
            elif name != b"host":
                headers.append((name, value))
        route_header = RouteHeader.decode(route_value, self.token) if route_value else None
        route = self.route_for(route_header) if route_header else None
        trailers: Headers = []  # filled when the request body ends (a stream: later)
        body, body_stream = await _request_body(connection, reader, request, trailers)
        if route is None:
            await _send_error(connection, writer, 403, "not a reshape route", "upstream_error")
            return
        assert route_header is not None
        upstream_request = UpstreamRequest(
            method=request.method,
            scheme=route_header.scheme.encode(),
            authority=route_header.authority.encode(),
            target=request.target,
            headers=end_to_end(headers),
            body=body,
            body_stream=body_stream,
            trailers=trailers,
        )
        exchange = asyncio.ensure_future(self.engine.exchange(route, upstream_request))
        try:
            if body_stream is None:
                await _unless_client_leaves(exchange, connection, reader)
            response = await exchange
        except QueueRejected as e:
            await _send_error(
                connection, writer, 503, str(e), "rejected", retry_after=e.retry_after
            )
            return
        except FirstByteTimeout as e:
            await _send_error(connection, writer, 504, str(e), "upstream_error")
            return
        except DestinationRefused as e:
            await _send_error(connection, writer, 403, str(e), "rejected")
            return
        except UpstreamError as e:
            await _send_error(connection, writer, 502, str(e), "upstream_error")
            return
        await _relay(
            connection,
            writer,
            response,
            route.read_timeout,
            request.method,
            upstream_request.assignment,
        )


async def _unless_client_leaves(
    exchange: asyncio.Future[UpstreamResponse],
    connection: h11.Connection,
    reader: asyncio.StreamReader,
) -> None:
    """Wait for `exchange`; if mitmproxy closes this connection first (its client went away),
    cancel it, which takes the request out of the pool's queue at once."""
    watch: asyncio.Future[bytes] = asyncio.ensure_future(reader.read(1))
    pending: list[asyncio.Future[object]] = [exchange, watch]  # type: ignore[list-item]
    try:
        await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not watch.done():
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
    early = watch.result() if not watch.cancelled() else None
    if early:
        connection.receive_data(early)  # the start of the next request: h11 keeps it
    elif early == b"" and not exchange.done():
        exchange.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await exchange
        raise ConnectionError("client went away while its request waited")


async def _next_event(connection: h11.Connection, reader: asyncio.StreamReader) -> h11.Event:
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            connection.receive_data(await reader.read(_READ_SIZE))
            continue
        if event is h11.PAUSED:
            raise h11.LocalProtocolError("paused")
        return event  # type: ignore[return-value]


async def _request_body(
    connection: h11.Connection,
    reader: asyncio.StreamReader,
    request: h11.Request,
    trailers: Headers,
) -> tuple[bytes, AsyncIterator[bytes] | None]:
    """The request body, whole or as a stream; its trailer fields are added to `trailers` when
    it ends (for a stream, before the stream does)."""
    length = next((v for n, v in request.headers if n == b"content-length"), None)
    chunked = any(n == b"transfer-encoding" for n, _ in request.headers)
    if not chunked and (length is None or int(length) <= BUFFERED_BODY_LIMIT):
        parts = []
        while True:
            event = await _next_event(connection, reader)
            if isinstance(event, h11.Data):
                parts.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                trailers.extend(_trailer_fields(event.headers.raw_items()))
                return b"".join(parts), None
            else:
                raise h11.RemoteProtocolError(f"unexpected {event!r}")

    async def stream() -> AsyncIterator[bytes]:
        while True:
            event = await _next_event(connection, reader)
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                trailers.extend(_trailer_fields(event.headers.raw_items()))
                return

    return b"", stream()


async def _send_error(
    connection: h11.Connection,
    writer: asyncio.StreamWriter,
    status: int,
    message: str,
    outcome: str,
    *,
    retry_after: int | None = None,
) -> None:
    body = f"reshape: {message}\n".encode()
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
        (OUTCOME_HEADER.encode(), outcome.encode()),
    ]
    if retry_after is not None:
        headers.append((b"retry-after", str(retry_after).encode()))
    writer.write(connection.send(h11.Response(status_code=status, headers=headers)) or b"")
    writer.write(connection.send(h11.Data(data=body)) or b"")
    writer.write(connection.send(h11.EndOfMessage()) or b"")
    await writer.drain()


async def _relay(
    connection: h11.Connection,
    writer: asyncio.StreamWriter,
    response: UpstreamResponse,
    read_timeout: float,
    method: bytes,
    assignment: Assignment | None = None,
) -> None:
    """Stream the origin's response to mitmproxy, trailers included (the CarryHttp1Trailers
    patch makes mitmproxy read them). An origin silent for `read_timeout` mid-body is cut off.

    Trailers need a chunked body on this hop: h11 chunks every response without a length. An
    HTTP/2 origin may send a length and trailers both; when its head announces them (a `Trailer`
    field) the length is dropped so they fit. Otherwise trailers after a body with a length have
    no place on HTTP/1.1 and stay behind.
    """
    # The gateway's own fields are never the origin's to set.
    ours = (OUTCOME_HEADER.encode(), ASSIGNMENT_HEADER.encode())
    headers = [(n, v) for n, v in end_to_end(response.headers) if n.lower() not in ours]
    announced = any(name.lower() == b"trailer" for name, _ in response.headers)
    if announced and response.http_version == "HTTP/2":
        headers = [(n, v) for n, v in headers if n.lower() != b"content-length"]
    bodiless = method == b"HEAD" or response.status in (204, 304)
    chunked = not bodiless and not any(name.lower() == b"content-length" for name, _ in headers)
    if assignment is not None:
        value = f"{assignment.kind} {int(assignment.queued)} {assignment.queue_seconds:.6f}"
        headers.append((ASSIGNMENT_HEADER.encode(), value.encode()))
    try:
        writer.write(
            connection.send(
                h11.Response(status_code=response.status, headers=headers, reason=response.reason)
            )
            or b""
        )
        while True:
            try:
                chunk = await asyncio.wait_for(response.read(), read_timeout)
            except TimeoutError:
                raise UpstreamError(
                    f"origin silent for {read_timeout:g} s in the middle of a response"
                ) from None
            if not chunk:
                break
            writer.write(connection.send(h11.Data(data=chunk)) or b"")
            await writer.drain()
        trailers = _trailer_fields(response.trailers)
        if trailers and not chunked:
            log.debug("trailers of a response with a length or no body dropped: %r", trailers)
            trailers = []
        writer.write(connection.send(h11.EndOfMessage(headers=trailers)) or b"")
        await writer.drain()
    except BaseException:
        response.abort()
        raise


# RFC 9110 §5.1, §5.5: a field name is a token; a value has no control characters but HTAB.
_FIELD_NAME = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_FIELD_VALUE_FORBIDDEN = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")


def _trailer_fields(fields: Iterable[tuple[bytes, bytes]]) -> Headers:
    """Trailer fields fit to pass on: end-to-end, not framing (h11 refuses Content-Length and
    Transfer-Encoding there), and valid — h11 would otherwise fail the connection at the very
    end of a response whose body has been relayed."""
    kept = []
    for name, value in end_to_end(list(fields)):
        value = value.strip(b" \t")
        if (
            name.lower() != b"content-length"
            and _FIELD_NAME.fullmatch(name)
            and not _FIELD_VALUE_FORBIDDEN.search(value)
        ):
            kept.append((name, value))
    return kept
