from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench.capacity.apache import APACHE, ApacheSettings, config
from bench.capacity.metrics import Samples
from bench.capacity.report import SEARCH, ConfigResult, StepSummary, capacity_table
from bench.capacity.search import CapacitySearch
from bench.capacity.users import PageOutcome, StepPlan, StepResult
from tests.support.quick_bench import run_quick

CONFIG_LABELS = (
    "direct, 2/user",
    "direct, 6/user",
    "reshape pool",
    "reshape pool, http2: true",
    "reshape {}",
)


@pytest.mark.parametrize(
    ("truth", "steps"),
    [
        (0, [2, 1]),
        (1, [2, 1]),
        (3, [2, 4, 3]),
        (8, [2, 4, 8, 16, 12, 10, 9]),
        (12, [2, 4, 8, 16, 12, 14, 13]),
    ],
)
def test_search_doubles_then_bisects_to_the_exact_capacity(truth: int, steps: list[int]) -> None:
    search = CapacitySearch(start=2, limit=32, max_steps=10)
    taken = []
    while (users := search.next_users()) is not None:
        taken.append(users)
        search.record(users, users <= truth)
    assert taken == steps
    assert search.capacity == truth
    assert search.exact
    assert search.label() == str(truth)


def test_a_search_cut_short_reports_a_lower_bound() -> None:
    search = CapacitySearch(start=2, limit=32, max_steps=2)
    for users in (2, 4):
        assert search.next_users() == users
        search.record(users, True)
    assert search.next_users() is None
    assert search.label() == ">= 4"
    limited = CapacitySearch(start=2, limit=4, max_steps=9)
    for users in (2, 4):
        limited.record(users, True)
    assert limited.next_users() is None
    assert limited.label() == ">= 4 (limit)"


def test_failed_pages_count_as_infinitely_slow() -> None:
    plan = StepPlan(1, 2, "http://h/p", {}, None, 0, 10, (1, 3), 5, 2.0, 1)
    result = StepResult(
        plan,
        pages=[
            PageOutcome(0, 0.5, None, False, 141, 0),
            PageOutcome(1, 3.0, None, False, 141, 0),
            PageOutcome(2, math.inf, "no load within 5 s", True, 0, 0),
            PageOutcome(3, 0.2, "/s1/r001.png: status 404", False, 141, 0),
        ],
    )
    assert result.good == 1
    assert result.timeouts == 1
    assert result.errors == 1
    assert result.percentile(0.5) == 3.0
    assert math.isinf(result.percentile(0.75))


def test_apache_config_is_prefork_with_keepalive_and_every_worker_up_front() -> None:
    text = config(Path("/srv/www"), "127.0.0.2", 8080, ApacheSettings(max_request_workers=12))
    for line in (
        "mod_mpm_prefork.so",
        "Listen 127.0.0.2:8080",
        "StartServers 12",
        "MaxRequestWorkers 12",
        "ServerLimit 12",
        "KeepAlive On",
        "KeepAliveTimeout 5",
        "MaxKeepAliveRequests 100",
        "User ${APACHE_RUN_USER}",
    ):
        assert line in text


def test_metrics_parse_subtract_and_sum_by_label() -> None:
    before = Samples.parse(
        'reshape_upstream_requests_total{arm="none",connection="new",policy="p"} 2.0\n'
    )
    after = Samples.parse(
        "# HELP reshape_upstream_requests_total Requests.\n"
        'reshape_upstream_requests_total{arm="none",connection="new",policy="p"} 5.0\n'
        'reshape_upstream_requests_total{arm="none",connection="reused",policy="p"} 7.0\n'
        'reshape_transaction_seconds_bucket{arm="none",le="0.5",policy="p"} 3.0\n'
    )
    diff = after - before
    assert diff.sum("reshape_upstream_requests_total") == 10.0
    assert diff.sum("reshape_upstream_requests_total", connection="new") == 3.0
    assert diff.bucket("reshape_transaction_seconds", 0.5) == 3.0


def _step(users: int, passed: bool, p90: float) -> StepSummary:
    return StepSummary(
        "direct-2", users, SEARCH, passed, 10, 1.0 if passed else 0.5, 0.1, p90, 100.0, 4, 0, 0,
        (), None, None, 0.1, 0.1, 0.0, False, None, None, 0.5,
    )  # fmt: skip


def test_capacity_table_gives_the_ratio_to_the_baseline() -> None:
    two = CapacitySearch(2, 32, 9, {2: True, 4: True, 8: True, 9: False})
    six = CapacitySearch(2, 32, 9, {2: True, 4: False, 3: False})
    results = [
        ConfigResult("direct-2", "direct, 2/user", 2, "2 per user", two, (_step(8, True, 0.1),)),
        ConfigResult("direct-6", "direct, 6/user", 6, "6 per user", six, (_step(2, True, 0.1),)),
    ]
    rows = {
        line.split("|")[1].strip(): [cell.strip() for cell in line.strip("|").split("|")]
        for line in capacity_table(results, "direct-2").splitlines()[2:]
    }
    assert rows["direct, 2/user"][3:5] == ["8", "1.00x"]
    assert rows["direct, 6/user"][3:5] == ["2", "0.25x"]


@pytest.mark.slow
def test_quick_run_has_every_configuration_without_errors(tmp_path: Path) -> None:
    if not APACHE.exists():
        pytest.skip("apache2 is not installed (bench/capacity installs it when run as root)")
    quick = run_quick("capacity", tmp_path, "--no-record", timeout=90)
    table = quick.stdout.split("\n\n")[0]
    labels = [line.split("|")[1].strip() for line in table.splitlines()[2:]]
    assert labels == list(CONFIG_LABELS), quick.stdout
    for row in table.splitlines()[2:]:
        assert row.rstrip(" |").endswith("| 0"), row  # the errors column
    for measured in json.loads(quick.figures.read_text()):
        assert measured["steps"], measured
        for step in measured["steps"]:
            assert step["pages"] > 0, step
            assert step["errors"] == step["timeouts"] == 0, step
    assert not quick.results.exists()
