"""A CONNECT tunnel's bytes to an HTTP/1.1 client go out as they are, not as a response body.

Why a patch: in mitmproxy 12.2.3 whatever the layers inside a CONNECT tunnel send to the client
(the client TLS layer's records, every response a browser gets through the tunnel) leaves
`HttpStream.passthrough` (proxy/layers/http/__init__.py) as `SendHttp(ResponseData)` of the
CONNECT's response. The HttpLayer hands that to the client connection's layer, `Http1Server`,
whose `send` looks the response's Transfer-Encoding up (a case-insensitive scan of its fields)
and yields the same bytes as a `SendData` to the same connection: one more trip down and up
the layers (`HttpLayer.event_to_child`, `Http1Server._handle_event` and `send`, two wrappers of
other patches) for every record, three per response over HTTP/2 (head, data, end). That trip
is on the path the page load waits for: the proxy's work on responses, not on requests,
moves the lab's load times (bench/RESULTS.md, Issue 17). No hook sees it. Measured: 2-3% more
requests per second through the pool in bench/overhead (h2 and https); the lab's page loads
did not move beyond their noise.

The replacement runs mitmproxy's own `passthrough` and changes one command: a
`SendHttp(ResponseData)` to the client becomes the `SendData` that `Http1Server.send` would
have made of it, when the tunnel is a CONNECT whose request came over HTTP/1 and whose 2xx
response is not chunked (Http1Server would send the data as it is). Everything else (a 101
upgrade, CONNECT over HTTP/2, a chunked response, every other command) goes mitmproxy's way.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable
from typing import Any

from mitmproxy.proxy import commands, events
from mitmproxy.proxy.layers.http import HttpStream, SendHttp
from mitmproxy.proxy.layers.http._events import ResponseData

from reshape.mitm.patches.base import Patch, Replacement, relay

_HTTP1 = ("HTTP/1.1", "HTTP/1.0")
_DIRECT = "_reshape_tunnel_sends_directly"


def sends_directly(stream: HttpStream) -> bool:
    """Whether `stream` is a CONNECT tunnel to an HTTP/1 client whose data Http1Server would
    send as it is. Decided once per stream (the response was sent before any tunnel data)."""
    decided: bool | None = stream.__dict__.get(_DIRECT)
    if decided is None:
        request, response = stream.flow.request, stream.flow.response
        decided = (
            request.method == "CONNECT"
            and request.http_version in _HTTP1
            and response is not None
            and 200 <= response.status_code < 300
            and "chunked" not in response.headers.get("transfer-encoding", "").lower()
        )
        stream.__dict__[_DIRECT] = decided
    return decided


class SendTunnelDataDirectly(Patch):
    """Replace `HttpStream.passthrough` with one whose client data skips Http1Server."""

    def replacements(self) -> Iterable[Replacement]:
        original = HttpStream.passthrough

        def passthrough(self: HttpStream, event: events.Event) -> Generator[Any, Any, None]:
            if not sends_directly(self):
                return (yield from original(self, event))
            client = self.context.client

            def direct(command: Any) -> list[Any]:
                if (
                    type(command) is SendHttp
                    and command.connection is client
                    and type(command.event) is ResponseData
                ):
                    return [commands.SendData(client, command.event.data)]
                return [command]

            return (yield from relay(original(self, event), direct))

        yield HttpStream, "passthrough", passthrough
