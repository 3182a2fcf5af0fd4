"""103 Early Hints to an HTTP/2 client: reshape's own (learned), soon after a request's
requestheaders hook, and the origin's own 1xx responses as the engine receives them."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Iterable
from typing import Any

from mitmproxy import http
from mitmproxy.proxy.commands import Command, RequestWakeup
from mitmproxy.proxy.events import Wakeup
from mitmproxy.proxy.layers.http import (
    HttpRequestHeadersHook,
    HttpStream,
    ResponseHeaders,
    SendHttp,
)

from reshape.mitm.engine_client import InterimResponse
from reshape.mitm.patches.base import Patch, Replacement, relay

log = logging.getLogger("reshape.early_hints")

# Both called inside mitmproxy's protocol code: must not raise. Provided by the early hints addon.
LinksFor = Callable[[http.HTTPFlow], "list[str] | None"]
HintsSent = Callable[[http.HTTPFlow], None]
# An origin's 1xx for the flow: its status, and whether it went on to the client.
InterimSeen = Callable[[http.HTTPFlow, int, bool], None]

# How long after the request a 103 waits. Chromium (156) drops a 103 that arrives before it has
# finished sending the request: its HTTP/2 stream takes the 1xx head in while the transaction has
# not yet asked for response headers, and the final response then overwrites it. In its netlog
# the 103 is received (HTTP2_SESSION_RECV_HEADERS) but never read
# (HTTP_TRANSACTION_READ_EARLY_HINTS_RESPONSE_HEADERS), whenever HTTP_TRANSACTION_SEND_REQUEST
# ended as late as the 103 arrived: 3-4 ms after it began on a busy machine, in 3 of 7 hinted
# loads with the browser on loopback and the 103 sent at once. Over a real network the client's
# own round trip is the wait; 10 ms is what a hint gives up of a round trip to the origin, which
# is what it saves (100-200 ms in the lab).
DELAY = 0.010
# Where a stream keeps its wakeup command and Link values until the wakeup comes.
WAITING = "_reshape_early_hints"


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


def _nothing() -> Generator[Any, Any, None]:
    yield from ()


class SendEarlyHints(Patch):
    """Once a request's `requestheaders` hook has run, send its HTTP/2 client, `delay` later
    (the request goes on meanwhile) and unless the response or an error came first, the 103
    Early Hints response whose Link values `links_for(flow)` gives (none: nothing is sent); then
    `sent(flow)`.

    Why: no mitmproxy 12.2.3 hook can write to the client before the flow's response: a hook may
    only set `flow.response`, which is final. `HttpStream` itself sends a 1xx only for `Expect:
    100-continue`, the same way this patch does: a `ResponseHeaders` command to the client's
    layer, which `Http2Server` turns into a HEADERS frame on the stream (h2 keeps the stream open
    for the final response after a 1xx) without touching the stream's state. So
    `HttpStream.state_wait_for_request_headers` is wrapped: the command after the hook (or the
    method's end) is preceded by a `RequestWakeup(delay)` (see DELAY), and
    `HttpStream._handle_event` sends the 103 when that wakeup comes back, unless the response or
    an error came first. Not sent when the hook answered or killed the flow, nor to an HTTP/1.1
    client (`Http1Server` would take the 103 for the response itself); Chromium acts on Early
    Hints over HTTP/2 and HTTP/3 only.

    The origin's own informational responses (1xx but 100 and 101) arrive from the engine as
    `InterimResponse` events (reshape/mitm/engine_channel.py), which mitmproxy's HttpStream does
    not know: the same `_handle_event` sends them on, the same way, to an HTTP/2 client while the
    final response has not come, and drops them otherwise; `interim_seen(flow, status, sent_on)`
    hears of each. mitmproxy 12.2.3 has no hook for them, and its own server layers drop 1xx
    responses from origins.
    """

    def __init__(
        self,
        links_for: LinksFor,
        sent: HintsSent,
        interim_seen: InterimSeen,
        *,
        delay: float = DELAY,
    ) -> None:
        super().__init__()
        self.links_for = links_for
        self.sent = sent
        self.interim_seen = interim_seen
        self.delay = delay

    def replacements(self) -> Iterable[Replacement]:
        original = HttpStream.state_wait_for_request_headers
        original_handle_event = HttpStream._handle_event
        links_for, sent, delay = self.links_for, self.sent, self.delay
        interim_seen = self.interim_seen

        def answered(stream: HttpStream) -> bool:
            flow = stream.flow
            return flow.response is not None or flow.error is not None

        def hints(stream: HttpStream) -> list[Command]:
            flow = stream.flow
            # The connection's protocol, not the request's http_version, which an addon may set.
            if answered(stream) or flow.is_replay or stream.context.client.alpn != b"h2":
                return []
            links = [link for link in links_for(flow) or () if link.isascii()]
            if not links:
                return []
            wakeup = RequestWakeup(delay)
            stream.__dict__[WAITING] = (wakeup, links)
            return [wakeup]

        def send_hints(stream: HttpStream, links: list[str]) -> Generator[Any, Any, None]:
            if answered(stream):  # the response, or an error, came first: too late for hints
                return
            sent(stream.flow)
            yield SendHttp(
                ResponseHeaders(stream.stream_id, early_hints_response(links)),
                stream.context.client,
            )

        def forward_interim(
            stream: HttpStream, response: http.Response
        ) -> Generator[Any, Any, None]:
            if answered(stream) or stream.context.client.alpn != b"h2":
                log.debug(
                    "an origin's %d not sent on: answered, or not HTTP/2", response.status_code
                )
                interim_seen(stream.flow, response.status_code, False)
                return
            interim_seen(stream.flow, response.status_code, True)
            yield SendHttp(ResponseHeaders(stream.stream_id, response), stream.context.client)

        def _handle_event(self: HttpStream, event: Any) -> Generator[Any, Any, None]:
            # Not a generator itself: every other event goes to mitmproxy's own, unwrapped.
            if type(event) is InterimResponse:
                return forward_interim(self, event.response)
            if type(event) is Wakeup:
                pending = self.__dict__.get(WAITING)
                if pending is not None and event.command is pending[0]:
                    del self.__dict__[WAITING]
                    return send_hints(self, pending[1])
                # mitmproxy's HttpStream (12.2.3) asks for no wakeups and would fail on one: a
                # wakeup no patch took (the first-byte timeout's take theirs before this one)
                # is dropped, as that patch dropped them before it passed others on.
                log.debug("dropped a wakeup no patch of HttpStream asked for: %r", event.command)
                return _nothing()
            return original_handle_event(self, event)

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
        yield HttpStream, "_handle_event", _handle_event
