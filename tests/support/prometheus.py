"""A real Prometheus server (Debian's) for tests that read reshape's metrics as operators do."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from tests.support.clients import http_get
from tests.support.reshape_process import free_port

PROMETHEUS = "/usr/bin/prometheus"


class Prometheus:
    """A real Prometheus server (Debian's) scraping one target every second, data in tmp."""

    def __init__(self, tmp_path: Path, target: str) -> None:
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: reshape\n    static_configs: [{{targets: ['{target}']}}]\n"
        )
        self.log = tmp_path / "prometheus.log"
        self.url = f"http://127.0.0.1:{free_port()}"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address={self.url.removeprefix('http://')}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                if http_get(f"{self.url}/-/ready", timeout=1)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        pytest.fail(f"prometheus did not start:\n{self.log.read_text()}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def api(self, path: str, **params: str | list[str]) -> dict[str, Any]:
        """GET /api/v1/`path`; {"status": "error", "error": ...} for a refused query."""
        query = urllib.parse.urlencode(params, doseq=True)
        status, body = http_get(f"{self.url}/api/v1/{path}?{query}", timeout=10)
        try:
            answer: dict[str, Any] = json.loads(body)
        except ValueError:
            return {"status": "error", "error": f"HTTP {status}: {body[:200]!r}"}
        return answer

    def value(self, expr: str) -> float:
        result = self.api("query", query=expr).get("data", {}).get("result", [])
        return float(result[0]["value"][1]) if result else 0.0
