"""What reshape answers a request with itself (a refusal, a challenge, a page of its own), fit
for the request's method.

mitmproxy 12.2.3 sends a response an addon sets as it is, body included, whatever the request's
method (`HttpStream.send_response`, proxy/layers/http/__init__.py). To a HEAD request the body
must not go (RFC 9110 §9.3.2): an HTTP/1.1 client reads it as the start of its next response on
the connection, which then fails (httpx: "illegal status line").
"""

from __future__ import annotations

from mitmproxy import http


def answer_to(request: http.Request, response: http.Response) -> http.Response:
    """`response` as the answer to `request`: to HEAD, its head alone, with the length a GET's
    body would have (RFC 9110 §8.6)."""
    if request.method.upper() == "HEAD":
        body = response.raw_content or b""
        response.raw_content = b""
        response.headers["Content-Length"] = str(len(body))
    return response
