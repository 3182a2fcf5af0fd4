"""bench/queueing's results: one table per RTT, the findings, and what the emulation leaves out.

Pure functions over `Run`s (one configuration at one RTT in one round); rounds are pooled per
configuration and RTT. The RESULTS.md section is assembled by bench/capacity/report.py.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

HEADING = "## Queueing (bench/queueing)"
KINDS = ("new", "reused", "pipelined", "multiplexed")
LABELS = {
    "direct": "direct (no proxy)",
    "reshape-plain": "reshape {}",
    "pool": "pool, no pipelining",
    "pool-pipelined": "pool, pipeline_depth 8",
    "pool-h2": "pool, HTTP/2",
}
EXPLANATIONS = (
    "What the relay emulates (labkit/relay.py): a delay of half the RTT on every chunk in "
    "each direction, in order, and here a connect delay of one RTT before a new connection "
    "reaches the origin. What it does not: loss, reordering, jitter, a bandwidth limit or a "
    "bottleneck shared by connections, slow start on the emulated path (loopback's own TCP is "
    "underneath), MTU effects. Only the proxy-to-origin path is long; browsers reach the proxy "
    "over plain loopback, as with a proxy close to its users.",
    "Two queues: each browser still has 6 connections to the proxy, so most of a page's "
    "requests wait in the browser first (browser queue); what reshape changes is the wait for an "
    "origin connection behind it (proxy queue), which pipelining and HTTP/2 remove once their "
    "connections are up. A proxy-queue request served by a connection still being opened "
    "counts as queued.",
    "At ~0 RTT the figures measure CPU, not the network: reshape is one Python process doing "
    "a few ms of work per request, on 2 cores shared with nginx, the relay and the browsers.",
)


@dataclass
class Run:
    """One configuration at one RTT in one round, as measured."""

    config: str
    rtt: float
    round: int
    requests: int
    transactions_s: list[float]  # per request, at the browser: wanted -> response head
    browser_queue_s: list[float]  # per request: waiting for the browser's own connections
    body_s: list[float]  # per request: response head -> end of body, at the browser
    browser_new: int  # requests that opened a browser connection
    page_s: list[float]
    seconds: float
    errors: list[str]
    browser_connections: int
    origin_connections: int  # the relay's connections to the origin
    origin_max_open: int
    # reshape's metrics over the run (absent for direct)
    pool_kinds: dict[str, int] = field(default_factory=dict)
    proxy_queue: tuple[int, int, float] | None = None  # (queued, sent, seconds waited in all)
    proxy_transaction: tuple[int, float] | None = None  # (count, seconds in all)
    proxy_connections: dict[str, int] | None = None  # upstream connections opened, by proto
    proxy_cpu_s: float | None = None
    proxy_wait_s: float | None = None  # ready to run but without a core (other work had it)


@dataclass(frozen=True)
class Row:
    config: str
    rtt: float
    rounds: int
    requests: int
    errors: int
    browser_queued: float  # share
    browser_queue_ms: float
    proxy_queued: float | None
    proxy_queue_ms: float | None
    mix: dict[str, float] | None  # share of requests per connection kind
    origin_connections: float  # per run
    origin_max_open: int
    transaction_ms: float
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


def rows(runs: Sequence[Run], configs: Sequence[str], rtts: Sequence[float]) -> list[Row]:
    result = []
    for rtt in rtts:
        for config in configs:
            chosen = [r for r in runs if r.config == config and r.rtt == rtt]
            if chosen:
                result.append(_row(chosen))
    return result


def _row(runs: Sequence[Run]) -> Row:
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
    return Row(
        config=first.config,
        rtt=first.rtt,
        rounds=len(runs),
        requests=requests,
        errors=sum(len(r.errors) for r in runs),
        browser_queued=_share(queue, lambda q: q > 0),
        browser_queue_ms=1000 * _mean(queue),
        proxy_queued=proxy_queued,
        proxy_queue_ms=proxy_queue_ms,
        mix=_mix(runs),
        origin_connections=sum(r.origin_connections for r in runs) / len(runs),
        origin_max_open=max(r.origin_max_open for r in runs),
        transaction_ms=1000 * _mean(transactions),
        proxy_transaction_ms=proxy_transaction_ms,
        within=tuple(_share(transactions, lambda t, m=m: t <= m) for m in marks(first.rtt)),
        page_s=_mean([p for r in runs for p in r.page_s]),
        proxy_cpu_ms_per_request=1000 * sum(cpu) / requests if cpu and requests else None,
        proxy_wait_ms_per_request=1000 * sum(wait) / requests if wait and requests else None,
    )


def _mix(runs: Sequence[Run]) -> dict[str, float] | None:
    """Share of requests per kind of origin connection; see the setup for where each comes from."""
    counts = dict.fromkeys(KINDS, 0)
    for run in runs:
        if run.pool_kinds and sum(run.pool_kinds.values()):
            for kind in KINDS:
                counts[kind] += run.pool_kinds.get(kind, 0)
        elif run.proxy_connections is not None:
            opened = sum(run.proxy_connections.values())
            counts["new"] += opened
            counts["reused"] += max(0, run.requests - opened)
        else:
            counts["new"] += run.browser_new
            counts["reused"] += run.requests - run.browser_new
    total = sum(counts.values())
    return {kind: n / total for kind, n in counts.items()} if total else None


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def _share(values: Sequence[float], test: object) -> float:
    assert callable(test)
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


def table(all_rows: Sequence[Row], rtt: float) -> str:
    header = (
        "config",
        "requests",
        "browser queued",
        "browser avg queue ms",
        "proxy queued",
        "proxy avg queue ms",
        "new / reused / pipelined / multiplexed",
        "origin conns per run (most open)",
        "avg transaction ms",
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
        mix = (" / ".join(f"{100 * row.mix[kind]:.0f}" for kind in KINDS) if row.mix else "-") + (
            " %" if row.mix else ""
        )
        lines.append(
            (
                LABELS.get(row.config, row.config),
                str(row.requests),
                _pct(row.browser_queued),
                _ms(row.browser_queue_ms),
                _pct(row.proxy_queued),
                _ms(row.proxy_queue_ms),
                mix,
                f"{row.origin_connections:g} ({row.origin_max_open})",
                _ms(row.transaction_ms),
                _ms(row.proxy_transaction_ms),
                *(_pct(share) for share in row.within),
                f"{row.page_s:.2f}",
                _per_request(row.proxy_cpu_ms_per_request),
                _per_request(row.proxy_wait_ms_per_request),
                str(row.errors),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]

    def render(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    separator = "| " + " | ".join("-" * w for w in widths) + " |"
    return "\n".join([render(lines[0]), separator, *(render(line) for line in lines[1:])])


def findings(all_rows: Sequence[Row]) -> list[str]:
    lines = []
    for rtt in sorted({row.rtt for row in all_rows}):
        at = {row.config: row for row in all_rows if row.rtt == rtt}
        where = f"at {rtt * 1000:g} ms RTT"
        pools = [at[name] for name in ("pool", "pool-pipelined", "pool-h2") if name in at]
        if pools:
            lines.append(
                f"{where}, requests queued in the proxy (avg wait): "
                + "; ".join(
                    f"{LABELS[r.config]} {_pct(r.proxy_queued)} ({_ms(r.proxy_queue_ms)} ms)"
                    for r in pools
                )
                + " (Firefox's study at ~250 ms: 79% -> 0 with pipelining)"
            )
        lines.append(
            f"{where}, average transaction at the browser: "
            + "; ".join(f"{LABELS.get(c, c)} {_ms(r.transaction_ms)} ms" for c, r in at.items())
            + " (Firefox's study: 1,906 -> 702 ms)"
        )
        lines.append(
            f"{where}, origin connections per run (most open at once): "
            + "; ".join(
                f"{LABELS.get(c, c)} {r.origin_connections:g} ({r.origin_max_open})"
                for c, r in at.items()
            )
            + " (Facebook in the study: ~60 -> ~30)"
        )
    return lines
