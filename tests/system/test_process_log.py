"""`reshape run --log-level`, `--log-format json` and `--log-requests` in a real process."""

from __future__ import annotations

import json

import httpx
import pytest

from reshape.features.onboarding.addon import ONBOARDING_HOST
from tests.support.reshape_process import StartProxy


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["1", "2"])
def test_json_lines_with_every_request(start_reshape: StartProxy, workers: str) -> None:
    proxy = start_reshape("--log-format", "json", "--log-requests", "--workers", workers)
    with httpx.Client(proxy=proxy.proxy_url) as client:
        assert client.get(f"http://{ONBOARDING_HOST}/cert/pem").status_code == 200
        assert client.get(f"http://{ONBOARDING_HOST}/missing").status_code == 404
    assert proxy.stop() == 0
    lines = [json.loads(line) for line in proxy.log().splitlines()]  # every line is JSON
    assert any("proxy listening on" in line["message"] for line in lines)
    requests = [line["request"] for line in lines if line["logger"] == "reshape.requests"]
    assert sorted(r["status"] for r in requests) == [200, 404]
    assert all(r["host"] == ONBOARDING_HOST and r["policy"] == "baseline" for r in requests)


@pytest.mark.slow
def test_log_level_warning_keeps_start_up_quiet(start_reshape: StartProxy) -> None:
    proxy = start_reshape("--log-level", "warning", "--log-requests")
    with httpx.Client(proxy=proxy.proxy_url) as client:
        assert client.get(f"http://{ONBOARDING_HOST}/").status_code == 200
    assert proxy.stop() == 0
    assert proxy.log() == ""  # requests and start-up facts are info


@pytest.mark.slow
def test_text_by_default_with_requests_only_when_asked(start_reshape: StartProxy) -> None:
    quiet, chatty = start_reshape(), start_reshape("--log-requests")
    for proxy in (quiet, chatty):
        with httpx.Client(proxy=proxy.proxy_url) as client:
            assert client.get(f"http://{ONBOARDING_HOST}/").status_code == 200
        assert proxy.stop() == 0
    assert " INFO reshape: proxy listening on " in quiet.log()
    assert f"GET http://{ONBOARDING_HOST}" not in quiet.log()
    assert f" INFO reshape.requests: GET http://{ONBOARDING_HOST} 200 ok " in chatty.log()
