"""The Grafana dashboards in dashboards/: well-formed, built only from metrics
reshape/features/telemetry/metrics.py defines. Every panel's query against a real Prometheus:
tests/system/test_dashboards.py."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

import reshape.features.telemetry.metrics  # noqa: F401  (registers every reshape metric)

DASHBOARD_DIR = Path(__file__).resolve().parents[2] / "dashboards"
DASHBOARDS = sorted(DASHBOARD_DIR.glob("*.json"))
EXPECTED = {"overview.json", "upstream-pool.json", "tls-trailers.json", "experiments.json"}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
BUILTINS = ("$__rate_interval", "$__interval", "$__range")

SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
METRIC = re.compile(r"\breshape_[a-z0-9_]+\b")
VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")
LABEL_VALUES = re.compile(r"^label_values\((?:(.+),\s*)?(\w+)\)$")


@dataclass(frozen=True)
class Target:
    dashboard: str  # file name
    panel: str  # title
    ref: str
    expr: str
    instant: bool

    def __str__(self) -> str:
        return f"{self.dashboard} / {self.panel!r} [{self.ref}]"


def load(path: Path) -> dict[str, Any]:
    board: dict[str, Any] = json.loads(path.read_text())
    return board


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those folded into rows included."""
    for panel in board.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def targets(path: Path) -> list[Target]:
    return [
        Target(path.name, panel["title"], t["refId"], t["expr"], bool(t.get("instant")))
        for panel in panels(load(path))
        for t in panel.get("targets", [])
    ]


def variables(board: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in board["templating"]["list"]}


def exported_names() -> dict[str, str]:
    """Every series name reshape's metrics can export (whether or not it has samples yet) →
    the metric's name as reshape/features/telemetry/metrics.py declares it."""
    names = {}
    for family in REGISTRY.collect():
        if family.name.startswith("reshape_"):
            for suffix in SUFFIXES[family.type]:
                names[family.name + suffix] = family.name
    return names


# ------------------------------------------------------------------------------------- static


def test_the_four_dashboards_are_there() -> None:
    missing = EXPECTED - {p.name for p in DASHBOARDS}
    assert not missing, missing


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_is_well_formed(path: Path) -> None:
    board = load(path)  # valid JSON, or this raises with the position
    assert board["title"].startswith("reshape"), board["title"]
    assert board["uid"] and len(board["uid"]) <= 40  # Grafana's limit
    found = list(panels(board))
    assert found, "no panels"
    ids = [p["id"] for p in found]
    assert len(ids) == len(set(ids)), f"duplicate panel ids: {sorted(ids)}"
    for panel in found:
        if panel["type"] == "row":
            continue
        where = f"{path.name} / {panel['title']!r}"
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24, where
        assert panel["targets"], f"{where}: no query"
        assert panel.get("description"), f"{where}: say what the panel shows"


def test_dashboard_uids_are_unique() -> None:
    uids = [load(p)["uid"] for p in DASHBOARDS]
    assert len(uids) == len(set(uids)), uids


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_datasource_is_a_variable(path: Path) -> None:
    """No data source uid of one Grafana baked in: importing picks the user's Prometheus."""
    board = load(path)
    declared = variables(board)
    assert declared["datasource"]["type"] == "datasource"
    assert declared["datasource"]["query"] == "prometheus"
    for variable in declared.values():
        if variable["type"] == "query":
            assert variable["datasource"] == DATASOURCE, variable["name"]
    for panel in panels(board):
        assert panel.get("datasource") == DATASOURCE, panel["title"]
        for target in panel.get("targets", []):
            assert target.get("datasource", DATASOURCE) == DATASOURCE, panel["title"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_policy_and_arm_variables_come_from_label_values(path: Path) -> None:
    declared = variables(load(path))
    for name in ("policy", "arm"):
        variable = declared[name]
        match = LABEL_VALUES.match(variable["definition"])
        assert variable["type"] == "query" and match and match[2] == name, variable
        assert variable["query"]["query"] == variable["definition"]
        assert variable["includeAll"] and variable["allValue"] == ".*"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_queries_use_only_metrics_defined_in_proxy_metrics(path: Path) -> None:
    defined = exported_names()
    problems = []
    for target in targets(path):
        used = set(METRIC.findall(target.expr))
        if not used:
            problems.append(f"{target}: no reshape_ metric in {target.expr!r}")
        for name in sorted(used - set(defined)):
            problems.append(
                f"{target}: {name} is not defined in reshape/features/telemetry/metrics.py "
                "(not yet added, or renamed?)"
            )
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_queries_use_only_declared_variables_and_grafana_intervals(path: Path) -> None:
    """A hard-coded range ([5m]) would show nothing at a short scrape interval or a long zoom."""
    declared = set(variables(load(path)))
    for target in targets(path):
        expr = target.expr
        for builtin in BUILTINS:
            expr = expr.replace(builtin, "")
        used = {a or b for a, b in VARIABLE.findall(expr)}
        assert used <= declared, f"{target}: undeclared {used - declared}"
        ranges = re.findall(r"\[([^\]]*)\]", target.expr)
        assert all(r in BUILTINS for r in ranges), f"{target}: range {ranges}"


def test_every_reshape_metric_is_on_a_dashboard() -> None:
    """A metric nobody can see is a metric nobody reads: a new one needs a panel."""
    used = {name for path in DASHBOARDS for t in targets(path) for name in METRIC.findall(t.expr)}
    missing = sorted(set(exported_names().values()) - {exported_names()[n] for n in used})
    assert not missing, (
        f"metrics on no dashboard (add a panel, see dashboards/README.md): {missing}"
    )
