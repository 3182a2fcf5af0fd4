"""The admin endpoint: /metrics, /healthz, /proxy.pac and the onboarding site, on Tornado.

Separate from the proxy listener, so it answers while the proxy is saturated, and it serves only
these documents (the CA's certificate, never its key):

- `/metrics`: prometheus_client's own exposition — Prometheus text, or OpenMetrics when the
  scraper sends `Accept: application/openmetrics-text`; gzip on `Accept-Encoding: gzip`;
  `?name[]=` filters;
- `/healthz`: 200 `ok` while the proxy listens, else 503;
- `/proxy.pac`: a PAC file sending every URL to the proxy;
- `/`, `/cert/pem`, `/cert/cer`, `/cert/p12`: the onboarding page and the CA
  (reshape/features/onboarding/); `/ca.pem`, the older name of `/cert/pem`.

Tornado (a maintained server that mitmproxy already depends on, and asyncio-native, so it runs in
the proxy's own event loop) speaks HTTP: keep-alive, HEAD with the GET's headers and no body,
limits on header size and time, 400 for malformed requests. Only GET and HEAD are allowed.
"""

from __future__ import annotations

import gzip
import logging
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

import tornado.httpserver
import tornado.iostream
import tornado.netutil
import tornado.web
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.registry import Collector, CollectorRegistry

from reshape.base.addresses import ListenAddress, Network
from reshape.features.client_access.addon import client_allowed
from reshape.features.onboarding.downloads import CaDownloads
from reshape.features.onboarding.site import OnboardingSite, reachable_at

log = logging.getLogger("reshape.admin")

MAX_HEAD_BYTES = 8192
# A connection must send its request head within this many seconds, and may idle this long
# between requests.
HEAD_TIMEOUT = 10.0
ALLOWED_METHODS = ("GET", "HEAD")


@dataclass(frozen=True)
class AdminContent:
    """Where the admin endpoint gets what it serves."""

    proxy_address: ListenAddress
    ca: CaDownloads
    registry: Collector  # the process's own, or the supervisor's merged view of its workers
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


def request_host(host_header: str) -> str:
    """The host part of a Host header (`name:port`, `[v6]:port`, or without the port)."""
    if host_header.startswith("["):
        return host_header[1 : host_header.find("]")]
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


def metrics_document(
    registry: Collector, accept: str | None, accept_encoding: str | None, query: str = ""
) -> tuple[bytes, dict[str, str]]:
    """(body, headers) of /metrics, negotiated as prometheus_client's own exposition does."""
    encoder, content_type = choose_encoder(accept or "")
    names = parse_qs(query).get("name[]")
    if names and isinstance(registry, CollectorRegistry):
        registry = registry.restricted_registry(names)
    body = encoder(registry)
    headers = {"Content-Type": content_type, "Vary": "Accept, Accept-Encoding"}
    if gzip_accepted(accept_encoding or ""):
        body = gzip.compress(body)
        headers["Content-Encoding"] = "gzip"
    return body, headers


class _Handler(tornado.web.RequestHandler):
    SUPPORTED_METHODS = ALLOWED_METHODS

    def initialize(self, admin: AdminServer) -> None:
        self.admin = admin

    @property
    def content(self) -> AdminContent:
        return self.admin.content

    def set_default_headers(self) -> None:
        self.clear_header("Server")
        self.set_header("Cache-Control", "no-store")

    def compute_etag(self) -> None:
        return None  # every document is generated now; nothing to revalidate

    def reply(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.set_status(status)
        for name, value in headers.items():
            self.set_header(name, value)
        self.finish(body)  # Tornado sets Content-Length, and drops the body for HEAD

    def get(self) -> None:
        raise NotImplementedError

    def head(self) -> None:
        self.get()

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        if status_code == 405:
            self.set_header("Allow", ", ".join(ALLOWED_METHODS))
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(f"{status_code} {self._reason}\n")


class _Metrics(_Handler):
    def get(self) -> None:
        request = self.request
        body, headers = metrics_document(
            self.content.registry,
            request.headers.get("Accept"),
            request.headers.get("Accept-Encoding"),
            request.query,
        )
        self.reply(200, headers, body)


class _Health(_Handler):
    def get(self) -> None:
        healthy = self.content.is_healthy()
        self.reply(
            200 if healthy else 503,
            {"Content-Type": "text/plain; charset=utf-8"},
            b"ok\n" if healthy else b"unhealthy\n",
        )


class _Pac(_Handler):
    def get(self) -> None:
        proxy = reachable_at(self.content.proxy_address, request_host(self.request.host))
        proxy = proxy or self.content.proxy_address
        self.reply(
            200,
            {"Content-Type": "application/x-ns-proxy-autoconfig"},
            pac_file(proxy.host, proxy.port),
        )


class _Onboarding(_Handler):
    def get(self) -> None:
        content = self.content
        path = "/cert/pem" if self.request.path == "/ca.pem" else self.request.path
        host = request_host(self.request.host)
        proxy = reachable_at(content.proxy_address, host) or content.proxy_address
        reply = OnboardingSite(content.ca).reply(
            path, proxy=str(proxy), pac_url=f"http://{self.request.host}/proxy.pac"
        )
        if reply is None:
            raise tornado.web.HTTPError(404)
        self.reply(reply.status, reply.headers, reply.body)


class _NotFound(_Handler):
    def get(self) -> None:
        paths = "/metrics /healthz /proxy.pac / /cert/pem /cert/cer /cert/p12 /ca.pem"
        self.reply(
            404, {"Content-Type": "text/plain; charset=utf-8"}, f"not found: try {paths}\n".encode()
        )


class _AllowListServer(tornado.httpserver.HTTPServer):
    """Closes connections from clients outside the allow-list before reading a byte."""

    allowed: tuple[Network, ...] = ()

    def handle_stream(self, stream: tornado.iostream.IOStream, address: tuple[Any, ...]) -> None:
        peer = address[0] if address else ""
        if not client_allowed(peer, self.allowed):
            stream.close()
            return
        super().handle_stream(stream, address)


def _quiet(handler: tornado.web.RequestHandler) -> None:
    # Tornado logs every request at INFO; scrapes every few seconds would drown the log.
    request = handler.request
    log.debug("%d %s %s (%s)", handler.get_status(), request.method, request.uri, request.remote_ip)


class AdminServer:
    def __init__(
        self, address: ListenAddress, content: AdminContent, allowed: Sequence[Network] = ()
    ) -> None:
        self.address = address
        self.content = content  # replaced when the proxy's port is known (port 0)
        self.allowed = tuple(allowed)
        self._server: _AllowListServer | None = None

    def application(self) -> tornado.web.Application:
        args = {"admin": self}
        return tornado.web.Application(
            [
                (r"/metrics", _Metrics, args),
                (r"/healthz", _Health, args),
                (r"/proxy\.pac", _Pac, args),
                (r"/|/ca\.pem|/cert/[a-z0-9]+", _Onboarding, args),
            ],
            default_handler_class=_NotFound,
            default_handler_args=args,
            log_function=_quiet,
        )

    async def start(self) -> ListenAddress:
        """Listen; an OSError if the address cannot be bound."""
        sockets = tornado.netutil.bind_sockets(
            self.address.port, self.address.host, family=socket.AF_UNSPEC
        )
        server = _AllowListServer(
            self.application(),
            idle_connection_timeout=HEAD_TIMEOUT,
            max_header_size=MAX_HEAD_BYTES,
            max_body_size=MAX_HEAD_BYTES,
        )
        server.allowed = self.allowed
        server.add_sockets(sockets)
        self._server = server
        host, port = sockets[0].getsockname()[:2]
        return ListenAddress(host, port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            await self._server.close_all_connections()
            self._server = None
