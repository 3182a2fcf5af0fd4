"""Preconnect end to end: httpx "browsers" (Fetch Metadata and Referer as a browser sends them)
→ `reshape run` → relays (which count what each origin sees) → nginx over TLS on loopback."""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from labkit.origins import nginx_origin
from labkit.pki import OriginPKI
from labkit.relay import Relay, RelayThread, relays
from tests.support.reshape_process import RunningProxy, StartProxy

pytestmark = pytest.mark.slow

# Origin name -> (nginx address, the address the relay in front of it listens on).
HOSTS = {"www": ("127.0.0.2", "127.0.0.41"), "cdn": ("127.0.0.3", "127.0.0.42")}
HOSTS["img"] = ("127.0.0.4", "127.0.0.43")
RESOURCES = 4  # per non-page origin
WARM_IDLE = 1.5


@dataclass
class Lab:
    relays: dict[str, Relay]

    def base(self, name: str) -> str:
        return f"https://{HOSTS[name][1]}:{self.relays[name].port}"

    @property
    def page(self) -> str:
        return f"{self.base('www')}/index.html"

    def accepted(self, name: str) -> int:
        return self.relays[name].stats.accepted

    def open(self, name: str) -> int:
        return self.relays[name].stats.open


@contextmanager
def lab_of(directory: Path, origin_pki: OriginPKI, *, http2: bool) -> Iterator[Lab]:
    """nginx origins (offering h2 if `http2`), each behind a relay that counts connections."""
    with ExitStack() as stack:
        thread: RelayThread = stack.enter_context(relays())
        found: dict[str, Relay] = {}
        for name, (host, relay_host) in HOSTS.items():
            root = directory / name
            root.mkdir()
            (root / "index.html").write_text("<!doctype html><title>page</title>")
            for i in range(RESOURCES):
                (root / f"r{i}.png").write_bytes(bytes([i]) * 20_000)
            tls = origin_pki.issue([relay_host])
            origin = stack.enter_context(nginx_origin(root, host, tls=tls, http2=http2))
            found[name] = thread.add(relay_host, (origin.host, origin.port))
        yield Lab(found)


@pytest.fixture
def lab(tmp_path: Path, origin_pki: OriginPKI) -> Iterator[Lab]:
    with lab_of(tmp_path, origin_pki, http2=False) as started:
        yield started


# Two connections per origin: the warm ones are all a load gets, so the counts are exact.
POOLED = "{idle_timeout: 0.3, max_connections_per_host: 2}"


def policy(tmp_path: Path, preconnect: str, upstream: str = POOLED) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(
        "version: 1\ndefault: pooled\npolicies:\n  pooled:\n"
        f"    upstream: {upstream}\n    preconnect: {preconnect}\n"
    )
    return path


def client(proxy: RunningProxy) -> httpx.Client:
    trust = ssl.create_default_context(cafile=proxy.ca_cert)
    return httpx.Client(proxy=proxy.proxy_url, verify=trust, timeout=30)


def navigate(browser: httpx.Client, lab: Lab) -> None:
    response = browser.get(
        lab.page,
        headers={
            "accept": "text/html",
            "sec-fetch-dest": "document",
            "sec-fetch-mode": "navigate",
            "sec-fetch-site": "none",
        },
    )
    assert response.status_code == 200, response.text


def subresources(browser: httpx.Client, lab: Lab, names: tuple[str, ...]) -> None:
    """Every resource on `names`, all at once, as a page's images would be."""
    urls = [f"{lab.base(n)}/r{i}.png" for n in names for i in range(RESOURCES)]
    headers = {"sec-fetch-dest": "image", "sec-fetch-site": "cross-site", "referer": lab.page}
    with ThreadPoolExecutor(len(urls)) as pool:
        responses = list(pool.map(lambda u: browser.get(u, headers=headers), urls))
    assert [r.status_code for r in responses] == [200] * len(urls)
    assert all(len(r.content) == 20_000 for r in responses)


def load(proxy: RunningProxy, lab: Lab, names: tuple[str, ...] = ("cdn", "img")) -> None:
    """One page load by a new client; then the pool's connections expire (upstream
    idle_timeout 0.3 s), so the next load starts cold unless something warms it."""
    with client(proxy) as browser:
        navigate(browser, lab)
        subresources(browser, lab, names)
    time.sleep(1.0)


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def preconnected(proxy: RunningProxy) -> float:
    return proxy.metric("reshape_upstream_requests_total", connection="preconnected")


def test_a_second_load_finds_warm_connections_to_the_origins_the_first_needed(
    start_reshape: StartProxy, lab: Lab, tmp_path: Path
) -> None:
    proxy = start_reshape(policy=policy(tmp_path, f"{{mode: learned, idle_timeout: {WARM_IDLE}}}"))
    load(proxy, lab)
    assert preconnected(proxy) == 0  # nothing learned yet
    cold = {name: lab.accepted(name) for name in ("cdn", "img")}

    with client(proxy) as browser:
        navigate(browser, lab)
        # Before any request to them: the origins saw new connections (TCP and TLS done).
        assert wait_for(lambda: all(lab.accepted(n) > cold[n] for n in cold))
        assert wait_for(lambda: proxy.metric("reshape_upstream_connections_active") >= 2)
        time.sleep(0.3)
        subresources(browser, lab, ("cdn", "img"))
    # nginx speaks HTTP/1.1 here and the first load had 4 requests in flight per origin:
    # rule history, capped by max_connections_per_origin and the per-host cap (both 2).
    assert all(lab.accepted(n) - cold[n] == 2 for n in cold)
    assert preconnected(proxy) == 4
    assert proxy.metric("reshape_preconnects_total", outcome="used") == 4
    assert proxy.metric("reshape_preconnects_total", outcome="unused") == 0


def test_an_h2_origin_gets_one_warm_connection_that_carries_every_request(
    start_reshape: StartProxy, tmp_path: Path, origin_pki: OriginPKI
) -> None:
    with lab_of(tmp_path, origin_pki, http2=True) as lab:
        knobs = "{mode: learned, max_connections_per_origin: 4}"
        proxy = start_reshape(policy=policy(tmp_path, knobs, "{idle_timeout: 0.3}"))
        load(proxy, lab)
        cold = {name: lab.accepted(name) for name in ("cdn", "img")}
        with client(proxy) as browser:
            navigate(browser, lab)
            assert wait_for(lambda: all(lab.accepted(n) > cold[n] for n in cold))
            time.sleep(0.3)
            subresources(browser, lab, ("cdn", "img"))
        # The first load had 4 requests in flight per origin, but h2 needs one connection.
        assert all(lab.accepted(n) - cold[n] == 1 for n in cold)
        assert preconnected(proxy) == 2
        assert all(lab.relays[n].stats.max_open == 1 for n in cold)  # never two at once


def test_an_origin_the_page_stops_using_is_dropped_after_max_misses(
    start_reshape: StartProxy, lab: Lab, tmp_path: Path
) -> None:
    proxy = start_reshape(
        policy=policy(tmp_path, f"{{mode: learned, max_misses: 3, idle_timeout: {WARM_IDLE}}}")
    )
    load(proxy, lab, ("cdn", "img"))
    load(proxy, lab, ("cdn",))  # img: 1 hit, 1 miss: confidence 0.5, not above 0.75
    time.sleep(WARM_IDLE)  # the warm connections that load did not use are gone
    before = {name: lab.accepted(name) for name in ("cdn", "img")}
    with client(proxy) as browser:
        navigate(browser, lab)  # the second miss in a row follows
        assert wait_for(lambda: lab.accepted("cdn") > before["cdn"])
        time.sleep(0.3)
        assert lab.accepted("img") == before["img"]
        subresources(browser, lab, ("cdn",))
    load(proxy, lab, ("cdn",))  # the third miss in a row: img is forgotten
    assert proxy.stop() == 0
    learned = json.loads((proxy.confdir / "preconnect.json").read_text())
    [page] = learned["first_parties"]
    assert page["origin"] == lab.base("www")
    assert [o["origin"] for o in page["origins"]] == [lab.base("cdn")]


def test_unused_warm_connections_close_after_idle_timeout(
    start_reshape: StartProxy, lab: Lab, tmp_path: Path
) -> None:
    proxy = start_reshape(policy=policy(tmp_path, f"{{mode: learned, idle_timeout: {WARM_IDLE}}}"))
    load(proxy, lab)
    assert lab.open("cdn") == lab.open("img") == 0
    with client(proxy) as browser:
        navigate(browser, lab)  # and then the page needs nothing after all
    assert wait_for(lambda: lab.open("cdn") == 2 and lab.open("img") == 2, 5)
    warm_at = time.monotonic()
    assert wait_for(lambda: lab.open("cdn") == lab.open("img") == 0, 10)
    # Closed by the proxy's warm idle timeout, not the pool's (0.3 s) or nginx's (75 s).
    assert time.monotonic() - warm_at >= WARM_IDLE - 0.5
    assert wait_for(lambda: proxy.metric("reshape_preconnects_total", outcome="unused") == 4)
    assert proxy.metric("reshape_preconnects_total", outcome="used") == 0


def test_what_was_learned_survives_a_restart(
    start_reshape: StartProxy, lab: Lab, tmp_path: Path
) -> None:
    path = policy(tmp_path, "{mode: learned}")
    first = start_reshape(policy=path)
    load(first, lab)
    assert first.stop() == 0  # the open navigation ends and is written on the way out
    assert (first.confdir / "preconnect.json").exists()

    second = start_reshape("--confdir", str(first.confdir), policy=path)
    second.confdir = first.confdir  # the fixture's own choice was overridden
    before = {name: lab.accepted(name) for name in ("cdn", "img")}
    with client(second) as browser:
        navigate(browser, lab)
        assert wait_for(lambda: all(lab.accepted(n) > before[n] for n in before))
        time.sleep(0.3)
        subresources(browser, lab, ("cdn", "img"))
    # A new process does not know yet that these https origins speak HTTP/1.1 rather than
    # h2, so it warms one connection to each (what one h2 connection would need).
    assert preconnected(second) == 2


def test_a_corrupt_table_is_a_warning_not_a_crash(
    start_reshape: StartProxy, lab: Lab, tmp_path: Path
) -> None:
    confdir = tmp_path / "corrupt-conf"
    confdir.mkdir()
    (confdir / "preconnect.json").write_text('{"version": 1, "first_parties": [')
    proxy = start_reshape("--confdir", str(confdir), policy=policy(tmp_path, "{mode: learned}"))
    proxy.confdir = confdir  # the fixture's own choice was overridden
    load(proxy, lab)
    assert "is not a preconnect table" in proxy.log()
    assert proxy.stop() == 0
    assert json.loads((confdir / "preconnect.json").read_text())["version"] == 1


def test_static_mode_opens_static_connections_on_first_sight(
    start_reshape: StartProxy, lab: Lab, tmp_path: Path
) -> None:
    knobs = f"{{mode: static, static_connections: 3, idle_timeout: {WARM_IDLE}}}"
    proxy = start_reshape(policy=policy(tmp_path, knobs, "{idle_timeout: 0.3}"))
    # First sight ever: the origin's protocol is unknown and an https origin may speak h2, so
    # only the request's own connection opens (and tells the engine it speaks HTTP/1.1).
    with client(proxy) as browser:
        navigate(browser, lab)
    assert lab.accepted("www") == 1
    time.sleep(1.0)  # the pool expires: the next request is a first sight again
    with client(proxy) as browser:
        navigate(browser, lab)
    # The request's own connection and 2 warm ones, which the page does not use (IE9's waste).
    # The request takes whichever of the three is ready first (the pool serves a waiting request
    # on the first free connection): usually its own, which it opened first; should a warm one
    # be ready before it, that one is counted as used and its own stays an ordinary connection.
    assert wait_for(lambda: lab.accepted("www") == 4)

    def unused() -> float:
        return proxy.metric("reshape_preconnects_total", outcome="unused")

    assert wait_for(lambda: unused() + preconnected(proxy) == 2), (
        f"warm connections unused {unused()}, used {preconnected(proxy)}; "
        f"origin connections {lab.accepted('www')}"
    )
    assert preconnected(proxy) <= 1


def learned_first_parties(path: Path) -> list[str]:
    try:
        return [fp["origin"] for fp in json.loads(path.read_text())["first_parties"]]
    except (OSError, ValueError):
        return []


def test_the_workers_of_one_proxy_share_what_they_learned(
    start_reshape: StartProxy, lab: Lab, tmp_path: Path
) -> None:
    proxy = start_reshape("--workers", "2", policy=policy(tmp_path, "{mode: learned}"))
    # The client's connections (one CONNECT tunnel per origin) are spread over both workers:
    # each sees part of the load, and the parts are put together in the shared file once the
    # navigation has settled (SETTLE_SECONDS, 27 s, after it began).
    load(proxy, lab)
    table = proxy.confdir / "preconnect.json"
    assert wait_for(lambda: learned_first_parties(table) == [lab.base("www")], 60)
    [page] = json.loads(table.read_text())["first_parties"]
    assert {o["origin"] for o in page["origins"]} == {lab.base("cdn"), lab.base("img")}
    time.sleep(12)  # every worker has merged the file since (every 5 s; slack for a busy machine)
    # Each new client lands on either worker (SO_REUSEPORT spreads by source port): every one
    # finds warm connections. Were nothing shared, 6 loads all on the learning worker would
    # happen 1 time in 64.
    for _ in range(6):
        before = {name: lab.accepted(name) for name in ("cdn", "img")}

        def warmed(before: dict[str, int] = before) -> bool:
            return all(lab.accepted(n) > before[n] for n in before)

        with client(proxy) as browser:
            navigate(browser, lab)
            assert wait_for(warmed, 15)
            time.sleep(0.3)
            subresources(browser, lab, ("cdn", "img"))
        time.sleep(1.0)
