"""One TCP connection to an origin, with TLS (if any) done in memory by `TlsClient`.

Reads are pulled by the connection's owner (`await wire.read()`), so a slow client slows the read
from the origin: past a high-water mark the socket stops being read (transport.pause_reading),
which is TCP backpressure all the way to the origin. Writes wait for the kernel buffer the same
way (`await wire.drain()`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
import typing
from collections.abc import Callable

from reshape.base.unread_bytes import unread_bytes
from reshape.upstream.observer import EngineObserver
from reshape.upstream.tls import TlsClient, TlsError
from reshape.upstream.types import RecordSizer

HIGH_WATER = 512 * 1024
LOW_WATER = 128 * 1024


class WireError(Exception):
    """The connection could not be made or broke."""


class PeerRefused(WireError):
    """Connected, but to an address the caller's `check_peer` refuses (the name resolved to a
    forbidden address: DNS rebinding); closed before a byte was sent."""


# Given the connected peer (ip, port), why the connection must not be used, or None.
PeerFilter = Callable[[tuple[str, int]], str | None]


def _mark_retrieved(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


class Wire(asyncio.Protocol):
    def __init__(
        self,
        tls: TlsClient | None,
        check_peer: PeerFilter | None = None,
        sizer: RecordSizer | None = None,
        observer: EngineObserver | None = None,
    ) -> None:
        self.tls = tls
        # Sizes this connection's TLS records (a policy's `tls_records` with `side: both`).
        self.sizer = sizer if tls is not None else None
        self.observer = observer or EngineObserver()
        self.check_peer = check_peer
        self.refused: str | None = None
        self.transport: asyncio.Transport | None = None
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._eof = False
        self._error: Exception | None = None
        self._readable = asyncio.Event()
        self._handshake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # Its failure is the connection's too (reads see the end or the error): an opener
        # cancelled before it awaited the handshake leaves nobody to, and asyncio would log the
        # exception unread, with a traceback.
        self._handshake.add_done_callback(_mark_retrieved)
        self._writable = asyncio.Event()
        self._writable.set()
        self._reading_paused = False
        self.on_close: Callable[[], None] | None = None
        # Set by the connection's owner while it expects nothing from the peer: called (once)
        # when data arrives anyway.
        self.on_idle_data: Callable[[], None] | None = None

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        *,
        tls: TlsClient | None,
        timeout: float,
        check_peer: PeerFilter | None = None,
        sizer: RecordSizer | None = None,
        observer: EngineObserver | None = None,
    ) -> Wire:
        """Connect (and shake hands). `check_peer` vets the address actually connected to
        before anything is sent, the TLS ClientHello included: PeerRefused if it objects."""
        loop = asyncio.get_running_loop()
        try:
            _, wire = await asyncio.wait_for(
                loop.create_connection(lambda: cls(tls, check_peer, sizer, observer), host, port),
                timeout,
            )
        except TimeoutError:
            raise WireError(f"connect to {host}:{port} timed out after {timeout:g} s") from None
        except OSError as e:
            raise WireError(f"connect to {host}:{port} failed: {e.strerror or e}") from None
        if wire.refused is not None:
            raise PeerRefused(wire.refused)
        if tls is not None:
            try:
                await asyncio.wait_for(asyncio.shield(wire._handshake), timeout)
            except asyncio.CancelledError:
                wire.close()
                raise
            except TimeoutError:
                wire.close()
                raise WireError(f"TLS handshake with {host}:{port} timed out") from None
            except (TlsError, WireError) as e:
                wire.close()
                raise WireError(f"{host}:{port}: {e}") from None
        return wire

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = typing.cast(asyncio.Transport, transport)
        if self.check_peer is not None:
            peer = self.transport.get_extra_info("peername")
            self.refused = self.check_peer((peer[0], peer[1])) if peer else "no peer address"
            if self.refused is not None:
                self._handshake.cancel()  # never to be awaited
                self.transport.abort()
                return
        if self.tls is not None:
            self.transport.write(self.tls.start())
        else:
            self._handshake.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self.tls is not None:
            try:
                plaintext, out = self.tls.receive(data)
            except TlsError as e:
                self._fail(e)
                return
            if out and self.transport is not None:
                self.transport.write(out)
            if self.tls.handshake_done and not self._handshake.done():
                self._handshake.set_result(None)
            data = plaintext
        if data:
            self._chunks.append(data)
            self._buffered += len(data)
            self._readable.set()
            idle_data, self.on_idle_data = self.on_idle_data, None
            if idle_data is not None:
                idle_data()
            if self._buffered > HIGH_WATER and not self._reading_paused and self.transport:
                self.transport.pause_reading()
                self._reading_paused = True
        if self.tls is not None and self.tls.closed and not self._eof:
            # close_notify: the origin's end of the stream (RFC 8446 §6.1), as a FIN would be.
            # asyncio servers (hypercorn, uvicorn, aiohttp) end an idle connection with it and
            # wait up to 30 s for the TCP close; taken for nothing, the connection went to the
            # next request, which the origin dropped: a GET answered 30 s late, a POST a 502.
            self._end_of_stream()
            if self.transport is not None:
                self.transport.close()

    def eof_received(self) -> bool | None:
        if self.tls is not None:
            try:
                plaintext, _ = self.tls.receive(b"")
            except TlsError as e:
                self._fail(e)
                return None
            if plaintext:
                self._chunks.append(plaintext)
                self._buffered += len(plaintext)
        self._end_of_stream()
        return None

    def _end_of_stream(self) -> None:
        self._eof = True
        self._readable.set()
        if not self._handshake.done():
            self._handshake.set_exception(WireError("connection closed during the TLS handshake"))
        self._notify_close()

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None and self._error is None:
            try:
                self._read_what_arrived()
            finally:
                self._error = self._error or WireError(f"connection lost: {exc}")
                self._close_down()
            return
        self._close_down()

    def _close_down(self) -> None:
        self._eof = True
        self._readable.set()
        self._writable.set()
        if not self._handshake.done():
            self._handshake.set_exception(self._error or WireError("connection closed"))
        self._notify_close()

    def _read_what_arrived(self) -> None:
        """Deliver what the origin sent before the connection broke and nobody read yet
        (reshape/base/unread_bytes.py): answers to requests that would otherwise count as
        unanswered and be sent again."""
        # Bounded like a paused read: what a reader will take from a connection that broke.
        for data in unread_bytes(self.transport, HIGH_WATER):
            self.data_received(data)
            if self._error is not None:
                return

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # what the owner uses

    def _fail(self, error: Exception) -> None:
        self._error = WireError(str(error))
        if not self._handshake.done():
            self._handshake.set_exception(self._error)
        self._readable.set()
        if self.transport is not None:
            self.transport.abort()

    def _notify_close(self) -> None:
        callback, self.on_close = self.on_close, None
        if callback is not None:
            callback()

    @property
    def alpn(self) -> str | None:
        return self.tls.alpn if self.tls is not None else None

    @property
    def has_data(self) -> bool:
        return bool(self._chunks)

    def peek(self, size: int) -> bytes:
        """Up to `size` of the bytes that have arrived, left for `read`."""
        head = b""
        for chunk in self._chunks:
            head += chunk[: size - len(head)]
            if len(head) >= size:
                break
        return head

    @property
    def has_data_or_eof(self) -> bool:
        """Whether the peer sent anything or closed: an idle connection so marked is not reused."""
        return bool(self._chunks) or self._eof or self._error is not None

    @property
    def arrival(self) -> asyncio.Event:
        """Set when bytes arrive and when the connection ends: a waiter for the next arrival
        clears it first, as `readable` does."""
        return self._readable

    @property
    def is_closed(self) -> bool:
        return self.transport is None or self.transport.is_closing() or self._eof

    def write(self, data: bytes) -> None:
        """Write `data` at once: one segment if it fits; in TLS records as the sizer says."""
        if self.transport is None or self.transport.is_closing():
            raise WireError("connection closed")
        if self.tls is not None:
            sizes = None
            if self.sizer is not None:
                sizes = self.sizer.next_sizes(len(data), time.monotonic())
                self.observer.tls_records(sizes, self.sizer.small_bytes)
            data = self.tls.send(data, sizes=sizes)
        self.transport.write(data)

    def write_buffer_size(self) -> int:
        """Bytes written that the socket has not taken yet (the peer is not reading them)."""
        return self.transport.get_write_buffer_size() if self.transport is not None else 0

    async def drain(self) -> None:
        await self._writable.wait()
        if self._error is not None:
            raise self._error

    async def read(self) -> bytes:
        """The next plaintext bytes; b"" once the peer has closed. Raises WireError if it broke."""
        await self.readable()
        chunk = self.read_nowait()
        assert chunk is not None
        return chunk

    async def readable(self) -> None:
        """Wait until `read_nowait` has something to say: bytes, the end, or an error."""
        while not self._chunks and self._error is None and not self._eof:
            self._readable.clear()
            await self._readable.wait()

    def read_nowait(self) -> bytes | None:
        """As `read`, but None at once when nothing has arrived yet."""
        if not self._chunks:
            if self._error is not None:
                raise self._error
            return b"" if self._eof else None
        chunk = self._chunks.popleft()
        self._buffered -= len(chunk)
        if self._reading_paused and self._buffered < LOW_WATER and self.transport is not None:
            self.transport.resume_reading()
            self._reading_paused = False
        return chunk

    def close(self) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        if self.tls is not None and self.tls.handshake_done:
            with contextlib.suppress(Exception):  # close_notify is a courtesy
                self.transport.write(self.tls.close())
        self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
