"""bench/queueing's results: one table per RTT, the findings, and what the emulation leaves out.

Pure functions over `Run`s (one case at one RTT in one round). Transaction latency is summarised
per run (its average) and then over rounds (median, lowest, highest), and set against direct in
the same round; shares and queues pool the rounds. The RESULTS.md section is assembled by
bench/capacity/report.py.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

from bench.queueing.cases import BROWSERS, CONFIGS, ORIGINS, Case

HEADING = "## Queueing (bench/queueing)"
KINDS = ("new", "reused", "pipelined", "multiplexed")
# Issue 17: at 200 ms RTT, transactions through the pool at most this fraction of direct's, as
# the pipelining study found (1,906 -> 702 ms: 0.37).
TARGET_RATIO = 0.6
TARGET_RTT = 0.2
EXPLANATIONS = (
    "What the relay emulates (labkit/relay.py): a delay of half the RTT on every chunk in "
    "each direction, in order, and a connect delay of one RTT before a new connection reaches "
    "the origin. What it does not: loss, reordering, jitter, a bandwidth limit or a bottleneck "
    "shared by connections, slow start and congestion control on the emulated path (loopback's "
    "own TCP is underneath, so a response's bytes arrive one half-RTT after the origin sent "
    "them, however many there are), MTU effects. Only the proxy-to-origin path is long; "
    "browsers reach the proxy over plain loopback, as with a proxy close to its users.",
    "What the simulated browsers reproduce of Chromium: the protocol it chooses (h2 to an "
    "intercepting proxy that offers it, HTTP/1.1 with 6 connections to an HTTP/1.1-only origin; "
    "checked against headless Chromium, see its table when --chromium ran), waiting for the "
    "first connection's ALPN, first-come-first-served waits for a busy connection, HTTP/2 "
    "windows large enough never to hold a page back, connections kept between a browser's "
    "loads. What they do not: discovery of subresources while the HTML parses (all are wanted "
    "at once when the HTML has arrived), request priorities and Chromium's throttling of "
    "low-priority requests on HTTP/1.1, speculative preconnects, an HTTP cache, TLS session "
    "resumption, and the renderer's own CPU.",
    "Two queues: a browser that speaks HTTP/1.1 to the proxy keeps its 6 connections, so most "
    "of a page's requests wait in the browser whatever the pool does behind it (browser "
    "queue). A browser that speaks h2 to the proxy sends all of them at once; then they wait, if "
    "at all, for an origin connection in the pool (proxy queue), which pipelining and HTTP/2 "
    "remove once their connections are up. A proxy-queue request served by a connection still "
    "being opened counts as queued.",
    "At ~0 RTT the figures measure CPU, not the network: the proxy is one Python process doing "
    "about a millisecond of work per request, on 2 cores shared with nginx, the relays and the "
    "browsers.",
)


@dataclass
class Run:
    """One case at one RTT in one round, as measured."""

    origin: str
    browser_kind: str
    config: str
    rtt: float
    round: int
    browser_count: int
    requests: int
    transactions_s: list[float]  # per request, at the browser: wanted -> response head
    browser_queue_s: list[float]  # per request: waiting for the browser's own connections
    body_s: list[float]  # per request: response head -> end of body, at the browser
    browser_new: int  # requests that opened a browser connection
    browser_h2: int  # requests the browser sent over HTTP/2
    page_s: list[float]
    seconds: float
    errors: list[str]
    browser_connections: int
    origin_connections: int  # the relay's connections to the origin
    origin_max_open: int
    # reshape's metrics over the run (absent for direct and mitmdump)
    pool_kinds: dict[str, int] = field(default_factory=dict)
    proxy_queue: tuple[int, int, float] | None = None  # (queued, sent, seconds waited in all)
    proxy_transaction: tuple[int, float] | None = None  # (count, seconds in all)
    proxy_connections: dict[str, int] | None = None  # upstream connections opened, by proto
    proxy_cpu_s: float | None = None
    proxy_wait_s: float | None = None  # ready to run but without a core (other work had it)

    @property
    def case(self) -> Case:
        return Case(self.origin, self.browser_kind, self.config)

    @property
    def key(self) -> str:
        return self.case.key

    @property
    def transaction_s(self) -> float:
        """The run's average transaction."""
        return _mean(self.transactions_s)


@dataclass(frozen=True)
class Spread:
    """A figure over rounds: the median, the lowest and the highest."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread | None:
        return cls(statistics.median(values), min(values), max(values)) if values else None


@dataclass(frozen=True)
class Row:
    case: Case
    rtt: float
    rounds: int
    requests: int
    errors: int
    browser_h2: float  # share of requests over HTTP/2 to the next hop
    browser_connections: float  # per browser per run
    browser_queued: float  # share
    browser_queue_ms: float
    proxy_queued: float | None
    proxy_queue_ms: float | None
    mix: dict[str, float] | None  # share of requests per connection kind
    origin_connections: float  # per run
    origin_max_open: int
    transaction_ms: Spread  # of the runs' averages
    vs_direct: Spread | None  # of the rounds' ratios to direct
    proxy_transaction_ms: float | None
    within: tuple[float, ...]  # shares within marks(rtt)
    page_s: float
    proxy_cpu_ms_per_request: float | None
    proxy_wait_ms_per_request: float | None


def marks(rtt: float) -> tuple[float, float, float]:
    """Three latency marks (seconds) that scale with the RTT, on the histograms' bucket edges."""
    if rtt < 0.01:
        return (0.025, 0.1, 0.25)
    return (round(1.25 * rtt, 3), round(2.5 * rtt, 3), round(5 * rtt, 3))


def case_label(case: Case) -> str:
    return f"{_origin_label(case)} / {_browsers_label(case)} browsers / {_config_label(case)}"


def _origin_label(case: Case) -> str:
    return ORIGINS[case.origin].label if case.origin in ORIGINS else case.origin


def _browsers_label(case: Case) -> str:
    return BROWSERS[case.browsers].label if case.browsers in BROWSERS else case.browsers


def _config_label(case: Case) -> str:
    return CONFIGS[case.config].label if case.config in CONFIGS else case.config


def rows(runs: Sequence[Run], cases: Sequence[Case], rtts: Sequence[float]) -> list[Row]:
    result = []
    for rtt in rtts:
        for case in cases:
            chosen = [r for r in runs if r.case == case and r.rtt == rtt]
            if chosen:
                direct = {
                    r.round: r
                    for r in runs
                    if r.rtt == rtt
                    and r.config == "direct"
                    and (r.origin, r.browser_kind) == (case.origin, case.browsers)
                }
                result.append(_row(chosen, direct))
    return result


def _row(runs: Sequence[Run], direct: dict[int, Run]) -> Row:
    first = runs[0]
    transactions = [t for r in runs for t in r.transactions_s]
    queue = [q for r in runs for q in r.browser_queue_s]
    requests = sum(r.requests for r in runs)
    proxy_queued = proxy_queue_ms = proxy_transaction_ms = None
    if all(r.proxy_queue for r in runs):
        queued = sum(r.proxy_queue[0] for r in runs if r.proxy_queue)
        sent = sum(r.proxy_queue[1] for r in runs if r.proxy_queue)
        waited = sum(r.proxy_queue[2] for r in runs if r.proxy_queue)
        if sent:
            proxy_queued, proxy_queue_ms = queued / sent, 1000 * waited / sent
    if all(r.proxy_transaction for r in runs):
        count = sum(r.proxy_transaction[0] for r in runs if r.proxy_transaction)
        total = sum(r.proxy_transaction[1] for r in runs if r.proxy_transaction)
        proxy_transaction_ms = 1000 * total / count if count else None
    cpu = [r.proxy_cpu_s for r in runs if r.proxy_cpu_s is not None]
    wait = [r.proxy_wait_s for r in runs if r.proxy_wait_s is not None]
    averages = [1000 * r.transaction_s for r in runs if r.transactions_s]
    ratios = [
        r.transaction_s / direct[r.round].transaction_s
        for r in runs
        if r.transactions_s and r.round in direct and direct[r.round].transaction_s > 0
    ]
    return Row(
        case=first.case,
        rtt=first.rtt,
        rounds=len(runs),
        requests=requests,
        errors=sum(len(r.errors) for r in runs),
        browser_h2=sum(r.browser_h2 for r in runs) / requests if requests else 0.0,
        browser_connections=_mean([r.browser_connections / r.browser_count for r in runs]),
        browser_queued=_share(queue, lambda q: q > 0),
        browser_queue_ms=1000 * _mean(queue),
        proxy_queued=proxy_queued,
        proxy_queue_ms=proxy_queue_ms,
        mix=_mix(runs),
        origin_connections=sum(r.origin_connections for r in runs) / len(runs),
        origin_max_open=max(r.origin_max_open for r in runs),
        transaction_ms=Spread.of(averages) or Spread(0.0, 0.0, 0.0),
        vs_direct=None if first.config == "direct" else Spread.of(ratios),
        proxy_transaction_ms=proxy_transaction_ms,
        within=tuple(_share(transactions, partial(_within, mark)) for mark in marks(first.rtt)),
        page_s=_mean([p for r in runs for p in r.page_s]),
        proxy_cpu_ms_per_request=1000 * sum(cpu) / requests if cpu and requests else None,
        proxy_wait_ms_per_request=1000 * sum(wait) / requests if wait and requests else None,
    )


def _mix(runs: Sequence[Run]) -> dict[str, float] | None:
    """Share of requests per kind of origin connection: the pool's own count through reshape,
    the browsers' for direct, unknown for mitmdump."""
    counts = dict.fromkeys(KINDS, 0)
    for run in runs:
        if run.pool_kinds and sum(run.pool_kinds.values()):
            for kind in KINDS:
                counts[kind] += run.pool_kinds.get(kind, 0)
        elif run.config == "direct":
            counts["new"] += run.browser_new
            multiplexed = run.browser_h2 - min(run.browser_h2, run.browser_new)
            counts["multiplexed"] += multiplexed
            counts["reused"] += run.requests - run.browser_new - multiplexed
        else:
            return None
    total = sum(counts.values())
    return {kind: n / total for kind, n in counts.items()} if total else None


def _within(mark: float, seconds: float) -> bool:
    return seconds <= mark


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def _share(values: Sequence[float], test: Callable[[float], bool]) -> float:
    return sum(1 for v in values if test(v)) / len(values) if values else 0.0


def _ms_label(seconds: float) -> str:
    return f"{seconds:g} s" if seconds >= 1 else f"{seconds * 1000:g} ms"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if value < 10 else f"{value:.0f}"


def _per_request(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _spread_ms(spread: Spread) -> str:
    return f"{_ms(spread.median)} ({_ms(spread.low)}-{_ms(spread.high)})"


def _ratio(spread: Spread | None) -> str:
    if spread is None:
        return "-"
    return f"{spread.median:.2f} ({spread.low:.2f}-{spread.high:.2f})"


def _next_hop(row: Row) -> str:
    protocol = "h2" if row.browser_h2 >= 0.5 else "HTTP/1.1"
    return f"{protocol}, {row.browser_connections:.1f}"


def table(all_rows: Sequence[Row], rtt: float) -> str:
    header = (
        "origin",
        "browsers",
        "config",
        "requests",
        "browser to next hop, conns per browser",
        "avg transaction ms (range)",
        "x direct (range)",
        "browser queued",
        "browser avg queue ms",
        "proxy queued",
        "proxy avg queue ms",
        "new / reused / pipelined / multiplexed",
        "origin conns per run (most open)",
        "proxy avg transaction ms",
        *(f"<= {_ms_label(m)}" for m in marks(rtt)),
        "avg page s",
        "proxy CPU ms/req",
        "proxy CPU wait ms/req",
        "errors",
    )
    lines = [header]
    for row in all_rows:
        if row.rtt != rtt:
            continue
        mix = (
            (" / ".join(f"{100 * row.mix[kind]:.0f}" for kind in KINDS) + " %") if row.mix else "-"
        )
        lines.append(
            (
                _origin_label(row.case),
                _browsers_label(row.case),
                _config_label(row.case),
                str(row.requests),
                _next_hop(row),
                _spread_ms(row.transaction_ms),
                _ratio(row.vs_direct),
                _pct(row.browser_queued),
                _ms(row.browser_queue_ms),
                _pct(row.proxy_queued),
                _ms(row.proxy_queue_ms),
                mix,
                f"{row.origin_connections:g} ({row.origin_max_open})",
                _ms(row.proxy_transaction_ms),
                *(_pct(share) for share in row.within),
                f"{row.page_s:.2f}",
                _per_request(row.proxy_cpu_ms_per_request),
                _per_request(row.proxy_wait_ms_per_request),
                str(row.errors),
            )
        )
    return markdown(lines)


def markdown(lines: Sequence[Sequence[str]]) -> str:
    """A Markdown table of `lines`, the first being the header, columns padded to line up."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]

    def render(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    separator = "| " + " | ".join("-" * w for w in widths) + " |"
    return "\n".join([render(lines[0]), separator, *(render(line) for line in lines[1:])])


def findings(all_rows: Sequence[Row]) -> list[str]:
    lines = []
    for rtt in sorted({row.rtt for row in all_rows}):
        where = f"at {rtt * 1000:g} ms RTT"
        groups: dict[tuple[str, str], list[Row]] = {}
        for row in all_rows:
            if row.rtt == rtt:
                groups.setdefault((row.case.origin, row.case.browsers), []).append(row)
        for group in groups.values():
            direct = next((r for r in group if r.case.config == "direct"), None)
            others = [r for r in group if r.vs_direct is not None]
            if direct is None or not others:
                continue
            what = f"{_origin_label(group[0].case)}, {_browsers_label(group[0].case)} browsers"
            lines.append(
                f"{where}, {what}: average transaction direct {_ms(direct.transaction_ms.median)}"
                " ms; "
                + "; ".join(
                    f"{_config_label(r.case)} {_ms(r.transaction_ms.median)} ms = "
                    f"{_ratio(r.vs_direct)} x direct"
                    for r in others
                )
                + " (Firefox's study, pipelining in the browser: 1,906 -> 702 ms = 0.37 x)"
            )
            pools = [r for r in others if CONFIGS[r.case.config].proxy == "reshape"]
            if abs(rtt - TARGET_RTT) < 1e-9 and pools:
                lines.append(
                    f"issue 17's target (through the pool <= {TARGET_RATIO} x direct at "
                    f"{TARGET_RTT * 1000:g} ms RTT), {what}: "
                    + "; ".join(
                        f"{_config_label(r.case)} {_ratio(r.vs_direct)} x: "
                        + ("met" if _median_ratio(r) <= TARGET_RATIO else "NOT met")
                        for r in pools
                    )
                )
    return lines


def _median_ratio(row: Row) -> float:
    assert row.vs_direct is not None
    return row.vs_direct.median
