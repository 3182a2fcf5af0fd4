"""The bench's page in real headless Chromium, direct and through the proxies: does Chromium speak
what the simulated browsers assume, and how do its transactions compare?

Every proxy of the cases starts once and runs through all loads (its pool warm after the first,
as with many users); each load is a fresh browser context (no cache, no connections), after one
unmeasured load per case; loads rotate through the cases. Per load: the protocol Chromium spoke
to the next hop and over how many connections (DevTools), the connections the origin saw (the
relay), and the average transaction of the page's subresources from Resource Timing
(responseStart - startTime: from when the page wanted the resource to its response head).
"""

from __future__ import annotations

import collections
import contextlib
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.capacity.site import Page
from bench.overhead import peers
from bench.overhead.peers import RunningProxy
from bench.queueing.cases import CONFIGS, Case
from bench.queueing.relay import RelayProcess
from bench.queueing.report import Spread, case_label, markdown
from labkit.browser import BrowserSession
from labkit.pki import OriginPKI

PAGE_TIMEOUT = 60.0


@dataclass(frozen=True)
class Load:
    protocols: dict[str, int]  # responses by the protocol to the next hop
    browser_connections: int
    origin_connections: int
    transaction_ms: float  # average over the subresources
    load_ms: float


@dataclass(frozen=True)
class Row:
    case: Case
    loads: list[Load]
    vs_direct: Spread | None

    @property
    def protocol(self) -> str:
        counts: collections.Counter[str] = collections.Counter()
        for load in self.loads:
            counts.update(load.protocols)
        return ", ".join(f"{name} {100 * n / counts.total():.0f}%" for name, n in counts.items())


def compare(
    cases: Sequence[Case],
    relays: dict[str, RelayProcess],
    page: Page,
    pki: OriginPKI,
    workdir: Path,
    *,
    loads: int,
    say: Callable[[str], None],
) -> list[Row]:
    cases = [c for c in cases if c.origin in relays]
    workdir.mkdir()
    with contextlib.ExitStack() as stack:
        proxies: dict[str, RunningProxy | None] = {}
        for config in dict.fromkeys(c.config for c in cases):
            proxies[config] = stack.enter_context(_proxy(config, workdir, pki.ca_cert_path))
        cas = [pki.ca_cert_path, *(p.https_ca for p in proxies.values() if p is not None)]
        session = stack.enter_context(BrowserSession(cas))
        measured: dict[Case, list[Load]] = {case: [] for case in cases}
        for number in range(loads + 1):
            for case in cases[number % len(cases) :] + cases[: number % len(cases)]:
                load = _load(session, case, relays[case.origin], page, proxies[case.config])
                if number:  # the first round warms up browser, proxies and origins
                    measured[case].append(load)
                    say(
                        f"chromium {number}: {case.key}: avg transaction "
                        f"{load.transaction_ms:.0f} ms, {load.protocols}, "
                        f"{load.browser_connections} browser connections"
                    )
    rows = []
    for case, done in measured.items():
        direct = measured.get(Case(case.origin, case.browsers, "direct"))
        ratios = (
            [a.transaction_ms / d.transaction_ms for a, d in zip(done, direct, strict=True)]
            if direct and case.config != "direct"
            else []
        )
        rows.append(Row(case, done, Spread.of(ratios)))
    return rows


def _proxy(
    config: str, workdir: Path, origin_ca: Path
) -> contextlib.AbstractContextManager[RunningProxy | None]:
    chosen = CONFIGS[config]
    home = workdir / config
    if chosen.proxy is None:
        return contextlib.nullcontext()
    home.mkdir()
    if chosen.proxy == "mitmdump":
        return peers.mitmdump(home, origin_ca)
    assert chosen.policy is not None
    (home / "policy.yaml").write_text(chosen.policy)
    return peers.reshape(home, origin_ca, home / "policy.yaml")


def _load(
    session: BrowserSession,
    case: Case,
    relay: RelayProcess,
    page: Page,
    proxy: RunningProxy | None,
) -> Load:
    before = relay.counts()
    result = session.load(
        f"https://{relay.host}:{relay.port}{page.path}",
        proxy=proxy.url if proxy else None,
        timeout=PAGE_TIMEOUT,
        bodies=False,
        resource_timing=True,
    )
    after = relay.counts()
    transactions = [t.response_start_ms - t.start_ms for t in result.timings]
    return Load(
        dict(collections.Counter(r.protocol for r in result.resources)),
        len({r.connection_id for r in result.resources}),
        after.accepted - before.accepted,
        statistics.fmean(transactions) if transactions else 0.0,
        result.load_ms,
    )


def table(rows: Sequence[Row]) -> str:
    lines: list[tuple[str, ...]] = [
        (
            "case",
            "loads",
            "protocol to next hop",
            "browser conns per load",
            "new origin conns per load",
            "avg transaction ms (range)",
            "x direct (range)",
            "load ms",
        )
    ]
    for row in rows:
        averages = Spread.of([load.transaction_ms for load in row.loads])
        if averages is None:
            continue
        ratio = row.vs_direct
        lines.append(
            (
                case_label(row.case),
                str(len(row.loads)),
                row.protocol,
                f"{statistics.median(load.browser_connections for load in row.loads):g}",
                f"{statistics.median(load.origin_connections for load in row.loads):g}",
                f"{averages.median:.0f} ({averages.low:.0f}-{averages.high:.0f})",
                "-" if ratio is None else f"{ratio.median:.2f} ({ratio.low:.2f}-{ratio.high:.2f})",
                f"{statistics.median(load.load_ms for load in row.loads):.0f}",
            )
        )
    return markdown(lines)


def findings(rows: Sequence[Row]) -> list[str]:
    lines = []
    for row in rows:
        if row.loads:
            lines.append(
                f"Chromium, {case_label(row.case)}: {row.protocol} to the next hop over "
                f"{statistics.median(load.browser_connections for load in row.loads):g} "
                "connection(s) per load"
                + (
                    f"; transactions {row.vs_direct.median:.2f} x direct"
                    if row.vs_direct is not None
                    else ""
                )
            )
    return lines
