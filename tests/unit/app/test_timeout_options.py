"""`reshape run --client-header-timeout S`, `--client-idle-timeout S`, `--origin-connect-timeout S`,
`--origin-read-timeout S`: checked at start-up, passed to the workers."""

from __future__ import annotations

from pathlib import Path

import pytest

from reshape.app.config import RunConfig
from reshape.cli import main
from reshape.features.client_errors.rules import (
    DEFAULT_CLIENT_IDLE_TIMEOUT,
    DEFAULT_HEADER_TIMEOUT,
)
from reshape.policy.schema import UpstreamKnobs

OPTIONS = [
    "--client-header-timeout",
    "--client-idle-timeout",
    "--origin-connect-timeout",
    "--origin-read-timeout",
]


@pytest.mark.parametrize("option", OPTIONS)
@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_a_timeout_that_is_not_positive_is_refused(
    option: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["run", "--confdir", str(tmp_path), option, value])
    assert status == 2
    assert f"{option} must be positive, got {value}" in capsys.readouterr().err


def test_the_default_and_the_worker_handover(monkeypatch: pytest.MonkeyPatch) -> None:
    from reshape.app.serve import worker_config, worker_environment
    from reshape.base.addresses import parse_listen_address

    config = RunConfig(
        listen=parse_listen_address("127.0.0.1:0", option="--listen"),
        admin=parse_listen_address("127.0.0.1:0", option="--admin"),
        policy_path=Path("reshape/policy/default.yaml"),
        confdir=Path("/tmp/c"),
        upstream_ca=None,
        workers=2,
        drain_seconds=1.0,
    )
    assert config.client_header_timeout == DEFAULT_HEADER_TIMEOUT
    assert config.client_idle_timeout == DEFAULT_CLIENT_IDLE_TIMEOUT
    # mitmproxy's own connections default to the pool's timeouts.
    pool = UpstreamKnobs()
    assert (config.origin_connect_timeout, config.origin_read_timeout) == (
        pool.connect_timeout,
        pool.read_timeout,
    )
    changed = {
        "client_header_timeout": 2.5,
        "client_idle_timeout": 7.5,
        "origin_connect_timeout": 3.0,
        "origin_read_timeout": 4,
    }
    for name, value in worker_environment(RunConfig(**{**config.__dict__, **changed})).items():
        monkeypatch.setenv(name, value)
    worker = worker_config()
    assert (worker.client_header_timeout, worker.origin_connect_timeout) == (2.5, 3.0)
    assert worker.origin_read_timeout == 4
    assert worker.client_idle_timeout == 7.5
