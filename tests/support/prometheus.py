"""A real Prometheus server (Debian's) for tests that read reshape's metrics as operators do."""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from labkit import processes
from tests.support.clients import http_get

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
        self.url = f"http://127.0.0.1:{processes.free_port()}"
        argv = [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address={self.url.removeprefix('http://')}",
        ]
        try:
            self.process = processes.start(
                "prometheus", argv, log=self.log, is_ready=self._ready, timeout=30
            )
        except processes.ProcessStartError as error:
            pytest.fail(str(error))

    def _ready(self) -> bool:
        try:
            return http_get(f"{self.url}/-/ready", timeout=1)[0] == 200
        except OSError:
            return False

    def stop(self) -> None:
        processes.stop(self.process)

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
