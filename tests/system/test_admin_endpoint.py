"""The admin endpoint of a real `reshape run`, one process and `--workers 2` (the supervisor's
merged metrics): OpenMetrics and gzip negotiation and HEAD on every path."""

from __future__ import annotations

import http.client

import httpx
import pytest

from reshape.features.onboarding.addon import ONBOARDING_HOST
from tests.support.reshape_process import StartProxy

ONBOARDING_PATHS = ["/", "/cert/pem", "/cert/cer", "/cert/p12"]
PATHS = ["/metrics", "/healthz", "/proxy.pac", "/ca.pem", *ONBOARDING_PATHS]
OPENMETRICS = "application/openmetrics-text; version=1.0.0"


def head(admin: str, path: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    host, port = admin.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request("HEAD", path, headers=headers)
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["1", "2"])
def test_metrics_formats_gzip_and_head_on_every_path(
    start_reshape: StartProxy, workers: str
) -> None:
    proxy = start_reshape("--workers", workers)
    with httpx.Client(proxy=proxy.proxy_url) as client:  # requests some worker counts
        for _ in range(4):
            assert client.get(f"http://{ONBOARDING_HOST}/").status_code == 200
    with httpx.Client(base_url=f"http://{proxy.admin}") as admin:
        plain = admin.get("/metrics", headers={"Accept-Encoding": "identity"})
        assert plain.headers["content-type"].startswith("text/plain")
        assert "# EOF" not in plain.text
        requests = sum(
            float(line.rsplit(" ", 1)[1])
            for line in plain.text.splitlines()
            if line.startswith("reshape_requests_total{")
        )
        assert requests == 4  # every worker's count, merged
        response = admin.get("/metrics", headers={"Accept": OPENMETRICS, "Accept-Encoding": "gzip"})
        assert response.headers["content-type"].startswith(OPENMETRICS)
        assert response.headers["content-encoding"] == "gzip"  # httpx has decoded it
        assert response.text.endswith("# EOF\n") and "reshape_requests_total{" in response.text
        for path in PATHS:
            for headers in ({}, {"Accept": OPENMETRICS, "Accept-Encoding": "gzip"}):
                get = admin.get(path, headers={"Accept-Encoding": "identity"} | headers)
                status, head_headers, body = head(
                    proxy.admin, path, {"Accept-Encoding": "identity"} | headers
                )
                assert status == get.status_code == 200, path
                assert body == b"", path
                assert head_headers["content-type"] == get.headers["content-type"], path
                assert head_headers.get("content-encoding") == get.headers.get("content-encoding")
                if path != "/metrics":  # metrics may move between the two requests
                    assert int(head_headers["content-length"]) == len(get.content), path
                else:
                    assert int(head_headers["content-length"]) > 0
