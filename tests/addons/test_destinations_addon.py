"""reshape/features/destinations/addon.py: refused destinations get 403 before any connection — unit
tests on
flows, then `reshape run` with curl."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from mitmproxy import http
from mitmproxy.proxy import server_hooks
from mitmproxy.test import tflow

from labkit.origins import Origin, nginx_origin
from reshape.base.addresses import ListenAddress
from reshape.features.destinations.addon import (
    Destinations,
    Resolver,
    kernel_says_local,
    own_addresses,
)
from reshape.features.destinations.rules import ip_of
from reshape.features.telemetry import metrics
from reshape.policy.chooser import PolicyChooser
from reshape.policy.loader import parse_policy_text
from reshape.policy.reload import PolicyHolder
from tests.support.clients import curl_via_proxy
from tests.support.reshape_process import REPO, StartProxy

STRICT = """\
version: 1
default: strict
policies:
  strict:
    destinations: {loopback: deny, private: deny}
"""


class FixedResolver(Resolver):
    """Answers from a table: the name-to-address cases without DNS."""

    def __init__(self, table: dict[str, tuple[str, ...]]) -> None:
        super().__init__()
        self.table = table

    def known(self, host: str) -> tuple[str, ...] | None:
        return self.table.get(host) or super().known(host)


def check(hook: Callable[[http.HTTPFlow], None], flow: http.HTTPFlow) -> None:
    """Run a hook as mitmproxy does: an intercepted flow is waited for."""

    async def run() -> None:
        hook(flow)
        await flow.wait_for_resume()

    asyncio.run(run())


class SlowResolver(Resolver):
    """Knows nothing until asked: every name takes the lookup path."""

    def __init__(self, table: dict[str, tuple[str, ...]]) -> None:
        super().__init__()
        self.table = table
        self.asked: list[str] = []

    def known(self, host: str) -> tuple[str, ...] | None:
        return None

    async def addresses(self, host: str) -> tuple[str, ...]:
        self.asked.append(host)
        await asyncio.sleep(0)
        return self.table[host]


def make(policy_text: str = STRICT, table: dict[str, tuple[str, ...]] | None = None):
    policy = parse_policy_text(policy_text, Path("p.yaml"))
    own = own_addresses(ListenAddress("127.0.0.1", 3128), ListenAddress("127.0.0.1", 9464))
    addon = Destinations(PolicyHolder(None, policy), own, FixedResolver(table or {}))
    return addon, PolicyChooser(policy)


def refused(reason: str, policy: str = "strict") -> float:
    return metrics.destinations_refused_total.labels(policy, "none", reason)._value.get()


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://169.254.169.254/latest/meta-data/", "link_local"),
        ("http://[fd00:ec2::254]/", "link_local"),
        ("http://127.0.0.1:3128/", "own_address"),
        ("http://127.0.0.1:9464/metrics", "own_address"),
        ("http://10.1.2.3/", "private"),
        ("http://metadata.internal/", "link_local"),  # a name: decided on what it resolves to
        ("http://localhost:8000/", "loopback"),
    ],
)
def test_refused_requests_get_403_and_are_counted(url: str, reason: str) -> None:
    addon, chooser = make(table={"metadata.internal": ("169.254.169.254",)})
    flow = tflow.tflow()
    flow.request.url = url
    chooser.requestheaders(flow)
    before = refused(reason)
    check(addon.requestheaders, flow)
    assert flow.response is not None and flow.response.status_code == 403
    assert flow.response.headers["content-type"].startswith("text/plain")
    assert flow.response.text.startswith("reshape: destination ")
    assert refused(reason) == before + 1


def test_allowed_request_passes_and_its_peer_is_checked() -> None:
    addon, chooser = make(table={"rebinding.example": ("93.184.216.34",)})
    flow = tflow.tflow()
    flow.request.url = "http://rebinding.example/"
    chooser.requestheaders(flow)
    check(addon.requestheaders, flow)
    assert flow.response is None

    # mitmproxy's own lookup then lands on a loopback address: refused after connecting.
    flow.server_conn.address = ("rebinding.example", 80)
    flow.server_conn.peername = ("127.0.0.1", 80)
    before = refused("loopback")
    addon.server_connected(
        server_hooks.ServerConnectionHookData(flow.server_conn, flow.client_conn)
    )
    assert flow.server_conn.error and "loopback" in flow.server_conn.error
    assert refused("loopback") == before + 1


def test_a_good_peer_is_left_alone() -> None:
    addon, _ = make()
    flow = tflow.tflow()
    flow.server_conn.address = ("example.com", 80)
    flow.server_conn.peername = ("93.184.216.34", 80)
    addon.server_connected(
        server_hooks.ServerConnectionHookData(flow.server_conn, flow.client_conn)
    )
    assert flow.server_conn.error is None


def test_connect_is_checked_under_its_own_policy_choice() -> None:
    addon, _ = make()
    flow = tflow.tflow()
    flow.request.method = "CONNECT"
    flow.request.host, flow.request.port = "169.254.169.254", 443
    check(addon.http_connect, flow)
    assert flow.response is not None and flow.response.status_code == 403
    assert "policy 'strict' denies it" in flow.response.text


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


@pytest.mark.parametrize(("address", "refusal"), [("93.184.216.34", None), ("127.0.0.9", 403)])
def test_a_name_to_look_up_holds_the_flow_until_it_is_decided(
    address: str, refusal: int | None
) -> None:
    policy = parse_policy_text(STRICT, Path("p.yaml"))
    own = own_addresses(ListenAddress("127.0.0.1", 3128), ListenAddress("127.0.0.1", 9464))
    resolver = SlowResolver({"looked-up.example": (address,)})
    addon = Destinations(PolicyHolder(None, policy), own, resolver)
    flow = tflow.tflow()
    flow.request.url = "http://looked-up.example/"
    PolicyChooser(policy).requestheaders(flow)

    async def run() -> None:
        addon.requestheaders(flow)
        assert flow.intercepted  # mitmproxy holds the flow: the hook completes on resume
        await flow.wait_for_resume()

    asyncio.run(run())
    assert resolver.asked == ["looked-up.example"] and not flow.intercepted
    assert (flow.response.status_code if flow.response else None) == refusal
