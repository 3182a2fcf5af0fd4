"""Client request heads refused (400, 501) or given the right Host before mitmproxy makes a flow.

reshape/features/request_framing/rules.py decides; this patch applies the decisions where only
mitmproxy's protocol layers can: the addon of the same feature handles the hop-by-hop fields.
"""

from __future__ import annotations

import functools
from collections.abc import Generator, Iterable
from typing import Any

import h2.errors
import h2.events
from mitmproxy.net.http import url
from mitmproxy.proxy import commands
from mitmproxy.proxy.layers.http import _http1, _http2
from mitmproxy.proxy.layers.http._base import ReceiveHttp
from mitmproxy.proxy.layers.http._events import RequestHeaders

from reshape.features.request_framing.rules import Refusal, RequestHead, refusal, with_host
from reshape.mitm.patches.base import Patch, Replacement
from reshape.mitm.patches.http1_head_guard import ClientErrorReport


class FrameRequests(Patch):
    """Refuse client requests whose Host or Content-Length no origin may see, and give HTTP/1
    requests the Host RFC 9112 §3.2.2 asks for; report each refusal.

    Why not a hook: mitmproxy 12.2.3's `HttpStream` clears an absolute-form request's authority
    before any hook runs (proxy/layers/http/__init__.py, "Set the request target to origin-form"),
    so no hook can tell whether the client's Host must be replaced by the request-target's; and a
    hook that answers a request whose body streams (over `stream_large_bodies`, as a 10^26-byte
    Content-Length does) makes mitmproxy raise, while a buffered one waits for the whole body
    first. Here, on the head just parsed:

    - HTTP/1 (`Http1Server.read_headers`): a refused head gets 400 (a transfer coding before
      chunked: 501) and a close, before its body is read and before any flow exists; an
      accepted one gets its Host set
      (`rules.with_host`: the absolute-form target's authority, or, for an HTTP/1.0 request
      without Host inside a CONNECT tunnel, the tunnel's). A head mitmproxy already refused
      (its own 400) is left to it.
    - HTTP/2 (`Http2Server.handle_h2_event`, RequestReceived): a refused request is a malformed
      one (RFC 9113 §8.1.1): it gets a 400 response, then RST_STREAM PROTOCOL_ERROR if the
      client is still sending; the connection and its other streams go on.
    """

    def __init__(self, report: ClientErrorReport) -> None:
        super().__init__()
        self.report = report

    def replacements(self) -> Iterable[Replacement]:
        yield from self._http1()
        yield from self._http2()

    def _http1(self) -> Iterable[Replacement]:
        original = _http1.Http1Server.read_headers
        report = self.report

        @functools.wraps(original)  # the head guard tells the state by its name
        def read_headers(self: _http1.Http1Server, event: Any) -> Generator[Any, Any, None]:
            commands_ = original(self, event)
            reply = None
            rejected = False  # mitmproxy answered 400 itself
            while True:
                try:
                    command = commands_.send(reply)
                except StopIteration:
                    return
                if isinstance(command, commands.CloseConnection):
                    rejected = True
                elif (
                    isinstance(command, ReceiveHttp)
                    and isinstance(command.event, RequestHeaders)
                    and not rejected
                ):
                    request = command.event.request
                    method = request.method.upper()
                    head = RequestHead(
                        request.http_version,
                        method,
                        # absolute-form (empty for origin-form; CONNECT's is its tunnel's)
                        (request.data.authority or None) if method != "CONNECT" else None,
                        request.headers.fields,
                    )
                    refused = refusal(head)
                    if refused is not None:
                        commands_.close()
                        self.state = self.done
                        yield commands.SendData(
                            self.conn, _http1.make_error_response(refused.status, refused.message)
                        )
                        yield commands.CloseConnection(self.conn)
                        if refused.kind is not None:
                            report(refused.kind)
                        return
                    request.headers.fields = tuple(with_host(head, _tunnel_authority(self)))
                reply = yield command

        yield _http1.Http1Server, "read_headers", read_headers

    def _http2(self) -> Iterable[Replacement]:
        original = _http2.Http2Server.handle_h2_event
        report = self.report

        def handle_h2_event(self: _http2.Http2Server, event: Any) -> Generator[Any, Any, bool]:
            if isinstance(event, h2.events.RequestReceived):
                refused = _h2_refusal(event)
                if refused is not None:
                    yield from _refuse_stream(self, event, refused)
                    if refused.kind is not None:
                        report(refused.kind)
                    return False
            return (yield from original(self, event))

        yield _http2.Http2Server, "handle_h2_event", handle_h2_event


def _tunnel_authority(layer: _http1.Http1Server) -> bytes | None:
    """host:port of the CONNECT tunnel the request came through; None outside a tunnel."""
    address = layer.context.server.address
    if address is None:
        return None
    scheme = "https" if layer.context.client.tls else "http"
    return url.hostport(scheme, address[0], address[1]).encode("idna")


def _h2_refusal(event: h2.events.RequestReceived) -> Refusal | None:
    # The block as h2 passed it on (bytes, mitmproxy's h2 decodes no text): `refusal` reads only
    # the fields it checks, which pseudo-fields never are, so they need not be taken out.
    fields = event.headers or []
    method = authority = b""
    for name, value in fields:
        if name == b":method":
            method = value
        elif name == b":authority":
            authority = value
    head = RequestHead("HTTP/2.0", bytes(method).decode("latin-1"), authority or None, fields)
    return refusal(head)


def _refuse_stream(
    layer: _http2.Http2Server, event: h2.events.RequestReceived, refused: Refusal
) -> Generator[Any, Any, None]:
    body = (refused.message + "\n").encode()
    conn = layer.h2_conn
    if conn.local_flow_control_window(event.stream_id) < len(body):
        body = b""  # the client's window is shut: the status alone
    conn.send_headers(
        event.stream_id,
        [
            (b":status", str(refused.status).encode()),
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
        ],
    )
    conn.send_data(event.stream_id, body, end_stream=True)
    if event.stream_ended is None:  # the client is still sending: tell it to stop
        conn.reset_stream(event.stream_id, h2.errors.ErrorCodes.PROTOCOL_ERROR)
    yield commands.SendData(layer.conn, conn.data_to_send())
