from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reshape.base.client_family import CLIENT_FAMILIES, client_family

USER_AGENTS = [
    (
        "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
        "Chrome/131.0.0.0 Safari/537.36",
        "chromium",
    ),
    (
        "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
        "HeadlessChrome/120.0.6099.224 Safari/537.36",
        "chromium",
    ),
    (
        "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
        "Chrome/131.0.0.0 Safari/537.36 Edg/131.0.0.0",
        "chromium",
    ),
    (
        "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
        "Chrome/129.0.0.0 Safari/537.36 OPR/115.0.0.0",
        "chromium",
    ),
    (
        "Mozilla/5.0 (Linux; Android 14; SM-S928B) AppleWebKit/537.36 (KHTML, like Gecko) "
        "SamsungBrowser/26.0 Chrome/122.0.0.0 Mobile Safari/537.36",
        "chromium",
    ),
    (
        "Mozilla/5.0 (Linux; Android 13; Pixel 7 Build/TQ3A.230805.001; wv) AppleWebKit/537.36 "
        "(KHTML, like Gecko) Version/4.0 Chrome/118.0.0.0 Mobile Safari/537.36",
        "chromium",
    ),
    ("Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0", "firefox"),
    ("Mozilla/5.0 (Android 14; Mobile; rv:133.0) Gecko/133.0 Firefox/133.0", "firefox"),
    (
        "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) "
        "Version/18.1 Safari/605.1.15",
        "safari",
    ),
    (
        "Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 "
        "(KHTML, like Gecko) Version/18.1 Mobile/15E148 Safari/604.1",
        "safari",
    ),
    # Every iOS browser uses WebKit's network stack.
    (
        "Mozilla/5.0 (iPhone; CPU iPhone OS 17_0 like Mac OS X) AppleWebKit/605.1.15 "
        "(KHTML, like Gecko) CriOS/131.0.6778.73 Mobile/15E148 Safari/604.1",
        "safari",
    ),
    (
        "Mozilla/5.0 (iPad; CPU OS 17_0 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) "
        "FxiOS/133.0 Mobile/15E148 Safari/605.1.15",
        "safari",
    ),
    ("curl/8.5.0", "curl"),
    ("curl/7.88.1", "curl"),
    # Legacy EdgeHTML claims Chrome.
    (
        "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
        "Chrome/70.0.3538.102 Safari/537.36 Edge/18.19582",
        "other",
    ),
    ("python-httpx/0.28.1", "other"),
    ("Wget/1.21.3", "other"),
    ("Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)", "other"),
    ("", "other"),
    ("libcurl-agent/1.0 curl/8.0", "other"),
]


@pytest.mark.parametrize(("user_agent", "family"), USER_AGENTS, ids=lambda v: v[:40])
def test_family_of_user_agent(user_agent: str, family: str) -> None:
    assert client_family(user_agent) == family


@given(st.text())
def test_any_header_value_maps_into_the_bounded_set(user_agent: str) -> None:
    assert client_family(user_agent) in CLIENT_FAMILIES
