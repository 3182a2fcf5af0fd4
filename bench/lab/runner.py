"""Page loads, one at a time, each measured from the browser and from the relays around it.

Every load is a fresh Chromium browser context (an empty cache, no connections, as a fresh
profile) that reads no bodies back, so that only the page's own work competes with the proxy
for the two cores. What it received is still
checked: every status 200, every file's size as generated, every POST answered.

Two ways to run the loads:

- `run_loads`: every connection anywhere is closed after each load, so every load starts cold,
  in the proxy too (the plt, booster and preconnect experiments);
- `run_warm_loads`: a gateway serving user after user. The loads go in groups of one page, one
  origin variant and one network setting; a group starts with no connection anywhere, then
  unrecorded loads warm it (one per configuration, `warm_up_loads` for several worker
  processes), then its repetitions run with the configurations
  alternating (A B C A B C …), and nothing closes between loads: each load is still a new user
  (a fresh browser context), but a proxy keeps what it keeps across users — reshape its pool of
  origin connections; the browser, direct or through mitmdump (whose origin connections belong
  to the browser's), keeps nothing. The proxies' CPU time is also read over each group's
  repetitions (`GroupCpu`), idle time between its loads included.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from bench.lab.network import Links, Network
from bench.lab.preconnect import preconnect_counts
from bench.lab.profile import Profiler
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
    # TCP connections to the origins that carried this load's requests, new or kept open from
    # an earlier load (a warm pool's), and of those the ones accepted during the load.
    origin_connections: int = 0
    origin_connections_new: int = 0
    origin_peak_per_host: int = 0  # the most open at once to one origin host
    browser_bytes: int = 0  # bytes the browser received
    origin_bytes: int = 0  # bytes the origins sent
    proxy_cpu_ms: float | None = None
    # Warm connections reshape's preconnect opened during the load, by outcome (lab_preconnect).
    preconnects_used: int = 0
    preconnects_unused: int = 0
    protocols: dict[str, int] = field(default_factory=dict)  # per response, as Chromium saw it
    browser_connection_ids: int = 0  # distinct connection ids in Chromium's responses
    # Resource Timing per subresource: [url, startTime, requestStart, responseStart,
    # responseEnd] in ms.
    timings: list[tuple[str, float, float, float, float]] = field(default_factory=list)
    # Navigation Timing of the page itself: [connectEnd, requestStart, responseStart,
    # responseEnd] in ms, when Resource Timing was asked for.
    navigation: tuple[float, float, float, float] | None = None
    error: str | None = None

    @property
    def cell(self) -> Cell:
        return Cell(self.variant, self.page, self.config, self.link)

    def as_json(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class GroupCpu:
    """A proxy's CPU time over one cell's repetitions in a warm run: from after the group's
    warm-up loads to its last load, the time between its own loads (others' turns) included."""

    variant: str
    page: str
    config: str
    link: str
    cpu_ms: float
    loads: int
    # Warm connections reshape's preconnect opened over the repetitions, by outcome.
    preconnects_used: int = 0
    preconnects_unused: int = 0

    @property
    def cell(self) -> Cell:
        return Cell(self.variant, self.page, self.config, self.link)

    @property
    def per_load_ms(self) -> float:
        return self.cpu_ms / self.loads if self.loads else float("nan")

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


def run_warm_loads(
    net: Network,
    browser: BrowserSession,
    cells: Sequence[Cell],
    links: dict[str, Links],
    reps: int,
    label: str,
    *,
    profiler: Profiler | None = None,
    profiled: str | None = None,
) -> tuple[list[Load], list[GroupCpu]]:
    """Loads every cell `reps` times, a group (link, variant, page) at a time: warm-up loads
    first, then the repetitions with configurations alternating; connections are closed only
    when a group starts. With a `profiler`, the proxy of config `profiled` is recorded during
    each group's repetitions, tagged "variant page"."""
    groups: dict[tuple[str, str, str], list[Cell]] = {}
    for cell in cells:
        groups.setdefault((cell.link, cell.variant, cell.page), []).append(cell)
    progress = Progress(len(cells) * reps, label)
    loads: list[Load] = []
    cpu: list[GroupCpu] = []
    for (link, variant, page), group in groups.items():
        net.close_connections()
        time.sleep(_SETTLE_SECONDS)
        for cell in warm_up_order(group, lambda c: net.endpoints[c.config].config.workers):
            warm = _measure(net, browser, cell, -1, links, close_after=False)
            if warm.error is not None:
                print(f"lab {label}: warm-up load failed: {warm.error}", file=sys.stderr)
        proxies = {
            cell.config: proxy for cell in group if (proxy := net.endpoints[cell.config].proxy)
        }
        recorded = proxies.get(profiled) if profiler is not None and profiled else None
        if profiler is not None and recorded is not None:
            profiler.start(recorded.pgid, f"{variant} {page}", time.monotonic())
        warm_before = {name: preconnect_counts(proxy) for name, proxy in proxies.items()}
        before = {name: peers.group_cpu_seconds(proxy.pgid) for name, proxy in proxies.items()}
        try:
            for rep in range(reps):
                for cell in group:
                    load = _measure(net, browser, cell, rep, links, close_after=False)
                    loads.append(load)
                    what = f"{variant} {page} {cell.config} {link} rep {rep + 1}"
                    progress.advance(what, load.error is None)
                    if load.error is not None:
                        print(f"lab {label}: FAILED {what}: {load.error}", file=sys.stderr)
        finally:
            if profiler is not None and recorded is not None:
                profiler.stop(time.monotonic())
        spent = {n: peers.group_cpu_seconds(p.pgid) - before[n] for n, p in proxies.items()}
        for name, proxy in proxies.items():
            used, unused = preconnect_counts(proxy)
            cpu.append(
                GroupCpu(
                    variant,
                    page,
                    name,
                    link,
                    spent[name] * 1000,
                    reps,
                    used - warm_before[name][0],
                    unused - warm_before[name][1],
                )
            )
    net.close_connections()
    return loads, cpu


# A proxy of N worker processes is N pools, and the kernel hands each of a browser's connections
# to any worker, so one load warms one worker per origin host. With 4 loads per worker a given
# worker is still cold on a given host at odds of ((N - 1) / N)^(4N) (N = 2: 1 in 256), as the
# workers of a gateway are warm after its first users.
WARM_UPS_PER_WORKER = 4


def warm_up_loads(workers: int) -> int:
    """A group's unrecorded loads for a configuration of `workers` proxy processes."""
    return 1 if workers == 1 else WARM_UPS_PER_WORKER * workers


def warm_up_order(group: Sequence[Cell], workers: Callable[[Cell], int]) -> list[Cell]:
    """A group's unrecorded loads in the order they run: the extra ones of configurations with
    several worker processes first, then one per configuration in the order of the repetitions.
    Each pool then idles as long before its first recorded load as between two recorded ones
    (the other configurations' loads; pools drop connections idle 60 s). With the extra ones
    last, a single pool idled 13 loads: about 60 s for the app page over HTTP/1.1 origins at
    200 ms, by the load times of the full run at 86e7cc1."""
    extra = [cell for cell in group for _ in range(warm_up_loads(workers(cell)) - 1)]
    return [*extra, *group]


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
    net: Network,
    browser: BrowserSession,
    cell: Cell,
    rep: int,
    links: dict[str, Links],
    *,
    close_after: bool = True,
) -> Load:
    """One load of `cell`. `close_after`: close every connection after it, and count the warm
    connections reshape's preconnect opened (from its /metrics, outside the CPU reading; a warm
    run counts them per group instead, as scraping costs the proxy CPU)."""
    endpoint = net.endpoints[cell.config]
    page = net.pages[cell.variant][cell.page]
    net.set_links(links[cell.link], endpoint.config)
    net.reset_counters()
    load = Load(cell.variant, cell.page, cell.config, cell.link, rep)
    proxy = endpoint.proxy
    warm_before = preconnect_counts(proxy) if close_after else (0, 0)
    cpu_before = peers.group_cpu_seconds(proxy.pgid) if proxy else 0.0
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
        # The first line says how many requests failed; the next ones say which and why.
        lines = [line for line in str(error).splitlines() if line]
        load.error = "; ".join(lines[:3])[:400]
        loaded = None
    if proxy is not None:
        load.proxy_cpu_ms = (peers.group_cpu_seconds(proxy.pgid) - cpu_before) * 1000
    origins = [host.relay.stats for host in net.hosts[cell.variant].values()]
    load.origin_connections = sum(stats.used for stats in origins)
    load.origin_connections_new = sum(stats.accepted for stats in origins)
    load.origin_peak_per_host = max((stats.max_open for stats in origins), default=0)
    load.origin_bytes = sum(stats.bytes_down for stats in origins)
    if endpoint.relay is None:
        load.browser_connections = load.origin_connections_new
        load.browser_bytes = load.origin_bytes
    else:
        load.browser_connections = endpoint.relay.stats.accepted
        load.browser_bytes = endpoint.relay.stats.bytes_down
    if close_after:
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
            (t.url, t.start_ms, t.request_start_ms, t.response_start_ms, t.response_end_ms)
            for t in loaded.timings
        ]
        nav = loaded.navigation
        if nav is not None:
            load.navigation = (
                nav.connect_end_ms,
                nav.request_start_ms,
                nav.response_start_ms,
                nav.response_end_ms,
            )
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
