from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.queueing.cases import DEFAULT_CASES, Case
from bench.queueing.report import Run, findings, marks, rows, table
from tests.support.quick_bench import run_quick


def _run(origin: str, browsers: str, config: str, **kwargs: object) -> Run:
    fields: dict[str, object] = {
        "origin": origin,
        "browser_kind": browsers,
        "config": config,
        "rtt": 0.2,
        "round": 1,
        "browser_count": 2,
        "requests": 4,
        "transactions_s": [0.2, 0.3, 0.6, 1.3],  # average 0.6
        "browser_queue_s": [0.0, 0.0, 0.1, 0.3],
        "body_s": [0.001, 0.001, 0.002, 0.001],
        "browser_new": 2,
        "browser_h2": 0,
        "page_s": [1.5],
        "seconds": 3.0,
        "errors": [],
        "browser_connections": 4,
        "origin_connections": 2,
        "origin_max_open": 2,
    }
    fields.update(kwargs)
    return Run(**fields)  # type: ignore[arg-type]


def test_marks_scale_with_the_rtt_and_sit_on_bucket_edges() -> None:
    assert marks(0.0) == (0.025, 0.1, 0.25)
    assert marks(0.2) == (0.25, 0.5, 1.0)


def test_transactions_are_medians_over_rounds_and_ratios_pair_each_round_with_its_direct() -> None:
    pool = {
        "pool_kinds": {"new": 1, "reused": 1, "pipelined": 2, "multiplexed": 0},
        "proxy_queue": (2, 4, 0.4),
        "proxy_transaction": (4, 1.0),
        "proxy_connections": {"h1": 1, "h2": 0},
        "proxy_cpu_s": 0.01,
        "browser_h2": 4,
        "browser_connections": 2,
    }
    runs = [
        _run("h1", "alpn", "direct"),
        _run("h1", "alpn", "direct", round=2, transactions_s=[1.0] * 4, origin_connections=4),
        _run("h1", "alpn", "direct", round=3, transactions_s=[0.4] * 4, origin_max_open=3),
        _run("h1", "alpn", "pool-pipelined", transactions_s=[0.3] * 4, **pool),
        _run("h1", "alpn", "pool-pipelined", round=2, transactions_s=[0.2] * 4, **pool),
        _run("h1", "alpn", "pool-pipelined", round=3, transactions_s=[0.4] * 4, **pool),
        # Another origin's direct must not be the reference.
        _run("h2", "alpn", "direct", transactions_s=[0.01] * 4, browser_h2=4),
        _run("h2", "alpn", "mitmdump", transactions_s=[0.02] * 4, browser_h2=4),
    ]
    cases = [
        Case("h1", "alpn", "direct"),
        Case("h1", "alpn", "pool-pipelined"),
        Case("h2", "alpn", "direct"),
        Case("h2", "alpn", "mitmdump"),
    ]
    by_key = {row.case.key: row for row in rows(runs, cases, [0.2])}
    direct = by_key["h1/alpn/direct"]
    assert direct.rounds == 3 and direct.requests == 12
    assert direct.transaction_ms.median == pytest.approx(600)
    assert (direct.transaction_ms.low, direct.transaction_ms.high) == pytest.approx((400, 1000))
    assert direct.vs_direct is None
    assert direct.origin_connections == pytest.approx(8 / 3)
    assert direct.origin_max_open == 3
    assert direct.browser_h2 == 0 and direct.browser_connections == 2  # 4 over 2 browsers
    assert direct.mix == {"new": 0.5, "reused": 0.5, "pipelined": 0.0, "multiplexed": 0.0}
    pipelined = by_key["h1/alpn/pool-pipelined"]
    assert pipelined.transaction_ms.median == pytest.approx(300)
    assert pipelined.vs_direct is not None
    # Rounds: 0.3/0.6, 0.2/1.0, 0.4/0.4.
    assert pipelined.vs_direct.median == pytest.approx(0.5)
    assert (pipelined.vs_direct.low, pipelined.vs_direct.high) == pytest.approx((0.2, 1.0))
    assert pipelined.proxy_queued == 0.5
    assert pipelined.proxy_queue_ms == pytest.approx(100)
    assert pipelined.proxy_transaction_ms == pytest.approx(250)
    assert pipelined.mix == {"new": 0.25, "reused": 0.25, "pipelined": 0.5, "multiplexed": 0.0}
    assert pipelined.proxy_cpu_ms_per_request == pytest.approx(2.5)
    assert pipelined.browser_h2 == 1.0 and pipelined.browser_connections == 1
    h2_direct = by_key["h2/alpn/direct"]
    assert h2_direct.mix == {"new": 0.5, "reused": 0.0, "pipelined": 0.0, "multiplexed": 0.5}
    mitmdump = by_key["h2/alpn/mitmdump"]
    assert mitmdump.mix is None  # mitmdump says nothing about its connections
    assert mitmdump.vs_direct is not None and mitmdump.vs_direct.median == pytest.approx(2)
    rendered = table(list(by_key.values()), 0.2)
    assert "<= 250 ms" in rendered and "<= 1 s" in rendered
    assert "0.50 (0.20-1.00)" in rendered
    assert "h2, 1.0" in rendered and "HTTP/1.1, 2.0" in rendered
    said = findings(list(by_key.values()))
    assert any(
        "target" in line and "pipeline_depth 8 0.50 (0.20-1.00) x: met" in line for line in said
    )
    assert not any("NOT met" in line for line in said)


def test_the_target_is_not_met_when_the_pool_is_slower_than_sixty_percent_of_direct() -> None:
    runs = [
        _run("h1", "alpn", "direct"),
        _run("h1", "alpn", "pool-h2", transactions_s=[0.4] * 4, proxy_queue=(0, 4, 0.0)),
    ]
    cases = [Case("h1", "alpn", "direct"), Case("h1", "alpn", "pool-h2")]
    said = findings(rows(runs, cases, [0.2]))
    assert any("NOT met" in line and "0.67 (0.67-0.67) x" in line for line in said), said


@pytest.mark.slow
def test_quick_run_has_every_case_at_every_rtt_and_the_browsers_negotiate_like_chromium(
    tmp_path: Path,
) -> None:
    quick = run_quick("queueing", tmp_path, "--no-record", timeout=150)
    tables = [block for block in quick.stdout.split("\n\n") if block.startswith("| origin")]
    assert len(tables) == 2, quick.stdout  # ~0 and 200 ms RTT
    for rendered in tables:
        assert len(rendered.splitlines()) == 2 + len(DEFAULT_CASES), rendered
        for line in rendered.splitlines()[2:]:
            assert line.rstrip(" |").endswith("| 0"), line  # the errors column
    runs = [Run(**run) for run in json.loads(quick.figures.read_text())]
    assert len(runs) == 2 * len(DEFAULT_CASES)
    for run in runs:
        assert run.requests > 0 and not run.errors, run
        speaks_h1 = run.origin == "h1" and run.config in ("direct", "mitmdump")
        if run.browser_kind == "h1" or speaks_h1:
            # HTTP/1.1 end to end: several connections per browser for the page's burst.
            assert run.browser_h2 == 0, run.key
            assert run.browser_connections > run.browser_count, run.key
        else:
            # h2 offered (by the origin, or by the proxy): one connection per browser.
            assert run.browser_h2 == run.requests, run.key
            assert run.browser_connections == run.browser_count, run.key
    assert not quick.results.exists()
