"""Origins that fail on purpose, and count what reached them.

`FaultyOrigin` speaks HTTP/1.1 in clear or HTTP/2 over TLS (ALPN), keeps every request it was sent
in `seen` (method and path, in order of arrival), and answers by path:

- `/echo/<id>[?delay=S]`: 200, body `<id>` and `X-Echo: <id>`, after S seconds — a response a
  client can check is its own;
- `/cut/length`, `/cut/chunked`: a head announcing 100,000 bytes (Content-Length, or chunked),
  1,000 bytes of body, then a TCP reset — a response cut mid-body;
- `/silent`: reads the request and never answers;
- `/drop`, `/drop/get`: read the request, then reset the connection without a byte of answer;
- `/reset` (HTTP/2): RST_STREAM INTERNAL_ERROR before any response head;
- `/bad-head/<kind>` (HTTP/2): a response head RFC 9113 §8.2 forbids (`BAD_HEADS`: a line
  break in a value, an upper-case name, a value with surrounding space, a connection-specific
  field), sent with the origin's own HTTP/2 checks turned off;
- `/bad-window/<kind>` (HTTP/2): no answer, but a WINDOW_UPDATE on the request's stream that
  RFC 9113 §6.9 makes the stream's error (`BAD_WINDOW_UPDATES`: an increment of 0, or one that
  takes the window above 2^31-1), written as raw bytes past h2's checks.

`unreachable_address()` is a loopback port nothing listens on (connection refused);
`Backlog` is a listener whose accept queue is full, so a connect to it hangs (connect timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import urllib.parse
from typing import Self

import h2.config
import h2.connection
import h2.errors
import h2.events
import h11

from labkit.pki import IssuedCert
from labkit.processes import free_port
from tests.support.scripted_origins import ScriptedOrigin, h2_events, h2_server, h11_event

CUT_DECLARED = 100_000
CUT_SENT = 1_000


class FaultyOrigin(ScriptedOrigin):
    """HTTP/1.1 in clear, or HTTP/2 only over TLS (ALPN h2)."""

    QUIET_ERRORS = (*ScriptedOrigin.QUIET_ERRORS, h11.ProtocolError)

    def __init__(self, host: str, tls: IssuedCert | None = None) -> None:
        super().__init__(host, tls, alpn=("h2",))
        self.seen: list[tuple[str, str]] = []
        # HTTP/2: request body bytes received so far, per path (as they arrive, not at the end).
        self.received: dict[str, int] = {}
        # HTTP/2: the targets `/refuse-once/...` has refused (REFUSED_STREAM) once already.
        self.refused: set[str] = set()
        self.connections = 0  # accepted so far

    def count(self, path: str) -> int:
        return sum(1 for _, seen in self.seen if seen == path)

    def count_prefix(self, prefix: str) -> int:
        return sum(1 for _, seen in self.seen if seen.startswith(prefix))

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        if self.tls is not None:
            await self._serve_h2(reader, writer)
        else:
            await self._serve_h1(reader, writer)
            writer.close()

    async def _serve_h1(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = h11.Connection(h11.SERVER)
        while True:
            request = None
            while True:  # one whole request, body included
                event = await h11_event(connection, reader)
                if event is None:
                    return
                if isinstance(event, h11.Request):
                    request = event
                    self.seen.append((event.method.decode(), event.target.decode()))
                elif isinstance(event, h11.EndOfMessage):
                    break
                elif not isinstance(event, h11.Data):
                    return
            assert request is not None
            path, query = _split(request.target)
            if path in ("/cut/length", "/cut/chunked"):
                framing = (
                    b"Content-Length: %d" % CUT_DECLARED
                    if path == "/cut/length"
                    else b"Transfer-Encoding: chunked"
                )
                body = b"x" * CUT_SENT
                if path == "/cut/chunked":
                    body = b"%x\r\n%s\r\n" % (len(body), body)
                writer.write(b"HTTP/1.1 200 OK\r\n" + framing + b"\r\n\r\n" + body)
                await writer.drain()
                await asyncio.sleep(0.2)
                writer.transport.abort()
                return
            if path == "/silent":
                await asyncio.sleep(3600)
            if path in ("/drop", "/drop/get"):
                writer.transport.abort()
                return
            ident = await _echo_id(path, query)
            writer.write(
                connection.send(
                    h11.Response(
                        status_code=200,
                        headers=[("Content-Length", str(len(ident))), ("X-Echo", ident)],
                    )
                )
                or b""
            )
            writer.write(connection.send(h11.Data(data=ident)) or b"")
            writer.write(connection.send(h11.EndOfMessage()) or b"")
            await writer.drain()
            if connection.our_state is h11.MUST_CLOSE:
                return
            connection.start_next_cycle()

    async def _serve_h2(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = h2_server(writer)
        pending: set[asyncio.Task[None]] = set()
        path_of: dict[int, str] = {}

        async def answer(stream_id: int, path: str, query: dict[str, str]) -> None:
            ident = await _echo_id(path, query)
            with contextlib.suppress(h2.exceptions.StreamClosedError):
                connection.send_headers(
                    stream_id,
                    [
                        (b":status", b"200"),
                        (b"content-length", b"%d" % len(ident)),
                        (b"x-echo", ident),
                    ],
                )
                connection.send_data(stream_id, ident, end_stream=True)
            writer.write(connection.data_to_send())

        async for event in h2_events(connection, reader, writer):
            if isinstance(event, h2.events.RequestReceived):
                headers = dict(event.headers)
                target = headers[b":path"]
                self.seen.append((headers[b":method"].decode(), target.decode()))
                path, query = _split(target)
                path_of[event.stream_id] = path
                if path == "/reset":
                    connection.reset_stream(event.stream_id, h2.errors.ErrorCodes.INTERNAL_ERROR)
                elif path.startswith("/refuse-once/") and target.decode() not in self.refused:
                    # Not processed (RFC 9113 §8.7): the client may send it again.
                    self.refused.add(target.decode())
                    connection.reset_stream(event.stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
                elif path.startswith("/bad-head/"):
                    connection.config.validate_outbound_headers = False
                    connection.config.normalize_outbound_headers = False
                    bad = BAD_HEADS[path.rsplit("/", 1)[-1]]
                    connection.send_headers(event.stream_id, [(b":status", b"200"), bad])
                    connection.send_data(event.stream_id, b"bad", end_stream=True)
                    writer.write(connection.data_to_send())
                elif path.startswith("/bad-window/"):
                    increment = BAD_WINDOW_UPDATES[path.rsplit("/", 1)[-1]]
                    window_update = struct.pack(">I B I", 4 << 8 | 0x8, 0, event.stream_id)
                    writer.write(window_update + struct.pack(">I", increment))
                else:
                    task = asyncio.create_task(answer(event.stream_id, path, query))
                    pending.add(task)
                    task.add_done_callback(pending.discard)
            elif isinstance(event, h2.events.DataReceived):
                path = path_of.get(event.stream_id, "")
                self.received[path] = self.received.get(path, 0) + len(event.data)
                connection.acknowledge_received_data(event.flow_controlled_length, event.stream_id)


# What `/bad-head/<kind>` puts in its response head beside `:status`.
BAD_HEADS = {
    "crlf": (b"x-bad", b"a\r\nx-injected: 1"),
    "upper": (b"X-Upper", b"1"),
    "space": (b"x-space", b" padded"),
    "connection": (b"connection", b"close"),
}


# The increment `/bad-window/<kind>` sends on its stream.
BAD_WINDOW_UPDATES = {"zero": 0, "overflow": 2**31 - 1}


def _split(target: bytes) -> tuple[str, dict[str, str]]:
    url = urllib.parse.urlsplit(target.decode("latin-1"))
    return url.path, dict(urllib.parse.parse_qsl(url.query))


async def _echo_id(path: str, query: dict[str, str]) -> bytes:
    delay = float(query.get("delay", "0"))
    if delay:
        await asyncio.sleep(delay)
    return path.rsplit("/", 1)[-1].encode()


def unreachable_address(host: str) -> tuple[str, int]:
    """A port on `host` that refuses connections (nothing listens on it)."""
    return host, free_port(host)


class Backlog:
    """A listener with a full accept queue: connects to it get no SYN-ACK and hang."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.port = 0
        self._sockets: list[socket.socket] = []

    def __enter__(self) -> Self:
        listener = socket.socket()
        listener.bind((self.host, 0))
        listener.listen(0)
        self.port = listener.getsockname()[1]
        self._sockets.append(listener)
        # Fill the queue (Linux accepts backlog + 1) with connections nobody accepts.
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect((self.host, self.port))
            self._sockets.append(filler)
        return self

    def __exit__(self, *exc: object) -> None:
        for s in self._sockets:
            s.close()
