"""Dashboards use only metrics reshape defines, and every panel filters by policy and arm."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

import proxy.metrics  # noqa: F401  (defines the metrics)

DASHBOARDS = sorted((Path(__file__).resolve().parents[1] / "dashboards").glob("*.json"))


SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def exported_names() -> set[str]:
    """Every series name the reshape metrics can export, whether or not it has samples yet."""
    names = set()
    for family in REGISTRY.collect():
        if family.name.startswith("reshape_"):
            names.update(family.name + suffix for suffix in SUFFIXES[family.type])
    return names


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_queries_use_only_defined_reshape_metrics(path: Path) -> None:
    dashboard = json.loads(path.read_text())
    defined = exported_names()
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"policy", "arm"} <= variables
    assert dashboard["panels"]
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            used = set(re.findall(r"\b(reshape_[a-z_]+)", target["expr"]))
            assert used, target["expr"]
            assert used <= defined, used - defined


def test_there_is_an_overview() -> None:
    assert any(p.name == "overview.json" for p in DASHBOARDS)
