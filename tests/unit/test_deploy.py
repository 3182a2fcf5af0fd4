"""deploy/: the docker-compose stack (proxy + Prometheus + Grafana), checked without Docker.

There is no Docker engine where the suite runs, so this checks what can go wrong before one
starts: the YAML, that every file a service mounts exists, that the proxy's command is one
`reshape run` accepts and lets the Prometheus container in, that Prometheus (its own `promtool`)
accepts its configuration and scrapes the proxy's admin port, and that Grafana's provisioning
finds the data source and the repository's dashboards.
"""

from __future__ import annotations

import ipaddress
import urllib.parse
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from ruamel.yaml import YAML

from reshape.app.config import RunConfig
from reshape.cli import _parser, run_config
from reshape.features.client_access.addon import client_allowed
from tests.support.reshape_process import REPO
from tests.system.test_deploy_checks import image_environment

DEPLOY = REPO / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"


def read_yaml(path: Path) -> Any:
    return YAML(typ="safe").load(path.read_text())


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document: dict[str, Any] = read_yaml(COMPOSE)
    return document


def mounts(service: dict[str, Any]) -> dict[PurePosixPath, str]:
    """Container path → source (a host path relative to deploy/, or a named volume)."""
    found = {}
    for volume in service.get("volumes", []):
        source, target, *_ = volume.split(":")
        found[PurePosixPath(target)] = source
    return found


def host_path(service: dict[str, Any], container_path: str) -> Path:
    """Where a path inside the container comes from on the host, through its bind mounts."""
    path = PurePosixPath(container_path)
    for target, source in sorted(mounts(service).items(), key=lambda m: -len(m[0].parts)):
        if path == target or target in path.parents:
            assert source.startswith(("./", "../")), f"{container_path} is in volume {source}"
            return (DEPLOY / source / path.relative_to(target)).resolve()
    raise AssertionError(f"{container_path} is not mounted from the host")


def proxy_config(compose: dict[str, Any]) -> RunConfig:
    """The proxy service's command as `reshape run` sees it: with the image's environment and the
    service's own on top (RESHAPE_* variables are the flags' defaults)."""
    service = compose["services"]["proxy"]
    environment = {**image_environment(), **service.get("environment", {})}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in environment.items():
            patch.setenv(name, str(value))
        args = _parser().parse_args([str(a) for a in service["command"]])
    assert args.command == "run"
    return run_config(args)  # raises UsageError as `reshape run` would refuse to start


def compose_subnet(compose: dict[str, Any]) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    (network,) = compose["networks"].values()
    (pool,) = network["ipam"]["config"]
    return ipaddress.ip_network(pool["subnet"])


def test_the_stack_has_its_three_services(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"proxy", "prometheus", "grafana"}
    build = compose["services"]["proxy"]["build"]
    assert (DEPLOY / build["context"]).resolve() == REPO
    assert (DEPLOY / build["context"] / build.get("dockerfile", "Dockerfile")).is_file()


def test_every_mounted_file_exists_and_every_volume_is_declared(compose: dict[str, Any]) -> None:
    declared = set(compose.get("volumes") or {})
    for name, service in compose["services"].items():
        for target, source in mounts(service).items():
            if source.startswith(("./", "../", "/")):
                assert (DEPLOY / source).exists(), f"{name}: {source} (for {target}) is missing"
            else:
                assert source in declared, f"{name}: volume {source} not declared"


def test_ports_are_published_on_loopback_only(compose: dict[str, Any]) -> None:
    """An open proxy on the host's network would be anyone's; widening it is a decision."""
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name}: {port}"


def test_proxy_command_is_accepted_and_lets_the_compose_network_in(
    compose: dict[str, Any],
) -> None:
    config = proxy_config(compose)
    # Other containers (Prometheus) must reach the admin endpoint, the host the proxy port.
    assert config.listen.is_wildcard and config.admin.is_wildcard
    subnet = compose_subnet(compose)
    for address in (subnet[1], subnet[2], subnet[-2]):  # the gateway, the first containers, …
        assert client_allowed(str(address), config.allow_clients), address
    assert not client_allowed("8.8.8.8", config.allow_clients)
    ports = {str(p).rsplit(":", 1)[1] for p in compose["services"]["proxy"]["ports"]}
    assert {str(config.listen.port), str(config.admin.port)} <= ports


def test_prometheus_scrapes_the_proxys_admin_port(compose: dict[str, Any]) -> None:
    service = compose["services"]["prometheus"]
    flags = dict(a.split("=", 1) for a in service["command"] if "=" in a)
    config = read_yaml(host_path(service, flags["--config.file"]))
    targets = [
        target
        for job in config["scrape_configs"]
        for static in job["static_configs"]
        for target in static["targets"]
    ]
    assert f"proxy:{proxy_config(compose).admin.port}" in targets
    assert all(
        job.get("metrics_path", "/metrics") == "/metrics" for job in config["scrape_configs"]
    )


def test_grafana_data_source_is_the_stacks_prometheus(compose: dict[str, Any]) -> None:
    service = compose["services"]["grafana"]
    directory = host_path(service, "/etc/grafana/provisioning/datasources")
    sources = [s for f in sorted(directory.glob("*.yml")) for s in read_yaml(f)["datasources"]]
    (source,) = sources
    assert source["type"] == "prometheus" and source["isDefault"]
    url = urllib.parse.urlsplit(source["url"])
    assert url.hostname in compose["services"]
    assert url.port == 9090  # Prometheus's own port in its container


def test_grafana_provisions_the_repositorys_dashboards(compose: dict[str, Any]) -> None:
    service = compose["services"]["grafana"]
    directory = host_path(service, "/etc/grafana/provisioning/dashboards")
    providers = [p for f in sorted(directory.glob("*.yml")) for p in read_yaml(f)["providers"]]
    assert providers
    for provider in providers:
        assert provider["type"] == "file"
        assert host_path(service, provider["options"]["path"]) == REPO / "dashboards"
    home = service["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert host_path(service, home).is_file()
