"""`reshape run --client-header-timeout S`: checked at start-up, passed to the workers."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.cli import main
from proxy.client_errors import DEFAULT_HEADER_TIMEOUT
from proxy.config import RunConfig


@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_a_timeout_that_is_not_positive_is_refused(
    value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["run", "--confdir", str(tmp_path), "--client-header-timeout", value])
    assert status == 2
    assert "--client-header-timeout must be positive" in capsys.readouterr().err


def test_the_default_and_the_worker_handover(monkeypatch: pytest.MonkeyPatch) -> None:
    from proxy.addresses import parse_listen_address
    from proxy.serve import worker_config, worker_environment

    config = RunConfig(
        listen=parse_listen_address("127.0.0.1:0", option="--listen"),
        admin=parse_listen_address("127.0.0.1:0", option="--admin"),
        policy_path=Path("policies/default.yaml"),
        confdir=Path("/tmp/c"),
        upstream_ca=None,
        workers=2,
        drain_seconds=1.0,
    )
    assert config.client_header_timeout == DEFAULT_HEADER_TIMEOUT
    for name, value in worker_environment(
        RunConfig(**{**config.__dict__, "client_header_timeout": 2.5})
    ).items():
        monkeypatch.setenv(name, value)
    assert worker_config().client_header_timeout == 2.5
