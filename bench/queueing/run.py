"""bench/queueing: where requests wait, and for how long, direct and through reshape's pool.

Firefox's pipelining study (at ~250 ms RTT: transactions 1,906 -> 702 ms on average, queued
requests 79% -> 0) measured a browser that pipelined to HTTP/1.1 origins itself. Through a proxy
the browser does not pipeline; what takes its place is the protocol it speaks to the proxy.
Chromium speaks HTTP/2 to an intercepting proxy that offers it on the CONNECT-tunnelled TLS (as
reshape does), and HTTP/1.1 with 6 connections per host to an HTTP/1.1-only origin when direct
(`--chromium` checks it). So the comparison here:

- Origins: nginx (1 worker) over TLS, HTTP/1.1 only (an origin of the study's era) on 127.0.0.2,
  and h2 + HTTP/1.1 by ALPN on 127.0.0.3, with keep-alive that outlasts the run. In front of
  each, a user-space relay (bench/queueing/relay.py, a process of its own) emulates the path to
  the origin: ~0 RTT, and 200 ms RTT with each new connection costing one RTT more.
- Browsers (bench/queueing/load.py on bench/capacity/client.py): a few at once, each loading a
  page of many small resources several times, each load a burst. They negotiate ALPN as
  Chromium does (h2 when offered, else HTTP/1.1 with 6 connections per host); HTTP/1.1-only
  browsers (the earlier setup) are kept as a reference.
- Configurations: direct (no proxy); mitmdump (a peer: mirrors the origin's ALPN to the
  browser, one origin connection per browser connection); reshape's pool as `{}` configures it
  (6 connections per host, h2 where the origin offers it, no pipelining); and the pool with
  `pipeline_depth: 8` over HTTP/1.1.

Per case and RTT: transaction latency at the browser (request wanted -> response head), as the
median over rounds of each run's average, and its ratio to direct in the same round; the share
of requests that waited for a connection and how long, in the browsers and in reshape's pool
(from its /metrics); the kind of origin connection each request went out on; connections the
origin saw; the proxy's CPU per request. Every proxy is started afresh for every run, so every
run starts with cold connections on both sides. `--profile` records where the proxy's CPU goes
(py-spy), `--chromium` loads the same page in real headless Chromium.

Run it as `python -m bench.queueing` (see its `--help`).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import json
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import uvloop

from bench import profiles, runs
from bench.capacity import procs
from bench.capacity import report as capacity_report
from bench.capacity.client import tls_context
from bench.capacity.metrics import Samples, scrape
from bench.capacity.site import Page, build_page
from bench.overhead import peers
from bench.overhead.peers import ProxyStartError, RunningProxy
from bench.queueing import chromium, report
from bench.queueing.cases import BROWSERS, CONFIGS, DEFAULT_CASES, ORIGINS, Case, Config
from bench.queueing.load import LoadPlan, LoadResult, run_load
from bench.queueing.relay import RelayCounts, RelayProcess, relay_process
from bench.queueing.report import HEADING, Run
from labkit.browser import PageLoadError
from labkit.origins import OriginStartError, nginx_origin
from labkit.pki import OriginPKI

BENCH = runs.Bench("queueing")
say = BENCH.say
SETTLE_SECONDS = 0.5
# nginx never ends a keep-alive connection during a run (its default would, after 1,000
# requests), so every connection the origin sees was the client's choice.
ORIGIN_KEEPALIVE_REQUESTS = 1_000_000_000


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.queueing",
        description="Transaction latency, queueing and connection reuse direct and through "
        "reshape's pool (HTTP/2 and pipelining upstream), with browsers that negotiate HTTP/2 as "
        "Chromium does, at ~0 and 200 ms RTT.",
    )
    parser.add_argument("--configs", help=f"comma-separated, from {','.join(CONFIGS)} (all)")
    parser.add_argument("--origins", help=f"comma-separated, from {','.join(ORIGINS)} (all)")
    parser.add_argument(
        "--browser-kinds",
        help="comma-separated: alpn (h2 when offered, as Chromium), h1 (HTTP/1.1 only); (all)",
    )
    parser.add_argument("--rtts", default="0,0.2", help="emulated RTTs in seconds (0,0.2)")
    parser.add_argument("--browsers", type=int, help="browsers at once (4)")
    parser.add_argument("--per-host", type=int, default=6, help="HTTP/1.1 connections per host")
    parser.add_argument("--pages", type=int, help="page loads per browser (3)")
    parser.add_argument("--resources", type=int, help="subresources on the page (40)")
    parser.add_argument("--pause", default="0.5,1.5", help="seconds between a browser's loads")
    parser.add_argument("--repeat", type=int, help="interleaved rounds (5)")
    parser.add_argument("--timeout", type=float, default=120.0, help="bound on one run, seconds")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--profile",
        action="store_true",
        help="after the rounds, one more run of each reshape case at the highest RTT with "
        "py-spy attached to the proxy (not counted in the tables); the breakdown is recorded",
    )
    parser.add_argument(
        "--chromium",
        type=int,
        default=0,
        metavar="LOADS",
        help="also load the page LOADS times per case in headless Chromium at the highest RTT "
        "(protocol, connections, transaction latency from Resource Timing)",
    )
    parser.add_argument("--quick", action="store_true", help="smoke test: one small round")
    runs.add_output_arguments(parser, figures="run")
    args = parser.parse_args(argv)

    configs = {c.name for c in runs.chosen_configs(parser, args.configs, CONFIGS)}
    origins = _chosen(parser, "--origins", args.origins, ORIGINS)
    kinds = _chosen(parser, "--browser-kinds", args.browser_kinds, BROWSERS)
    args.cases = [
        case
        for case in DEFAULT_CASES
        if case.config in configs and case.origin in origins and case.browsers in kinds
    ]
    if not args.cases:
        parser.error("no case left: see the default cases in bench/queueing/cases.py")
    try:
        args.rtts = sorted({float(v) for v in args.rtts.split(",")})
        low, high = (float(v) for v in args.pause.split(","))
    except ValueError:
        parser.error("--rtts: numbers, e.g. 0,0.2; --pause: two numbers, e.g. 0.5,1.5")
    args.pause = (low, high)
    quick = args.quick
    args.browsers = args.browsers or (2 if quick else 4)
    args.pages = args.pages or (1 if quick else 3)
    args.resources = args.resources or (20 if quick else 40)
    args.repeat = args.repeat or (1 if quick else 5)
    if quick:
        args.pause = (0.0, 0.2)
    if min(args.rtts) < 0 or not 0 <= low <= high or args.timeout <= 0:
        parser.error("RTTs and pauses must not be negative; --timeout must be positive")
    if min(args.browsers, args.per_host, args.pages, args.repeat) < 1 or args.chromium < 0:
        parser.error("--browsers, --per-host, --pages and --repeat must be at least 1")
    return args


def _chosen(
    parser: argparse.ArgumentParser, option: str, value: str | None, known: Mapping[str, object]
) -> set[str]:
    wanted = set(value.split(",")) if value else set(known)
    if not wanted or wanted - set(known):
        parser.error(f"{option}: unknown {sorted(wanted - set(known))}; choose from {list(known)}")
    return wanted


def main(argv: Sequence[str]) -> int:
    return BENCH.main(
        argv, parse_args, _run, (ProxyStartError, OriginStartError, PageLoadError, RuntimeError)
    )


@dataclass(frozen=True)
class Lab:
    """What every run of the bench shares: the page, the PKI and the relays, by origin and RTT."""

    page: Page
    pki: OriginPKI
    relays: dict[tuple[str, float], RelayProcess]
    workdir: Path


def _run(args: argparse.Namespace, command: str) -> int:
    facts = runs.machine()
    started = datetime.datetime.now(datetime.UTC)
    notes = BENCH.busy_machine_notes()
    measured: list[Run] = []
    profile_texts: list[str] = []
    chromium_rows: list[chromium.Row] = []
    with BENCH.workdir(args.workdir) as workdir, _lab(args, workdir) as (lab, addresses):
        for round_number in range(1, args.repeat + 1):
            for rtt in args.rtts:
                for case in _rotated(args.cases, round_number):
                    measured.append(_one_run(args, lab, case, rtt, round_number))
        top = max(args.rtts)
        if args.profile:
            for case in args.cases:
                if CONFIGS[case.config].proxy == "reshape":
                    profile_texts.append(_profiled_run(args, lab, case, top, measured))
        if args.chromium:
            chromium_rows = chromium.compare(
                [c for c in args.cases if c.browsers == "alpn"],
                {
                    origin: lab.relays[(origin, top)]
                    for origin in ORIGINS
                    if (origin, top) in lab.relays
                },
                lab.page,
                lab.pki,
                lab.workdir / "chromium",
                loads=args.chromium,
                say=say,
            )
    facts["load average at end"] = runs.load_average()

    rows = report.rows(measured, args.cases, args.rtts)
    tables = [report.table(rows, rtt) for rtt in args.rtts]
    findings = report.findings(rows)
    extra = []
    if chromium_rows:
        extra.append(
            f"Headless Chromium at {top * 1000:g} ms RTT:\n\n{chromium.table(chromium_rows)}"
        )
        findings += chromium.findings(chromium_rows)
    extra += profile_texts
    for table in [*tables, *extra]:
        print(table)
        print()
    for line in findings:
        print(line)
    failed = [run for run in measured if run.errors]
    for run in failed:
        say(f"{run.key} at {run.rtt * 1000:g} ms: errors {run.errors[:3]}")
        notes.append(
            f"FAILED requests in {run.key} at {run.rtt * 1000:g} ms RTT, round "
            f"{run.round}: {len(run.errors)}"
        )
    busy = BENCH.still_accepting(addresses)
    if args.json:
        args.json.write_text(json.dumps([asdict(run) for run in measured], indent=2, default=str))
    if runs.publish(
        args,
        HEADING,
        capacity_report.section(
            heading=HEADING,
            when=started.strftime("%Y-%m-%d %H:%M UTC"),
            command=command,
            setup=_setup_text(args, lab.page),
            tables=[
                *(
                    f"RTT {rtt * 1000:g} ms:\n\n{table}"
                    for rtt, table in zip(args.rtts, tables, strict=True)
                ),
                *extra,
            ],
            findings=findings,
            notes=[*notes, *report.EXPLANATIONS],
            facts={**facts, **_versions()},
        ),
    ):
        say(f"recorded in {args.results}")
    return 1 if failed or busy else 0


@contextlib.contextmanager
def _lab(args: argparse.Namespace, workdir: Path) -> Iterator[tuple[Lab, list[tuple[str, int]]]]:
    """The origins the cases need and a relay in front of each per RTT; their addresses, to check
    that all of them stopped."""
    www = workdir / "www"
    page = build_page(www, resources=args.resources, seed=args.seed)
    pki = OriginPKI(workdir / "pki")
    needed = [ORIGINS[name] for name in ORIGINS if any(c.origin == name for c in args.cases)]
    tls = pki.issue([host for kind in needed for host in (kind.host, kind.relay_host)])
    addresses: list[tuple[str, int]] = []
    with contextlib.ExitStack() as stack:
        relays = {}
        for kind in needed:
            origin = stack.enter_context(
                nginx_origin(
                    www,
                    kind.host,
                    tls=tls,
                    http2=kind.http2,
                    workdir=workdir / f"nginx-{kind.name}",
                    keepalive_requests=ORIGIN_KEEPALIVE_REQUESTS,
                )
            )
            addresses.append((origin.host, origin.port))
            for rtt in args.rtts:
                relay = stack.enter_context(
                    relay_process(
                        kind.relay_host,
                        (origin.host, origin.port),
                        rtt,
                        rtt,
                        workdir / f"relay-{kind.name}-{rtt:g}.log",
                    )
                )
                relays[(kind.name, rtt)] = relay
                addresses.append((relay.host, relay.port))
        yield Lab(page, pki, relays, workdir), addresses


def _rotated(cases: Sequence[Case], round_number: int) -> list[Case]:
    """The cases in an order that starts one later each round, so that no case always runs
    first (after the origin idled) or right after the same neighbour."""
    shift = (round_number - 1) % len(cases)
    return [*cases[shift:], *cases[:shift]]


def _one_run(
    args: argparse.Namespace,
    lab: Lab,
    case: Case,
    rtt: float,
    round_number: int,
    *,
    profile_to: tuple[Path, float] | None = None,
) -> Run:
    """One run of `case`; with `profile_to` (a file, seconds), py-spy samples the proxy for that
    long from the run's start into that file."""
    config = CONFIGS[case.config]
    relay = lab.relays[(case.origin, rtt)]
    home = lab.workdir / f"{case.slug}-{rtt:g}-{round_number}"
    home.mkdir()
    with _proxy(config, home, lab.pki.ca_cert_path) as proxy:
        admin = ("127.0.0.1", proxy.ports[1]) if proxy and config.proxy == "reshape" else None
        before = scrape(admin) if admin else None
        relay_before = relay.counts()  # and the most-open count starts here
        plan = LoadPlan(
            page_url=f"https://{relay.host}:{relay.port}{lab.page.path}",
            sizes=lab.page.sizes,
            browsers=args.browsers,
            per_host=args.per_host,
            pages=args.pages,
            pause=args.pause,
            proxy=("127.0.0.1", proxy.ports[0]) if proxy else None,
            tls=tls_context(
                proxy.https_ca if proxy else lab.pki.ca_cert_path,
                http2=BROWSERS[case.browsers].http2,
            ),
            http2=BROWSERS[case.browsers].http2,
            timeout=args.timeout,
            seed=args.seed + round_number,
        )
        sampling = (
            profiles.recording(proxy.pgid, profile_to[1], profile_to[0])
            if proxy is not None and profile_to is not None
            else contextlib.nullcontext()
        )
        with sampling:
            cpu_before = _proxy_cpu(proxy)
            result = uvloop.run(run_load(plan))
            cpu_after = _proxy_cpu(proxy)
        metrics = scrape(admin) - before if admin and before else None
        time.sleep(SETTLE_SECONDS)  # the relay sees the browsers' closes
        relay_after = relay.counts()
    run = _as_run(
        case, rtt, round_number, args.browsers, result, metrics, relay_before, relay_after
    )
    if cpu_after is not None and cpu_before is not None:
        run.proxy_cpu_s = cpu_after[0] - cpu_before[0]
        run.proxy_wait_s = cpu_after[1] - cpu_before[1]
    say(
        f"round {round_number}, {rtt * 1000:g} ms: {case.key}: {len(result.fetches)} requests "
        f"in {result.seconds:.1f} s, avg transaction "
        f"{1000 * statistics.fmean(run.transactions_s or [0]):.0f} ms, "
        f"origin connections {run.origin_connections}"
        + (f", errors {len(run.errors)}" if run.errors else "")
    )
    return run


def _profiled_run(
    args: argparse.Namespace, lab: Lab, case: Case, rtt: float, measured: Sequence[Run]
) -> str:
    """One more run of `case` with py-spy sampling the proxy for as long as the case's measured
    runs took (py-spy needs a duration up front); the breakdown as RESULTS.md text."""
    raw = lab.workdir / f"profile-{case.slug}-{rtt:g}.txt"
    seconds = statistics.median(r.seconds for r in measured if r.case == case and r.rtt == rtt)
    run = _one_run(args, lab, case, rtt, 0, profile_to=(raw, seconds))
    title = f"Profile of the proxy, {report.case_label(case)}, {rtt * 1000:g} ms RTT"
    cost = (
        f" ({1000 * run.proxy_cpu_s / run.requests:.2f} CPU ms per request over {run.requests} "
        "requests; sampling slows the proxy, so this run is not in the tables)"
        if run.proxy_cpu_s is not None and run.requests
        else ""
    )
    return profiles.markdown(title + cost, profiles.summary(raw)).rstrip()


def _proxy(
    config: Config, home: Path, origin_ca: Path
) -> contextlib.AbstractContextManager[RunningProxy | None]:
    if config.proxy == "mitmdump":
        return peers.mitmdump(home, origin_ca)
    if config.proxy == "reshape":
        assert config.policy is not None
        policy = home / "policy.yaml"
        policy.write_text(config.policy)
        return peers.reshape(home, origin_ca, policy)
    return contextlib.nullcontext()


def _proxy_cpu(proxy: RunningProxy | None) -> tuple[float, float] | None:
    """The proxy's CPU seconds used, and spent waiting for a core, so far."""
    if proxy is None:
        return None
    return (
        peers.group_cpu_seconds(proxy.pgid),
        procs.group_runqueue_seconds(proxy.pgid),
    )


def _as_run(
    case: Case,
    rtt: float,
    round_number: int,
    browsers: int,
    result: LoadResult,
    metrics: Samples | None,
    relay_before: RelayCounts,
    relay_after: RelayCounts,
) -> Run:
    fetches = result.fetches
    pool = {}
    proxy_queue = None
    proxy_transaction = None
    proxy_connections = None
    if metrics is not None:
        pool = {
            kind: int(metrics.sum("reshape_upstream_requests_total", connection=kind))
            for kind in report.KINDS
        }
        waited = metrics.sum("reshape_request_queue_seconds_count")
        proxy_queue = (
            int(metrics.sum("reshape_requests_queued_total")),
            int(waited),
            metrics.sum("reshape_request_queue_seconds_sum"),
        )
        proxy_transaction = (
            int(metrics.sum("reshape_transaction_seconds_count")),
            metrics.sum("reshape_transaction_seconds_sum"),
        )
        proxy_connections = {
            proto: int(metrics.sum("reshape_upstream_connections_opened_total", proto=proto))
            for proto in ("h1", "h2")
        }
    return Run(
        origin=case.origin,
        browser_kind=case.browsers,
        config=case.config,
        rtt=rtt,
        round=round_number,
        browser_count=browsers,
        requests=len(fetches),
        transactions_s=[f.transaction for f in fetches],
        browser_queue_s=[f.queue_wait for f in fetches],
        body_s=[f.done - f.head for f in fetches],
        browser_new=sum(1 for f in fetches if f.new_connection),
        browser_h2=sum(1 for f in fetches if f.protocol == "h2"),
        page_s=result.page_seconds,
        seconds=result.seconds,
        errors=result.errors,
        browser_connections=result.connections_opened,
        origin_connections=relay_after.accepted - relay_before.accepted,
        origin_max_open=relay_after.max_open,
        pool_kinds=pool,
        proxy_queue=proxy_queue,
        proxy_transaction=proxy_transaction,
        proxy_connections=proxy_connections,
    )


def _setup_text(args: argparse.Namespace, page: Page) -> str:
    low, high = args.pause
    rounds = (
        f"{args.repeat} rounds; within each, every case at every RTT, the cases in an order "
        "rotated from round to round"
        if args.repeat > 1
        else "one round"
    )
    rtts = ", ".join(f"{rtt * 1000:g} ms" for rtt in args.rtts)
    cases = "; ".join(report.case_label(c) for c in args.cases)
    return f"""\
- Origins: nginx (1 worker) over TLS with keep-alive for the whole run: HTTP/1.1 only (an
  origin of the study's era) on {ORIGINS["h1"].host}, and h2 + HTTP/1.1 by ALPN on
  {ORIGINS["h2"].host}. Browsers and proxies reach each through a relay
  ({ORIGINS["h1"].relay_host}, {ORIGINS["h2"].relay_host}; labkit/relay.py in a process of its
  own) emulating RTT {rtts} between the proxy (or the direct browser) and the origin: half the RTT
  each way on every chunk, and one RTT before a new connection reaches the origin
  (`Link.rtt(rtt, connect_delay=rtt)`). Browsers talk to the proxy over plain loopback.
- Load: {args.browsers} browsers (bench/capacity/client.py on uvloop, TLS through CONNECT to a
  proxy), each loading a page of {page.requests} files ({page.requests - 1} small stylesheets,
  scripts and images, {page.total_bytes / 1024:.0f} KB) {args.pages} times: the HTML, then all
  subresources at once; {low:g}-{high:g} s between a browser's loads (seeded), starts spread
  over the first pause; a browser keeps its connections from one load to the next. Browsers
  "h2 by ALPN" negotiate as Chromium does: they offer h2 and http/1.1, wait for the first
  connection's answer, then send every request on that one HTTP/2 connection (Chromium's
  windows: 6 MB per stream, 15 MB per connection) or go on with HTTP/1.1 and
  {args.per_host} connections per host. "HTTP/1.1" browsers (the earlier setup) offer
  http/1.1 alone.
- Cases (origin / browsers / configuration): {cases}. {rounds}. Every proxy is one process,
  started afresh for every run (cold connections on both sides). reshape `{{}}` is the pool
  with a browser's limits: 6 connections per host, HTTP/2 where the origin offers it, no
  pipelining; "pool, pipeline_depth 8" sets `pipeline_depth: 8, http2: false` (HTTP/1.1 to
  every origin). mitmdump 12.2.3 without addons connects to the origin when the browser
  connects and offers the browser the origin's ALPN choice.
- Transaction: from the moment the page wants a request to its response head, at the browser
  (so it includes the browser's queue); per run the average over its requests; the table gives
  the median over rounds with the lowest and highest in brackets, and the ratio to direct
  (same origin, same browsers, same round) the same way. Proxy transaction:
  reshape_transaction_seconds (request received -> first response byte, at the proxy). Marks
  scale with the RTT; shares and queues pool the rounds.
- Browser queue: time a request waited for one of its browser's own busy connections (or for
  the first connection's ALPN). Proxy queue: reshape_requests_queued_total over requests the
  pool sent; average wait over all of them (reshape_request_queue_seconds). Connection mix:
  reshape_upstream_requests_total by connection kind; for direct, the browsers' own (new,
  reused, or multiplexed on HTTP/2). Origin connections: what the relay opened to the origin
  (per run, and the most open at once).
- Proxy CPU per request: the proxy's CPU time over the run; CPU wait: the time its threads
  were ready to run but had no core (/proc schedstat), i.e. CPU that other work took from it."""


def _versions() -> dict[str, str]:
    nginx = subprocess.run(
        ["/usr/sbin/nginx", "-v"], capture_output=True, text=True, timeout=30, check=False
    )
    return {
        "nginx": (nginx.stderr or nginx.stdout).strip() or "unknown",
        "mitmproxy": importlib.metadata.version("mitmproxy"),
        "reshape": importlib.metadata.version("reshape"),
        "h2 (browsers)": importlib.metadata.version("h2"),
        "uvloop (browsers, relay)": importlib.metadata.version("uvloop"),
        "Chromium": runs.first_line(["/usr/bin/chromium", "--version"]),
        "py-spy": runs.package_version("py-spy"),
        "Python": platform.python_version(),
    }


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
