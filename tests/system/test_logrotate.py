"""Done-when: Debian's logrotate rotating the request log while requests flow loses no line —
with a postrotate SIGUSR1 (as deploy/logrotate/reshape sends it), with `--workers 2` (the
supervisor passes the signal on), and with no signal at all (reshape notices the move)."""

from __future__ import annotations

import gzip
import json
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from reshape.features.onboarding.addon import ONBOARDING_HOST
from tests.support.reshape_process import StartProxy

LOGROTATE = "/usr/sbin/logrotate"
ROTATIONS = 3
CLIENTS = 3


def records(directory: Path) -> list[dict[str, object]]:
    lines: list[str] = []
    for path in sorted(directory.iterdir()):
        if path.name.startswith("requests.jsonl"):
            data = path.read_bytes()
            lines += (gzip.decompress(data) if path.suffix == ".gz" else data).decode().splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("workers", "signal"),
    [("1", True), ("2", True), ("1", False)],
    ids=["usr1", "workers", "moved"],
)
def test_logrotate_loses_no_request_line(
    start_reshape: StartProxy, tmp_path: Path, workers: str, signal: bool
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / "requests.jsonl"
    proxy = start_reshape("--workers", workers, "--request-log", str(log))
    postrotate = (
        f"    postrotate\n        kill -USR1 {proxy.process.pid}\n    endscript\n" if signal else ""
    )
    config = tmp_path / "logrotate.conf"
    config.write_text(
        f"{log} {{\n    rotate 20\n    missingok\n    create\n    compress\n"
        f"    delaycompress\n{postrotate}}}\n"
    )
    sent = [0] * CLIENTS
    stop = threading.Event()

    def client(index: int) -> None:
        with httpx.Client(proxy=proxy.proxy_url, timeout=10) as session:
            while not stop.is_set():
                response = session.get(f"http://{ONBOARDING_HOST}/cert/pem", params={"c": index})
                assert response.status_code == 200
                sent[index] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(ROTATIONS):
            time.sleep(1.5)  # longer than the log's flush interval, as any real schedule is
            result = subprocess.run(
                [LOGROTATE, "--force", "--state", str(tmp_path / "state"), str(config)],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert result.returncode == 0, result.stderr
        time.sleep(1.0)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    total = sum(sent)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(records(logs)) < total:
        time.sleep(0.2)
    found = records(logs)
    assert total > 50 and len(found) == total
    assert all(r["host"] == ONBOARDING_HOST and r["status"] == 200 for r in found)
    rotated = sorted(p.name for p in logs.iterdir())
    assert rotated == [
        "requests.jsonl",
        "requests.jsonl.1",
        *(f"requests.jsonl.{n}.gz" for n in range(2, ROTATIONS + 1)),
    ]
    counts = {name: records_in(logs / name) for name in rotated}
    assert all(counts.values()), counts  # every file got lines
    assert proxy.stop() == 0


def records_in(path: Path) -> int:
    data = path.read_bytes()
    return len((gzip.decompress(data) if path.suffix == ".gz" else data).splitlines())
