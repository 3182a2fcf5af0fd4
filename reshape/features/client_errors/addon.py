"""Counts bad input from clients in `reshape_client_errors_total{kind}`.

Two sources, one counter:

- the `error` hook, for what mitmproxy refuses once a flow exists: ambiguous framing
  (Content-Length with Transfer-Encoding, several Content-Lengths — smuggling), invalid header
  names, a broken chunked body, a body cut short (reshape/features/client_errors/rules.py
  `classify_flow_error`);
- `report(kind)`, called by the GuardHttp1Heads and GuardHttp2Floods patches for what no hook sees:
heads that
  are too large or too slow, control characters in header values, heads mitmproxy cannot parse,
  HTTP/2 floods and protocol errors.

Errors caused by origins, and clients that leave after their request was whole, are not client
errors; Telemetry counts those as request outcomes.
"""

from __future__ import annotations

import logging

from mitmproxy import http

from reshape.features.client_errors.rules import CLIENT_ERROR_KINDS, classify_flow_error
from reshape.features.telemetry import metrics

log = logging.getLogger("reshape.client_errors")


class ClientErrors:
    def report(self, kind: str) -> None:
        """Count one client error of `kind` (one of CLIENT_ERROR_KINDS)."""
        if kind not in CLIENT_ERROR_KINDS:  # a label outside the bounded set is a bug of ours
            log.error("unknown client error kind %r", kind)
            return
        metrics.labelled(metrics.client_errors_total, kind).inc()

    def error(self, flow: http.HTTPFlow) -> None:
        if flow.error is None:
            return
        kind = classify_flow_error(flow.error.msg, flow.request.timestamp_end is not None)
        if kind is not None:
            self.report(kind)
