"""Removes the hop-by-hop fields of every request before it leaves for an origin, on either path
(reshape/features/request_framing/rules.py `end_to_end` decides).

Thin on purpose. Runs at `requestheaders`, after proxy authentication has read its
Proxy-Authorization and before the pool addon (at `request`) or mitmproxy (after `request`)
sends the request on. The rest of the feature needs mitmproxy's protocol layers and lives in
reshape/mitm/patches/request_framing.py: refusals (400) and the Host of HTTP/1 requests.
"""

from __future__ import annotations

from mitmproxy import http

from reshape.features.request_framing.rules import RequestHead, end_to_end


class RequestFraming:
    def requestheaders(self, flow: http.HTTPFlow) -> None:
        request = flow.request
        if request.method.upper() == "CONNECT":
            return  # a tunnel: nothing of it goes to an origin as an HTTP request
        head = RequestHead(
            request.http_version,
            request.method.upper(),
            request.data.authority or None,
            request.headers.fields,
        )
        request.headers.fields = tuple(end_to_end(head))
