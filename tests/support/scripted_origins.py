"""Small origins with scripted misbehaviour, for the cases real servers cannot be told to do.

Each runs an asyncio TCP server on its own event-loop thread, so synchronous tests can use it
next to `reshape run` as a subprocess.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import ssl
import threading
from collections.abc import AsyncIterator, Callable
from typing import Self

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h11

from labkit.pki import IssuedCert


class ScriptedOrigin:
    """An origin on `host` (a free port, unless `port` is set before entering) whose `handle`
    coroutine plays each connection.

    With `tls` it is HTTPS, offering `alpn`. Connection errors in `handle` (the peer went away,
    or any of `QUIET_ERRORS`) end that connection quietly; leaving the context stops the server
    and cancels the connections still being played.
    """

    QUIET_ERRORS: tuple[type[BaseException], ...] = (ConnectionError, asyncio.IncompleteReadError)

    def __init__(
        self, host: str, tls: IssuedCert | None = None, alpn: tuple[str, ...] = ("http/1.1",)
    ) -> None:
        self.host = host
        self.port = 0
        self.tls = tls
        self.alpn = alpn
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    def url(self, path: str = "/") -> str:
        return f"{self.scheme}://{self.host}:{self.port}{path}"

    def __enter__(self) -> Self:
        context = None
        if self.tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(self.tls.cert_path, self.tls.key_path)
            context.set_alpn_protocols(list(self.alpn))
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, self.host, self.port, ssl=context), self._loop
        ).result(5)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            assert self._server is not None
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self.handle(reader, writer)
        except self.QUIET_ERRORS:
            pass
        except asyncio.CancelledError:
            pass  # stopping: end quietly (asyncio logs a cancelled connection callback)
        finally:
            self._tasks.discard(task)


async def h11_event(connection: h11.Connection, reader: asyncio.StreamReader) -> h11.Event | None:
    """`connection`'s next event, reading from `reader` as it needs; None if the peer closed
    first."""
    while (event := connection.next_event()) is h11.NEED_DATA:
        data = await reader.read(65536)
        if not data:
            return None
        connection.receive_data(data)
    return event


def h2_server(writer: asyncio.StreamWriter) -> h2.connection.H2Connection:
    """The server side of an HTTP/2 connection (bytes headers), its preface written."""
    config = h2.config.H2Configuration(client_side=False, header_encoding=None)
    connection = h2.connection.H2Connection(config)
    connection.initiate_connection()
    writer.write(connection.data_to_send())
    return connection


async def h2_events(
    connection: h2.connection.H2Connection,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
) -> AsyncIterator[h2.events.Event]:
    """Every event of `connection` until the peer closes; what the connection has to send after
    each read's events is written."""
    while data := await reader.read(65536):
        for event in connection.receive_data(data):
            yield event
        writer.write(connection.data_to_send())


class SlowOrigin(ScriptedOrigin):
    """Answers each request `delay` seconds after reading it, then closes."""

    def __init__(self, host: str, delay: float) -> None:
        super().__init__(host)
        self.delay = delay

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await asyncio.sleep(self.delay)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\nslow")
        await writer.drain()
        writer.close()


class GreetingOrigin(ScriptedOrigin):
    """A service that speaks first, as SMTP does: a greeting, then `250 <line>` for each line it
    reads, `221 bye` and the close for `QUIT`."""

    GREETING = b"220 mail.test ESMTP ready\r\n"

    def __init__(self, host: str, port: int = 0) -> None:
        super().__init__(host)
        self.port = port

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(self.GREETING)
        await writer.drain()
        while line := await reader.readline():
            if line.strip() == b"QUIT":
                writer.write(b"221 bye\r\n")
                break
            writer.write(b"250 " + line)
            await writer.drain()
        await writer.drain()
        writer.close()


class PipelineBreakingOrigin(ScriptedOrigin):
    """Reads pipelined GETs and, after answering `per_connection` of them on a connection, drops
    it without `Connection: close` — a broken pipeline. The body is `body_for(path)`."""

    def __init__(self, host: str, per_connection: int, body_for: Callable[[str], bytes]) -> None:
        super().__init__(host)
        self.per_connection = per_connection
        self.body_for = body_for
        self.served: list[str] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(self.per_connection):
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                break
            path = head.split(b" ")[1].decode()
            self.served.append(path)
            body = self.body_for(path)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            await writer.drain()
        writer.transport.abort()


class EarlyAnswerOrigin(ScriptedOrigin):
    """Answers every request as soon as its head has arrived, without reading its body, and
    closes: what a server does to an upload it refuses (nginx's 413 past client_max_body_size).
    Unread body bytes make the close a reset."""

    ANSWER = b"upload refused: too large\n"

    def __init__(self, host: str) -> None:
        super().__init__(host)
        self.heads: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        self.heads.append(head)
        writer.write(
            b"HTTP/1.1 413 Content Too Large\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
            % len(self.ANSWER)
            + self.ANSWER
        )
        await writer.drain()
        writer.close()


class InterimThenReadAllOrigin(ScriptedOrigin):
    """Sends `100 Continue` as soon as a request's head has arrived, unasked, then reads the whole
    body (of its Content-Length, or chunked) and answers 200 with its SHA-256: a client must not
    take the interim response for an early answer and stop sending."""

    def __init__(self, host: str) -> None:
        super().__init__(host)
        self.received: list[int] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).lower()
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
        digest = hashlib.sha256()
        size = 0
        if b"\r\ncontent-length:" in head:
            length = int(head.split(b"\r\ncontent-length:")[1].split(b"\r\n")[0])
            while size < length:
                chunk = await reader.read(min(1 << 16, length - size))
                if not chunk:
                    raise asyncio.IncompleteReadError(b"", length - size)
                digest.update(chunk)
                size += len(chunk)
        while b"transfer-encoding: chunked" in head:
            length = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if length == 0:
                await reader.readuntil(b"\r\n")  # no trailers: the empty line
                break
            chunk = await reader.readexactly(length)
            await reader.readexactly(2)
            digest.update(chunk)
            size += length
        self.received.append(size)
        answer = digest.hexdigest().encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(answer) + answer)
        await writer.drain()
        writer.close()


class ReadCountingH2Origin(ScriptedOrigin):
    """An HTTP/2 origin (TLS, ALPN h2) that answers every GET with its path, and records how many
    requests each of its reads brought (`requests_per_read`, reads that brought none left out):
    how a proxy's writes reach it."""

    def __init__(self, host: str, tls: IssuedCert) -> None:
        super().__init__(host, tls, alpn=("h2",))
        self.requests_per_read: list[int] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = h2_server(writer)
        while data := await reader.read(65536):
            events = connection.receive_data(data)
            received = [e for e in events if isinstance(e, h2.events.RequestReceived)]
            if received:
                self.requests_per_read.append(len(received))
            for event in received:
                path = dict(event.headers or [])[b":path"]
                connection.send_headers(
                    event.stream_id,
                    [(b":status", b"200"), (b"content-length", str(len(path)).encode())],
                )
                connection.send_data(event.stream_id, path, end_stream=True)
            writer.write(connection.data_to_send())


class EarlyHintsOrigin(ScriptedOrigin):
    """Answers every GET with 103 Early Hints (`LINK`), as many as its path's `hints=N` says (one
    without), all in one write (or one every S seconds, with `every=S` in the path: an origin
    telling its client it is still at work, as 102 Processing does); then, `wait` seconds later,
    200 with the path as body: an origin
    that tells the browser what the page needs while it makes the page (or, with many, one that
    floods its client with them). HTTP/2 when it offers h2 (`alpn`), else HTTP/1.1. Keeps
    (connection number, path) of every request (`requests`) and counts the connections it has
    open (`open`)."""

    LINK = b"</static/site.css>; rel=preload; as=style"

    def __init__(
        self,
        host: str,
        tls: IssuedCert | None = None,
        alpn: tuple[str, ...] = ("http/1.1",),
        wait: float = 0.05,
    ) -> None:
        super().__init__(host, tls, alpn)
        self.wait = wait
        self.connections = 0
        self.open = 0
        self.requests: list[tuple[int, str]] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open += 1
        try:
            ssl_object = writer.get_extra_info("ssl_object")
            if ssl_object is not None and ssl_object.selected_alpn_protocol() == "h2":
                await self._h2(self.connections, reader, writer)
            else:
                await self._h1(self.connections, reader, writer)
        finally:
            self.open -= 1

    async def _h1(
        self, number: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        hint = b"HTTP/1.1 103 Early Hints\r\nLink: " + self.LINK + b"\r\n\r\n"
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ")[1]
            self.requests.append((number, path.decode()))
            every = _every_in(path)
            for _ in range(_hints_in(path) if every else 1):
                writer.write(hint if every else hint * _hints_in(path))
                await writer.drain()
                await asyncio.sleep(every)
            await asyncio.sleep(self.wait)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(path) + path)
            await writer.drain()

    async def _h2(
        self, number: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        connection = h2_server(writer)
        async for event in h2_events(connection, reader, writer):
            if not isinstance(event, h2.events.RequestReceived):
                continue
            path = dict(event.headers or [])[b":path"]
            self.requests.append((number, path.decode()))
            every = _every_in(path)
            for _ in range(_hints_in(path)):
                connection.send_headers(
                    event.stream_id, [(b":status", b"103"), (b"link", self.LINK)]
                )
                if every:
                    writer.write(connection.data_to_send())
                    await writer.drain()
                    await asyncio.sleep(every)
            writer.write(connection.data_to_send())
            await writer.drain()
            await asyncio.sleep(self.wait)
            # The client may have reset the stream meanwhile (too many 103s).
            with contextlib.suppress(h2.exceptions.StreamClosedError):
                connection.send_headers(
                    event.stream_id,
                    [(b":status", b"200"), (b"content-length", str(len(path)).encode())],
                )
                connection.send_data(event.stream_id, path, end_stream=True)
            writer.write(connection.data_to_send())


def _every_in(path: bytes) -> float:
    """The seconds between the 103s a request for `path` asks of EarlyHintsOrigin: `every=S`,
    or 0 (all at once)."""
    match = re.search(rb"[?&]every=([0-9.]+)", path)
    return float(match[1]) if match else 0.0


def _hints_in(path: bytes) -> int:
    """The number of 103s a request for `path` asks of EarlyHintsOrigin: `hints=N`, or 1."""
    match = re.search(rb"[?&]hints=([0-9]+)", path)
    return int(match[1]) if match else 1


class DrainingH2Origin(ScriptedOrigin):
    """An HTTP/2 origin (TLS, ALPN h2) that is shutting down: its SETTINGS and a GOAWAY
    (NO_ERROR, `last_stream_id`) go in one write, before any request; then it reads until the
    peer closes. `connections` counts what it accepted, `requests` the streams it was sent."""

    def __init__(self, host: str, tls: IssuedCert, *, last_stream_id: int = 2**31 - 1) -> None:
        super().__init__(host, tls, alpn=("h2",))
        self.last_stream_id = last_stream_id
        self.connections = 0
        self.requests = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        config = h2.config.H2Configuration(client_side=False, header_encoding=None)
        connection = h2.connection.H2Connection(config)
        connection.initiate_connection()
        connection.close_connection(last_stream_id=self.last_stream_id)
        writer.write(connection.data_to_send())
        while data := await reader.read(65536):
            with contextlib.suppress(h2.exceptions.ProtocolError):
                events = connection.receive_data(data)
                self.requests += sum(isinstance(e, h2.events.RequestReceived) for e in events)


class CloseNotifyOrigin(ScriptedOrigin):
    """An HTTPS origin (HTTP/1.1) that ends a connection idle for `idle` seconds as asyncio
    servers do (hypercorn, uvicorn): TLS close_notify, then a wait of up to 30 s for the peer
    to close before the TCP connection goes. It answers every request with its method and
    records what it received (`requests`: (connection number, method, path))."""

    def __init__(self, host: str, tls: IssuedCert, *, idle: float = 0.3) -> None:
        super().__init__(host, tls)
        self.idle = idle
        self.connections = 0
        self.requests: list[tuple[int, str, str]] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        connection = h11.Connection(h11.SERVER)
        while True:
            try:
                event = await asyncio.wait_for(h11_event(connection, reader), self.idle)
            except TimeoutError:
                writer.close()  # close_notify; asyncio then waits for the peer's close
                with contextlib.suppress(Exception):
                    await writer.wait_closed()
                return
            if not isinstance(event, h11.Request):
                return
            while not isinstance(await h11_event(connection, reader), h11.EndOfMessage):
                pass
            self.requests.append((number, event.method.decode(), event.target.decode()))
            body = event.method
            writer.write(
                connection.send(
                    h11.Response(status_code=200, headers=[("content-length", str(len(body)))])
                )
                + connection.send(h11.Data(data=body))
                + connection.send(h11.EndOfMessage())
            )
            connection.start_next_cycle()
