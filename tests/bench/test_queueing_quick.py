from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.queueing.report import Run, marks, rows, table
from tests.support.quick_bench import run_quick

CONFIG_LABELS = (
    "direct (no proxy)",
    "reshape {}",
    "pool, no pipelining",
    "pool, pipeline_depth 8",
    "pool, HTTP/2",
)


def _run(config: str, **kwargs: object) -> Run:
    fields: dict[str, object] = {
        "config": config,
        "rtt": 0.2,
        "round": 1,
        "requests": 4,
        "transactions_s": [0.2, 0.3, 0.6, 1.2],
        "browser_queue_s": [0.0, 0.0, 0.1, 0.3],
        "body_s": [0.001, 0.001, 0.002, 0.001],
        "browser_new": 2,
        "page_s": [1.5],
        "seconds": 3.0,
        "errors": [],
        "browser_connections": 2,
        "origin_connections": 2,
        "origin_max_open": 2,
    }
    fields.update(kwargs)
    return Run(**fields)  # type: ignore[arg-type]


def test_marks_scale_with_the_rtt_and_sit_on_bucket_edges() -> None:
    assert marks(0.0) == (0.025, 0.1, 0.25)
    assert marks(0.2) == (0.25, 0.5, 1.0)


def test_rows_pool_rounds_and_take_the_mix_from_where_each_config_has_it() -> None:
    runs = [
        _run("direct"),
        _run("direct", round=2, origin_connections=4, origin_max_open=3),
        _run(
            "pool-pipelined",
            pool_kinds={"new": 1, "reused": 1, "pipelined": 2, "multiplexed": 0},
            proxy_queue=(2, 4, 0.4),
            proxy_transaction=(4, 1.0),
            proxy_connections={"h1": 1, "h2": 0},
            proxy_cpu_s=0.01,
        ),
        _run(
            "reshape-plain",
            pool_kinds={"new": 0, "reused": 0, "pipelined": 0, "multiplexed": 0},
            proxy_queue=(0, 0, 0.0),
            proxy_transaction=(4, 2.0),
            proxy_connections={"h1": 3, "h2": 0},
        ),
    ]
    by_config = {
        row.config: row for row in rows(runs, ["direct", "pool-pipelined", "reshape-plain"], [0.2])
    }
    direct = by_config["direct"]
    assert direct.requests == 8
    assert direct.origin_connections == 3  # per run
    assert direct.origin_max_open == 3
    assert direct.browser_queued == 0.5
    assert direct.within == (0.25, 0.5, 0.75)
    assert direct.mix == {"new": 0.5, "reused": 0.5, "pipelined": 0.0, "multiplexed": 0.0}
    assert direct.proxy_queued is None
    pipelined = by_config["pool-pipelined"]
    assert pipelined.proxy_queued == 0.5
    assert pipelined.proxy_queue_ms == pytest.approx(100)
    assert pipelined.proxy_transaction_ms == pytest.approx(250)
    assert pipelined.mix == {"new": 0.25, "reused": 0.25, "pipelined": 0.5, "multiplexed": 0.0}
    assert pipelined.proxy_cpu_ms_per_request == pytest.approx(2.5)
    plain = by_config["reshape-plain"]
    assert plain.proxy_queued is None  # the pool was not used
    assert plain.mix == {"new": 0.75, "reused": 0.25, "pipelined": 0.0, "multiplexed": 0.0}
    text = table(list(by_config.values()), 0.2)
    assert "<= 250 ms" in text and "<= 1 s" in text


@pytest.mark.slow
def test_quick_run_has_every_configuration_at_every_rtt_without_errors(tmp_path: Path) -> None:
    quick = run_quick("queueing", tmp_path, "--no-record", timeout=90)
    tables = [block for block in quick.stdout.split("\n\n") if block.startswith("| config")]
    assert len(tables) == 2, quick.stdout  # ~0 and 200 ms RTT
    for text in tables:
        labels = [line.split("|")[1].strip() for line in text.splitlines()[2:]]
        assert labels == list(CONFIG_LABELS), quick.stdout
        for line in text.splitlines()[2:]:
            assert line.rstrip(" |").endswith("| 0"), line  # the errors column
    runs = json.loads(quick.figures.read_text())
    assert len(runs) == 2 * len(CONFIG_LABELS)
    for run in runs:
        assert run["requests"] > 0 and not run["errors"], run
    assert not quick.results.exists()
