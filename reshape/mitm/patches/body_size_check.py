"""The body-size check of every request and response decided from the raw head when it can be.

Why a patch: mitmproxy 12.2.3's `HttpStream.check_body_size` (proxy/layers/http/__init__.py)
runs for each request head, each response head and each piece of a response body it holds, and
reshape always sets `stream_large_bodies`, so it never returns early: each time it parses both
size options (`human.parse_size`) and, before the body, works out the expected size with
`expected_http_body_size`, which reads Transfer-Encoding and Content-Length through mitmproxy's
case-insensitive multidict (every field name decoded and lowercased, once per lookup): ~4 µs
per head, timed alone, where the replacement takes ~0.7 (about 0.5% of the pool's CPU per
request, bench/RESULTS.md; py-spy's samples in the lab's page loads had put it higher). No hook
runs before the check.

The replacement decides the common cases itself and hands every other to mitmproxy's own:

- each option value is parsed once (per distinct value);
- the expected size is the body already held; or, before the body, the one Content-Length of a
  message without Transfer-Encoding, if it is all digits (names compared lowercased, as bytes,
  straight from the fields); or 0 where there is no body (the response to a HEAD or to a
  CONNECT that succeeded, 1xx, 204, 304, a request with neither field); or -1 for a response
  with neither (read until the connection closes);
- a size not above zero or not above any limit needs nothing, as in mitmproxy's own (which then
  returns False without a command). Anything else (a body over a limit, Transfer-Encoding,
  several or odd Content-Lengths) goes to mitmproxy's check, which does what it always did.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable
from typing import Any

from mitmproxy import http
from mitmproxy.proxy.layers.http import HttpStream
from mitmproxy.utils import human

from reshape.mitm.patches.base import Patch, Replacement

_NO_BODY_STATUS = frozenset({204, 304})


def expected_size(request: http.Request, response: http.Response | None) -> int | None:
    """`expected_http_body_size(request, response)` for the common heads; None where the
    answer needs mitmproxy's own reading (Transfer-Encoding, several or odd Content-Lengths)."""
    if response is not None:
        status = response.status_code
        method = request.data.method.upper()
        if (
            method == b"HEAD"
            or 100 <= status <= 199
            or status in _NO_BODY_STATUS
            or (200 <= status <= 299 and method == b"CONNECT")
        ):
            return 0
        fields = response.data.headers.fields
    else:
        fields = request.data.headers.fields
    length: bytes | None = None
    for name, value in fields:
        lowered = name.lower()
        if lowered == b"content-length":
            if length is not None:
                return None
            length = value
        elif lowered == b"transfer-encoding":
            return None
    if length is None:
        return 0 if response is None else -1
    return int(length) if length.isdigit() else None


class CheckBodySizesFromHeads(Patch):
    """`HttpStream.check_body_size` without re-reading the head through the multidict (see the
    module docstring)."""

    def replacements(self) -> Iterable[Replacement]:
        original = HttpStream.check_body_size
        parsed: dict[str | None, int | None] = {}

        def limit_of(value: str | None) -> int | None:
            try:
                return parsed[value]
            except KeyError:
                size = parsed[value] = human.parse_size(value)
                return size

        def check_body_size(self: HttpStream, request: bool) -> Generator[Any, Any, bool]:
            options = self.context.options
            stream_limit = options.stream_large_bodies
            total_limit = options.body_size_limit
            if not (stream_limit or total_limit):
                return False
            held = self.request_body_buf if request else self.response_body_buf
            if held:
                size: int | None = len(held)
            else:
                size = expected_size(self.flow.request, None if request else self.flow.response)
            if size is not None:
                if size <= 0:
                    return False
                stream_max, total_max = limit_of(stream_limit), limit_of(total_limit)
                if (stream_max is None or size <= stream_max) and (
                    total_max is None or size <= total_max
                ):
                    return False
            return bool((yield from original(self, request)))

        yield HttpStream, "check_body_size", check_body_size
