"""Done-when: an htpasswd file made with Apache's `htpasswd -B` (Debian's apache2-utils) admits
its user and refuses a wrong password, through a real `reshape run --users`; users added with
htpasswd while it runs are admitted without a restart."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from reshape.features.onboarding.addon import ONBOARDING_HOST
from tests.support.reshape_process import REPO, RESHAPE, StartProxy

HTPASSWD = "/usr/bin/htpasswd"
URL = f"http://{ONBOARDING_HOST}/"


def htpasswd(*args: str) -> None:
    subprocess.run([HTPASSWD, *args], check=True, capture_output=True, timeout=30)


def status_as(proxy_url: str, user: str | None, password: str = "") -> str:
    credentials = ["--proxy-user", f"{user}:{password}"] if user else []
    result = subprocess.run(
        ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "-x", proxy_url, *credentials]
        + [URL],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return result.stdout


def reshape(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RESHAPE, *args], capture_output=True, text=True, cwd=REPO, timeout=60)


@pytest.mark.slow
def test_apaches_htpasswd_file_admits_its_user_and_refuses_a_wrong_password(
    start_reshape: StartProxy, tmp_path: Path
) -> None:
    users = tmp_path / "users.htpasswd"
    htpasswd("-c", "-b", "-B", str(users), "bob", "s3cret pass")
    # htpasswd creates it readable by everyone; reshape says so and how to fix it.
    exposed = reshape("users", "list", "--users", str(users))
    assert exposed.returncode == 2 and f"chmod 600 {users}" in exposed.stderr
    users.chmod(0o600)
    assert reshape("users", "list", "--users", str(users)).stdout == "bob\n"
    refused = reshape("users", "remove", "bob", "--users", str(users))
    assert refused.returncode == 2 and "manage it with htpasswd(1)" in refused.stderr

    proxy = start_reshape("--users", str(users))
    assert status_as(proxy.proxy_url, "bob", "s3cret pass") == "200"
    assert status_as(proxy.proxy_url, "bob", "s3cret Pass") == "407"
    assert status_as(proxy.proxy_url, "alice", "s3cret pass") == "407"
    assert status_as(proxy.proxy_url, None) == "407"

    htpasswd("-b", "-B", str(users), "carol", "another")  # rewrites the file in place, 0600 kept
    deadline = time.monotonic() + 10
    while status_as(proxy.proxy_url, "carol", "another") != "200":
        assert time.monotonic() < deadline, proxy.log()
        time.sleep(0.3)
    assert status_as(proxy.proxy_url, "bob", "s3cret pass") == "200"
    assert proxy.metric("reshape_proxy_auth_failures_total", reason="rejected") >= 2
