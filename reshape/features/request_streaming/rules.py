"""Which request bodies stream to the origin from their head, decided on the head's fields.

mitmproxy 12.2.3 holds a request body until it has it whole, or until it passes
`stream_large_bodies` (1 MiB, reshape/app/runtime.py) when its length is unknown. For a gRPC call
(or a Connect-protocol stream) that is a deadlock: its client sends a message and waits for the
answer before it sends the next, and the origin never gets the first. Such a body streams from
its head on; the engine sends it as it comes and hands the origin's answer back while it still
goes (reshape/upstream/h2.py, `_head_while_sending`).

Other bodies without a Content-Length (a `fetch()` with a ReadableStream body, `curl -T -`) are
held as mitmproxy holds them, and so are bodies with one. Held whole, a small body leaves with a
Content-Length the engine adds: an HTTP/1.1 origin gets it framed as most accept (many answer
a chunked request body 411), with its head in one write (reshape/features/split_requests), and a
stream the origin refuses can be sent again. Those clients do not wait for an answer before
they finish their body (a browser's fetch is half duplex), so holding them costs latency, not
progress.
"""

from __future__ import annotations

from collections.abc import Iterable

# gRPC (`application/grpc`, `application/grpc+proto`, …) and the Connect protocol's streams
# (`application/connect+proto`, …): both bidirectional over HTTP/2.
STREAMING_MEDIA_TYPES = (b"application/grpc", b"application/connect")


def streams_from_head(method: str, fields: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether a request's body (if it has one) streams from its head: a gRPC or Connect
    stream's, without a Content-Length. A tunnel's CONNECT has no body to stream. (A request
    without a body at all is not streamed by mitmproxy whatever this says: it streams only a
    body still to come.)"""
    if method.upper() == "CONNECT":
        return False
    media = b""
    for name, value in fields:
        lowered = name.lower()
        if lowered == b"content-length":
            return False
        if lowered == b"content-type":
            media = value.split(b";", 1)[0].strip().lower()
    return any(media == kind or media.startswith(kind + b"+") for kind in STREAMING_MEDIA_TYPES)
