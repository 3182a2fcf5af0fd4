"""`reshape run` end to end: real origins (nginx, hypercorn), real clients (curl, an h2 client)."""

from __future__ import annotations

import hashlib
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from labkit.origins import Origin, hypercorn_origin, nginx_origin
from labkit.pki import OriginPKI
from tests.support.clients import http_get
from tests.support.faulty_origins import unreachable_address
from tests.support.reshape_process import RunningProxy, StartProxy
from tests.support.scripted_origins import SlowOrigin

BODY = bytes(range(256)) * 4096  # 1 MiB, every byte value


@pytest.fixture
def site_root(tmp_path: Path) -> Path:
    root = tmp_path / "www"
    root.mkdir()
    (root / "blob.bin").write_bytes(BODY)
    (root / "small.txt").write_text("hello from the origin\n")
    return root


@pytest.fixture
def h2_origin(site_root: Path, origin_pki: OriginPKI) -> Iterator[Origin]:
    with hypercorn_origin(site_root, "127.0.0.4", tls=origin_pki.issue(["127.0.0.4"])) as origin:
        yield origin


def curl(proxy: RunningProxy, url: str, *extra: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [
            "curl",
            "--silent",
            "--show-error",
            "--fail",
            "--max-time",
            "30",
            "--proxy",
            proxy.proxy_url,
            *extra,
            url,
        ],
        capture_output=True,
        timeout=60,
    )


def test_curl_fetches_http_and_https_through_the_proxy(
    start_reshape: StartProxy, http_origin: Origin, https_origin: Origin
) -> None:
    proxy = start_reshape()
    plain = curl(proxy, http_origin.url("/blob.bin"))
    assert plain.returncode == 0, plain.stderr
    assert hashlib.sha256(plain.stdout).digest() == hashlib.sha256(BODY).digest()
    # HTTPS is intercepted: curl verifies the proxy's certificate against /ca.pem alone.
    secure = curl(proxy, https_origin.url("/blob.bin"), "--cacert", str(proxy.ca_cert))
    assert secure.returncode == 0, secure.stderr
    assert secure.stdout == BODY
    issuer = subprocess.run(
        [
            "curl",
            "-sv",
            "-o",
            "/dev/null",
            "--proxy",
            proxy.proxy_url,
            "--cacert",
            str(proxy.ca_cert),
            https_origin.url("/small.txt"),
        ],
        capture_output=True,
        text=True,
    ).stderr
    assert "reshape interception CA" in issuer


def test_https_without_trusting_the_ca_fails(
    start_reshape: StartProxy, https_origin: Origin
) -> None:
    proxy = start_reshape()
    result = curl(proxy, https_origin.url("/small.txt"))
    assert result.returncode == 60  # peer certificate cannot be authenticated


def test_origins_are_verified(start_reshape: StartProxy, site_root: Path, tmp_path: Path) -> None:
    stranger = OriginPKI(tmp_path / "stranger")  # a CA reshape was not told to trust
    with nginx_origin(site_root, "127.0.0.5", tls=stranger.issue(["127.0.0.5"])) as origin:
        proxy = start_reshape()
        result = curl(
            proxy,
            origin.url("/small.txt"),
            "--cacert",
            str(proxy.ca_cert),
            "--write-out",
            "%{http_code}",
        )
        assert result.returncode == 22  # --fail: an HTTP error status, not a body
        assert result.stdout.endswith(b"502")
        assert proxy.metric("reshape_requests_total", outcome="upstream_error") == 1


def test_h2_client_to_h2_origin(start_reshape: StartProxy, h2_origin: Origin) -> None:
    proxy = start_reshape()
    trust = ssl.create_default_context(cafile=proxy.ca_cert)
    with httpx.Client(http2=True, proxy=proxy.proxy_url, verify=trust) as client:
        responses = [client.get(h2_origin.url("/blob.bin")) for _ in range(3)]
    assert all(r.status_code == 200 and r.content == BODY for r in responses)
    assert [r.http_version for r in responses] == ["HTTP/2"] * 3
    assert proxy.metric("reshape_requests_total", client_proto="h2", outcome="ok") == 3
    assert proxy.metric("reshape_upstream_connections_opened_total", proto="h2") >= 1


def test_metrics_follow_the_traffic(start_reshape: StartProxy, http_origin: Origin) -> None:
    proxy = start_reshape()
    for _ in range(5):
        assert curl(proxy, http_origin.url("/blob.bin"), "-o", "/dev/null").returncode == 0
    ok = dict(policy="baseline", arm="none", client_proto="h1", outcome="ok")
    assert proxy.metric("reshape_requests_total", **ok) == 5
    assert proxy.metric("reshape_response_bytes_total", policy="baseline") == 5 * len(BODY)
    assert proxy.metric("reshape_transaction_seconds_count", policy="baseline") == 5
    assert proxy.metric("reshape_client_connections_total") == 5
    # reshape's own answers are no origin's response time: they counted in the histogram, a
    # 504 at the read timeout with all its wait.
    host, port = unreachable_address("127.0.0.6")
    refused = curl(proxy, f"http://{host}:{port}/", "-o", "/dev/null", "-w", "%{http_code}")
    assert refused.stdout == b"502"
    assert proxy.metric("reshape_transaction_seconds_count", policy="baseline") == 5
    # curl has gone; the proxy notices its closed connection on its own time.
    deadline = time.monotonic() + 5
    while proxy.metric("reshape_client_connections_active") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proxy.metric("reshape_client_connections_active") == 0
    # Five clients, one after the other: the pool's connection carries all of them.
    assert proxy.metric("reshape_upstream_connections_opened_total", proto="h1") == 1
    text = proxy.metrics()
    for name in (
        "reshape_requests_total",
        "reshape_transaction_seconds_bucket",
        "reshape_upstream_connections_opened_total",
        "reshape_response_bytes_total",
        "reshape_client_connections_total",
        "reshape_client_connections_active",
    ):
        assert f"\n{name}" in text


def test_admin_endpoints(start_reshape: StartProxy) -> None:
    proxy = start_reshape()
    status, pac = http_get(f"http://{proxy.admin}/proxy.pac")
    assert status == 200 and f'"PROXY {proxy.listen}"'.encode() in pac
    status, pem = http_get(f"http://{proxy.admin}/ca.pem")
    assert status == 200 and pem == (proxy.confdir / "mitmproxy-ca-cert.pem").read_bytes()
    assert http_get(f"http://{proxy.admin}/healthz")[0] == 200


def test_sigterm_drains_requests_in_flight_then_exits_0(start_reshape: StartProxy) -> None:
    proxy = start_reshape()
    with SlowOrigin("127.0.0.6", delay=1.5) as origin:
        url = f"http://{origin.host}:{origin.port}/"
        result: dict[str, object] = {}

        def fetch() -> None:
            result["response"] = curl(proxy, url)

        fetcher = threading.Thread(target=fetch)
        fetcher.start()
        time.sleep(0.5)  # the request is now waiting on the origin
        started = time.monotonic()
        status = proxy.stop()
        fetcher.join(10)
        response = result["response"]
        assert isinstance(response, subprocess.CompletedProcess)
        assert response.returncode == 0 and response.stdout == b"slow"
        assert status == 0
        assert time.monotonic() - started < 8
        # After the drain nothing listens any more.
        assert curl(proxy, url).returncode == 7
