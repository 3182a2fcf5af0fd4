from __future__ import annotations

import pytest
from mitmproxy.test import tutils

from reshape.base.request_host import _host_of, pretty_host


@pytest.mark.parametrize(
    ("http_version", "host_header", "authority"),
    [
        ("HTTP/1.1", "Example.COM:8080", ""),
        ("HTTP/1.1", "[::1]:443", ""),
        ("HTTP/1.1", "xn--bcher-kva.example", ""),
        ("HTTP/1.1", "not a host", ""),  # malformed: mitmproxy gives the text back
        ("HTTP/1.1", None, ""),  # no Host header: the request's own host
        ("HTTP/2.0", None, "api.example:443"),
        ("HTTP/2.0", "ignored.example", "api.example"),
    ],
)
def test_the_host_is_mitmproxys_pretty_host(
    http_version: str, host_header: str | None, authority: str
) -> None:
    request = tutils.treq(host="10.0.0.1", authority=authority.encode(), http_version=http_version)
    if host_header is None:
        request.headers.pop("Host", None)
    else:
        request.headers["Host"] = host_header
    assert pretty_host(request) == request.pretty_host


def test_an_authority_is_parsed_once() -> None:
    request = tutils.treq()
    request.headers["Host"] = "once.example:8443"
    pretty_host(request)
    misses = _host_of.cache_info().misses
    for _ in range(3):
        assert pretty_host(request) == "once.example"
    assert _host_of.cache_info().misses == misses
