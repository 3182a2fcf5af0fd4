from __future__ import annotations

import pytest

from labkit.browser import proxy_flags


@pytest.mark.parametrize(
    ("proxy", "flags"),
    [
        (None, ["--no-proxy-server"]),
        (
            "127.0.0.1:8080",
            ["--proxy-server=http://127.0.0.1:8080", "--proxy-bypass-list=<-loopback>"],
        ),
        (
            "http://127.0.0.1:9",
            ["--proxy-server=http://127.0.0.1:9", "--proxy-bypass-list=<-loopback>"],
        ),
    ],
)
def test_proxy_flags(proxy: str | None, flags: list[str]) -> None:
    assert proxy_flags(proxy) == flags
