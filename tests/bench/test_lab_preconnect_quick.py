"""`python -m bench.lab run --quick preconnect` end to end, and its pure parts."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.lab.preconnect import MODES, preconnect_configs, preconnect_counts
from tests.bench.test_lab_quick import _quick_run


def test_one_config_per_mode_each_with_its_policy(tmp_path: Path) -> None:
    configs = preconnect_configs(tmp_path)
    assert [c.name for c in configs] == [f"preconnect-{m}" for m in MODES]
    for config, mode in zip(configs, MODES, strict=True):
        assert config.policy is not None
        assert f"preconnect: {{mode: {mode}}}" in config.policy.read_text()


def test_no_admin_endpoint_means_no_counts() -> None:
    assert preconnect_counts(None) == (0, 0)


@pytest.mark.slow
@pytest.mark.browser
def test_quick_preconnect_warms_what_the_warm_up_load_taught(tmp_path: Path) -> None:
    loads, stdout = _quick_run("preconnect", tmp_path)
    by_config = {load["config"]: load for load in loads}
    assert set(by_config) == {f"preconnect-{m}" for m in MODES}
    off, learned = by_config["preconnect-off"], by_config["preconnect-learned"]
    assert off["preconnects_used"] == off["preconnects_unused"] == 0
    # The warm-up load taught learned the news page's origins: its load found them warm.
    assert isinstance(learned["preconnects_used"], int) and learned["preconnects_used"] >= 5
    assert "## preconnect: news" in stdout
    assert "wasted share" in stdout
