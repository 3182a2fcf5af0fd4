"""mitmproxy's parse of an authority (Host, `:authority`, a CONNECT target), and its decoding
from bytes, once per text."""

from __future__ import annotations

import functools
from collections.abc import Iterable

from mitmproxy import http
from mitmproxy.net.http import url

from reshape.mitm.patches.base import Patch, Replacement

# Distinct (authority, check) pairs kept; a gateway's clients ask for far fewer hosts at once.
DISTINCT_AUTHORITIES = 4096


class CacheAuthorityParses(Patch):
    """Answer `mitmproxy.net.http.url.parse_authority` from a bounded cache.

    Why: in mitmproxy 12.2.3 `parse_authority` matches a regular expression, decodes the host
    with Python's `idna` codec (written in Python, label by label) and checks it
    (`net.check.is_valid_host`) on every call: for every HTTP/2 request
    (`_http2.parse_h2_request_headers`), every HTTP/1 request line with an authority
    (`http1/read.py`), every `Request.pretty_host` and `pretty_url` an addon reads (the policy
    chooser, the request log and the onboarding site each read one per request). In
    bench/overhead's h2 rows the codec and the parse were 3.3% of the pool's CPU (py-spy). No hook
    sees these calls; the function is pure (its answer depends only on its two arguments, and a
    (host, port) tuple cannot be changed by a caller), so the callers get the same answers from a
    cache. A malformed authority is not cached: `check=True` raises ValueError on every call, as
    before.

    Likewise `Request.authority`'s reading (not its setting): it decodes the request's authority
    bytes with the `idna` codec on every read, and `host_header` and `pretty_host` read it (the
    engine's request, the onboarding site's and the request log's checks: 1.8% of the pool's CPU
    in a profile of bursts of browser-like HTTP/2 requests, py-spy). The decoding is a pure
    function of the bytes, so it comes from a cache too.
    """

    def replacements(self) -> Iterable[Replacement]:
        cached = functools.lru_cache(maxsize=DISTINCT_AUTHORITIES)(url.parse_authority)
        yield url, "parse_authority", cached
        original = http.Request.authority
        assert isinstance(original, property) and original.fget is not None

        @functools.lru_cache(maxsize=DISTINCT_AUTHORITIES)
        def decoded(raw: bytes) -> str:
            try:
                return raw.decode("idna")
            except UnicodeError:
                return raw.decode("utf8", "surrogateescape")

        def authority(self: http.Request) -> str:
            return decoded(self.data.authority)

        authority.__doc__ = original.__doc__
        yield http.Request, "authority", property(authority, original.fset)
