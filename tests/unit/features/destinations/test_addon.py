"""reshape/features/destinations/addon.py on flows: refused destinations get 403 before any
connection. With real sockets and `reshape run`:
tests/system/features/destinations/test_addon.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from mitmproxy import http
from mitmproxy.proxy import server_hooks
from mitmproxy.test import tflow

from reshape.base.addresses import ListenAddress
from reshape.features.destinations.addon import Destinations, Resolver, own_addresses
from reshape.features.telemetry import metrics
from reshape.policy.chooser import PolicyChooser
from reshape.policy.loader import parse_policy_text
from reshape.policy.reload import PolicyHolder

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


def check_refused(url: str, reason: str) -> None:
    """A request for `url` gets reshape's 403 before any connection, counted under `reason`."""
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


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://169.254.169.254/latest/meta-data/", "link_local"),
        ("http://[fd00:ec2::254]/", "link_local"),
        ("http://127.0.0.1:3128/", "own_address"),
        ("http://127.0.0.1:9464/metrics", "own_address"),
        ("http://10.1.2.3/", "private"),
        ("http://metadata.internal/", "link_local"),  # a name: decided on what it resolves to
    ],
)
def test_refused_requests_get_403_and_are_counted(url: str, reason: str) -> None:
    check_refused(url, reason)


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
