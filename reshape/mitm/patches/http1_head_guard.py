"""Client request heads that are too large, too slow or carry control characters (HTTP/1)."""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable, Generator, Iterable
from typing import Any

from mitmproxy.proxy import commands, events
from mitmproxy.proxy.layers.http import _http1
from mitmproxy.proxy.layers.http._base import ReceiveHttp
from mitmproxy.proxy.layers.http._events import RequestHeaders

from reshape.features.client_errors.rules import bad_header_value, head_too_large
from reshape.mitm.patches.base import Patch, Replacement

# Called with the kind of each client error the patch refuses or sees (the kinds of
# reshape/features/client_errors/rules.py). Provided by the client_errors addon.
ClientErrorReport = Callable[[str], None]

# h11's ReceiveBuffer ends a head at the first blank line, CRLF or bare LF.
_BLANK_LINE = re.compile(rb"\n\r?\n")


class GuardHttp1Heads(Patch):
    """Refuse HTTP/1 request heads that are too large, too slow or carry control characters, and
    report each refusal.

    Why: in mitmproxy 12.2.3 `Http1Server.read_headers` (proxy/layers/http/_http1.py) buffers a
    head without any limit ("FIXME: protect against header size DoS") and has no timeout (only
    the 10-minute idle `tcp_timeout`, which a client sending a byte now and then never reaches);
    header values with NUL, CR or DEL pass through to the origin. A malformed head that mitmproxy
    rejects before a flow exists produces only a log line, so it is counted here too. In
    `Http1Server._handle_event`, before mitmproxy parses: a head (complete or not) over
    `max_head_bytes` gets 431 and a close; a head not complete `header_timeout` seconds after the
    connection started or after its first byte arrived gets 408 and a close (a `RequestWakeup`
    timer, mitmproxy's own mechanism for layer timers); a parsed head with a control character
    in a value gets 400 and a close, before any addon or origin sees it — unless mitmproxy
    answered 400 for the same head already (it does when the character is in the framing
    fields), so a client gets one answer; mitmproxy's own 400 for a head it cannot parse is
    counted as `malformed`.
    """

    def __init__(self, report: ClientErrorReport, *, max_head_bytes: int, header_timeout: float):
        super().__init__()
        self.report = report
        self.max_head_bytes = max_head_bytes
        self.header_timeout = header_timeout
        # Per client connection: the header timer armed now (stale wakeups are ignored).
        self._head_timers: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()

    def replacements(self) -> Iterable[Replacement]:
        original_handle_event = _http1.Http1Server._handle_event
        guard = self
        timers = self._head_timers

        def reading_head(self: _http1.Http1Server) -> bool:
            # By name: `state` is a bound method, and read_headers may be another patch's wrapper.
            return getattr(self.state, "__name__", "") == "read_headers"

        def refuse(
            self: _http1.Http1Server, status: int, kind: str, message: str
        ) -> Generator[Any, Any, None]:
            timers.pop(self, None)
            self.state = self.done
            yield commands.SendData(self.conn, _http1.make_error_response(status, message))
            yield commands.CloseConnection(self.conn)
            guard.report(kind)

        def _handle_event(self: _http1.Http1Server, event: Any) -> Generator[Any, Any, None]:
            if isinstance(event, events.Wakeup):
                if event.command is timers.get(self) and reading_head(self):
                    yield from refuse(
                        self,
                        408,
                        "header_timeout",
                        f"Request head not complete within {guard.header_timeout:g} seconds.",
                    )
                return  # a timer for a head that has since completed
            if isinstance(event, events.DataReceived) and reading_head(self):
                buffered = len(self.buf) + len(event.data)
                if buffered > guard.max_head_bytes:
                    data = bytes(self.buf) + event.data
                    match = _BLANK_LINE.search(data)
                    end = match.end() if match else None
                    if head_too_large(buffered, end, guard.max_head_bytes):
                        yield from refuse(
                            self,
                            431,
                            "header_too_large",
                            f"Request head larger than {guard.max_head_bytes} bytes.",
                        )
                        return
            if self.state == self.passthrough:
                # A tunnel (after CONNECT or an upgrade): no head is read any more, nothing to
                # look at in its commands. Each response through a tunnel is three events here.
                # No timer to drop either: the event that completed the head dropped it (below).
                yield from original_handle_event(self, event)
                return
            parsing = reading_head(self) and isinstance(event, events.DataReceived)
            commands_ = original_handle_event(self, event)
            reply = None
            rejected = False
            while True:
                try:
                    command = commands_.send(reply)
                except StopIteration:
                    break
                if (
                    isinstance(command, ReceiveHttp)
                    and isinstance(command.event, RequestHeaders)
                    # mitmproxy has answered 400 already (its framing check: a control
                    # character or an obs-fold in Content-Length or Transfer-Encoding)
                    and not rejected
                    and (name := bad_header_value(command.event.request.headers.fields))
                ):
                    commands_.close()
                    yield from refuse(
                        self, 400, "malformed", f"Control character in header field {name!r}."
                    )
                    return
                if isinstance(command, commands.CloseConnection) and parsing:
                    rejected = True  # mitmproxy's 400 for a head it could not parse
                reply = yield command
            if rejected and self.request is None:
                # With a parsed request the error hook sees it (client_errors addon).
                guard.report("malformed")
            if isinstance(event, events.Start) or (
                reading_head(self) and self.buf and self not in timers
            ):
                timer = commands.RequestWakeup(guard.header_timeout)
                timers[self] = timer
                yield timer
            elif not reading_head(self):
                timers.pop(self, None)

        yield _http1.Http1Server, "_handle_event", _handle_event
