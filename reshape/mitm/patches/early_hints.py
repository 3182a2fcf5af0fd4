"""A 103 Early Hints response to an HTTP/2 client, right after a request's requestheaders hook."""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterable
from typing import Any

from mitmproxy import http
from mitmproxy.proxy.commands import Command
from mitmproxy.proxy.layers.http import (
    HttpRequestHeadersHook,
    HttpStream,
    ResponseHeaders,
    SendHttp,
)

from reshape.mitm.patches.base import Patch, Replacement, relay

# Both called inside mitmproxy's protocol code: must not raise. Provided by the early hints addon.
LinksFor = Callable[[http.HTTPFlow], "list[str] | None"]
HintsSent = Callable[[http.HTTPFlow], None]


def early_hints_response(links: list[str]) -> http.Response:
    """The 103 naming `links` (Link values), as mitmproxy's HTTP/2 server layer sends it."""
    return http.Response(
        http_version=b"HTTP/2.0",
        status_code=103,
        reason=b"",
        headers=http.Headers([(b"link", ", ".join(links).encode("ascii"))]),
        content=None,
        trailers=None,
        timestamp_start=time.time(),
        timestamp_end=None,
    )


class SendEarlyHints(Patch):
    """Once a request's `requestheaders` hook has run, send its HTTP/2 client the 103 Early Hints
    response whose Link values `links_for(flow)` gives (none: nothing is sent), before the request
    goes anywhere; then `sent(flow)`.

    Why: no mitmproxy 12.2.3 hook can write to the client before the flow's response: a hook may
    only set `flow.response`, which is final. `HttpStream` itself sends a 1xx only for `Expect:
    100-continue`, the same way this patch does: a `ResponseHeaders` command to the client's
    layer, which `Http2Server` turns into a HEADERS frame on the stream (h2 keeps the stream open
    for the final response after a 1xx) without touching the stream's state. So
    `HttpStream.state_wait_for_request_headers` is wrapped: the command after the hook (or the
    method's end) is preceded by the 103. Not sent when the hook answered or killed the flow, nor
    to an HTTP/1.1 client (`Http1Server` would take the 103 for the response itself); Chromium
    acts on Early Hints over HTTP/2 and HTTP/3 only.
    """

    def __init__(self, links_for: LinksFor, sent: HintsSent) -> None:
        super().__init__()
        self.links_for = links_for
        self.sent = sent

    def replacements(self) -> Iterable[Replacement]:
        original = HttpStream.state_wait_for_request_headers
        links_for, sent = self.links_for, self.sent

        def hints(stream: HttpStream) -> list[Command]:
            flow = stream.flow
            if flow.response is not None or flow.error is not None or flow.is_replay:
                return []
            if flow.request.http_version != "HTTP/2.0":
                return []
            links = [link for link in links_for(flow) or () if link.isascii()]
            if not links:
                return []
            sent(flow)
            return [
                SendHttp(
                    ResponseHeaders(stream.stream_id, early_hints_response(links)),
                    stream.context.client,
                )
            ]

        def state_wait_for_request_headers(
            self: HttpStream, event: Any
        ) -> Generator[Any, Any, None]:
            hooked = False

            def change(command: Any) -> list[Any]:
                nonlocal hooked
                before = hints(self) if hooked else []
                hooked = isinstance(command, HttpRequestHeadersHook)
                return [*before, command]

            result = yield from relay(original(self, event), change)
            if hooked:  # the method ended with the hook
                for command in hints(self):  # noqa: UP028 (`yield from` a list would choke on replies)
                    yield command
            return result

        yield HttpStream, "state_wait_for_request_headers", state_wait_for_request_headers
