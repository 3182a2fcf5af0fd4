from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.loadgen.runner import LoadResult
from bench.overhead.report import Measurement, table_rows, target_lines
from tests.support.quick_bench import run_quick, skip_without_go


def _result(rps: float, p50: float, p99: float, errors: int = 0) -> LoadResult:
    return LoadResult(
        requests=int(rps),
        errors=errors,
        warmup_errors=0,
        rps=rps,
        p50_ms=p50,
        p90_ms=p50,
        p99_ms=p99,
        max_ms=p99,
        bytes=int(rps) * 1024,
        connects=10,
        duration_s=1.0,
        error_samples=(),
    )


def test_table_adds_latency_over_direct_and_ratios_within_the_scheme() -> None:
    measurements = [
        Measurement("direct", "direct", "http", (_result(20_000, 0.5, 2.0),)),
        Measurement("squid", "squid", "http", (_result(5_000, 2.0, 6.0),)),
        Measurement("mitmdump", "mitmdump", "http", (_result(500, 20.0, 40.0),)),
        Measurement("mitmdump", "mitmdump", "https", (_result(250, 40.0, 80.0),)),
    ]
    rows = {(row[0], row[1]): row for row in table_rows(measurements)}
    assert rows[("squid", "http")][2:9] == (
        "5,000",
        "2.00",
        "6.00",
        "+1.50",
        "+4.00",
        "10.00x",
        "1.00x",
    )
    assert rows[("direct", "http")][5:7] == ("-", "-")
    assert rows[("squid", "http")][9:11] == ("-", "-")  # no CPU figures were given
    assert rows[("mitmdump", "https")][5:9] == ("-", "-", "1.00x", "-")


@pytest.mark.slow
def test_quick_run_measures_every_row_without_errors(tmp_path: Path) -> None:
    skip_without_go()
    quick = run_quick(
        "overhead",
        tmp_path,
        *("--configs", "direct,mitmdump,reshape", "--duration", "1.5"),
        *("--schemes", "http,https,h2"),
        "--no-record",
        timeout=180,
    )
    rows = {
        tuple(cell.strip() for cell in line.strip("|").split("|")[:2])
        for line in quick.stdout.splitlines()
        if line.startswith("| ")
    }
    for config in ("direct", "mitmdump", "reshape"):
        for scheme in ("http", "https", "h2"):
            assert (config, scheme) in rows, quick.stdout
    # The loadgen counts a response that did not come over HTTP/2 as an error (checked below).
    for measured in json.loads(quick.figures.read_text()):
        for run in measured["runs"]:
            assert run["requests"] > 0, measured
            assert run["errors"] == run["warmup_errors"] == 0, measured
    assert not quick.results.exists()


def test_target_lines_hold_the_pool_to_one_and_a_half_times_mitmdump() -> None:
    measurements = [
        Measurement("mitmdump", "mitmdump", "h2", (_result(500, 20.0, 40.0),)),
        Measurement("reshape-pooled", "pool", "h2", (_result(760, 13.0, 26.0),)),
        Measurement("mitmdump", "mitmdump", "http", (_result(500, 20.0, 40.0),)),
        Measurement("reshape-pooled", "pool", "http", (_result(740, 13.0, 26.0),)),
    ]
    lines = [line for line in target_lines(measurements) if "/ mitmdump" in line]
    assert lines == [
        "reshape (upstream pool) / mitmdump, http: 1.48x req/s (target >= 1.5: NOT met)",
        "reshape (upstream pool) / mitmdump, h2: 1.52x req/s (target >= 1.5: met)",
    ]
