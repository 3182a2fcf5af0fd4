"""`reshape report --prometheus` against a Prometheus that wants credentials: Basic in the URL
(Prometheus' own web.config.file), a bearer token and a tenant header (checked by nginx in front
of it, as a gateway would). The credentials work, wrong ones fail in one line, none is printed."""

from __future__ import annotations

import base64
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import httpx
import pytest

from labkit.processes import free_port
from reshape.features.onboarding.addon import ONBOARDING_HOST
from tests.support.reshape_process import REPO, RESHAPE, StartProxy

PROMETHEUS = "/usr/bin/prometheus"
NGINX = "/usr/sbin/nginx"
USER, PASSWORD = "reporter", "s3cret-for-prometheus"
TOKEN = "tok3n-for-the-gateway"
POLICY = """\
version: 1
default: direct
policies:
  direct: {}
  other: {}
experiments:
  - name: creds
    unit: header:X-User
    arms:
      control: {policy: direct, weight: 50}
      treatment: {policy: other, weight: 50}
"""

pytestmark = pytest.mark.slow


def basic() -> str:
    return "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()


def wait_until(check: object, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():  # type: ignore[operator]
                return
        except (httpx.HTTPError, LookupError, ValueError):  # not up yet, nothing scraped yet
            pass
        time.sleep(0.3)
    pytest.fail(f"{what} did not happen in {timeout} s")


@pytest.fixture
def prometheus(tmp_path: Path, start_reshape: StartProxy) -> Iterator[str]:
    """A Prometheus with Basic authentication, scraping a proxy that served the experiment."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    proxy = start_reshape(policy=policy)
    with httpx.Client(proxy=proxy.proxy_url) as client:
        for user in range(40):
            response = client.get(f"http://{ONBOARDING_HOST}/", headers={"X-User": f"u{user}"})
            assert response.status_code == 200
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    (tmp_path / "web.yml").write_text(f"basic_auth_users:\n  {USER}: '{hashed}'\n")
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s}\nscrape_configs:\n  - job_name: reshape\n"
        f"    static_configs: [{{targets: ['{proxy.admin}']}}]\n"
    )
    address = f"127.0.0.1:{free_port()}"
    with (tmp_path / "prometheus.log").open("wb") as log:
        process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--web.config.file={tmp_path / 'web.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address={address}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        query = f"http://{address}/api/v1/query"
        wait_until(
            lambda: (
                httpx.get(
                    query,
                    params={"query": 'sum(reshape_requests_total{arm=~"creds:.*"})'},
                    headers={"Authorization": basic()},
                ).json()["data"]["result"][0]["value"][1]
                == "40"
            ),
            "Prometheus scraping the proxy",
        )
        assert httpx.get(query, params={"query": "up"}).status_code == 401  # it wants them
        yield address
    finally:
        process.terminate()
        process.wait(20)


@pytest.fixture
def gateway(tmp_path: Path, prometheus: str) -> Iterator[str]:
    """nginx in front of Prometheus, admitting a bearer token with a tenant header only."""
    directory = tmp_path / "nginx"
    directory.mkdir()
    address = f"127.0.0.1:{free_port()}"
    (directory / "nginx.conf").write_text(
        f"""user root;
worker_processes 1;
pid {directory}/nginx.pid;
error_log {directory}/error.log warn;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {directory}/body;
    proxy_temp_path {directory}/proxy;
    fastcgi_temp_path {directory}/fastcgi;
    uwsgi_temp_path {directory}/uwsgi;
    scgi_temp_path {directory}/scgi;
    server {{
        listen {address};
        location / {{
            if ($http_authorization != "Bearer {TOKEN}") {{ return 401; }}
            if ($http_x_scope_orgid != "team-a") {{ return 403; }}
            proxy_set_header Authorization "{basic()}";
            proxy_pass http://{prometheus};
        }}
    }}
}}
"""
    )
    process = subprocess.Popen(
        [NGINX, "-c", str(directory / "nginx.conf"), "-g", "daemon off;"],
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: httpx.get(f"http://{address}/").status_code == 401, "nginx starting")
        yield address
    finally:
        process.terminate()
        process.wait(20)


def report(*args: str, token: Path | None = None) -> subprocess.CompletedProcess[str]:
    extra = ["--prometheus-token-file", str(token)] if token else []
    return subprocess.run(
        [*RESHAPE, "report", "--experiment", "creds", *args, *extra],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


def test_basic_credentials_in_the_url(prometheus: str) -> None:
    result = report("--prometheus", f"http://{USER}:{PASSWORD}@{prometheus}", "--json")
    assert result.returncode == 0, result.stderr
    assert '"treatment"' in result.stdout and PASSWORD not in result.stdout + result.stderr
    wrong = report("--prometheus", f"http://{USER}:not-it@{prometheus}")
    assert wrong.returncode == 1
    (line,) = wrong.stderr.strip().splitlines()
    assert f"Prometheus at http://{prometheus} refused the credentials (HTTP 401)" in line
    assert "not-it" not in wrong.stderr + wrong.stdout
    missing = report("--prometheus", f"http://{prometheus}")
    assert missing.returncode == 1 and "refused the credentials" in missing.stderr


def test_bearer_token_and_a_header(tmp_path: Path, gateway: str) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    header = ["--prometheus-header", "X-Scope-OrgID: team-a"]
    result = report("--prometheus", f"http://{gateway}", *header, token=token)
    assert result.returncode == 0, result.stderr
    assert "upstream connections per request" in result.stdout and TOKEN not in result.stdout
    other = report(
        "--prometheus", f"http://{gateway}", "--prometheus-header", "X-Scope-OrgID: b", token=token
    )
    assert other.returncode == 1 and "HTTP 403" in other.stderr
    assert TOKEN not in other.stderr
    no_token = report("--prometheus", f"http://{gateway}", *header)
    assert no_token.returncode == 1 and "HTTP 401" in no_token.stderr
