"""The admin endpoint: /metrics, /healthz, /proxy.pac and /ca.pem over plain HTTP/1.1.

Deliberately tiny and separate from the proxy listener: it must answer even while the proxy is
saturated, and it never serves anything but these four documents (never the CA key).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from reshape.base.addresses import ListenAddress, Network
from reshape.features.client_access.addon import client_allowed

log = logging.getLogger("reshape.admin")

_MAX_HEAD = 8192
_HEAD_TIMEOUT = 10.0


@dataclass(frozen=True)
class AdminContent:
    """Where the admin endpoint gets what it serves."""

    proxy_address: ListenAddress
    ca_pem: bytes
    render_metrics: Callable[[], tuple[bytes, str]]  # → (body, content type)
    is_healthy: Callable[[], bool]


def pac_file(proxy_host: str, proxy_port: int) -> bytes:
    """A PAC file sending every URL through the proxy, loopback origins included."""
    host = f"[{proxy_host}]" if ":" in proxy_host else proxy_host
    return (
        "// reshape: send all traffic through the proxy.\n"
        "function FindProxyForURL(url, host) {\n"
        f'  return "PROXY {host}:{proxy_port}";\n'
        "}\n"
    ).encode()


def _pac_host(proxy: ListenAddress, request_host: str | None) -> str:
    """The proxy host a browser can reach: the listen host, unless that is a wildcard."""
    if not proxy.is_wildcard or not request_host:
        return proxy.host
    if request_host.startswith("["):
        return request_host[1 : request_host.find("]")]
    return request_host.rsplit(":", 1)[0] if request_host.count(":") == 1 else request_host


class AdminServer:
    def __init__(
        self, address: ListenAddress, content: AdminContent, allowed: Sequence[Network] = ()
    ) -> None:
        self.address = address
        self.content = content
        self.allowed = tuple(allowed)
        self._server: asyncio.Server | None = None

    async def start(self) -> ListenAddress:
        self._server = await asyncio.start_server(
            self._handle, self.address.host, self.address.port
        )
        host, port = self._server.sockets[0].getsockname()[:2]
        return ListenAddress(host, port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        if not client_allowed(peer[0] if peer else "", self.allowed):
            writer.close()  # same rule as the proxy listener: loopback or --allow-clients
            return
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _HEAD_TIMEOUT)
            status, headers, body = self.respond(head)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            status, headers, body = 400, {"Content-Type": "text/plain"}, b"bad request\n"
        except ConnectionError:
            writer.close()
            return
        reason = {
            200: "OK",
            400: "Bad Request",
            404: "Not Found",
            405: "Method Not Allowed",
            503: "Service Unavailable",
        }[status]
        head_lines = [
            f"HTTP/1.1 {status} {reason}",
            f"Content-Length: {len(body)}",
            "Connection: close",
            "Cache-Control: no-store",
        ]
        head_lines += [f"{k}: {v}" for k, v in headers.items()]
        try:
            writer.write(("\r\n".join(head_lines) + "\r\n\r\n").encode() + body)
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    def respond(self, head: bytes) -> tuple[int, dict[str, str], bytes]:
        """(status, headers, body) for one request head. Pure, so it is tested without sockets."""
        text = head[:_MAX_HEAD].decode("latin-1")
        request_line, _, header_block = text.partition("\r\n")
        parts = request_line.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return 400, {"Content-Type": "text/plain"}, b"bad request\n"
        method, target, _ = parts
        if method not in ("GET", "HEAD"):
            return 405, {"Allow": "GET, HEAD", "Content-Type": "text/plain"}, b"GET only\n"
        host = None
        for line in header_block.split("\r\n"):
            name, _, value = line.partition(":")
            if name.strip().lower() == "host":
                host = value.strip()
        path = target.split("?", 1)[0]
        status, headers, body = self._route(path, host)
        return status, headers, b"" if method == "HEAD" else body

    def _route(self, path: str, host: str | None) -> tuple[int, dict[str, str], bytes]:
        content = self.content
        if path == "/metrics":
            body, content_type = content.render_metrics()
            return 200, {"Content-Type": content_type}, body
        if path == "/healthz":
            if content.is_healthy():
                return 200, {"Content-Type": "text/plain"}, b"ok\n"
            return 503, {"Content-Type": "text/plain"}, b"unhealthy\n"
        if path == "/proxy.pac":
            pac_host = _pac_host(content.proxy_address, host)
            return (
                200,
                {"Content-Type": "application/x-ns-proxy-autoconfig"},
                pac_file(pac_host, content.proxy_address.port),
            )
        if path == "/ca.pem":
            return (
                200,
                {
                    "Content-Type": "application/x-pem-file",
                    "Content-Disposition": 'attachment; filename="reshape-ca.pem"',
                },
                content.ca_pem,
            )
        return (
            404,
            {"Content-Type": "text/plain"},
            b"not found: try /metrics /healthz /proxy.pac /ca.pem\n",
        )
