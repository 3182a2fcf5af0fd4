"""The host a request is for, as mitmproxy's `Request.pretty_host` gives it, parsed once per
distinct authority.

`pretty_host` parses and validates the Host header or `:authority` (a regular expression, IDNA
decoding, a host check) on every call, ~20 µs; the policy chooser, the request log and the
onboarding site each ask for it per request, with the same few authorities over and over. The
answer depends only on the authority's text, so it is cached by that text (bounded: an LRU).
"""

from __future__ import annotations

import functools

from mitmproxy import http
from mitmproxy.net.http import url

_DISTINCT_AUTHORITIES = 4096


def pretty_host(request: http.Request) -> str:
    """`request.pretty_host`, the authority's parse cached."""
    authority = request.host_header
    if authority:
        return _host_of(authority)
    return request.host


@functools.lru_cache(maxsize=_DISTINCT_AUTHORITIES)
def _host_of(authority: str) -> str:
    return url.parse_authority(authority, check=False)[0]
