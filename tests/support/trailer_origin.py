"""An origin that ends its responses with trailer fields, over HTTP/1.1 (chunked) and HTTP/2.

nginx cannot be told to send trailers, and hypercorn sends them only over HTTP/2 and only to
requests with `te: trailers`; this origin sends them always. It runs on its own event-loop thread
(like tests/support/scripted_origins.py), plain HTTP/1.1, or HTTPS offering h2 and/or HTTP/1.1 by
ALPN.

Paths:
- `/trailers?size=N[&length=1][&trailers=0]`: N bytes of `body_bytes(N)` ending with
  TRAILERS plus `X-Checksum` (its sha-256, hex). `length=1` (HTTP/2 only) adds a Content-Length
  and announces the trailers in a `Trailer` field; `trailers=0` sends none.
- `/page.html`, `/script.js`, `/next`: the "2010 test" — the page loads a script whose response
  sets a cookie in a trailer, then fetches `/next`; the Cookie header each `/next` request
  carried is recorded in `cookies_on_next`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import urllib.parse
from collections.abc import Iterator

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h11

from labkit.pki import IssuedCert
from tests.support.scripted_origins import ScriptedOrigin, h2_events, h2_server, h11_event

Fields = list[tuple[bytes, bytes]]

# Every /trailers response ends with these (and an X-Checksum); Content-Type is one reshape must
# never pass on from a trailer section.
TRAILERS: Fields = [
    (b"Server-Timing", b"origin;dur=7"),
    (b"Content-Type", b"text/x-from-trailer"),
]
COOKIE = b"trailer_cookie=yes"
_BLOCK = bytes(range(256)) * 256  # 64 KiB
PAGE = b"""<!doctype html><title>trailers</title>
<script src="/script.js"></script>
<script>
fetch('/next').then(r => r.text()).then(() => { window.done = performance.now(); },
                                        e => { window.done = String(e); });
</script>
"""


def body_chunks(size: int) -> Iterator[bytes]:
    """The body of /trailers?size=`size`, in pieces of at most 64 KiB."""
    while size > 0:
        piece = _BLOCK[: min(size, len(_BLOCK))]
        size -= len(piece)
        yield piece


def body_bytes(size: int) -> bytes:
    return b"".join(body_chunks(size))


def body_sha256(size: int) -> str:
    digest = hashlib.sha256()
    for piece in body_chunks(size):
        digest.update(piece)
    return digest.hexdigest()


class TrailerOrigin(ScriptedOrigin):
    """The origin on `host` (free port); `tls` makes it HTTPS offering `alpn`."""

    QUIET_ERRORS = (*ScriptedOrigin.QUIET_ERRORS, h11.ProtocolError)

    def __init__(
        self, host: str, tls: IssuedCert | None = None, alpn: tuple[str, ...] = ("http/1.1",)
    ) -> None:
        super().__init__(host, tls, alpn)
        self.cookies_on_next: list[str] = []
        self.protocols_seen: list[str] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            ssl_object = writer.get_extra_info("ssl_object")
            protocol = (ssl_object.selected_alpn_protocol() if ssl_object else None) or "http/1.1"
            self.protocols_seen.append(protocol)
            if protocol == "h2":
                await self._serve_h2(reader, writer)
            else:
                await self._serve_h1(reader, writer)
        finally:
            writer.close()

    def _answer(
        self, target: bytes, headers: Fields
    ) -> tuple[int, Fields, Iterator[bytes], Fields]:
        """(status, headers, body pieces, trailers) for a request."""
        url = urllib.parse.urlsplit(target.decode("latin-1"))
        query = dict(urllib.parse.parse_qsl(url.query))
        if url.path == "/trailers":
            size = int(query.get("size", "1000"))
            trailers = []
            if query.get("trailers", "1") != "0":
                trailers = [*TRAILERS, (b"X-Checksum", body_sha256(size).encode())]
            head = [(b"content-type", b"application/octet-stream")]
            if query.get("length") == "1":
                head += [(b"content-length", str(size).encode())]
                head += [(b"trailer", b"Server-Timing, X-Checksum")]
            return 200, head, body_chunks(size), trailers
        if url.path == "/page.html":
            return 200, [(b"content-type", b"text/html")], iter([PAGE]), []
        if url.path == "/script.js":
            script = b"window.scriptRan = true;\n"
            cookie = COOKIE + b"; Path=/"
            return (
                200,
                [(b"content-type", b"text/javascript")],
                iter([script]),
                [(b"Set-Cookie", cookie)],
            )
        if url.path == "/next":
            self.cookies_on_next.append(
                "; ".join(v.decode() for n, v in headers if n.lower() == b"cookie")
            )
            return 200, [(b"content-type", b"text/plain")], iter([b"next"]), []
        return 404, [(b"content-type", b"text/plain")], iter([b"not found"]), []

    async def _serve_h1(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = h11.Connection(h11.SERVER)
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(65536)
                connection.receive_data(data)
                if not data and connection.their_state is not h11.DONE:
                    return
                continue
            if not isinstance(event, (h11.Request, h11.Data, h11.EndOfMessage)):
                return  # closed (or paused, which a served cycle never leaves us in)
            if not isinstance(event, h11.Request):
                continue  # the request body and its end: nothing to do with them
            status, head, body, trailers = self._answer(event.target, list(event.headers))
            writer.write(connection.send(h11.Response(status_code=status, headers=head)) or b"")
            for piece in body:
                writer.write(connection.send(h11.Data(data=piece)) or b"")
                await writer.drain()
            writer.write(connection.send(h11.EndOfMessage(headers=trailers)) or b"")
            await writer.drain()
            while connection.their_state is not h11.DONE:
                if await h11_event(connection, reader) is None:
                    return
            if connection.our_state is h11.MUST_CLOSE:
                return
            connection.start_next_cycle()

    async def _serve_h2(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = h2_server(writer)
        window_open = asyncio.Event()
        streams: set[asyncio.Task[None]] = set()

        async def respond(stream_id: int, headers: Fields) -> None:
            with contextlib.suppress(h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
                await answer(stream_id, headers)

        async def answer(stream_id: int, headers: Fields) -> None:
            target = next(v for n, v in headers if n == b":path")
            status, head, body, trailers = self._answer(target, headers)
            connection.send_headers(stream_id, [(b":status", str(status).encode()), *head])
            for piece in body:
                view = memoryview(piece)
                while view:
                    window = min(
                        connection.local_flow_control_window(stream_id),
                        connection.max_outbound_frame_size,
                    )
                    if window <= 0:
                        writer.write(connection.data_to_send())
                        window_open.clear()
                        await window_open.wait()
                        continue
                    connection.send_data(stream_id, bytes(view[:window]))
                    view = view[window:]
                writer.write(connection.data_to_send())
                await writer.drain()
            if trailers:
                connection.send_headers(
                    stream_id, [(n.lower(), v) for n, v in trailers], end_stream=True
                )
            else:
                connection.end_stream(stream_id)
            writer.write(connection.data_to_send())
            await writer.drain()

        try:
            async for event in h2_events(connection, reader, writer):
                if isinstance(event, h2.events.RequestReceived):
                    task = asyncio.create_task(respond(event.stream_id, list(event.headers)))
                    streams.add(task)
                    task.add_done_callback(streams.discard)
                elif isinstance(event, h2.events.DataReceived):
                    connection.acknowledge_received_data(
                        event.flow_controlled_length, event.stream_id
                    )
                elif isinstance(
                    event,
                    (
                        h2.events.WindowUpdated,
                        h2.events.RemoteSettingsChanged,
                        h2.events.StreamReset,
                    ),
                ):
                    window_open.set()  # a sender may go on (or find its stream gone)
        finally:
            for task in streams:
                task.cancel()
