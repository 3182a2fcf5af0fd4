"""What a rapid-reset flood leaves behind (issue 15, finding 4): after the GOAWAY
ENHANCE_YOUR_CALM, the flooding client's socket is closed (never left in CLOSE-WAIT with its
data unread), the proxy's file descriptors come back to where they were, every flow the flood
started has ended and is counted as the client's doing (none as an origin failure), and a
SIGTERM right after finds nothing in flight to drain. Both paths."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import h2.errors
import pytest

from labkit.pki import OriginPKI
from tests.support.faulty_origins import FaultyOrigin
from tests.support.h2_attacker import attack
from tests.support.origin_sockets import origin_connections_by_process
from tests.support.reshape_process import RunningProxy, StartProxy

POLICIES = {
    "direct": "version: 1\ndefault: p\npolicies:\n  p: {}\n",
    "pooled": "version: 1\ndefault: p\npolicies:\n  p:\n    upstream: {idle_timeout: 1}\n",
}
FLOODS = 4  # each left its socket open about every other time before the fix
BROWSER_LIMIT = 6  # `{}`'s connections per host: a browser's


def close_wait_sockets(pid: int) -> list[str]:
    out = subprocess.run(
        ["ss", "-tanpH", "state", "close-wait"], capture_output=True, text=True, check=True
    ).stdout
    return [line for line in out.splitlines() if f"pid={pid}," in line]


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def outcomes(proxy: RunningProxy) -> dict[str, float]:
    counted: dict[str, float] = {}
    for line in proxy.metrics().splitlines():
        match = re.match(r'reshape_requests_total\{.*outcome="(\w+)".*\} (\S+)', line)
        if match:
            counted[match[1]] = counted.get(match[1], 0) + float(match[2])
    return counted


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_a_flood_is_closed_its_flows_ended_and_counted(
    start_reshape: StartProxy, tmp_path: Path, origin_pki: OriginPKI, policy: str
) -> None:
    policy_path = tmp_path / "policy.yaml"
    policy_path.write_text(POLICIES[policy])
    proxy = start_reshape(policy=policy_path)
    pid = proxy.process.pid
    host, port = proxy.listen.split(":")
    with FaultyOrigin("127.0.0.69", tls=origin_pki.issue(["127.0.0.69"])) as origin:
        proxy.ca_cert  # noqa: B018 (downloaded before the baseline: the admin connection closes)
        time.sleep(0.5)
        baseline = open_fds(pid)
        for _ in range(FLOODS):
            outcome = attack((host, int(port)), (origin.host, origin.port), proxy.ca_cert, "reset")
            calm = h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
            assert outcome.goaway == calm or (outcome.goaway is None and outcome.closed)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            stuck = close_wait_sockets(pid)
            # A flood's request that reached the engine before its reset may have opened a
            # connection to the origin, which the pool keeps (idle, 60 s under `{}`).
            pooled = origin_connections_by_process(origin.host, origin.port).get(pid, 0)
            fds = open_fds(pid) - pooled
            if not stuck and fds <= baseline:
                break
            time.sleep(0.2)
        assert stuck == [], stuck
        assert fds <= baseline, (fds, baseline)  # beside what the pool keeps, within its limit
        assert pooled <= BROWSER_LIMIT, pooled

    counted = outcomes(proxy)
    assert counted.get("upstream_error", 0) == 0, counted
    assert counted.get("client_aborted", 0) + counted.get("client_error", 0) > 0, counted
    assert proxy.metric("reshape_client_errors_total", kind="h2_flood") == FLOODS
    started = time.monotonic()
    assert proxy.stop() == 0
    assert time.monotonic() - started < 5  # nothing in flight: no drain to wait out
    log = proxy.log()
    assert "abandoning" not in log
    assert "Traceback" not in log
