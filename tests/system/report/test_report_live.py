"""Done-when: `reshape report` finds a planted difference in upstream connections per request
(p < 0.01) and none in an A/A split, from a real Prometheus scraping the proxy; the request log
of the same run gives the same requests and the same finding.

One proxy runs two experiments at once, told apart by which header a simulated user sends:
`planted` (unit header:X-User) puts half the users on connections of their own (`share: false`)
and half on the shared pool; `aa` (unit header:X-AA) puts both arms on the same pooled policy. Every
request comes
on a fresh client connection, as from many different clients: without the pool each needs a new
origin connection, with it almost none do.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from labkit.origins import Origin, nginx_origin
from tests.support.prometheus import Prometheus
from tests.support.reshape_process import REPO, RESHAPE, StartProxy

USERS = 80
REQUESTS_PER_USER = 2

POLICY = """\
version: 1
default: direct
policies:
  direct:
    upstream: {share: false}
  pooled:
    upstream: {max_connections_per_host: 4}
experiments:
  - name: aa
    unit: header:X-AA
    arms:
      control: {policy: pooled, weight: 50}
      treatment: {policy: pooled, weight: 50}
  - name: planted
    unit: header:X-User
    arms:
      control: {policy: direct, weight: 50}
      treatment: {policy: pooled, weight: 50}
"""


@pytest.fixture
def origin(tmp_path: Path) -> Iterator[Origin]:
    root = tmp_path / "www"
    root.mkdir()
    (root / "page.txt").write_text("x" * 2000)
    with nginx_origin(root, "127.0.0.2") as running:
        yield running


def fetch(proxy_url: str, url: str, header: str, user: int) -> int:
    with httpx.Client(proxy=proxy_url, timeout=20) as client:  # a fresh client connection
        response = client.get(url, headers={header: f"user-{user}"})
        assert response.content == b"x" * 2000
        return response.status_code


def report(*args: str) -> str:
    result = subprocess.run(
        [*RESHAPE, "report", *args], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def connections_p(text: str) -> float:
    match = re.search(r"^  upstream connections per request\s.*p=([0-9.e+-]+)", text, re.M)
    assert match, text
    return float(match.group(1))


def scraped_requests(prometheus: Prometheus, experiment: str) -> float:
    return prometheus.value(f'sum(reshape_requests_total{{arm=~"{experiment}:.*"}})')


@pytest.mark.slow
def test_report_finds_the_planted_difference_and_none_in_a_a(
    start_reshape: StartProxy, origin: Origin, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    request_log = tmp_path / "requests.jsonl"
    proxy = start_reshape("--request-log", str(request_log), policy=policy)
    prometheus = Prometheus(tmp_path, proxy.admin)
    prometheus_url = prometheus.url
    try:
        url = f"http://{origin.host}:{origin.port}/page.txt"
        jobs = [
            (header, user)
            for user in range(USERS)
            for header in ("X-User", "X-AA")
            for _ in range(REQUESTS_PER_USER)
        ]
        with ThreadPoolExecutor(4) as pool:
            statuses = list(pool.map(lambda job: fetch(proxy.proxy_url, url, *job), jobs))
        assert statuses == [200] * len(jobs)
        expected = USERS * REQUESTS_PER_USER
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if all(scraped_requests(prometheus, e) >= expected for e in ("planted", "aa")):
                break
            time.sleep(0.5)
        else:
            pytest.fail("Prometheus never scraped all requests")
        time.sleep(1.5)  # the request log is flushed every second

        source = ["--prometheus", prometheus_url]
        planted = report("--experiment", "planted", *source, "--plot", str(tmp_path / "p"))
        assert connections_p(planted) < 0.01, planted
        significant = next(line for line in planted.splitlines() if "family-wise (Holm)" in line)
        assert "upstream connections" in significant, planted  # other measures may differ too
        assert (tmp_path / "p" / "planted-connections.png").exists()
        aa = report("--experiment", "aa", *source)
        assert connections_p(aa) > 0.01, aa

        # The log has every request and each one's connection kind — mitmproxy's own
        # connections (each one new here) and the pool's (the gateway hands its assignment
        # back) — so it finds the same difference.
        planted = report("--experiment", "planted", "--log", str(request_log))
        requests = re.search(r"^requests\s+(\d+) \[.*?\]\s+(\d+) \[", planted, re.M)
        assert requests and int(requests[1]) + int(requests[2]) == expected, planted
        assert connections_p(planted) < 0.01, planted
    finally:
        prometheus.stop()
