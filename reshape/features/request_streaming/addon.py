"""Streams a gRPC (or Connect) call's request body from its head
(reshape/features/request_streaming/rules.py decides).

Thin on purpose. Runs at `requestheaders`, after proxy authentication (which answers 407 with the
body held: mitmproxy cannot stream a body and answer it locally at once) and before the addons
that may answer locally after it (they set `stream` back to False).
"""

from __future__ import annotations

from mitmproxy import http

from reshape.features.request_streaming.rules import streams_from_head


class RequestStreaming:
    def requestheaders(self, flow: http.HTTPFlow) -> None:
        request = flow.request
        if flow.response is not None or request.stream:
            return
        if streams_from_head(request.method, request.headers.fields):
            request.stream = True
