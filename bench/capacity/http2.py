"""One HTTP/2 connection of the bench's browser model (bench/capacity/client.py), speaking as
Chromium does.

The protocol is h2's (python-hyper/h2, sans-IO); this module only moves its bytes over an asyncio
stream and hands each stream's response to the request that is waiting for it. What it copies
from Chromium (net/spdy, as of Chromium 120-130): no server push, a 64 KB header table, a 6 MB
stream window and a 15 MB connection window (so flow control never holds back a page's small
responses), and at most as many streams in flight as the server's SETTINGS_MAX_CONCURRENT_STREAMS
allow; a request beyond them waits for a stream to end. What it does not: priorities (every
stream has the default weight), and it sends no PING, so it never notices a silent peer sooner
than the bench's own timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

from bench.capacity.response import FetchError, Response, Unanswered

_READ_SIZE = 64 * 1024
_STREAM_WINDOW = 6 * 1024 * 1024
_CONNECTION_WINDOW = 15 * 1024 * 1024
_HEADER_TABLE = 64 * 1024
_MAX_HEADER_LIST = 256 * 1024


@dataclass
class _Stream:
    head: asyncio.Future[tuple[int, float]]  # (status, when the head arrived)
    done: asyncio.Future[None]
    keep_body: bool
    body: list[bytes] = field(default_factory=list)
    size: int = 0


class Http2Connection:
    """An HTTP/2 connection over a stream whose TLS already negotiated h2 by ALPN."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self._h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self._h2.local_settings = h2.settings.Settings(
            client=True,
            initial_values={
                h2.settings.SettingCodes.HEADER_TABLE_SIZE: _HEADER_TABLE,
                h2.settings.SettingCodes.ENABLE_PUSH: 0,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: _STREAM_WINDOW,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: _MAX_HEADER_LIST,
            },
        )
        # Settings given as initial values are never "acknowledged", so h2 would not let the
        # decoder use the larger table it announced; as it would on the server's ACK.
        self._h2.decoder.max_allowed_table_size = _HEADER_TABLE
        self._h2.initiate_connection()
        self._h2.increment_flow_control_window(_CONNECTION_WINDOW - 65_535)
        self._streams: dict[int, _Stream] = {}
        self._closed: str | None = None  # why the connection can carry no more streams
        self._last_processed: int | None = None  # from a GOAWAY
        self._flush()
        self._reading = asyncio.ensure_future(self._read())

    @property
    def closed_by_peer(self) -> bool:
        return self._closed is not None

    @property
    def has_free_stream(self) -> bool:
        """A new stream may start now (the server's concurrency limit allows it)."""
        limit = self._h2.remote_settings.max_concurrent_streams
        return not self._closed and self._h2.open_outbound_streams < limit

    def close(self) -> None:
        self._fail_all("closed by the browser")
        self._reading.cancel()
        with contextlib.suppress(Exception):
            self.writer.close()

    async def get(self, target: str, authority: str, *, keep_body: bool = False) -> Response:
        """GET `target` on a new stream; the whole response. Raises `Unanswered` when the
        server closed the connection without processing the stream (safe to send again),
        FetchError for any other failure."""
        if self._closed:
            raise Unanswered(self._closed)
        loop = asyncio.get_running_loop()
        stream_id = self._h2.get_next_available_stream_id()
        stream = _Stream(loop.create_future(), loop.create_future(), keep_body)
        self._streams[stream_id] = stream
        self._h2.send_headers(
            stream_id,
            [
                (b":method", b"GET"),
                (b":authority", authority.encode()),
                (b":scheme", b"https"),
                (b":path", target.encode()),
                (b"user-agent", b"reshape-bench"),
                (b"accept", b"*/*"),
            ],
            end_stream=True,
        )
        self._flush()
        try:
            status, head_at = await stream.head
            await stream.done
        finally:
            self._streams.pop(stream_id, None)
        return Response(status, stream.size, head_at, True, b"".join(stream.body))

    def _flush(self) -> None:
        data = self._h2.data_to_send()
        if data and not self.writer.is_closing():
            self.writer.write(data)

    async def _read(self) -> None:
        why = "connection closed by the server"
        try:
            while chunk := await self.reader.read(_READ_SIZE):
                try:
                    events = self._h2.receive_data(chunk)
                except h2.exceptions.ProtocolError as error:
                    why = f"HTTP/2 protocol error: {error}"
                    break
                for event in events:
                    self._on(event)
                self._flush()
                if self._closed:
                    why = self._closed
                    break
        except OSError as error:
            why = f"connection failed: {error}"
        self._fail_all(why)

    def _on(self, event: h2.events.Event) -> None:
        loop = asyncio.get_running_loop()
        if isinstance(event, h2.events.ResponseReceived):
            stream = self._streams.get(event.stream_id)
            status = dict(event.headers or ()).get(b":status", b"0")
            if stream is not None and not stream.head.done():
                stream.head.set_result((int(status), loop.time()))
        elif isinstance(event, h2.events.DataReceived):
            self._h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            stream = self._streams.get(event.stream_id)
            if stream is not None and event.data:
                stream.size += len(event.data)
                if stream.keep_body:
                    stream.body.append(event.data)
        elif isinstance(event, h2.events.StreamEnded):
            stream = self._streams.get(event.stream_id)
            if stream is not None and not stream.done.done():
                stream.done.set_result(None)
        elif isinstance(event, h2.events.StreamReset):
            self._fail(event.stream_id, f"stream reset by the server ({event.error_code!r})")
        elif isinstance(event, h2.events.ConnectionTerminated):
            self._closed = f"GOAWAY from the server ({event.error_code!r})"
            self._last_processed = event.last_stream_id

    def _fail(self, stream_id: int, why: str) -> None:
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        unprocessed = self._last_processed is not None and stream_id > self._last_processed
        error = Unanswered(why) if unprocessed or not stream.head.done() else FetchError(why)
        for future in (stream.head, stream.done):
            if not future.done():
                future.set_exception(error)
                # Retrieved here so that a stream nobody awaits any more logs no warning.
                future.exception()

    def _fail_all(self, why: str) -> None:
        self._closed = self._closed or why
        for stream_id in list(self._streams):
            self._fail(stream_id, why)
