"""reshape/app/admin.py without a socket: the proxy auto-config file. The endpoint on a real
loopback socket: tests/system/app/test_admin.py."""

from __future__ import annotations

from reshape.app.admin import pac_file


def test_pac_brackets_ipv6() -> None:
    assert b'"PROXY [::1]:8080"' in pac_file("::1", 8080)
