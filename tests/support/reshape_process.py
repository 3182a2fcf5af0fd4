"""`reshape run` as a real subprocess on free loopback ports, as a user starts it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from labkit import processes
from labkit.pki import OriginPKI
from tests.support.clients import http_get

REPO = Path(__file__).resolve().parents[2]
RESHAPE = [sys.executable, "-m", "reshape"]
START_TIMEOUT = 30.0


@dataclass
class RunningProxy:
    process: subprocess.Popen[bytes]
    listen: str  # host:port
    admin: str  # host:port
    confdir: Path
    log_path: Path

    @property
    def proxy_url(self) -> str:
        return f"http://{self.listen}"

    @property
    def ca_cert(self) -> Path:
        """The interception CA as served on /ca.pem (what a user downloads and trusts)."""
        path = self.confdir / "downloaded-ca.pem"
        if not path.exists():
            status, body = http_get(f"http://{self.admin}/ca.pem")
            assert status == 200
            path.write_bytes(body)
        return path

    def metrics(self) -> str:
        status, body = http_get(f"http://{self.admin}/metrics")
        assert status == 200
        return body.decode()

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include `labels`."""
        total = 0.0
        for line in self.metrics().splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            series, _, value = line.rpartition(" ")
            if all(f'{k}="{v}"' in series for k, v in labels.items()):
                total += float(value)
        return total

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def healthy(self) -> bool:
        """Whether /healthz answers 200 now."""
        try:
            return http_get(f"http://{self.admin}/healthz", timeout=1)[0] == 200
        except OSError:
            return False

    def wait_healthy(self, timeout: float = START_TIMEOUT) -> None:
        """Returns once /healthz answers 200; fails the test (with the log) if the process exits
        first or does not get there within `timeout` seconds."""
        try:
            processes.wait_ready(
                "reshape",
                self.process,
                is_ready=self.healthy,
                timeout=timeout,
                logs=[self.log_path],
            )
        except processes.ProcessStartError as error:
            pytest.fail(str(error))

    def settled_metrics(
        self, name: str, label: str, expected: dict[str, float], timeout: float = 5.0
    ) -> dict[str, float]:
        """`name`'s samples by `label`, for each value in `expected`: once they equal it, or as
        they are after `timeout` seconds (metrics of the last flows may still be on their way)."""
        deadline = time.monotonic() + timeout
        while True:
            counted = {value: self.metric(name, **{label: value}) for value in expected}
            if counted == expected or time.monotonic() > deadline:
                return counted
            time.sleep(0.05)

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, and its exit status; one that has not exited within `timeout` seconds is
        killed, with its workers, and fails the test."""
        status = processes.stop(self.process, timeout)
        if status == -signal.SIGKILL:
            pytest.fail(f"reshape did not stop within {timeout:g} s of SIGTERM:\n{self.log()}")
        return status


StartProxy = Callable[..., RunningProxy]


class ReshapeLauncher:
    """Starts `reshape run` processes for one test, each with its own confdir and log under
    `directory`, trusting `origin_pki`'s CA for origins; `stop_all` stops those still running."""

    def __init__(self, directory: Path, origin_pki: OriginPKI) -> None:
        self.directory = directory
        self.origin_pki = origin_pki
        self.started: list[RunningProxy] = []

    def start(
        self,
        *extra: str,
        policy: Path | None = None,
        wait: bool = True,
        confdir: Path | None = None,
    ) -> RunningProxy:
        """`reshape run` with `extra` arguments, its own confdir unless given one; with `wait`,
        returns once /healthz answers 200 (see `RunningProxy.wait_healthy`)."""
        number = len(self.started)
        confdir = confdir or self.directory / f"conf{number}"
        listen_port = admin_port = processes.free_port()
        while admin_port == listen_port:  # two free ports, not the same one twice
            admin_port = processes.free_port()
        listen = f"127.0.0.1:{listen_port}"
        admin = f"127.0.0.1:{admin_port}"
        log_path = self.directory / f"reshape{number}.log"
        args = [
            *RESHAPE,
            "run",
            "--listen",
            listen,
            "--admin",
            admin,
            "--confdir",
            str(confdir),
            "--upstream-ca",
            str(self.origin_pki.ca_cert_path),
            "--policy",
            str(policy or REPO / "reshape" / "policy" / "default.yaml"),
            *extra,
        ]
        with log_path.open("wb") as log:
            process = processes.spawn(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        running = self._started(RunningProxy(process, listen, admin, confdir, log_path))
        if wait:
            running.wait_healthy()
        return running

    def _started(self, running: RunningProxy) -> RunningProxy:
        self.started.append(running)
        return running

    def stop_all(self) -> None:
        """Stops the proxies still running (one that will not stop fails the test), and what the
        others left behind in their process groups."""
        for running in self.started:
            if running.process.poll() is None:
                running.stop()
            else:
                processes.stop(running.process)
