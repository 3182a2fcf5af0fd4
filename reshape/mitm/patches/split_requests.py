"""Which client requests arrived split: the body in a later read than the end of the head."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field
from typing import Any

import h2.events
from mitmproxy import http
from mitmproxy.proxy import commands, events
from mitmproxy.proxy.layers.http import _http1, _http2
from mitmproxy.proxy.layers.http._base import ReceiveHttp
from mitmproxy.proxy.layers.http._events import RequestHeaders

from reshape.mitm.patches.base import Patch, Replacement, relay

# Called with each split request, inside mitmproxy's protocol code: must not raise. Provided by
# the split_requests addon.
SplitListener = Callable[[http.Request], None]


@dataclass
class _Http2Reads:
    """What the patch knows about one HTTP/2 client connection."""

    reads: int = 0  # DataReceived events so far
    # Requests whose body has not begun yet: stream id → (request, read its head came in).
    waiting: dict[int, tuple[http.Request, int]] = field(default_factory=dict)


class ReportSplitRequests(Patch):
    """Call `listener(request)` for each client request whose body came in a later read than the
    end of its head (as most browsers send a POST: head and body in two TCP segments).

    Why: no mitmproxy 12.2.3 hook sees reads. `ConnectionHandler` passes each read from the client
    socket down as one `DataReceived` event (for a TLS client: everything decrypted from that
    read). HTTP/1: `Http1Server.read_headers` parses a head out of its buffer, and what is left in
    the buffer then came with the head; a request that expects a body and has none of it buffered
    is split. HTTP/2: `Http2Server` turns each read into h2 events; a request whose first non-empty
    DATA frame comes in a later read than its HEADERS is split. Requests without a body are never
    reported.
    """

    def __init__(self, listener: SplitListener) -> None:
        super().__init__()
        self.listener = listener
        self._http2_reads: weakref.WeakKeyDictionary[Any, _Http2Reads] = weakref.WeakKeyDictionary()

    def replacements(self) -> Iterable[Replacement]:
        yield from self._http1()
        yield from self._http2()

    def _http1(self) -> Iterable[Replacement]:
        original = _http1.Http1Server.read_headers
        report = self.listener

        def read_headers(self: _http1.Http1Server, event: Any) -> Generator[Any, Any, None]:
            rejected = False  # a malformed head: answered 400 and closed before it is passed on

            def check(command: Any) -> list[Any]:
                nonlocal rejected
                if isinstance(command, commands.CloseConnection):
                    rejected = True
                elif (
                    isinstance(command, ReceiveHttp)
                    and isinstance(command.event, RequestHeaders)
                    and not command.event.end_stream
                    and not rejected
                    and not self.buf  # checked before the body reader consumes the buffer
                ):
                    report(command.event.request)
                return [command]

            yield from relay(original(self, event), check)

        yield _http1.Http1Server, "read_headers", read_headers

    def _http2(self) -> Iterable[Replacement]:
        original_handle_event = _http2.Http2Server._handle_event
        original_handle_h2_event = _http2.Http2Server.handle_h2_event
        reads = self._http2_reads
        report = self.listener

        def _handle_event(self: _http2.Http2Server, event: Any) -> Generator[Any, Any, None]:
            # Not a generator itself (callers iterate the result at once): every event goes to
            # mitmproxy's own generator unwrapped, one generator frame fewer per event.
            if isinstance(event, events.DataReceived):
                state = reads.setdefault(self, _Http2Reads())
                state.reads += 1
            return original_handle_event(self, event)

        def handle_h2_event(self: _http2.Http2Server, event: Any) -> Generator[Any, Any, bool]:
            state = reads.setdefault(self, _Http2Reads())
            if isinstance(event, h2.events.DataReceived) and event.data:
                head = state.waiting.pop(event.stream_id, None)
                if head is not None and head[1] != state.reads:
                    report(head[0])
            elif isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)):
                state.waiting.pop(event.stream_id, None)

            if not isinstance(event, h2.events.RequestReceived) or event.stream_ended:
                # No head with a body to come: nothing to note, no command to look at.
                return bool((yield from original_handle_h2_event(self, event)))

            def note_head(command: Any) -> list[Any]:
                if isinstance(command, ReceiveHttp) and isinstance(command.event, RequestHeaders):
                    state.waiting[event.stream_id] = (command.event.request, state.reads)
                return [command]

            return bool((yield from relay(original_handle_h2_event(self, event), note_head)))

        yield _http2.Http2Server, "_handle_event", _handle_event
        yield _http2.Http2Server, "handle_h2_event", handle_h2_event
