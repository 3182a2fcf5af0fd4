"""Small origins with scripted misbehaviour, for the cases real servers cannot be told to do.

Each runs an asyncio TCP server on its own event-loop thread, so synchronous tests can use it
next to `reshape run` as a subprocess.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Self


class ScriptedOrigin:
    """An origin on `host` (free port) whose `handle` coroutine plays each connection."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    def url(self, path: str = "/") -> str:
        return f"http://{self.host}:{self.port}{path}"

    def __enter__(self) -> Self:
        self._thread.start()
        server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self.handle, self.host, 0), self._loop
        ).result(5)
        self.port = server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


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
