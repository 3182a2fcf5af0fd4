"""bench/lab: its pure parts directly, and each experiment's --quick run end to end, so the lab
cannot rot (the full runs are benchmarks, never tests)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.lab.network import chain, policy_file, rtt_link
from bench.lab.sites import HOSTS, PAGES, build_pages
from bench.lab.stats import median_interval, percentile, summarize
from bench.runs import replace_section
from labkit.relay import Link, Relay
from tests.support.quick_bench import run_bench

REPO = Path(__file__).resolve().parents[2]
QUICK_TIMEOUT = 150  # seconds; a quick run takes about 30–90 s on 2 busy cores


@pytest.mark.parametrize(
    ("n", "coverage"),
    [(2, 0.5), (3, 0.75), (5, 0.9375), (6, 0.96875), (9, 0.9609375)],
)
def test_median_interval_reports_the_coverage_it_reaches(n: int, coverage: float) -> None:
    low, high, reached = median_interval([float(v) for v in range(n)])
    assert reached == pytest.approx(coverage)
    assert low <= percentile(range(n), 50) <= high


def test_median_interval_narrows_once_95_percent_allows() -> None:
    values = [float(v) for v in range(20)]
    low, high, coverage = median_interval(values)
    assert (low, high) == (5.0, 14.0)  # 6th smallest to 6th largest: 95.9%
    assert coverage >= 0.95


def test_summary_of_one_load_has_no_interval() -> None:
    summary = summarize([42.0])
    assert (summary.median, summary.p90, summary.low, summary.high) == (42.0,) * 4
    assert summary.coverage == 0


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ("", "# Benchmark results"),
        ("# R\n\n## Other\n\nkept\n", "# R\n\n## Other\n\nkept\n\n## Lab: x\n\nnew\n"),
        (
            "# R\n\n## A\n\na\n\n## Lab: x\n\nold\n\n## B\n\nb  \n",
            "# R\n\n## A\n\na\n\n## Lab: x\n\nnew\n\n## B\n\nb  \n",
        ),
        ("# R\n\n## Lab: x\n\nold\n", "# R\n\n## Lab: x\n\nnew\n"),
    ],
    ids=["new-file", "appended", "between-others", "last"],
)
def test_replace_section_touches_only_its_own(document: str, expected: str) -> None:
    replaced = replace_section(document, "## Lab: x", "## Lab: x\n\nnew\n")
    if document:
        assert replaced == expected
    else:
        assert replaced.startswith(expected) and replaced.endswith("## Lab: x\n\nnew\n")


def test_chained_links_add_delays_and_keep_the_lower_rate() -> None:
    first = Link(up_delay=0.01, down_delay=0.02, down_rate=1000.0, connect_delay=0.03)
    second = rtt_link(100, down_rate=500.0, shared_down_rate=800.0)
    both = chain(first, second)
    assert (both.up_delay, both.down_delay) == pytest.approx((0.06, 0.07))
    assert both.connect_delay == pytest.approx(0.13)
    assert (both.down_rate, both.up_rate, both.shared_down_rate) == (500.0, None, 800.0)


def test_cap_policy_files_pass_reshape_policy_check(tmp_path: Path) -> None:
    policy = policy_file(tmp_path, "cap3", {"max_connections_per_host": 3})
    checked = subprocess.run(
        [sys.executable, "-m", "reshape.cli", "policy", "check", str(policy)],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_pages_are_the_same_bytes_every_time(tmp_path: Path) -> None:
    bases = {host: f"https://{address}:4443" for host, (address, _) in HOSTS.items()}
    trees = []
    for attempt in ("a", "b"):
        roots = {host: tmp_path / attempt / host for host in HOSTS}
        pages = build_pages(roots, bases, "h2")
        trees.append(
            {
                str(path.relative_to(tmp_path / attempt)): path.read_bytes()
                for path in sorted((tmp_path / attempt).rglob("*"))
                if path.is_file()
            }
        )
    assert trees[0] == trees[1]
    assert set(pages) == set(PAGES)
    news, app = pages["news"], pages["app"]
    assert len(news.hosts) == 13 and 75 <= news.requests <= 90
    assert app.requests >= 200 and app.posts > 0
    assert [pages[name].per_host["img"] for name in PAGES[:4]] == [4, 4, 4, 12]


async def test_relay_closes_connections_and_shares_its_bottleneck() -> None:
    blob = b"x" * 100_000
    served: list[asyncio.Task[None]] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served.append(asyncio.current_task())  # type: ignore[arg-type]
        await reader.readexactly(1)
        writer.write(blob)
        await writer.drain()
        await reader.read()  # until the relay closes the connection
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    relay = Relay("127.0.0.1", server.sockets[0].getsockname()[:2], Link(shared_down_rate=1e6))
    await relay.start()

    async def fetch() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
        writer.write(b"?")
        await reader.readexactly(len(blob))
        return reader, writer

    started = time.monotonic()
    clients = await asyncio.gather(fetch(), fetch())
    # Two connections share 1 MB/s: 200 KB take 0.2 s, where each alone would take 0.1 s.
    assert time.monotonic() - started >= 0.19
    assert (relay.stats.accepted, relay.stats.open, relay.stats.bytes_down) == (2, 2, 200_000)
    await relay.close_connections()
    assert relay.stats.open == 0
    assert [await reader.read() for reader, _ in clients] == [b"", b""]
    await asyncio.wait_for(asyncio.gather(*served), 5)  # the origin saw its connections end
    relay.stats.reset()
    assert (relay.stats.accepted, relay.stats.max_open, relay.stats.bytes_down) == (0, 0, 0)
    for _, writer in clients:
        writer.close()
    await relay.stop()
    server.close()
    await server.wait_closed()


async def test_relay_counts_a_kept_open_connection_that_carries_a_request_as_used() -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(100):
            writer.write(data)
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    relay = Relay("127.0.0.1", server.sockets[0].getsockname()[:2])
    await relay.start()
    pooled, idle = [await asyncio.open_connection("127.0.0.1", relay.port) for _ in range(2)]
    for reader, writer in (pooled, idle):
        writer.write(b"warm-up")
        assert await reader.readexactly(7) == b"warm-up"
    assert (relay.stats.accepted, relay.stats.used) == (2, 2)
    relay.stats.reset()  # a new load: the pool's connections stay open
    reader, writer = pooled
    writer.write(b"request")
    assert await reader.readexactly(7) == b"request"
    # No connection was new; one of the two kept open carried this load's request.
    assert (relay.stats.accepted, relay.stats.used, relay.stats.open) == (0, 1, 2)
    for _, writer in (pooled, idle):
        writer.close()
    await relay.stop()
    server.close()
    await server.wait_closed()


def _quick_run(name: str, tmp_path: Path, *options: str) -> tuple[list[dict[str, object]], str]:
    results = tmp_path / "RESULTS.md"
    figures = tmp_path / "loads.json"
    plots = tmp_path / "plots"
    stdout = run_bench(
        "lab",
        [
            *("run", "--quick", name, "--no-record", *options),
            *("--results", str(results), "--json", str(figures), "--plots", str(plots)),
        ],
        timeout=QUICK_TIMEOUT,
    )
    assert not results.exists()
    assert list(plots.glob("*.png"))
    loads: list[dict[str, object]] = json.loads(figures.read_text())["loads"]
    assert loads and all(load["error"] is None for load in loads), loads
    return loads, stdout


@pytest.mark.slow
@pytest.mark.browser
def test_quick_plt_loads_every_page_in_every_config(tmp_path: Path) -> None:
    loads, stdout = _quick_run("plt", tmp_path)
    assert {(load["page"], load["config"]) for load in loads} == {
        (page, config)
        for page in PAGES
        for config in ("direct", "mitmdump", "reshape", "reshape-pooled")
    }
    for load in loads:
        assert isinstance(load["plt_ms"], float) and load["plt_ms"] > 0
        assert load["origin_connections"] >= 1 and load["browser_connections"] >= 1
    for page in PAGES:
        assert f"## plt: {page}" in stdout


@pytest.mark.slow
@pytest.mark.browser
def test_quick_booster_sweeps_reshapes_cap(tmp_path: Path) -> None:
    loads, stdout = _quick_run("booster", tmp_path)
    by_config = {load["config"]: load for load in loads}
    assert set(by_config) == {"direct", "reshape", "cap-1", "cap-6", "cap-12"}
    # The cap is what the origin sees: never more connections open at once than allowed.
    for cap in (1, 6, 12):
        assert 1 <= by_config[f"cap-{cap}"]["origin_peak_per_host"] <= cap
    assert "rule N = R/2" in stdout


def test_a_used_workdir_is_refused_with_a_message(tmp_path: Path) -> None:
    (tmp_path / "proxies").mkdir()
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.lab",
            "run",
            "gateway",
            "--quick",
            "--workdir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2, run.stderr
    assert "is not an empty directory" in run.stderr and "Traceback" not in run.stderr
