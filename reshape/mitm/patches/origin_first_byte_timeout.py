"""A first-byte timeout on mitmproxy's own origin connections."""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Any

from mitmproxy import connection, flow, http, version
from mitmproxy.proxy import commands, events
from mitmproxy.proxy.layers import http as http_layers
from mitmproxy.proxy.layers.http._base import format_error
from mitmproxy.proxy.layers.http._events import (
    ErrorCode,
    RequestEndOfMessage,
    RequestProtocolError,
    ResponseData,
    ResponseEndOfMessage,
    ResponseHeaders,
)
from mitmproxy.proxy.layers.http._hooks import HttpErrorHook
from mitmproxy.utils import human

from reshape.mitm.engine_client import EngineServer
from reshape.mitm.patches.base import Patch, Replacement, relay


@dataclass
class _FirstByteTimer:
    """A request waiting for its response head: the pending timer it holds, when that timer is
    due, and when the request times out (later than `due` if it took over an older timer)."""

    timer: Any  # mitmproxy's commands.RequestWakeup
    due: float
    deadline: float


class _FirstByteWakeup(commands.RequestWakeup):
    """A first-byte timer: a stream's other wakeups (another patch's) are not this patch's."""


class _SpareTimers:
    """The pending first-byte timers of one `HttpLayer` that no request holds, by when they are
    due. The layer delivers a spare timer's wakeup here (its `command_sources` entry points
    here), which only forgets it."""

    def __init__(self) -> None:
        self.due: dict[Any, float] = {}

    def handle_event(self, event: Any) -> Generator[Any, Any, None]:
        self.due.pop(event.command, None)
        yield from ()


def _carried_by_engine(server: connection.Server) -> bool:
    return isinstance(server, EngineServer)


# A wakeup up to this early still counts as due (the event loop may run a timer a hair early).
_TIMER_SLACK = 0.001


class OriginFirstByteTimeout(Patch):
    """Answer 504 when an origin sends no response head within `timeout` seconds of the
    request's end.

    Why: `HttpStream` (proxy/layers/http/__init__.py) of mitmproxy 12.2.3 waits for a response
    head with no timer at all: only the idle `tcp_timeout` (600 s) ends the wait, and the client
    then gets no answer; no hook runs meanwhile. The patch arms a timer on each request once its
    end has gone to the origin (a `RequestWakeup`, mitmproxy's own mechanism for layer timers).
    Any event for the request — its response head, an error, the client leaving — disarms it.
    When it fires, the flow gets an error (the `error` hook runs), the request is cancelled at
    the origin (HTTP/1: the connection closes; HTTP/2: RST_STREAM CANCEL) and the client gets
    504. The timer lives in the per-request `HttpStream`, so HTTP/1 and HTTP/2 clients are
    treated alike; requests that legitimately wait longer (long polls) get the 504 too, as with
    the pool. Requests to connections `exempt` says yes to are left alone: by default the
    engine's (reshape/mitm/engine_client.py `EngineServer`), which times its own.

    mitmproxy cannot cancel a timer: a disarmed one stays pending until it is due, its wakeup
    pointed away from the request (which then keeps neither the stream nor its flow alive, and
    a stream that became a WebSocket after a 101 never sees it), and the next request of the
    same client connection takes it over instead of arming another.
    """

    def __init__(
        self, timeout: float, exempt: Callable[[connection.Server], bool] = _carried_by_engine
    ) -> None:
        super().__init__()
        self.timeout = timeout
        self.exempt = exempt
        # Per HttpStream waiting for its response head; per HttpLayer, its spare timers.
        self._armed: weakref.WeakKeyDictionary[Any, _FirstByteTimer] = weakref.WeakKeyDictionary()
        self._spares: weakref.WeakKeyDictionary[Any, _SpareTimers] = weakref.WeakKeyDictionary()

    def replacements(self) -> Iterable[Replacement]:
        patch = self
        _first_byte_timers = self._armed
        _spare_timers = self._spares
        HttpStream = http_layers.HttpStream
        SendHttp = http_layers.SendHttp
        original_handle_event = HttpStream._handle_event

        def parent_layer(stream: Any) -> Any:
            # As HttpStream.mode finds it: the HttpLayer right before the stream.
            layers = stream.context.layers
            return layers[layers.index(stream) - 1]

        def waiting_for_head(stream: Any) -> bool:
            return (
                stream.flow.response is None
                and stream.flow.error is None
                and stream.server_state == stream.state_wait_for_response_headers
            )

        def arm(stream: Any, delay: float) -> Generator[Any, Any, None]:
            deadline = time.monotonic() + delay
            layer = parent_layer(stream)
            spares = _spare_timers.get(layer)
            spare = (
                next((t for t, due in spares.due.items() if due <= deadline), None)
                if spares
                else None
            )
            if spares is not None and spare is not None:
                layer.command_sources[spare] = stream
                _first_byte_timers[stream] = _FirstByteTimer(spare, spares.due.pop(spare), deadline)
                return
            timer = _FirstByteWakeup(delay)
            _first_byte_timers[stream] = _FirstByteTimer(timer, deadline, deadline)
            yield timer  # the HttpLayer notes the stream as the timer's source

        def disarm(stream: Any) -> None:
            armed = _first_byte_timers.pop(stream)
            layer = parent_layer(stream)
            spares = _spare_timers.get(layer)
            if spares is None:
                spares = _spare_timers[layer] = _SpareTimers()
            layer.command_sources[armed.timer] = spares
            spares.due[armed.timer] = armed.due

        def time_out(stream: Any, timeouts: OriginFirstByteTimeout) -> Generator[Any, Any, None]:
            address = human.format_address(stream.context.server.address)
            message = f"{address} sent no response within {timeouts.timeout:g} s (read timeout)"
            stream.flow.error = flow.Error(message)
            stream.client_state = stream.server_state = stream.state_errored
            cancel = RequestProtocolError(stream.stream_id, message, ErrorCode.CANCEL)
            yield SendHttp(cancel, stream.context.server)
            yield HttpErrorHook(stream.flow)
            stream.flow.live = False
            if not (yield from stream.check_killed(False)):
                body = format_error(504, message)
                headers = http.Headers(Server=version.MITMPROXY, Content_Type="text/html")
                response = http.Response.make(504, body, headers)
                client = stream.context.client
                yield SendHttp(ResponseHeaders(stream.stream_id, response), client)
                if stream.flow.request.method != "HEAD":
                    yield SendHttp(ResponseData(stream.stream_id, body), client)
                yield SendHttp(ResponseEndOfMessage(stream.stream_id), client)
            yield http_layers.DropStream(stream.stream_id)

        def woken(stream: Any, event: Any) -> Generator[Any, Any, None]:
            armed = _first_byte_timers.get(stream)
            timeouts = patch
            if armed is None or armed.timer is not event.command:
                return  # not a timer this stream holds (disarmed ones go to the spares)
            del _first_byte_timers[stream]
            if not waiting_for_head(stream):
                return
            left = armed.deadline - time.monotonic()
            if left > _TIMER_SLACK:  # a timer taken over from an earlier request: due before ours
                timer = _FirstByteWakeup(left)
                _first_byte_timers[stream] = _FirstByteTimer(timer, armed.deadline, armed.deadline)
                yield timer
                return
            yield from time_out(stream, timeouts)

        def _handle_event(self: Any, event: Any) -> Generator[Any, Any, None]:
            # Not a generator itself: what needs no look at the commands goes to mitmproxy's own
            # generator (or `woken`) unwrapped, one generator frame fewer per event. Callers
            # iterate what `_handle_event` returns at once, so the disarming below happens when
            # it would have in a generator.
            if isinstance(event, events.Wakeup):
                if type(event.command) is _FirstByteWakeup:
                    return woken(self, event)
                return original_handle_event(self, event)  # another patch's timer
            if self in _first_byte_timers:
                # A head, an error or a client that left: no longer waiting for the head.
                disarm(self)
            if patch.exempt(self.context.server):
                # Its timers are someone else's (the engine's) and stay so for the stream: no
                # command needs looking at. Most events of the pooled path come this way, and
                # relaying each command in Python cost ~5% of the proxy's CPU (py-spy).
                return original_handle_event(self, event)
            return watched(self, event)

        def watched(self: Any, event: Any) -> Generator[Any, Any, None]:
            """The stream's commands, noting whether its request's end went to the origin: then
            its first-byte timer starts."""
            timeouts = patch
            sent_end = False

            def note_end(command: Any) -> list[Any]:
                nonlocal sent_end
                if (
                    isinstance(command, SendHttp)
                    and isinstance(command.event, RequestEndOfMessage)
                    and command.connection is self.context.server
                ):
                    sent_end = True
                return [command]

            yield from relay(original_handle_event(self, event), note_end)
            if sent_end and waiting_for_head(self) and not timeouts.exempt(self.context.server):
                yield from arm(self, timeouts.timeout)

        yield HttpStream, "_handle_event", _handle_event
