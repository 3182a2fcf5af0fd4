"""`reshape run` as a real subprocess on free loopback ports, as a user starts it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from labkit.pki import OriginPKI
from tests.support.clients import http_get

REPO = Path(__file__).resolve().parents[2]
RESHAPE = [sys.executable, "-m", "reshape"]
START_TIMEOUT = 30.0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


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

    def stop(self, timeout: float = 20.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise


StartProxy = Callable[..., RunningProxy]


class ReshapeLauncher:
    """Starts `reshape run` processes for one test, each with its own confdir and log under
    `directory`, trusting `origin_pki`'s CA for origins; `stop_all` stops those still running."""

    def __init__(self, directory: Path, origin_pki: OriginPKI) -> None:
        self.directory = directory
        self.origin_pki = origin_pki
        self.started: list[RunningProxy] = []

    def start(self, *extra: str, policy: Path | None = None, wait: bool = True) -> RunningProxy:
        """`reshape run` with `extra` arguments; with `wait`, returns once /healthz answers 200
        (fails the test if the process exits or does not get there within START_TIMEOUT)."""
        number = len(self.started)
        confdir = self.directory / f"conf{number}"
        listen = f"127.0.0.1:{free_port()}"
        admin = f"127.0.0.1:{free_port()}"
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
            process = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        running = RunningProxy(process, listen, admin, confdir, log_path)
        self.started.append(running)
        if wait:
            deadline = time.monotonic() + START_TIMEOUT
            while time.monotonic() < deadline:
                if process.poll() is not None:
                    pytest.fail(f"reshape exited with {process.returncode}:\n{running.log()}")
                try:
                    if http_get(f"http://{admin}/healthz", timeout=1)[0] == 200:
                        return running
                except OSError:
                    pass
                time.sleep(0.1)
            pytest.fail(f"reshape did not become healthy:\n{running.log()}")
        return running

    def stop_all(self) -> None:
        for running in self.started:
            if running.process.poll() is None:
                running.stop()
