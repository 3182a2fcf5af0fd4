"""`reshape run --workers N`: one port, N processes, one merged /metrics, workers kept alive."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from labkit.origins import Origin, nginx_origin
from tests.support.clients import http_get
from tests.support.reshape_process import RunningProxy, StartProxy


@pytest.fixture
def origin(tmp_path: Path) -> Iterator[Origin]:
    root = tmp_path / "www"
    root.mkdir()
    (root / "page.txt").write_text("x" * 1000)
    with nginx_origin(root, "127.0.0.2") as running:
        yield running


def worker_pids(proxy: RunningProxy) -> set[int]:
    out = subprocess.run(["pgrep", "-P", str(proxy.process.pid)], capture_output=True, text=True)
    return {int(pid) for pid in out.stdout.split()}


def _alive(pid: int) -> bool:
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def fetch(proxy: RunningProxy, url: str) -> bytes:
    result = subprocess.run(
        ["curl", "-sSf", "--max-time", "10", "--proxy", proxy.proxy_url, url],
        capture_output=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def wait_healthy(proxy: RunningProxy, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if http_get(f"http://{proxy.admin}/healthz")[0] == 200:
            return
        time.sleep(0.2)
    pytest.fail(f"not healthy again:\n{proxy.log()}")


@pytest.mark.slow
def test_workers_share_the_port_and_metrics_are_merged(
    start_reshape: StartProxy, origin: Origin
) -> None:
    proxy = start_reshape("--workers", "2")
    pids = worker_pids(proxy)
    assert len(pids) == 2
    for _ in range(30):
        assert fetch(proxy, origin.url("/page.txt")) == b"x" * 1000
    assert proxy.metric("reshape_requests_total", outcome="ok") == 30
    assert proxy.metric("reshape_client_connections_total") == 30
    assert proxy.metric("reshape_build_info") == 1  # one series, not one per worker

    # A worker that dies is replaced, and the port keeps serving meanwhile.
    victim = sorted(pids)[0]
    os.kill(victim, signal.SIGKILL)
    # Connections the kernel had already queued on the victim's socket are reset with it; once
    # it has exited, the other worker's socket takes every new connection.
    deadline = time.monotonic() + 10
    while _alive(victim) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fetch(proxy, origin.url("/page.txt")) == b"x" * 1000
    wait_healthy(proxy)
    new_pids = worker_pids(proxy)
    assert len(new_pids) == 2 and victim not in new_pids
    assert "worker 0 restarted" in proxy.log() or "worker 1 restarted" in proxy.log()

    assert proxy.stop() == 0
    for pid in new_pids:
        assert (
            not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
        )
