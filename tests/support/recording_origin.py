"""An HTTP/1.1 origin that keeps every request head exactly as it arrived, to check what a proxy
forwards (Host, hop-by-hop fields), and answers each request `200 ok`.

Hand-parsed on purpose: h11 and real servers refuse or merge the very heads the tests look for
(two Host fields, Connection options); the body is skipped by its Content-Length or chunks.
"""

from __future__ import annotations

import asyncio

from labkit.pki import IssuedCert
from tests.support.scripted_origins import ScriptedOrigin


class RecordingOrigin(ScriptedOrigin):
    """HTTP/1.1 in clear, or over TLS (ALPN http/1.1). `heads`: the raw heads, in order."""

    def __init__(self, host: str, tls: IssuedCert | None = None) -> None:
        super().__init__(host, tls, alpn=("http/1.1",))
        self.heads: list[bytes] = []

    def fields(self, index: int = -1) -> list[tuple[str, str]]:
        """The header fields of one recorded head: (lower-case name, value), in order."""
        lines = self.heads[index].split(b"\r\n")[1:]
        return [
            (name.strip().lower().decode(), value.strip().decode("latin-1"))
            for name, _, value in (line.partition(b":") for line in lines if line)
        ]

    def values(self, name: str, index: int = -1) -> list[str]:
        return [value for field, value in self.fields(index) if field == name]

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return
            self.heads.append(head[:-4])
            fields = self.fields()
            lengths = [int(v) for n, v in fields if n == "content-length"]
            if any("chunked" in v.lower() for n, v in fields if n == "transfer-encoding"):
                while True:
                    size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                    await reader.readexactly(size + 2)
                    if size == 0:
                        break
            elif lengths:
                await reader.readexactly(lengths[0])
            close = any("close" in v.lower() for n, v in fields if n == "connection")
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"
                + (b"Connection: close\r\n" if close else b"")
                + b"\r\nok"
            )
            await writer.drain()
            if close or head.split(b"\r\n", 1)[0].endswith(b"HTTP/1.0"):
                writer.close()
                return
