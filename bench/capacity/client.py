"""A small browser model for benches: K keep-alive connections per origin, FIFO waits, and
optionally HTTP/2 by ALPN.

A `Browser` fetches URLs like a browser of the HTTP/1.1 era: at most `per_host` connections to
each origin (opened as requests need them, kept alive, reused most-recently-used first); a request
that finds them all busy waits, first come first served, for one to be free. Through a forward
proxy the per-host limit applies to the origins it names, as in browsers (so 6 per host means
6 connections to the proxy per origin); plain http goes in absolute form, https through CONNECT
and TLS with the proxy's CA. With `http2` it negotiates as Chromium does: h2 when the server at
the end of the TLS connection (the origin, or an intercepting proxy) chooses it by ALPN, then one
connection per origin carries every request (bench/capacity/http2.py); HTTP/1.1 otherwise.

Each fetch records when the page wanted it, how long it waited for a busy connection, when it
was sent, when the response head arrived and when the body ended, so benches can split a
transaction into the browser's own queueing and the rest. Bodies are read and counted, and kept
only for the page itself (to find its subresources). Used by bench/capacity and bench/queueing.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import re
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from bench.capacity.http2 import Http2Connection
from bench.capacity.response import FetchError, Response, Unanswered

_MAX_HEAD = 64 * 1024
_READ_SIZE = 64 * 1024
_RESOURCE = re.compile(r'(?:src|href)="([^"]+)"')


@dataclass(frozen=True)
class OriginKey:
    scheme: str
    host: str
    port: int

    @classmethod
    def of(cls, url: str) -> OriginKey:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(parts.scheme, parts.hostname, port)

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


@dataclass(frozen=True)
class Fetch:
    """One request as the browser saw it; times are the event loop's clock (seconds)."""

    url: str
    ready: float  # the page wanted it
    sent: float  # it left on a connection (the last attempt's)
    head: float  # the response head had arrived
    done: float  # the body had ended
    status: int
    size: int
    new_connection: bool
    retried: bool
    queue_wait: float  # seconds spent waiting for one of the browser's busy connections
    protocol: str = "http/1.1"  # to the next hop (the proxy, when there is one): or "h2"

    @property
    def transaction(self) -> float:
        """Ready → response head: waiting for a connection, connecting, and the round trip."""
        return self.head - self.ready


@dataclass(frozen=True)
class PageLoad:
    url: str
    started: float
    finished: float
    fetches: list[Fetch]

    @property
    def seconds(self) -> float:
        return self.finished - self.started

    def problem(self, sizes: dict[str, int]) -> str | None:
        """Why the page loaded wrong (a status other than 200, or a size not in `sizes`, by
        path), or None."""
        for fetch in self.fetches:
            path = "/" + fetch.url.split("/", 3)[-1]
            if fetch.status != 200:
                return f"{path}: status {fetch.status}"
            if sizes.get(path) != fetch.size:
                return f"{path}: {fetch.size} bytes, expected {sizes.get(path)}"
        return None


def resources_of(html: str, base: str) -> list[str]:
    """The subresource URLs a page names (src= and href=, absolute or root-relative)."""
    origin = OriginKey.of(base)
    urls = []
    for reference in _RESOURCE.findall(html):
        if reference.startswith(("http://", "https://")):
            urls.append(reference)
        elif reference.startswith("/"):
            urls.append(f"{origin.scheme}://{origin.authority}{reference}")
    return urls


class Connection:
    """One HTTP/1.1 connection to an origin, direct or through a proxy."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(
        cls,
        origin: OriginKey,
        proxy: tuple[str, int] | None,
        tls: ssl.SSLContext | None,
    ) -> Connection:
        host, port = proxy or (origin.host, origin.port)
        try:
            reader, writer = await asyncio.open_connection(host, port, limit=_MAX_HEAD)
        except OSError as error:
            raise FetchError(f"connect {host}:{port}: {error}") from error
        connection = cls(reader, writer)
        try:
            if origin.scheme == "https":
                if tls is None:
                    raise FetchError(f"no TLS context for {origin.authority}")
                if proxy is not None:
                    await connection._tunnel(origin)
                await writer.start_tls(tls, server_hostname=origin.host)
        except BaseException:
            connection.close()
            raise
        return connection

    async def _tunnel(self, origin: OriginKey) -> None:
        target = f"{origin.host}:{origin.port}"
        self.writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        head = await self._read_head()
        status = _status(head)
        if status != 200:
            raise FetchError(f"CONNECT {target}: proxy answered {status}")

    @property
    def closed_by_peer(self) -> bool:
        return self.reader.at_eof() or self.writer.is_closing()

    @property
    def alpn(self) -> str | None:
        """The protocol TLS negotiated by ALPN (None: plain http, or no ALPN)."""
        ssl_object = self.writer.get_extra_info("ssl_object")
        return None if ssl_object is None else ssl_object.selected_alpn_protocol()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()

    async def get(self, target: str, authority: str, *, keep_body: bool = False) -> Response:
        """Sends GET `target` and reads the whole response (the body kept only if asked).

        Raises `Unanswered` when not one byte of a response came back (a server that closed an
        idle connection under us: safe to send again), FetchError for any other failure."""
        loop = asyncio.get_running_loop()
        self.writer.write(
            f"GET {target} HTTP/1.1\r\nHost: {authority}\r\nUser-Agent: reshape-bench\r\n"
            "Accept: */*\r\n\r\n".encode()
        )
        try:
            head = await self._read_head()
        except (FetchError, OSError) as error:
            raise Unanswered(str(error) or type(error).__name__) from error
        head_at = loop.time()
        status = _status(head)
        headers = _headers(head)
        reusable = "close" not in headers.get("connection", "").lower()
        body: list[bytes] | None = [] if keep_body else None
        try:
            if "chunked" in headers.get("transfer-encoding", "").lower():
                size = await self._read_chunked(body)
            elif "content-length" in headers:
                size = int(headers["content-length"])
                await self._read(size, body)
            else:
                size = await self._read_to_eof(body)
                reusable = False
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
            raise FetchError(f"GET {target}: body cut off: {e}") from e
        return Response(status, size, head_at, reusable, b"".join(body or ()))

    async def _read_head(self) -> bytes:
        try:
            return await self.reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as error:
            raise FetchError("connection closed before a response") from error
        except asyncio.LimitOverrunError as error:
            raise FetchError("response head too large") from error

    async def _read(self, size: int, keep: list[bytes] | None) -> None:
        while size > 0:
            chunk = await self.reader.read(min(size, _READ_SIZE))
            if not chunk:
                raise asyncio.IncompleteReadError(b"", size)
            if keep is not None:
                keep.append(chunk)
            size -= len(chunk)

    async def _read_chunked(self, keep: list[bytes] | None) -> int:
        total = 0
        while True:
            line = await self.reader.readuntil(b"\r\n")
            size = int(line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                while (await self.reader.readuntil(b"\r\n")) != b"\r\n":
                    pass  # trailers
                return total
            await self._read(size, keep)
            await self.reader.readexactly(2)
            total += size

    async def _read_to_eof(self, keep: list[bytes] | None) -> int:
        total = 0
        while chunk := await self.reader.read(_READ_SIZE):
            if keep is not None:
                keep.append(chunk)
            total += len(chunk)
        return total


def _status(head: bytes) -> int:
    try:
        return int(head.split(b" ", 2)[1])
    except (IndexError, ValueError) as error:
        raise FetchError(f"malformed status line {head[:60]!r}") from error


def _headers(head: bytes) -> dict[str, str]:
    headers: dict[str, str] = {}
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, colon, value = line.partition(":")
        if colon:
            headers[name.strip().lower()] = value.strip()
    return headers


@dataclass
class _HostConnections:
    """One origin's connections in one browser."""

    idle: list[Connection] = field(default_factory=list)
    count: int = 0  # open or opening (an HTTP/2 connection counts once)
    # Each resolves True when handed a freed connection or stream, False when only told to look
    # again (the first connection's ALPN is known).
    waiters: collections.deque[asyncio.Future[bool]] = field(default_factory=collections.deque)
    # The origin's HTTP/2 connection, once ALPN chose h2: every request goes there.
    multiplexed: Http2Connection | None = None
    # The first connection is being opened and may yet turn out to speak h2: others wait for it.
    negotiating: bool = False


type Carrier = Connection | Http2Connection


def tls_context(ca: Path, *, http2: bool) -> ssl.SSLContext:
    """A client TLS context trusting `ca`, offering h2 and http/1.1 by ALPN (as Chromium does)
    with `http2`, http/1.1 alone without: what a `Browser(..., http2=...)` needs."""
    context = ssl.create_default_context(cafile=str(ca))
    context.set_alpn_protocols(["h2", "http/1.1"] if http2 else ["http/1.1"])
    return context


class Browser:
    """A browser with `per_host` connections per origin, optionally through a forward proxy.

    With `http2` (and a `tls` context that offers h2, see `tls_context`) it negotiates by ALPN
    as Chromium does: while the first https connection to an origin is being opened, the origin's
    other requests wait for it; if the server (the origin, or an intercepting proxy at the end of
    the CONNECT tunnel) chose h2, every request to that origin goes on that one connection, else
    the browser goes on with HTTP/1.1 and `per_host` connections.
    """

    def __init__(
        self,
        per_host: int,
        *,
        proxy: tuple[str, int] | None = None,
        tls: ssl.SSLContext | None = None,
        http2: bool = False,
    ) -> None:
        if per_host < 1:
            raise ValueError("per_host must be at least 1")
        self.per_host = per_host
        self.proxy = proxy
        self.tls = tls
        self.http2 = http2
        self._hosts: dict[OriginKey, _HostConnections] = {}
        self.connections_opened = 0

    async def fetch(self, url: str, ready: float | None = None) -> Fetch:
        fetch, _ = await self._fetch(url, ready, keep_body=False)
        return fetch

    async def load_page(self, url: str) -> PageLoad:
        """The page, then every subresource it names, all wanted at once."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        page, html = await self._fetch(url, started, keep_body=True)
        if page.status != 200:
            raise FetchError(f"GET {url}: status {page.status}")
        ready = loop.time()
        subresources = resources_of(html.decode("utf-8", "replace"), url)
        tasks = [asyncio.ensure_future(self.fetch(u, ready)) for u in subresources]
        try:
            rest = await asyncio.gather(*tasks)
        except BaseException:
            # One failed (or the load was abandoned): the others stop too, as a page's would.
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        return PageLoad(url, started, loop.time(), [page, *rest])

    async def close(self) -> None:
        """Closes every idle connection; busy ones close as their requests end or are cancelled
        (an HTTP/2 connection at once, failing its streams)."""
        for host in self._hosts.values():
            for connection in host.idle:
                connection.close()
            if host.multiplexed is not None:
                host.multiplexed.close()
            for waiter in host.waiters:
                if not waiter.done():
                    waiter.cancel()
        self._hosts.clear()

    async def _fetch(
        self, url: str, ready: float | None, *, keep_body: bool
    ) -> tuple[Fetch, bytes]:
        loop = asyncio.get_running_loop()
        ready = loop.time() if ready is None else ready
        origin = OriginKey.of(url)
        parts = urlsplit(url)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        target = url if self.proxy is not None and origin.scheme == "http" else path
        retried = False
        queue_wait = 0.0
        while True:
            connection, new, waited = await self._acquire(origin)
            queue_wait += waited
            sent = loop.time()
            try:
                response = await connection.get(target, origin.authority, keep_body=keep_body)
            except Unanswered as error:
                self._release(origin, connection, reusable=False)
                # A kept-alive connection the server closed meanwhile: send again once, as
                # browsers do. On a fresh connection it is a real failure.
                if new or retried:
                    raise FetchError(f"GET {url}: {error}") from error
                retried = True
                continue
            except BaseException:
                self._release(origin, connection, reusable=False)
                raise
            self._release(origin, connection, reusable=response.reusable)
            fetch = Fetch(
                url,
                ready,
                sent,
                response.head_at,
                loop.time(),
                response.status,
                response.size,
                new,
                retried,
                queue_wait,
                "h2" if isinstance(connection, Http2Connection) else "http/1.1",
            )
            return fetch, response.body

    async def _acquire(self, origin: OriginKey) -> tuple[Carrier, bool, float]:
        """A connection to `origin`: (connection, newly opened, seconds waited for a busy one, or
        for the first connection's ALPN)."""
        loop = asyncio.get_running_loop()
        host = self._hosts.setdefault(origin, _HostConnections())
        waited = 0.0
        woken = False
        while True:
            multiplexed = host.multiplexed
            if multiplexed is not None and multiplexed.closed_by_peer:
                self._forget(host, multiplexed)
            elif multiplexed is not None:
                if multiplexed.has_free_stream:
                    return multiplexed, False, waited
            else:
                while host.idle:
                    connection = host.idle.pop()
                    if not connection.closed_by_peer:
                        return connection, False, waited
                    connection.close()
                    host.count -= 1
                if host.count < self.per_host and not host.negotiating:
                    return (*await self._open(origin, host), waited)
            waiter: asyncio.Future[bool] = loop.create_future()
            # Handed a connection but beaten to it: back to the front, not the back.
            if woken:
                host.waiters.appendleft(waiter)
            else:
                host.waiters.append(waiter)
            since = loop.time()
            try:
                woken = await waiter
            except asyncio.CancelledError:
                with contextlib.suppress(ValueError):
                    host.waiters.remove(waiter)
                if waiter.done() and not waiter.cancelled() and waiter.result():
                    self._wake(host)  # it was handed a connection it will not take
                raise
            finally:
                waited += loop.time() - since

    async def _open(self, origin: OriginKey, host: _HostConnections) -> tuple[Carrier, bool]:
        """A new connection to `origin`; with `http2`, the first one's ALPN decides for the rest."""
        host.count += 1
        host.negotiating = self.http2 and origin.scheme == "https" and host.count == 1
        try:
            connection = await Connection.open(origin, self.proxy, self.tls)
        except BaseException:
            host.count -= 1
            self._settle(host)
            self._wake(host)
            raise
        self.connections_opened += 1
        carrier: Carrier = connection
        if self.http2 and connection.alpn == "h2":
            carrier = host.multiplexed = Http2Connection(connection.reader, connection.writer)
        self._settle(host)
        return carrier, True

    @staticmethod
    def _settle(host: _HostConnections) -> None:
        """The first connection's ALPN is known (or it failed): everyone waiting for it looks
        again, in the order they came (none of them was handed a connection)."""
        if host.negotiating:
            host.negotiating = False
            while host.waiters:
                waiter = host.waiters.popleft()
                if not waiter.done():
                    waiter.set_result(False)

    def _forget(self, host: _HostConnections, connection: Http2Connection) -> None:
        """An HTTP/2 connection that can carry no more requests: the next one negotiates again."""
        if host.multiplexed is connection:
            host.multiplexed = None
            host.count -= 1
        connection.close()

    def _release(self, origin: OriginKey, connection: Carrier, *, reusable: bool) -> None:
        host = self._hosts.get(origin)
        if host is None:  # closed meanwhile
            connection.close()
            return
        if isinstance(connection, Http2Connection):
            if not reusable or connection.closed_by_peer:
                self._forget(host, connection)
        elif reusable and not connection.closed_by_peer:
            host.idle.append(connection)
        else:
            connection.close()
            host.count -= 1
        self._wake(host)

    @staticmethod
    def _wake(host: _HostConnections) -> None:
        """Hands what was freed to the first waiter."""
        while host.waiters:
            waiter = host.waiters.popleft()
            if not waiter.done():
                waiter.set_result(True)
                return
