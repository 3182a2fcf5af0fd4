"""Shared fixtures: a test PKI for origins, and `reshape run` as a real subprocess."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from labkit.origins import Origin, nginx_origin
from labkit.pki import OriginPKI

REPO = Path(__file__).resolve().parents[1]
RESHAPE = [sys.executable, "-m", "reshape"]
START_TIMEOUT = 30.0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def curl_via_proxy(proxy: str, url: str, *extra: str) -> tuple[str, str]:
    """(status, body): the response's status, or for https:// the CONNECT's status if not 200."""
    result = subprocess.run(
        [
            "curl",
            "--silent",
            "--max-time",
            "20",
            "--proxy",
            proxy,
            "--write-out",
            "|||%{http_code} %{http_connect}",
            *extra,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    body, _, codes = result.stdout.rpartition("|||")
    status, connect = codes.split()
    return (connect if connect not in ("000", "200") else status), body


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class RssPeak:
    """A process's resident memory while the `with` block runs, sampled every 50 ms: `before`
    (on entry) and `peak` bytes."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.before = self.peak = 0
        self._done = threading.Event()
        self._sampler = threading.Thread(target=self._sample)

    def __enter__(self) -> RssPeak:
        self.before = self.peak = rss_bytes(self.pid)
        self._sampler.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._sampler.join()

    def _sample(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, rss_bytes(self.pid))
            time.sleep(0.05)


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


@pytest.fixture(scope="session")
def origin_pki(tmp_path_factory: pytest.TempPathFactory) -> OriginPKI:
    return OriginPKI(tmp_path_factory.mktemp("origin-pki"))


@pytest.fixture
def start_reshape(tmp_path: Path, origin_pki: OriginPKI) -> Iterator[StartProxy]:
    """Start `reshape run` on free loopback ports; every proxy is stopped after the test."""
    started: list[RunningProxy] = []

    def start(*extra: str, policy: Path | None = None, wait: bool = True) -> RunningProxy:
        confdir = tmp_path / f"conf{len(started)}"
        listen = f"127.0.0.1:{free_port()}"
        admin = f"127.0.0.1:{free_port()}"
        log_path = tmp_path / f"reshape{len(started)}.log"
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
            str(origin_pki.ca_cert_path),
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
        started.append(running)
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

    yield start
    for running in started:
        if running.process.poll() is None:
            running.stop()


# nginx serving the test module's own `site_root` fixture (a directory), on 127.0.0.2 (http) and
# 127.0.0.3 (https, certificate from origin_pki).
@pytest.fixture
def http_origin(site_root: Path) -> Iterator[Origin]:
    with nginx_origin(site_root, "127.0.0.2") as origin:
        yield origin


@pytest.fixture
def https_origin(site_root: Path, origin_pki: OriginPKI) -> Iterator[Origin]:
    with nginx_origin(site_root, "127.0.0.3", tls=origin_pki.issue(["127.0.0.3"])) as origin:
        yield origin
