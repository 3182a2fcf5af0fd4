"""An origin's own 103 Early Hints through `reshape run`: scripted origins (HTTPS over HTTP/2
and over HTTP/1.1) that send a 103 before each response; clients that show every 1xx (h2 over
the CONNECT tunnel, curl). A proxy forwards 1xx responses (RFC 9110 §15.2); reshape sends them on
to HTTP/2 clients, the ones browsers act on them over."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from labkit.pki import OriginPKI
from tests.support.clients import curl_heads, h2_get, statuses_in
from tests.support.reshape_process import StartProxy
from tests.support.scripted_origins import EarlyHintsOrigin

pytestmark = pytest.mark.slow


@pytest.fixture(params=["h2", "http/1.1"])
def origin(request: pytest.FixtureRequest, origin_pki: OriginPKI) -> Iterator[EarlyHintsOrigin]:
    """An HTTPS origin sending its own 103s, over HTTP/2 or HTTP/1.1 to the proxy."""
    with EarlyHintsOrigin(
        "127.0.0.9", origin_pki.issue(["127.0.0.9"]), alpn=(request.param,)
    ) as scripted:
        yield scripted


def policy(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(f"version: 1\ndefault: p\npolicies:\n  p: {body}\n")
    return path


@pytest.mark.parametrize("knobs", ["{}", "{upstream: {max_connections_per_host: 2}}"])
def test_an_origins_103_reaches_an_http2_client_before_the_response(
    start_reshape: StartProxy, origin: EarlyHintsOrigin, tmp_path: Path, knobs: str
) -> None:
    proxy = start_reshape(policy=policy(tmp_path, knobs))
    for path in ("/index.html", "/again.html"):  # a new connection, then a reused one
        answer = h2_get(proxy, origin, path, {"sec-fetch-dest": "document"})
        assert answer.informational == [{b":status": b"103", b"link": EarlyHintsOrigin.LINK}]
        assert (answer.status, answer.body) == (200, path.encode())
    # Not reshape's own hints: the knob is off (the default); counted as the origin's.
    assert proxy.metric("reshape_early_hints_total", policy="p") == 0
    forwarded = {"policy": "p", "status": "103", "outcome": "forwarded"}
    assert proxy.metric("reshape_origin_interim_responses_total", **forwarded) == 2
    assert proxy.metric("reshape_origin_interim_responses_total", outcome="dropped") == 0


def test_an_http1_client_gets_the_response_alone(
    start_reshape: StartProxy, origin: EarlyHintsOrigin, tmp_path: Path
) -> None:
    """mitmproxy's HTTP/1.1 server would take a 1xx for the response itself; browsers act on
    Early Hints over HTTP/2 and HTTP/3 only, so an HTTP/1.1 client is not told."""
    proxy = start_reshape(policy=policy(tmp_path, "{}"))
    heads = curl_heads(proxy, origin.url("/index.html"), "--http1.1")
    assert statuses_in(heads) == ["HTTP/1.1 200 OK"]
    dropped = {"status": "103", "outcome": "dropped"}
    assert proxy.metric("reshape_origin_interim_responses_total", **dropped) == 1
    assert statuses_in(curl_heads(proxy, origin.url("/index.html"), "--http2")) == [
        "HTTP/2 103",
        "HTTP/2 200",
    ]
