"""Which family of HTTP client a User-Agent names: a small, fixed set, fit for a metric label.

Families are network stacks, not brands: what the metrics compare is how clients put requests on
the wire. Every browser on iOS must use WebKit's networking, so Chrome (CriOS), Firefox (FxiOS) and
Edge (EdgiOS) on iOS are `safari`; Edge, Opera, Brave, Samsung Internet and other Blink browsers
are `chromium`. Legacy EdgeHTML Edge (`Edge/`) claims Chrome but is not: `other`.
"""

from __future__ import annotations

import re

CLIENT_FAMILIES = ("chromium", "firefox", "safari", "curl", "other")

_IOS = re.compile(r"\((?:iPhone|iPad|iPod)\b")


def client_family(user_agent: str) -> str:
    """One of CLIENT_FAMILIES for a User-Agent header value ("" when there is none)."""
    if user_agent.startswith("curl/"):
        return "curl"
    if "AppleWebKit/" in user_agent and _IOS.search(user_agent):
        return "safari"
    if "Firefox/" in user_agent and "Gecko/" in user_agent:
        return "firefox"
    if " Edge/" in user_agent:
        return "other"
    if "Chrome/" in user_agent or "Chromium/" in user_agent:
        return "chromium"
    if "AppleWebKit/" in user_agent and "Safari/" in user_agent:
        return "safari"
    return "other"
