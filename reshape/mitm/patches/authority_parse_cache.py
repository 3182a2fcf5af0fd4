"""mitmproxy's parse of an authority (Host, `:authority`, a CONNECT target), once per text."""

from __future__ import annotations

import functools
from collections.abc import Iterable

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
    """

    def replacements(self) -> Iterable[Replacement]:
        cached = functools.lru_cache(maxsize=DISTINCT_AUTHORITIES)(url.parse_authority)
        yield url, "parse_authority", cached
