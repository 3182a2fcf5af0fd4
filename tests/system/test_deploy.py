"""deploy/: the docker-compose stack (proxy + Prometheus + Grafana), checked without Docker.

There is no Docker engine where the suite runs, so this checks what can go wrong before one
starts: the YAML, that every file a service mounts exists, that the proxy's command is one
`reshape run` accepts and lets the Prometheus container in, that Prometheus (its own `promtool`)
accepts its configuration and scrapes the proxy's admin port, and that Grafana's provisioning
finds the data source and the repository's dashboards.
"""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from tests.support.reshape_process import REPO, RESHAPE
from tests.unit.test_deploy import COMPOSE, host_path, proxy_config, read_yaml

PROMTOOL = "/usr/bin/promtool"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document: dict[str, Any] = read_yaml(COMPOSE)
    return document


def test_proxy_policy_is_valid(compose: dict[str, Any]) -> None:
    config = proxy_config(compose)
    policy = host_path(compose["services"]["proxy"], str(config.policy_path))
    result = subprocess.run(
        [*RESHAPE, "policy", "check", str(policy)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_prometheus_config_is_accepted_by_promtool(compose: dict[str, Any]) -> None:
    service = compose["services"]["prometheus"]
    flags = dict(a.split("=", 1) for a in service["command"] if "=" in a)
    config = host_path(service, flags["--config.file"])
    result = subprocess.run(
        [PROMTOOL, "check", "config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
