"""HTTP/2 floods and protocol errors from a client: the attacking connection gets GOAWAY
(ENHANCE_YOUR_CALM for a flood, PROTOCOL_ERROR otherwise) and is closed, the error is counted,
the origin sees at most the flood's budget of requests, and a well-behaved HTTP/2 client on
another connection is served throughout."""

from __future__ import annotations

import ssl
import threading
import time
from pathlib import Path

import h2.errors
import httpx
import pytest

from labkit.pki import OriginPKI
from tests.support.faulty_origins import FaultyOrigin
from tests.support.h2_attacker import attack
from tests.support.reshape_process import StartProxy

POLICIES = {
    "direct": "version: 1\ndefault: p\npolicies:\n  p: {}\n",
    "pooled": "version: 1\ndefault: p\npolicies:\n  p:\n    upstream: {}\n",
}
# reshape/features/client_errors/rules.py FloodLimits: a reset budget of 200 at once.
RESET_BURST = 200


class H2Client(threading.Thread):
    """GETs `url` over HTTP/2 through the proxy until stopped; keeps the statuses."""

    def __init__(self, proxy: str, url: str, trust: Path) -> None:
        super().__init__(daemon=True)
        self.proxy, self.url, self.trust = proxy, url, trust
        self.statuses: list[int | str] = []
        self.versions: set[str] = set()
        self.stop = threading.Event()

    def run(self) -> None:
        context = ssl.create_default_context(cafile=str(self.trust))
        with httpx.Client(http2=True, proxy=self.proxy, verify=context, timeout=10) as client:
            while not self.stop.is_set() and len(self.statuses) < 100_000:
                try:
                    response = client.get(self.url)
                    self.statuses.append(response.status_code)
                    self.versions.add(response.http_version)
                except httpx.HTTPError as e:
                    self.statuses.append(type(e).__name__)
                time.sleep(0.01)


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_floods_are_cut_off_and_everyone_else_is_served(
    start_reshape: StartProxy, tmp_path: Path, origin_pki: OriginPKI, policy: str
) -> None:
    policy_path = tmp_path / "policy.yaml"
    policy_path.write_text(POLICIES[policy])
    proxy = start_reshape(policy=policy_path)
    host, port = proxy.listen.split(":")
    with FaultyOrigin("127.0.0.62", tls=origin_pki.issue(["127.0.0.62"])) as origin:
        good = H2Client(proxy.proxy_url, origin.url("/echo/good"), proxy.ca_cert)
        good.start()
        try:
            outcomes = {
                kind: attack((host, int(port)), (origin.host, origin.port), proxy.ca_cert, kind)
                for kind in ("reset", "settings", "ping", "protocol")
            }
            time.sleep(0.5)
        finally:
            good.stop.set()
            good.join(15)

    calm = h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
    for kind in ("reset", "settings", "ping"):
        outcome = outcomes[kind]
        # GOAWAY ENHANCE_YOUR_CALM, or a reset that overtook it: the proxy closes while the
        # flood is still coming in, and the kernel then drops what the client had not read.
        assert outcome.goaway == calm or (outcome.goaway is None and outcome.closed), outcome
        assert outcome.frames_sent < 20_000, (kind, outcome)  # stopped long before the end
    assert outcomes["protocol"].goaway == h2.errors.ErrorCodes.PROTOCOL_ERROR, outcomes
    # Rapid reset: the origin saw at most the reset budget of the flood's streams.
    assert origin.count_prefix("/echo/rapid") <= RESET_BURST + 10
    assert good.statuses and set(good.statuses) == {200}, good.statuses[-10:]
    assert good.versions == {"HTTP/2"}
    assert proxy.metric("reshape_client_errors_total", kind="h2_flood") == 3
    assert proxy.metric("reshape_client_errors_total", kind="h2_protocol") == 1
    assert "mitmproxy has crashed" not in proxy.log()
