"""The body-size check decided from the raw head (reshape/mitm/patches/body_size_check.py),
sans-IO: its reading of a head agrees with mitmproxy's wherever it gives an answer, and mitmproxy's
HttpLayer, driven by hand with reshape's `stream_large_bodies`, does the same with the patch as
without it: small bodies held, a large one streamed, one over `body_size_limit` refused."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from mitmproxy import http
from mitmproxy.net.http.http1 import expected_http_body_size
from mitmproxy.proxy import commands, events
from mitmproxy.proxy.layers import http as http_layers

from reshape.mitm.patches import Patches
from reshape.mitm.patches.body_size_check import CheckBodySizesFromHeads, expected_size
from tests.unit.mitm.patches.test_origin_first_byte_timeout import DrivenLayer, server_of

GET = b"GET http://origin.test/a HTTP/1.1\r\nHost: origin.test\r\n\r\n"


def request_with(method: bytes, *fields: tuple[bytes, bytes]) -> http.Request:
    request = http.Request.make(method.decode(), "http://origin.test/a")
    request.headers = http.Headers(list(fields))
    return request


def response_with(status: int, *fields: tuple[bytes, bytes]) -> http.Response:
    response = http.Response.make(status)
    response.headers = http.Headers(list(fields))
    return response


HEADS = [
    (request_with(b"GET"), None),
    (request_with(b"POST", (b"Content-Length", b"12")), None),
    (request_with(b"POST", (b"content-length", b"0")), None),
    (request_with(b"POST", (b"Transfer-Encoding", b"chunked")), None),
    (request_with(b"POST", (b"Content-Length", b"3"), (b"CONTENT-LENGTH", b"3")), None),
    (request_with(b"POST", (b"Content-Length", b"-1")), None),
    (request_with(b"POST", (b"Content-Length", b"")), None),
    (request_with(b"GET"), response_with(200, (b"Content-Length", b"5"))),
    (request_with(b"GET"), response_with(200, (b"Server", b"x"))),
    (request_with(b"GET"), response_with(200, (b"Transfer-Encoding", b"gzip, chunked"))),
    (request_with(b"GET"), response_with(200, (b"Content-Length", b"1 2"))),
    (request_with(b"HEAD"), response_with(200, (b"Content-Length", b"5000"))),
    (request_with(b"head"), response_with(200, (b"Content-Length", b"5000"))),
    (request_with(b"GET"), response_with(103, (b"Link", b"</a.css>"))),
    (request_with(b"GET"), response_with(204)),
    (request_with(b"GET"), response_with(304, (b"Content-Length", b"99"))),
    (request_with(b"CONNECT"), response_with(200, (b"Content-Length", b"99"))),
    (request_with(b"CONNECT"), response_with(407, (b"Content-Length", b"99"))),
]


@pytest.mark.parametrize(("request_", "response"), HEADS)
def test_the_size_read_from_the_head_is_mitmproxys_wherever_it_answers(
    request_: http.Request, response: http.Response | None
) -> None:
    ours = expected_size(request_, response)
    try:
        theirs = expected_http_body_size(request_, response)
    except ValueError:
        theirs = None
    if ours is not None:
        assert ours == theirs
    else:  # the patch hands these to mitmproxy: a coding, several or odd lengths
        fields = (response or request_).headers
        assert "transfer-encoding" in fields or not fields.get("content-length", "").isdigit()


@pytest.fixture
def readings(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[object]]:
    """Each time mitmproxy's HttpStream reads an expected size from a head itself."""
    seen: list[object] = []

    def counted(request: http.Request, response: http.Response | None = None) -> int | None:
        seen.append(response or request)
        return expected_http_body_size(request, response)

    monkeypatch.setattr(http_layers, "expected_http_body_size", counted)
    yield seen


def exchange(response_head: bytes, body: bytes, body_size_limit: str | None = None) -> list[str]:
    """A GET relayed by mitmproxy's HttpLayer with reshape's `stream_large_bodies`: what the
    client got, and whether the response streamed."""
    driven = DrivenLayer()
    driven.layer.context.options.stream_large_bodies = "1m"
    driven.layer.context.options.body_size_limit = body_size_limit
    flows: list[http.HTTPFlow] = []

    def seen(hook: commands.StartHook) -> None:
        if hook.name == "responseheaders":
            flows.append(hook.args()[0])

    driven.on_hook = seen
    out = driven.from_client(GET)
    server = server_of(out)
    out += driven.feed(events.DataReceived(server, response_head + body))
    sent = b"".join(
        c.data for c in out if isinstance(c, commands.SendData) and c.connection is driven.client
    )
    streamed = bool(flows and flows[0].response and flows[0].response.stream)
    return [sent.split(b"\r\n", 1)[0].decode(), f"{len(sent)} bytes", f"streamed={streamed}"]


CASES = [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", b"hello", None),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", b"5\r\nhello\r\n0\r\n\r\n", None),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2000000\r\n\r\n", b"x" * 2_000_000, None),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n", b"x" * 5000, "4k"),
]


@pytest.mark.parametrize(
    ("head", "body", "limit"), CASES, ids=["small", "chunked", "large", "over-limit"]
)
def test_the_layer_does_with_the_patch_what_it_did_without(
    head: bytes, body: bytes, limit: str | None
) -> None:
    before = exchange(head, body, limit)
    with Patches([CheckBodySizesFromHeads()]):
        after = exchange(head, body, limit)
    assert after == before


def test_a_small_response_is_held_without_mitmproxy_reading_its_head_again(
    readings: list[object],
) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"
    assert exchange(head, b"hello") == [
        "HTTP/1.1 200 OK",
        f"{len(head) + 5} bytes",
        "streamed=False",
    ]
    assert len(readings) == 1  # the response head: mitmproxy's own check reads it
    readings.clear()
    with Patches([CheckBodySizesFromHeads()]):
        assert exchange(head, b"hello")[2] == "streamed=False"
    assert readings == []


def test_a_large_response_still_streams_and_one_over_the_limit_is_still_refused() -> None:
    with Patches([CheckBodySizesFromHeads()]):
        large = exchange(b"HTTP/1.1 200 OK\r\nContent-Length: 2000000\r\n\r\n", b"x" * 2_000_000)
        refused = exchange(b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n", b"x" * 5000, "4k")
    assert large[0] == "HTTP/1.1 200 OK" and large[2] == "streamed=True"
    assert refused[0] == "HTTP/1.1 502 Bad Gateway"
