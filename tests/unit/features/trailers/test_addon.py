"""reshape/features/trailers/addon.py on mitmproxy test flows: hooks called as the proxy calls them,
no sockets.

tests/system/features/trailers/test_through_proxy.py has the real clients, origins and the proxy."""

from __future__ import annotations

from pathlib import Path

import pytest
from mitmproxy import http
from mitmproxy.test import tflow

from reshape.features.telemetry import metrics
from reshape.features.telemetry.addon import ByteCounter, Telemetry
from reshape.features.trailers.addon import DigestingStream, Trailers
from reshape.features.trailers.rules import ContentDigest
from reshape.policy.chooser import PolicyChooser
from reshape.policy.loader import parse_policy_text

POLICY = """
version: 1
default: auto
policies:
  auto: {}
  strip: {trailers: {mode: strip}}
  forward: {trailers: {mode: forward}}
  promote: {trailers: {mode: promote, promote_fields: [Set-Cookie], max_promote_buffer: 100}}
  digest: {trailers: {synthesize: [content-digest]}}
rules:
  - {match: {destination: "strip.example"}, policy: strip}
  - {match: {destination: "forward.example"}, policy: forward}
  - {match: {destination: "promote.example"}, policy: promote}
  - {match: {destination: "digest.example"}, policy: digest}
"""
CHOOSER = PolicyChooser(parse_policy_text(POLICY, Path("unit.yaml")))
ORIGIN_TRAILERS = [(b"Server-Timing", b"db;dur=5"), (b"Set-Cookie", b"a=1"), (b"Host", b"evil")]


def exchange(
    host: str,
    *,
    client: str = "HTTP/1.1",
    te: str = "",
    origin: str = "HTTP/1.1",
    body: bytes = b"0123456789",
    chunked: bool | None = True,  # None: neither Transfer-Encoding nor Content-Length
    method: str = "GET",
) -> tuple[http.HTTPFlow, Trailers, Telemetry]:
    """A flow through Telemetry and the addon up to its response head, as mitmproxy runs them."""
    flow = tflow.tflow(resp=True)
    flow.request.host = host
    flow.request.method = method
    flow.request.http_version = client
    if te:
        flow.request.headers["te"] = te
    response = flow.response
    assert response is not None
    response.http_version = origin
    response.headers.clear()
    if chunked:
        response.headers["transfer-encoding"] = "chunked"
    elif chunked is False:
        response.headers["content-length"] = str(len(body))
    response.raw_content = body
    CHOOSER.requestheaders(flow)
    telemetry, addon = Telemetry(), Trailers()
    telemetry.requestheaders(flow)
    addon.requestheaders(flow)
    telemetry.responseheaders(flow)
    addon.responseheaders(flow)
    return flow, addon, telemetry


def finish(
    flow: http.HTTPFlow, addon: Trailers, telemetry: Telemetry, trailers: list[tuple[bytes, bytes]]
) -> http.Response:
    """The body passes (through the stream callable if there is one), the origin's trailers
    arrive, the response hook runs."""
    response = flow.response
    assert response is not None
    if callable(response.stream):
        response.stream(response.raw_content or b"")
        response.stream(b"")
    response.trailers = http.Headers(trailers) if trailers else None
    telemetry.response(flow)
    addon.response(flow)
    return response


def count(policy: str, action: str) -> float:
    value = metrics.trailers_total.labels(policy, "none", action)._value.get()
    return float(value)


def test_auto_forwards_to_a_client_that_sent_te_trailers_without_forbidden_fields() -> None:
    before = count("auto", "forwarded"), count("auto", "stripped")
    flow, addon, telemetry = exchange("auto.example", te="trailers")
    response = finish(flow, addon, telemetry, ORIGIN_TRAILERS)
    assert response.trailers is not None
    assert list(response.trailers.items(multi=True)) == [
        ("Server-Timing", "db;dur=5"),
        ("Set-Cookie", "a=1"),
    ]
    assert count("auto", "forwarded") == before[0] + 1
    assert count("auto", "stripped") == before[1] + 1  # Host was dropped


@pytest.mark.parametrize(
    ("host", "client", "te"),
    [
        ("auto.example", "HTTP/1.1", ""),
        ("auto.example", "HTTP/1.1", "gzip"),
        ("strip.example", "HTTP/2.0", "trailers"),
        ("forward.example", "HTTP/1.0", ""),
    ],
)
def test_clients_that_cannot_take_trailers_get_none(host: str, client: str, te: str) -> None:
    policy = host.split(".")[0]
    before = count(policy, "stripped")
    flow, addon, telemetry = exchange(host, client=client, te=te)
    response = finish(flow, addon, telemetry, ORIGIN_TRAILERS)
    assert not response.trailers
    assert count(policy, "stripped") == before + 1


def test_http2_clients_get_trailers_in_auto_mode() -> None:
    flow, addon, telemetry = exchange("auto.example", client="HTTP/2.0", chunked=False)
    response = finish(flow, addon, telemetry, ORIGIN_TRAILERS[:1])
    assert response.trailers is not None
    # HTTP/2 field names are lower case: a client would reset the stream over "Server-Timing".
    assert response.trailers.fields == ((b"server-timing", b"db;dur=5"),)


def test_an_http2_response_without_a_length_is_chunked_for_an_http1_client_taking_trailers() -> (
    None
):
    with_length, _, _ = exchange("forward.example", origin="HTTP/2.0", chunked=False)
    assert with_length.response is not None
    assert "transfer-encoding" not in with_length.response.headers  # framing left alone
    without, _, _ = exchange("forward.example", origin="HTTP/2.0", chunked=None)
    assert without.response is not None
    # Else it would reach the client delimited by the connection's close, with no room for them.
    assert without.response.headers["transfer-encoding"] == "chunked"


def test_trailers_of_a_body_with_a_length_to_an_http1_client_are_stripped() -> None:
    flow, addon, telemetry = exchange("forward.example", origin="HTTP/2.0", chunked=False)
    response = finish(flow, addon, telemetry, ORIGIN_TRAILERS[:1])
    assert not response.trailers  # an HTTP/1.1 body with Content-Length has no room for them


def test_promote_holds_a_small_body_and_moves_allowed_fields_into_the_head() -> None:
    before = count("promote", "promoted")
    flow, addon, telemetry = exchange("promote.example")
    response = flow.response
    assert response is not None
    assert response.stream is False  # Telemetry would have streamed it (no length)
    finish(flow, addon, telemetry, ORIGIN_TRAILERS)
    assert response.headers.get_all("set-cookie") == ["a=1"]
    assert "server-timing" not in response.headers  # not in promote_fields
    assert not response.trailers
    assert count("promote", "promoted") == before + 1


def test_promote_holds_a_body_without_a_length_for_an_http10_client() -> None:
    # The engine's head for an HTTP/1.0 client is neither chunked nor HTTP/2 (it has no
    # chunked coding), whatever the origin: without a length, trailers may still follow.
    before = count("promote", "promoted")
    flow, addon, telemetry = exchange("promote.example", client="HTTP/1.0", chunked=None)
    response = flow.response
    assert response is not None
    assert response.stream is False
    finish(flow, addon, telemetry, ORIGIN_TRAILERS)
    assert response.headers.get_all("set-cookie") == ["a=1"]
    assert "transfer-encoding" not in response.headers and not response.trailers
    assert count("promote", "promoted") == before + 1


def test_promote_streams_a_body_above_the_limit_and_strips() -> None:
    before = count("promote", "stripped")
    flow, addon, telemetry = exchange(
        "promote.example", origin="HTTP/2.0", chunked=False, body=b"x" * 101
    )
    response = flow.response
    assert response is not None
    assert "set-cookie" not in response.headers
    assert not response.stream  # small with a length: Telemetry relays it whole anyway
    finish(flow, addon, telemetry, ORIGIN_TRAILERS)
    assert "set-cookie" not in response.headers and not response.trailers
    assert count("promote", "stripped") == before + 1


def test_promote_forwards_to_clients_that_take_trailers() -> None:
    flow, addon, telemetry = exchange("promote.example", client="HTTP/2.0")
    response = finish(flow, addon, telemetry, ORIGIN_TRAILERS)
    assert "set-cookie" not in response.headers
    assert response.trailers is not None and response.trailers["set-cookie"] == "a=1"


def test_synthesize_wraps_telemetrys_counter_and_adds_the_digest() -> None:
    before = count("digest", "synthesized")
    body = b"y" * 100_000
    flow, addon, telemetry = exchange("digest.example", client="HTTP/2.0", body=body)
    response = flow.response
    assert response is not None
    assert isinstance(response.stream, DigestingStream)
    assert isinstance(response.stream.inner, ByteCounter)
    bytes_before = metrics.response_bytes_total.labels("digest", "none")._value.get()
    finish(flow, addon, telemetry, [])
    assert response.trailers is not None
    assert response.trailers["content-digest"] == ContentDigest([body]).value()
    assert count("digest", "synthesized") == before + 1
    # Telemetry still counted the streamed bytes through the wrapper.
    assert metrics.response_bytes_total.labels("digest", "none")._value.get() == (
        bytes_before + len(body)
    )


def test_synthesize_for_an_http1_client_switches_a_body_with_length_to_chunked() -> None:
    body = b"z" * 10
    flow, addon, telemetry = exchange("digest.example", te="trailers", body=body, chunked=False)
    response = flow.response
    assert response is not None
    assert response.headers["transfer-encoding"] == "chunked"
    assert "content-length" not in response.headers
    finish(flow, addon, telemetry, [])
    assert response.trailers is not None
    assert response.trailers["content-digest"] == ContentDigest([body]).value()


def test_no_digest_for_a_head_request() -> None:
    flow, addon, telemetry = exchange(
        "digest.example", client="HTTP/2.0", method="HEAD", body=b"", chunked=False
    )
    response = finish(flow, addon, telemetry, [])
    assert not response.trailers


def test_each_client_connection_is_surveyed_once() -> None:
    def survey(accepts: str) -> float:
        return float(metrics.clients_total.labels(accepts, "curl")._value.get())

    before = survey("yes"), survey("no")
    addon = Trailers()
    first = tflow.tflow()
    first.request.headers["user-agent"] = "curl/8.0"
    first.request.headers["te"] = "trailers"
    addon.requestheaders(first)
    second = tflow.tflow()
    second.client_conn = first.client_conn
    addon.requestheaders(second)
    other = tflow.tflow()
    other.request.headers["user-agent"] = "curl/8.0"
    addon.requestheaders(other)
    assert (survey("yes"), survey("no")) == (before[0] + 1, before[1] + 1)
    addon.client_disconnected(first.client_conn)
    assert first.client_conn.id not in addon._surveyed
