"""`python -m bench.lab run --quick --profile gateway` end to end, and its pure parts."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import pytest

from bench.lab.cli import parse_args
from bench.lab.experiments import UnknownConfigError, experiment
from bench.lab.gateway import POOLED_POLICY, hints_policy, learned_policy
from bench.lab.gateway_report import step_table
from bench.lab.network import Config
from bench.lab.profile import Profile, area_of
from bench.lab.report import Run, _load_record
from bench.lab.runner import Load
from bench.lab.sites import GATEWAY_PAGES, HOSTS, PHASES, build_pages, phase_of
from reshape.policy.loader import load_policy_file
from tests.bench.test_lab_quick import _quick_run

# Every configuration with reshape's engine: the warm-up loads warm each worker's pool
# (bench/lab/runner.py, `warm_up_loads`), so pooled-w2's too.
WARM_POOLS = (
    "reshape",
    "reshape-pooled",
    "pooled-learned",
    "pooled-hints",
    "pooled-w2",
    "engine-floor",
)


def test_learned_policy_is_pooled_plus_learned_preconnect(tmp_path: Path) -> None:
    learned = load_policy_file(learned_policy(tmp_path))
    pooled = load_policy_file(POOLED_POLICY)
    policy = learned.policies[learned.default]
    assert policy.upstream == pooled.policies[pooled.default].upstream
    assert policy.preconnect is not None and policy.preconnect.mode == "learned"


def test_hints_policy_is_pooled_plus_learned_early_hints(tmp_path: Path) -> None:
    hinted = load_policy_file(hints_policy(tmp_path))
    pooled = load_policy_file(POOLED_POLICY)
    policy = hinted.policies[hinted.default]
    assert policy.upstream == pooled.policies[pooled.default].upstream
    assert policy.early_hints.mode == "learned" and policy.preconnect.mode == "off"


def test_a_part_of_the_gateway_names_only_what_it_has(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        parse_args(["run", "gateway", "--pages", "app,news"])  # news is plt's
    with pytest.raises(SystemExit):
        parse_args(["run", "gateway", "--profiled", "mitmdump"])  # without --profile
    part = dataclasses.replace(experiment("gateway"), only_configs=("direct", "mitmdump"))
    assert [c.name for c in part.configs(tmp_path, {})] == ["direct", "mitmdump"]
    with pytest.raises(UnknownConfigError, match="squid"):
        dataclasses.replace(part, only_configs=("squid",)).configs(tmp_path, {})


def _app_load(config: str, css: tuple[float, float, float], tiles: list[tuple[float, ...]]) -> Load:
    """A load of the app page whose stylesheet and first tiles were asked for, sent and
    answered at these times (start, request start, response start)."""
    base = "https://127.0.0.16:1/h2/app"
    timings = [(f"{base}/app.css", *css, css[2] + 1)]
    timings += [(f"{base}/tile-{i:03}.png", *t, t[2] + 1) for i, t in enumerate(tiles)]
    return Load("h2", "app", config, "200 ms", 0, plt_ms=1.0, timings=timings)


def test_step_table_gives_each_phases_wait_and_start_up() -> None:
    loads = [
        # Direct: the tiles' host is new, two round trips of TCP and TLS before the requests.
        _app_load("direct", (600, 610, 815), [(850, 1260, 1470), (851, 1262, 1480)]),
        # Through the pool: a tunnel and TLS to the proxy, then a longer wait per request.
        _app_load("reshape-pooled", (250, 265, 480), [(500, 550, 780), (501, 552, 802)]),
        # A cross-origin timing without Timing-Allow-Origin (request start 0) is not counted.
        _app_load("reshape-pooled", (250, 265, 480), [(500, 0, 0), (500, 550, 800)]),
    ]
    configs = [Config("direct", "direct"), Config("reshape-pooled", "reshape", label="pooled")]
    run = Run(experiment("gateway"), "", "", 0.0, loads, configs, {}, {})
    table = step_table(run, "app")
    wait, start_up = table.split("\n\nstart-up\n\n")
    rows = {line.split("|")[3].strip(): line for line in wait.splitlines() if "200 ms" in line}
    assert [c.strip() for c in rows["direct"].split("|")[4:6]] == ["205", "214"]
    # Medians: of each load's waits (230 and 250 | 250), then over the loads.
    assert [c.strip() for c in rows["pooled"].split("|")[4:6]] == ["215", "245"]
    rows = {line.split("|")[3].strip(): line for line in start_up.splitlines() if "200 ms" in line}
    assert [c.strip() for c in rows["direct"].split("|")[4:6]] == ["10", "410"]
    assert [c.strip() for c in rows["pooled"].split("|")[4:6]] == ["15", "50"]


def test_a_load_recorded_before_request_starts_were_kept_reads_as_unknown() -> None:
    old = dataclasses.asdict(Load("h2", "app", "direct", "200 ms", 0))
    old["timings"] = [["https://127.0.0.16:1/h2/app/app.css", 600.0, 815.0, 816.0]]
    assert Load(**_load_record(old)).timings == [
        ["https://127.0.0.16:1/h2/app/app.css", 600.0, 0.0, 815.0, 816.0]
    ]


def test_news6_is_the_issues_page(tmp_path: Path) -> None:
    roots = {host: tmp_path / host for host in HOSTS}
    bases = {host: f"https://{address}:4443" for host, (address, _) in HOSTS.items()}
    page = build_pages(roots, bases, "h1", GATEWAY_PAGES)["news-6"]
    assert page.requests == 42 and len(page.hosts) == 6
    assert sorted(page.per_host.values()) == [5, 6, 6, 6, 6, 12]  # scripts+css, images, API
    api = [url for url in page.sizes if "/api/" in url]
    assert len(api) == 12 and all(url.startswith(bases["www"]) for url in api)


def test_profile_counts_self_and_inclusive_once_per_sample() -> None:
    profile = Profile()
    profile.add_raw(
        "<module> (reshape:8);run (asyncio/runners.py:118);f (reshape/upstream/h1.py:10);"
        "f (reshape/upstream/h1.py:12) 3\n"
        "<module> (reshape:8);run (asyncio/runners.py:118);g (ssl.py:5) 2\n"
    )
    assert profile.samples == 5
    assert profile.functions_self == Counter({"f (reshape/upstream/h1.py)": 3, "g (ssl.py)": 2})
    assert profile.functions_inclusive["f (reshape/upstream/h1.py)"] == 3  # recursion: once
    assert profile.functions_inclusive["run (asyncio/runners.py)"] == 5
    assert profile.areas_inclusive["reshape.upstream"] == 3
    assert Profile.from_json(profile.as_json()) == profile


def test_every_subresource_of_a_gateway_page_has_a_phase(tmp_path: Path) -> None:
    roots = {host: tmp_path / host for host in HOSTS}
    bases = {host: f"https://{address}:4443" for host, (address, _) in HOSTS.items()}
    pages = build_pages(roots, bases, "h2", GATEWAY_PAGES)
    for name, page in pages.items():
        phases = Counter(phase_of(name, url) for url in page.sizes if url != page.url)
        assert set(phases) == set(PHASES[name]), name
    app = Counter(phase_of("app", url) for url in pages["app"].sizes)
    assert [app[f"tiles {n}"] for n in (1, 2, 3)] == [48, 48, 24]
    assert app["feed 1"] == app["feed 2"] == 20  # the GETs; each burst's POSTs share its phase
    assert phase_of("app", "https://127.0.0.2:4443/echo/h2/app/event-025") == "feed 2"


def test_profile_names_the_direct_caller_of_what_runs() -> None:
    profile = Profile()
    profile.add_raw(
        "<module> (reshape:8);send (reshape/engine/h2.py:3);write (ssl.py:5) 4\n"
        "<module> (reshape:8);flush (mitmproxy/proxy/server.py:9);write (ssl.py:5) 1\n"
    )
    assert profile.callers == Counter(
        {
            ("write (ssl.py)", "send (reshape/engine/h2.py)"): 4,
            ("write (ssl.py)", "flush (mitmproxy/proxy/server.py)"): 1,
        }
    )
    assert Profile.from_json(profile.as_json()) == profile


@pytest.mark.parametrize(
    ("file", "area"),
    [
        ("mitmproxy/proxy/layers/http/_http2.py", "mitmproxy.proxy.layers.http"),
        ("mitmproxy/proxy/server.py", "mitmproxy.proxy.server"),
        ("mitmproxy/addonmanager.py", "mitmproxy.addonmanager"),
        ("/work/x/reshape/mitm/patches/inline_hooks.py", "reshape.mitm"),
        ("asyncio/streams.py", "asyncio"),
        ("h2/connection.py", "h2"),
        ("ssl.py", "ssl"),
    ],
)
def test_areas_name_packages_and_mitmproxys_modules(file: str, area: str) -> None:
    assert area_of(file) == area


@pytest.mark.slow
@pytest.mark.browser
def test_quick_gateway_keeps_the_pool_warm_across_users(tmp_path: Path) -> None:
    loads, stdout = _quick_run("gateway", tmp_path, "--profile")
    assert {(load["page"], load["config"]) for load in loads} == {
        (page, config)
        for page in GATEWAY_PAGES
        for config in (
            "direct",
            "mitmdump",
            "reshape",
            "reshape-pooled",
            "pooled-learned",
            "pooled-hints",
            "pooled-w2",
            "engine-floor",
        )
    }
    for load in loads:
        # A new user each time: the browser opens its own connections to the proxy or origins.
        assert isinstance(load["browser_connections"], int) and load["browser_connections"] >= 1
        # Every load's requests crossed connections to the origins, counted at the origins.
        assert isinstance(load["origin_connections"], int) and load["origin_connections"] >= 1
        if load["config"] in ("direct", "mitmdump"):
            assert load["origin_connections_new"] == load["origin_connections"], load
        elif load["config"] in WARM_POOLS:
            # The warm-up load left the pool warm: this user's load used connections earlier
            # users opened. (Not always all of them: a pool opens on demand, and this load may
            # have more requests in flight to one origin at once than the warm-up had; seen
            # once in ~5 runs, 2 new of the load's connections.)
            assert load["origin_connections_new"] < load["origin_connections"], load
        # The HTML's own exchange, in order: its connection ready, its request out, its first
        # and last bytes back.
        connected, request_start, first_byte, last_byte = load["navigation"]
        assert 0 < connected <= request_start <= first_byte <= last_byte, load["navigation"]
        # Every subresource's exchange is timed, the other origins' too (Timing-Allow-Origin).
        for url, start, request_start, response_start, end in load["timings"]:
            assert 0 < start <= request_start <= response_start <= end, (url, load["config"])
    assert "Issue 17's targets" in stdout
    assert "HTML 1st byte" in stdout
    assert "each phase's exchanges" in stdout
    assert "Profile of the pooled proxy" in stdout and "Top 25 functions by self time" in stdout
    assert "Proxy CPU per load" in stdout
    assert "new origin conns" in stdout
