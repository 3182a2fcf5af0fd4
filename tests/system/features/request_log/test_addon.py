"""The request log that `reshape run` writes: pooled requests with their queueing and connection
kind; workers appending to one file."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from labkit.origins import Origin, nginx_origin
from tests.support.reshape_process import StartProxy


@pytest.fixture
def origin(tmp_path: Path) -> Iterator[Origin]:
    root = tmp_path / "www"
    root.mkdir()
    (root / "page.txt").write_text("z" * 3000)
    with nginx_origin(root, "127.0.0.2") as running:
        yield running


@pytest.mark.slow
def test_workers_append_every_request_to_one_file(
    start_reshape: StartProxy, origin: Origin, tmp_path: Path
) -> None:
    log = tmp_path / "requests.jsonl"
    proxy = start_reshape("--workers", "2", "--request-log", str(log))
    url = f"http://{origin.host}:{origin.port}/page.txt"
    for _ in range(12):
        result = subprocess.run(
            ["curl", "-sS", "--max-time", "10", "--proxy", proxy.proxy_url, url, url],
            capture_output=True,
            timeout=30,
        )
        assert result.returncode == 0 and result.stdout == b"z" * 6000
    missing = f"http://{origin.host}:{origin.port}/missing"
    subprocess.run(["curl", "-sS", "--proxy", proxy.proxy_url, missing], capture_output=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(log.read_text().splitlines()) < 25:
        time.sleep(0.2)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(records) == 25
    pages = [r for r in records if r["status"] == 200]
    assert len(pages) == 24
    assert all(r["bytes"] == 3000 and r["policy"] == "baseline" for r in pages)
    assert all(r["host"] == origin.host and r["scheme"] == "http" for r in records)
    # One run after the other: each worker's pool opens one origin connection and reuses it.
    kinds = [r["upstream_connection"] for r in records]
    assert all(r["pooled"] for r in records)
    assert set(kinds) <= {"new", "reused"} and 1 <= kinds.count("new") <= 2, kinds
    assert [r["status"] for r in records if r["status"] != 200] == [404]
    carried = sum(
        proxy.metric("reshape_upstream_requests_total", connection=kind)
        for kind in ("new", "reused")
    )
    assert carried == 25


@pytest.mark.slow
def test_pooled_requests_log_their_queueing_and_connection_kind(
    start_reshape: StartProxy, origin: Origin, tmp_path: Path
) -> None:
    log = tmp_path / "requests.jsonl"
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "version: 1\ndefault: p\npolicies:\n  p: {upstream: {max_connections_per_host: 1}}\n"
    )
    proxy = start_reshape("--request-log", str(log), policy=policy)
    url = f"http://{origin.host}:{origin.port}/page.txt"
    # Four transfers at once from four connections: with one origin connection, three wait.
    result = subprocess.run(
        [
            "curl",
            "-sS",
            "--parallel",
            "--parallel-immediate",
            "--max-time",
            "20",
            "--proxy",
            proxy.proxy_url,
            *[url] * 4,
            "-o",
            "/dev/null",
            "-o",
            "/dev/null",
            "-o",
            "/dev/null",
            "-o",
            "/dev/null",
        ],
        capture_output=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(log.read_text().splitlines()) < 4:
        time.sleep(0.2)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(records) == 4 and all(r["pooled"] and r["status"] == 200 for r in records)
    assert sorted(r["upstream_connection"] for r in records) == [
        "new",
        "reused",
        "reused",
        "reused",
    ]
    assert all(isinstance(r["queue_seconds"], float) for r in records)
    waited = [r for r in records if r["queued"]]
    assert len(waited) >= 1 and all(r["queue_seconds"] > 0 for r in waited)
    assert len(waited) == proxy.metric("reshape_requests_queued_total")
