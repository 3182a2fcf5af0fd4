"""reshape/features/request_streaming: which request bodies stream from their head (the rules,
and the addon that applies them to a flow)."""

from __future__ import annotations

import pytest
from mitmproxy import http
from mitmproxy.test import tflow

from reshape.features.request_streaming.addon import RequestStreaming


def flow_with(method: str, headers: list[tuple[bytes, bytes]]) -> http.HTTPFlow:
    flow = tflow.tflow()
    flow.request.method = method
    flow.request.headers = http.Headers(headers)
    return flow


@pytest.mark.parametrize(
    ("headers", "streams"),
    [
        ([(b"content-type", b"application/grpc"), (b"te", b"trailers")], True),
        ([(b"Content-Type", b"Application/GRPC+proto; charset=x")], True),
        ([(b"content-type", b"application/connect+json")], True),
        # A length: held whole (one write with its head, replayable).
        ([(b"content-length", b"5"), (b"content-type", b"application/grpc")], False),
        # Other bodies without a length are held as mitmproxy holds them (an HTTP/1.1 origin
        # gets a Content-Length), however they are framed.
        ([(b"Transfer-Encoding", b"chunked")], False),
        ([(b"content-type", b"application/octet-stream")], False),
        ([(b"content-type", b"application/grpc-web")], False),
        ([(b"content-type", b"application/grpcx")], False),
    ],
)
def test_a_grpc_calls_body_streams_from_its_head(
    headers: list[tuple[bytes, bytes]], streams: bool
) -> None:
    flow = flow_with("POST", headers)
    RequestStreaming().requestheaders(flow)
    assert flow.request.stream is streams


def test_a_request_answered_here_or_a_tunnel_is_left_as_it_is() -> None:
    answered = flow_with("POST", [(b"content-type", b"application/grpc")])
    answered.response = http.Response.make(407)
    tunnel = flow_with("CONNECT", [(b"content-type", b"application/grpc")])
    for flow in (answered, tunnel):
        RequestStreaming().requestheaders(flow)
        assert flow.request.stream is False
