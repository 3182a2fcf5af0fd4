"""mitmproxy's run-time type check of every request and response it constructs, skipped."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from mitmproxy import http

from reshape.mitm.patches.base import Patch, Replacement


class SkipMessageTypecheck(Patch):
    """Construct requests and responses without checking each field's type at run time.

    Why: in mitmproxy 12.2.3 `MessageData.__post_init__` (http.py) checks every field of every
    request and response built with `typecheck.check_option_type` — about 5% of the proxy's CPU
    per request (py-spy, bench/overhead) — but only `if __debug__`: mitmproxy drops the check
    itself when Python runs with -O. reshape does not run with -O (its own assertions stay on);
    the messages are built by mitmproxy's parsers and by reshape's join
    (reshape/mitm/engine_channel.py) from values of the right types, and mypy checks the latter.
    """

    def replacements(self) -> Iterable[Replacement]:
        def __post_init__(self: Any) -> None:
            pass

        yield http.MessageData, "__post_init__", __post_init__
