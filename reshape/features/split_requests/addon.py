"""Counts client requests whose head and body arrived in separate reads, by client family.

Most browsers send a POST's head and body as two TCP segments; that is what this shows, per
family of client (reshape/base/client_family.py). A request counts when its first body bytes came in
a
later read from the client socket than the end of its head (HTTP/1.1 and HTTP/2 alike; for a TLS
client, a read is whatever was decrypted from one socket read). Two segments read at once count as
one read, so a busy proxy sees fewer splits than the client made. A request with
`Expect: 100-continue` is not counted: its client waits for the proxy before sending the body.

The ReportSplitRequests patch (reshape/mitm/patches/split_requests.py) calls `request_split`, at the
moment the split is seen.
"""

from __future__ import annotations

from mitmproxy import http

from reshape.base.client_family import client_family
from reshape.features.telemetry import metrics


class SplitRequests:
    def request_split(self, request: http.Request) -> None:
        if "100-continue" in request.headers.get("expect", "").lower():
            return
        family = client_family(request.headers.get("user-agent", ""))
        metrics.client_split_requests_total.labels(family).inc()
