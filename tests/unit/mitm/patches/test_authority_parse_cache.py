"""reshape/mitm/patches/authority_parse_cache.py: the same answers, each text parsed once."""

from __future__ import annotations

import pytest
from mitmproxy.net.http import url
from mitmproxy.test import tutils

from reshape.mitm.patches import Patches
from reshape.mitm.patches.authority_parse_cache import CacheAuthorityParses

AUTHORITIES = [
    "example.com",
    "Example.COM:8080",
    b"api.example:443",
    "[::1]:8443",
    "xn--bcher-kva.example",
    b"b\xc3\xbccher.example",
    "127.0.0.1:65535",
]
MALFORMED = ["exa mple.com", "example.com:99999", b"\xff\xfe", ""]


@pytest.mark.parametrize("authority", AUTHORITIES + MALFORMED)
@pytest.mark.parametrize("check", [True, False])
def test_answers_as_mitmproxy_does(authority: str | bytes, check: bool) -> None:
    def answer() -> object:
        try:
            return url.parse_authority(authority, check=check)
        except ValueError:
            return ValueError

    expected = answer()
    with Patches([CacheAuthorityParses()]):
        assert answer() == expected
        assert answer() == expected  # from the cache, or raised again


def test_each_text_is_parsed_once_and_malformed_ones_raise_every_time() -> None:
    patch = CacheAuthorityParses()
    with Patches([patch]):
        cached = url.parse_authority
        cached("once.example:8443", check=False)
        misses = cached.cache_info().misses  # type: ignore[attr-defined]
        for _ in range(3):
            assert url.parse_authority("once.example:8443", check=False) == ("once.example", 8443)
        assert cached.cache_info().misses == misses  # type: ignore[attr-defined]
        for _ in range(2):
            with pytest.raises(ValueError):
                url.parse_authority("exa mple.com", check=True)


def test_requests_read_their_host_through_it_and_uninstall_restores_the_original() -> None:
    original = url.parse_authority
    with Patches([CacheAuthorityParses()]):
        info = url.parse_authority.cache_info  # type: ignore[attr-defined]
        request = tutils.treq()
        request.headers["Host"] = "shop.example:8080"
        before = info()
        assert request.pretty_host == request.pretty_host == "shop.example"
        assert (info().misses, info().hits) == (before.misses + 1, before.hits + 1)
    assert url.parse_authority is original


@pytest.mark.parametrize(
    "raw", [b"example.com:443", b"EXAMPLE.com", b"xn--bcher-kva.example", b"b\xc3\xbccher", b""]
)
def test_a_request_reads_its_authority_as_before_and_sets_it_as_before(raw: bytes) -> None:
    request = tutils.treq()
    request.data.authority = raw
    expected = request.authority
    with Patches([CacheAuthorityParses()]):
        assert request.authority == request.authority == expected
        request.authority = "b\u00fccher.example"  # the setter: mitmproxy's own
        assert request.data.authority == b"xn--bcher-kva.example"
        assert request.authority == "b\u00fccher.example"
    request.data.authority = raw
    assert request.authority == expected  # uninstalled: mitmproxy's property again
