"""Hot reload under load: a bounded load runs through several reloads and loses no request.

Four clients send requests through a real nginx origin while the policy file is switched from
plain proxying to the shared pool and back (by file change and by SIGHUP), and an invalid version
is refused on the way. Every response must arrive whole with status 200; the reload metric says
what happened; requests after the last reload run under its policy — in every worker.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from labkit.origins import Origin, nginx_origin
from tests.support.reshape_process import RunningProxy, StartProxy

BODY = b"y" * 5000
CLIENTS = 4
MAX_REQUESTS_PER_CLIENT = 400


def policy(name: str, pooled: bool) -> str:
    section = "{upstream: {max_connections_per_host: 2}}" if pooled else "{}"
    return f"version: 1\ndefault: {name}\npolicies:\n  {name}: {section}\n"


INVALID = "version: 1\ndefault: first\npolicies:\n  first: {upstreem: {}}\n"


@pytest.fixture
def origin(tmp_path: Path) -> Iterator[Origin]:
    root = tmp_path / "www"
    root.mkdir()
    (root / "page.bin").write_bytes(BODY)
    with nginx_origin(root, "127.0.0.2") as running:
        yield running


def replace_file(path: Path, text: str) -> None:
    partial = path.with_suffix(".partial")
    partial.write_text(text)
    partial.replace(path)


def wait_for(proxy: RunningProxy, outcome: str, count: float, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proxy.metric("reshape_policy_reloads_total", outcome=outcome) >= count:
            return
        time.sleep(0.2)
    pytest.fail(f"no {outcome} reload #{count}:\n{proxy.log()}")


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_reloads_under_load_lose_no_request(
    start_reshape: StartProxy, origin: Origin, tmp_path: Path, workers: int
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(policy("first", pooled=False))
    proxy = start_reshape("--workers", str(workers), policy=path)
    url = f"http://{origin.host}:{origin.port}/page.bin"
    stop = threading.Event()
    results: list[tuple[int, bool]] = []
    failures: list[str] = []

    def client() -> None:
        with httpx.Client(proxy=proxy.proxy_url, timeout=20) as http:
            for _ in range(MAX_REQUESTS_PER_CLIENT):
                if stop.is_set():
                    return
                try:
                    response = http.get(url)
                    results.append((response.status_code, response.content == BODY))
                except httpx.HTTPError as e:
                    failures.append(repr(e))

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    try:
        ok = workers  # every worker reloads and counts for itself
        time.sleep(0.5)
        replace_file(path, policy("second", pooled=True))  # the first pooled policy: lazy now
        wait_for(proxy, "ok", ok)
        time.sleep(0.5)
        path.write_text(INVALID)  # rewritten in place
        wait_for(proxy, "invalid", workers)
        proxy.process.send_signal(signal.SIGHUP)  # still invalid: refused again
        wait_for(proxy, "invalid", 2 * workers)
        replace_file(path, policy("third", pooled=False))
        wait_for(proxy, "ok", 2 * ok)
        time.sleep(0.5)
        proxy.process.send_signal(signal.SIGHUP)  # the same valid file again
        wait_for(proxy, "ok", 3 * ok)
        time.sleep(0.5)
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    assert failures == []
    assert len(results) >= CLIENTS * 5
    assert all(status == 200 and intact for status, intact in results), results
    assert proxy.metric("reshape_requests_total", outcome="ok") == len(results)
    assert proxy.metric("reshape_requests_total", policy="second") > 0
    # New requests, on new client connections (any worker): all under the last policy.
    before = proxy.metric("reshape_requests_total", policy="third")
    for _ in range(10):
        with httpx.Client(proxy=proxy.proxy_url, timeout=20) as http:
            assert http.get(url).content == BODY
    assert proxy.metric("reshape_requests_total", policy="third") == before + 10
    assert "refused, keeping the previous policy" in proxy.log()
    assert proxy.process.poll() is None
