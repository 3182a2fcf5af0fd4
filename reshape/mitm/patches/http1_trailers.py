"""Trailer fields of HTTP/1 chunked messages, read and written by mitmproxy's HTTP/1 layers."""

from __future__ import annotations

import weakref
from collections.abc import Generator, Iterable
from typing import Any

import h11
from mitmproxy import http
from mitmproxy.proxy import commands
from mitmproxy.proxy.layers.http import _http1
from mitmproxy.proxy.layers.http._base import ReceiveHttp
from mitmproxy.proxy.layers.http._events import (
    RequestEndOfMessage,
    RequestTrailers,
    ResponseEndOfMessage,
    ResponseTrailers,
)

from reshape.mitm.patches.base import Patch, Replacement, relay


class TrailerKeepingReader:
    """h11's ChunkedReader, with the trailer fields of the end of message set aside."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.trailers: http.Headers | None = None

    def __call__(self, buf: Any) -> Any:
        event = self.inner(buf)
        if isinstance(event, h11.EndOfMessage) and event.headers:
            self.trailers = http.Headers(list(event.headers.raw_items()))
            return h11.EndOfMessage()
        return event

    def read_eof(self) -> Any:
        return self.inner.read_eof()


class CarryHttp1Trailers(Patch):
    """Read and write trailer fields of HTTP/1 chunked messages, in both directions.

    Why: mitmproxy 12.2.3 handles trailers only on HTTP/2 and HTTP/3. `Http1Connection.read_body`
    (proxy/layers/http/_http1.py) raises NotImplementedError when h11's chunked reader returns
    trailers, and `Http1Server.send` / `Http1Client.send` fail an assertion on a
    ResponseTrailers / RequestTrailers event — either way the whole client connection dies. No
    hook sees those bytes. This patch:

    - wraps the chunked body reader `make_body_reader` returns, so h11's end of message comes
      back without its fields; `read_body` then passes them up as a RequestTrailers /
      ResponseTrailers event just before the end of message, as the HTTP/2 layer does;
    - makes `send` keep a trailers event and write the fields in place of the bare last chunk
      (`0\\r\\n\\r\\n`) when the message is chunked; a message that is not chunked (or the
      response to a HEAD) has no room for them, and they are dropped.

    Everything else stays mitmproxy's own code: the patch only adds and replaces events and
    SendData commands around it. Field values come from h11, h2 or an addon, all of which refuse
    CR and LF in them.
    """

    def replacements(self) -> Iterable[Replacement]:
        original_make_body_reader = _http1.make_body_reader

        def make_body_reader(expected_size: int | None) -> Any:
            reader = original_make_body_reader(expected_size)
            return TrailerKeepingReader(reader) if expected_size is None else reader

        original_read_body = _http1.Http1Connection.read_body

        def read_body(self: _http1.Http1Connection, event: Any) -> Generator[Any, Any, None]:
            def trailers_first(command: Any) -> list[Any]:
                reader = self.body_reader
                if (
                    isinstance(command, ReceiveHttp)
                    and isinstance(command.event, (RequestEndOfMessage, ResponseEndOfMessage))
                    and isinstance(reader, TrailerKeepingReader)
                    and reader.trailers is not None
                ):
                    trailers, reader.trailers = reader.trailers, None
                    kind = (
                        RequestTrailers
                        if isinstance(command.event, RequestEndOfMessage)
                        else ResponseTrailers
                    )
                    return [ReceiveHttp(kind(command.event.stream_id, trailers)), command]
                return [command]

            yield from relay(original_read_body(self, event), trailers_first)

        pending: weakref.WeakKeyDictionary[Any, http.Headers] = weakref.WeakKeyDictionary()

        def with_trailers(
            original_send: Any,
            trailers_event: type[RequestTrailers | ResponseTrailers],
            end_event: type[RequestEndOfMessage | ResponseEndOfMessage],
        ) -> Any:
            def send(self: _http1.Http1Connection, event: Any) -> Generator[Any, Any, None]:
                if isinstance(event, trailers_event):
                    pending[self] = event.trailers  # sent with the end of message, if chunked
                    return
                trailers = pending.pop(self, None) if isinstance(event, end_event) else None
                if not trailers:  # nothing to put in the last chunk (and every CONNECT tunnel's
                    # data passes here): no command needs looking at
                    return (yield from original_send(self, event))

                def with_last_chunk(command: Any) -> list[Any]:
                    if (
                        trailers
                        and isinstance(command, commands.SendData)
                        and command.data == b"0\r\n\r\n"
                    ):
                        last_chunk = b"0\r\n%s\r\n" % bytes(trailers)
                        return [commands.SendData(command.connection, last_chunk)]
                    return [command]

                yield from relay(original_send(self, event), with_last_chunk)

            return send

        yield _http1, "make_body_reader", make_body_reader
        yield _http1.Http1Connection, "read_body", read_body
        yield (
            _http1.Http1Server,
            "send",
            with_trailers(_http1.Http1Server.send, ResponseTrailers, ResponseEndOfMessage),
        )
        yield (
            _http1.Http1Client,
            "send",
            with_trailers(_http1.Http1Client.send, RequestTrailers, RequestEndOfMessage),
        )
