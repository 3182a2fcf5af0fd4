"""Page loads, one at a time, each measured from the browser and from the relays around it.

Every load is a fresh Chromium browser context (an empty cache, no connections, as a fresh
profile) that reads no bodies back, so that only the page's own work competes with the proxy
for the two cores. What it received is still
checked: every status 200, every file's size as generated, every POST answered.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from bench.lab.network import Links, Network
from bench.lab.preconnect import preconnect_counts
from bench.lab.sites import Page
from bench.overhead import peers
from labkit.browser import BrowserSession, PageLoad, PageLoadError

PAGE_TIMEOUT = 90.0
# Lets the proxies see the connections the relays just closed before the next load starts.
_SETTLE_SECONDS = 0.1


@dataclass(frozen=True)
class Cell:
    """One combination the experiment measures repeatedly."""

    variant: str  # origins' protocols: h1 or h2
    page: str
    config: str
    link: str  # name of the network setting


@dataclass
class Load:
    """One measured page load."""

    variant: str
    page: str
    config: str
    link: str
    rep: int
    plt_ms: float | None = None  # load time: loadEventEnd, or the page's own done mark if later
    load_ms: float | None = None
    fcp_ms: float | None = None
    done_ms: float | None = None
    requests: int = 0
    browser_connections: int = 0  # TCP connections the browser opened (to the proxy, or origins)
    origin_connections: int = 0  # TCP connections the origins accepted
    origin_peak_per_host: int = 0  # the most open at once to one origin host
    browser_bytes: int = 0  # bytes the browser received
    origin_bytes: int = 0  # bytes the origins sent
    proxy_cpu_ms: float | None = None
    # Warm connections reshape's preconnect opened during the load, by outcome (lab_preconnect).
    preconnects_used: int = 0
    preconnects_unused: int = 0
    protocols: dict[str, int] = field(default_factory=dict)  # per response, as Chromium saw it
    browser_connection_ids: int = 0  # distinct connection ids in Chromium's responses
    # Resource Timing per subresource: [url, startTime, responseStart, responseEnd] in ms.
    timings: list[tuple[str, float, float, float]] = field(default_factory=list)
    error: str | None = None

    @property
    def cell(self) -> Cell:
        return Cell(self.variant, self.page, self.config, self.link)

    def as_json(self) -> dict[str, object]:
        return asdict(self)


class Progress:
    """A one-line progress bar on stderr (a line per 5% when stderr is not a terminal)."""

    def __init__(self, total: int, label: str) -> None:
        self.total, self.label = total, label
        self.done = 0
        self.failed = 0
        self.started = time.monotonic()
        self._tty = sys.stderr.isatty()
        self._step = max(1, total // 20)

    def advance(self, what: str, ok: bool) -> None:
        self.done += 1
        self.failed += 0 if ok else 1
        if not self._tty and self.done % self._step and self.done != self.total:
            return
        elapsed = time.monotonic() - self.started
        eta = elapsed / self.done * (self.total - self.done)
        width = 24
        filled = round(width * self.done / self.total)
        bar = "#" * filled + "." * (width - filled)
        failed = f" {self.failed} failed" if self.failed else ""
        line = (
            f"lab {self.label}: [{bar}] {self.done}/{self.total} {what} "
            f"elapsed {elapsed / 60:.1f} min, eta {eta / 60:.1f} min{failed}"
        )
        if self._tty:
            end = "\n" if self.done == self.total else ""
            print(f"\r\x1b[K{line}", end=end, file=sys.stderr, flush=True)
        else:
            print(line, file=sys.stderr, flush=True)


def run_loads(
    net: Network,
    browser: BrowserSession,
    cells: Sequence[Cell],
    links: dict[str, Links],
    reps: int,
    label: str,
    *,
    every_host_warm: bool = True,
    on_load: Callable[[Load], None] | None = None,
) -> list[Load]:
    """Loads every cell once per repetition, in the given order (so configurations alternate:
    A B C A B C …), after unrecorded warm-up loads (`warm_up_cells`)."""
    warm_up = warm_up_cells(net, cells, every_host_warm)
    print(f"lab {label}: {len(warm_up)} warm-up loads", file=sys.stderr, flush=True)
    for cell in warm_up:
        _measure(net, browser, cell, -1, links)
    progress = Progress(len(cells) * reps, label)
    loads: list[Load] = []
    for rep in range(reps):
        for cell in cells:
            load = _measure(net, browser, cell, rep, links)
            loads.append(load)
            if on_load is not None:
                on_load(load)
            what = f"{cell.variant} {cell.page} {cell.config} {cell.link} rep {rep + 1}"
            progress.advance(what, load.error is None)
            if load.error is not None:
                print(f"lab {label}: FAILED {what}: {load.error}", file=sys.stderr, flush=True)
    return loads


def warm_up_cells(net: Network, cells: Sequence[Cell], every_host: bool = True) -> list[Cell]:
    """Loads that pay first-use costs outside the measurements: starting Chromium, and each
    proxy's first contact with every origin host (mitmproxy makes a certificate per host). Per
    configuration, the smallest pages of the first setting that together reach every host (or
    only the smallest page, unless `every_host`)."""
    if not cells:
        return []
    first = cells[0]
    warm: list[Cell] = []
    for config in dict.fromkeys(cell.config for cell in cells):
        reached: set[str] = set()
        names = {c.page for c in cells if (c.variant, c.link) == (first.variant, first.link)}
        by_size = sorted(names, key=lambda name: net.pages[first.variant][name].total_bytes)
        for name in by_size:
            hosts = set(net.pages[first.variant][name].hosts)
            if not hosts <= reached:
                warm.append(Cell(first.variant, name, config, first.link))
                reached |= hosts
                if not every_host:
                    break
    return warm


def _measure(
    net: Network, browser: BrowserSession, cell: Cell, rep: int, links: dict[str, Links]
) -> Load:
    endpoint = net.endpoints[cell.config]
    page = net.pages[cell.variant][cell.page]
    net.set_links(links[cell.link], endpoint.config)
    net.reset_counters()
    load = Load(cell.variant, cell.page, cell.config, cell.link, rep)
    proxy = endpoint.proxy
    cpu_before = peers.group_cpu_seconds(proxy.pgid) if proxy else 0.0
    warm_before = preconnect_counts(proxy)
    try:
        loaded = browser.load(
            page.url,
            proxy=endpoint.proxy_address,
            timeout=PAGE_TIMEOUT,
            bodies=False,
            done_global=page.done_global,
            resource_timing=True,
        )
    except PageLoadError as error:
        load.error = str(error).splitlines()[0][:300]
        loaded = None
    if proxy is not None:
        load.proxy_cpu_ms = (peers.group_cpu_seconds(proxy.pgid) - cpu_before) * 1000
    origins = [host.relay.stats for host in net.hosts[cell.variant].values()]
    load.origin_connections = sum(stats.accepted for stats in origins)
    load.origin_peak_per_host = max((stats.max_open for stats in origins), default=0)
    load.origin_bytes = sum(stats.bytes_down for stats in origins)
    if endpoint.relay is None:
        load.browser_connections = load.origin_connections
        load.browser_bytes = load.origin_bytes
    else:
        load.browser_connections = endpoint.relay.stats.accepted
        load.browser_bytes = endpoint.relay.stats.bytes_down
    net.close_connections()
    time.sleep(_SETTLE_SECONDS)
    # After the close: a warm connection nobody used is counted once it has closed.
    warm_after = preconnect_counts(proxy)
    load.preconnects_used = warm_after[0] - warm_before[0]
    load.preconnects_unused = warm_after[1] - warm_before[1]
    if loaded is not None:
        load.load_ms, load.fcp_ms, load.done_ms = loaded.load_ms, loaded.fcp_ms, loaded.done_ms
        load.plt_ms = max(loaded.load_ms, loaded.done_ms or 0.0)
        load.requests = len(loaded.resources)
        load.protocols = dict(Counter(r.protocol or "?" for r in loaded.resources))
        load.browser_connection_ids = len({r.connection_id for r in loaded.resources})
        load.timings = [
            (t.url, t.start_ms, t.response_start_ms, t.response_end_ms) for t in loaded.timings
        ]
        load.error = received_wrong(page, loaded)
        if load.error is not None:
            load.plt_ms = None
    return load


def received_wrong(page: Page, loaded: PageLoad) -> str | None:
    """Why what the load received is not the page as generated, or None if it is."""
    bad = [f"{r.method} {r.url} {r.status}" for r in loaded.resources if r.status != 200]
    if bad:
        return f"{len(bad)} responses not 200, e.g. {bad[0]}"
    sizes = {r.url: r.size for r in loaded.resources if r.method == "GET"}
    missing = sorted(set(page.sizes) - set(sizes))
    if missing:
        return f"{len(missing)} resources never fetched, e.g. {missing[0]}"
    wrong = [url for url, size in page.sizes.items() if sizes[url] != size]
    if wrong:
        return f"{len(wrong)} bodies of the wrong size, e.g. {wrong[0]}: {sizes[wrong[0]]} bytes"
    posts = sum(1 for r in loaded.resources if r.method == "POST")
    if posts != page.posts:
        return f"{posts} POSTs answered, {page.posts} expected"
    return None
