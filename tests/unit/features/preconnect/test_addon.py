"""reshape/features/preconnect/addon.py: its pure helpers (the hooks run end to end in
test_preconnect_through_proxy.py)."""

from __future__ import annotations

import pytest
from mitmproxy.test import tutils

from reshape.features.pool.routes import Destination
from reshape.features.preconnect.addon import is_navigation, origin_of, referer_origin


@pytest.mark.parametrize(
    ("method", "headers", "navigation"),
    [
        ("GET", {"sec-fetch-dest": "document"}, True),
        ("GET", {"sec-fetch-dest": "iframe", "accept": "text/html"}, False),
        ("GET", {"sec-fetch-dest": "image"}, False),
        ("GET", {"accept": "text/html,application/xhtml+xml"}, True),  # no Fetch Metadata
        ("POST", {"accept": "text/html"}, False),
        ("GET", {"accept": "*/*"}, False),
    ],
)
def test_is_navigation(method: str, headers: dict[str, str], navigation: bool) -> None:
    request = tutils.treq(method=method.encode())
    request.headers.clear()
    request.headers.update(headers)
    assert is_navigation(request) is navigation


@pytest.mark.parametrize(
    ("referer", "origin"),
    [
        ("https://News.test/a/b?c", "https://news.test:443"),
        ("http://news.test:8080/", "http://news.test:8080"),
        ("https://[::1]:8443/x", "https://[::1]:8443"),
        ("ftp://news.test/", None),
        ("https://news.test:99999/", None),  # a port out of range
        ("not a url", None),
        ("", None),
    ],
)
def test_referer_origin(referer: str, origin: str | None) -> None:
    request = tutils.treq()
    request.headers["referer"] = referer
    assert referer_origin(request) == origin


def test_a_request_without_referer_has_no_referer_origin() -> None:
    request = tutils.treq()
    request.headers.pop("referer", None)
    assert referer_origin(request) is None


@pytest.mark.parametrize(
    ("origin", "destination"),
    [
        ("https://cdn.test:443", Destination("https", "cdn.test", 443, "cdn.test")),
        ("https://127.0.0.3:8443", Destination("https", "127.0.0.3", 8443, None)),
        ("http://cdn.test:80", Destination("http", "cdn.test", 80, None)),
        ("https://[::1]:443", Destination("https", "::1", 443, None)),
        ("ftp://cdn.test:21", None),
        ("https://cdn.test", None),  # origins are stored with their port
    ],
)
def test_a_learned_origin_is_the_destination_a_request_would_get(
    origin: str, destination: Destination | None
) -> None:
    assert Destination.of_origin(origin) == destination


def test_origin_of_lowercases_and_brackets() -> None:
    assert origin_of("https", "CDN.test", 443) == "https://cdn.test:443"
    assert origin_of("https", "::1", 8443) == "https://[::1]:8443"
