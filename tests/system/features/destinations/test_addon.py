"""reshape/features/destinations/addon.py with real sockets: a name the system resolves, the
kernel's own addresses, then `reshape run` with curl. On flows alone:
tests/unit/features/destinations/test_addon.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from labkit.origins import Origin, nginx_origin
from reshape.features.destinations.addon import kernel_says_local
from reshape.features.destinations.rules import ip_of
from tests.support.clients import curl_via_proxy
from tests.support.reshape_process import REPO, StartProxy
from tests.unit.features.destinations.test_addon import STRICT, check_refused


# "localhost" is answered by the system's resolver (/etc/hosts), not by a table.
@pytest.mark.parametrize(("url", "reason"), [("http://localhost:8000/", "loopback")])
def test_refused_requests_get_403_and_are_counted(url: str, reason: str) -> None:
    check_refused(url, reason)


def test_kernel_knows_its_own_addresses() -> None:
    assert kernel_says_local(ip_of("127.0.0.1"))
    assert not kernel_says_local(ip_of("192.0.2.254"))  # TEST-NET-1: never assigned here


# End to end: `reshape run`, curl as the client.


@pytest.fixture
def loopback_origin(tmp_path: Path) -> Iterator[Origin]:
    root = tmp_path / "www"
    root.mkdir()
    (root / "small.txt").write_text("hello\n")
    with nginx_origin(root, "127.0.0.1") as origin:
        yield origin


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["reshape/policy/default.yaml", "policies/pooled.yaml"])
def test_own_addresses_and_metadata_are_refused(start_reshape: StartProxy, policy: str) -> None:
    proxy = start_reshape(policy=REPO / policy)
    started = time.monotonic()
    for url in (f"http://{proxy.listen}/", f"http://{proxy.admin}/metrics"):
        status, body = curl_via_proxy(proxy.proxy_url, url)
        assert status == "403" and "this proxy's own address" in body, (url, body)
    status, body = curl_via_proxy(proxy.proxy_url, "http://169.254.169.254/latest/meta-data/")
    assert status == "403" and "169.254.169.254 is link-local" in body
    assert curl_via_proxy(proxy.proxy_url, "https://169.254.169.254/")[0] == "403"  # the CONNECT
    assert curl_via_proxy(proxy.proxy_url, f"https://{proxy.listen}/")[0] == "403"
    # Nothing was attempted: a connection to 169.254.169.254 would hang until curl gives up.
    assert time.monotonic() - started < 15
    assert proxy.metric("reshape_destinations_refused_total", reason="own_address") == 3
    assert proxy.metric("reshape_destinations_refused_total", reason="link_local") == 2


@pytest.mark.slow
def test_loopback_by_name_follows_the_policy(
    start_reshape: StartProxy, loopback_origin: Origin, tmp_path: Path
) -> None:
    by_name = f"http://localhost:{loopback_origin.port}/small.txt"
    allowing = start_reshape()  # the default policy allows loopback
    assert curl_via_proxy(allowing.proxy_url, by_name) == ("200", "hello\n")
    log = loopback_origin.access_log
    assert log is not None
    answered = len(log.read_text().splitlines())
    strict = tmp_path / "strict.yaml"
    strict.write_text(STRICT)
    denying = start_reshape(policy=strict)
    status, body = curl_via_proxy(denying.proxy_url, by_name)
    assert status == "403"
    assert body.startswith("reshape: destination localhost (")
    assert "is loopback (policy 'strict' denies it)" in body
    assert len(log.read_text().splitlines()) == answered  # the origin saw nothing more
