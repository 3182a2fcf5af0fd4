"""bench/queueing: where requests wait, and for how long, with and without pipelining and HTTP/2.

The table of Firefox's pipelining study (at ~250 ms RTT: transactions 1,906 -> 702 ms on average,
queued requests 79% -> 0), rebuilt around reshape's shared pool:

- One nginx origin (1 worker) on 127.0.0.2 over TLS, offering h2 and http/1.1 by ALPN, with
  keep-alive that outlasts the run. In front of it, a user-space relay (labkit/relay.py,
  in a process of its own) emulates the path from the proxy to the origin: ~0 RTT, and 200 ms
  RTT with each new connection costing one RTT more.
- A few browsers (bench/queueing/load.py, 6 connections per host each) load a page of many
  small resources several times, each load a burst.
- Configurations: direct (the browsers through the relay, no proxy), plain reshape (`{}`,
  mitmproxy's own upstream connections), and reshape's pool with 6 connections per host:
  without pipelining, with `pipeline_depth: 8`, and with HTTP/2.

Per configuration and RTT: the share of requests that waited for a connection and how long, in
the browsers and in reshape's pool (from its /metrics, before and after each run); the kind of
connection each request went out on; connections the origin saw; average transaction latency
(request wanted -> response head) and the share of responses within three marks scaled to the
RTT. reshape is started afresh for every run, so every run starts with cold connections.

Run it as `python -m bench.queueing` (see its `--help`).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import json
import platform
import ssl
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path

import uvloop

from bench import runs
from bench.capacity import procs
from bench.capacity import report as capacity_report
from bench.capacity.metrics import Samples, scrape
from bench.capacity.site import Page, build_page
from bench.overhead import peers
from bench.overhead.peers import ProxyStartError, RunningProxy
from bench.queueing import report
from bench.queueing.load import LoadPlan, LoadResult, run_load
from bench.queueing.relay import RelayCounts, RelayProcess, relay_process
from bench.queueing.report import HEADING, Run
from labkit.origins import OriginStartError, nginx_origin
from labkit.pki import OriginPKI

BENCH = runs.Bench("queueing")
say = BENCH.say
ORIGIN_HOST = "127.0.0.2"
RELAY_HOST = "127.0.0.4"
SETTLE_SECONDS = 0.5
# nginx never ends a keep-alive connection during a run (its default would, after 1,000
# requests), so every connection the origin sees was the client's choice.
ORIGIN_KEEPALIVE_REQUESTS = 1_000_000_000


@dataclass(frozen=True)
class Config:
    name: str
    label: str
    policy: str | None  # None: the browsers go to the origin themselves


def _pool(knobs: str) -> str:
    return f"version: 1\ndefault: pool\npolicies:\n  pool:\n    upstream: {{{knobs}}}\n"


CONFIGS = {
    c.name: c
    for c in (
        Config("direct", "direct (no proxy)", None),
        Config(
            "reshape-plain", "reshape {}", "version: 1\ndefault: plain\npolicies:\n  plain: {}\n"
        ),
        Config(
            "pool",
            "pool, no pipelining",
            _pool("max_connections_per_host: 6, pipeline_depth: 0, http2: false"),
        ),
        Config(
            "pool-pipelined",
            "pool, pipeline_depth 8",
            _pool("max_connections_per_host: 6, pipeline_depth: 8, http2: false"),
        ),
        Config(
            "pool-h2",
            "pool, HTTP/2",
            _pool("max_connections_per_host: 6, pipeline_depth: 0, http2: true"),
        ),
    )
}


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.queueing",
        description="Queueing, connection reuse and transaction latency through reshape's pool, "
        "with and without pipelining and HTTP/2, at ~0 and 200 ms RTT.",
    )
    parser.add_argument("--configs", help=f"comma-separated, from {','.join(CONFIGS)} (all)")
    parser.add_argument("--rtts", default="0,0.2", help="emulated RTTs in seconds (0,0.2)")
    parser.add_argument("--browsers", type=int, help="browsers at once (4)")
    parser.add_argument("--per-host", type=int, default=6, help="browser connections per host")
    parser.add_argument("--pages", type=int, help="page loads per browser (3)")
    parser.add_argument("--resources", type=int, help="subresources on the page (40)")
    parser.add_argument("--pause", default="0.5,1.5", help="seconds between a browser's loads")
    parser.add_argument("--repeat", type=int, help="interleaved rounds, pooled (2)")
    parser.add_argument("--timeout", type=float, default=120.0, help="bound on one run, seconds")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="smoke test: one small round")
    runs.add_output_arguments(parser, figures="run")
    args = parser.parse_args(argv)

    args.configs = runs.chosen_configs(parser, args.configs, CONFIGS)
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
    args.repeat = args.repeat or (1 if quick else 2)
    if quick:
        args.pause = (0.0, 0.2)
    if min(args.rtts) < 0 or not 0 <= low <= high or args.timeout <= 0:
        parser.error("RTTs and pauses must not be negative; --timeout must be positive")
    if min(args.browsers, args.per_host, args.pages, args.repeat) < 1:
        parser.error("--browsers, --per-host, --pages and --repeat must be at least 1")
    return args


def main(argv: Sequence[str]) -> int:
    return BENCH.main(argv, parse_args, _run, (ProxyStartError, OriginStartError, RuntimeError))


def _run(args: argparse.Namespace, command: str) -> int:
    facts = runs.machine()
    started = datetime.datetime.now(datetime.UTC)
    notes = BENCH.busy_machine_notes()
    measured: list[Run] = []
    with BENCH.workdir(args.workdir) as workdir:
        www = workdir / "www"
        page = build_page(www, resources=args.resources, seed=args.seed)
        pki = OriginPKI(workdir / "pki")
        tls = pki.issue([ORIGIN_HOST, RELAY_HOST])
        with contextlib.ExitStack() as stack:
            origin = stack.enter_context(
                nginx_origin(
                    www,
                    ORIGIN_HOST,
                    tls=tls,
                    http2=True,
                    workdir=workdir / "nginx",
                    keepalive_requests=ORIGIN_KEEPALIVE_REQUESTS,
                )
            )
            relays = {
                rtt: stack.enter_context(
                    relay_process(
                        RELAY_HOST,
                        (origin.host, origin.port),
                        rtt,
                        rtt,
                        workdir / f"relay-{rtt:g}.log",
                    )
                )
                for rtt in args.rtts
            }
            for round_number in range(1, args.repeat + 1):
                for rtt in args.rtts:
                    for config in args.configs:
                        measured.append(
                            _one_run(
                                args, config, rtt, round_number, relays[rtt], page, pki, workdir
                            )
                        )
            addresses = [(origin.host, origin.port)] + [(r.host, r.port) for r in relays.values()]
    facts["load average at end"] = runs.load_average()

    rows = report.rows(measured, [c.name for c in args.configs], args.rtts)
    tables = [report.table(rows, rtt) for rtt in args.rtts]
    findings = report.findings(rows)
    for table in tables:
        print(table)
        print()
    for line in findings:
        print(line)
    failed = [run for run in measured if run.errors]
    for run in failed:
        say(f"{run.config} at {run.rtt * 1000:g} ms: errors {run.errors[:3]}")
        notes.append(
            f"FAILED requests in {run.config} at {run.rtt * 1000:g} ms RTT, round "
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
            setup=_setup_text(args, page),
            tables=[
                f"RTT {rtt * 1000:g} ms:\n\n{table}"
                for rtt, table in zip(args.rtts, tables, strict=True)
            ],
            findings=findings,
            notes=[*notes, *report.EXPLANATIONS],
            facts={**facts, **_versions()},
        ),
    ):
        say(f"recorded in {args.results}")
    return 1 if failed or busy else 0


def _one_run(
    args: argparse.Namespace,
    config: Config,
    rtt: float,
    round_number: int,
    relay: RelayProcess,
    page: Page,
    pki: OriginPKI,
    workdir: Path,
) -> Run:
    home = workdir / f"{config.name}-{rtt:g}-{round_number}"
    home.mkdir()
    with _proxy(config, home, pki.ca_cert_path) as proxy:
        admin = ("127.0.0.1", proxy.ports[1]) if proxy else None
        before = scrape(admin) if admin else None
        relay_before = relay.counts()  # and the most-open count starts here
        plan = LoadPlan(
            page_url=f"https://{relay.host}:{relay.port}{page.path}",
            sizes=page.sizes,
            browsers=args.browsers,
            per_host=args.per_host,
            pages=args.pages,
            pause=args.pause,
            proxy=("127.0.0.1", proxy.ports[0]) if proxy else None,
            tls=_client_tls(proxy.https_ca if proxy else pki.ca_cert_path),
            timeout=args.timeout,
            seed=args.seed + round_number,
        )
        cpu_before = _proxy_cpu(proxy)
        result = uvloop.run(run_load(plan))
        cpu_after = _proxy_cpu(proxy)
        metrics = scrape(admin) - before if admin and before else None
        time.sleep(SETTLE_SECONDS)  # the relay sees the browsers' closes
        relay_after = relay.counts()
    run = _as_run(config, rtt, round_number, result, metrics, relay_before, relay_after)
    if cpu_after is not None and cpu_before is not None:
        run.proxy_cpu_s = cpu_after[0] - cpu_before[0]
        run.proxy_wait_s = cpu_after[1] - cpu_before[1]
    say(
        f"round {round_number}, {rtt * 1000:g} ms: {config.name}: {len(result.fetches)} requests "
        f"in {result.seconds:.1f} s, avg transaction "
        f"{1000 * statistics.fmean(run.transactions_s or [0]):.0f} ms, "
        f"origin connections {run.origin_connections}"
        + (f", errors {len(run.errors)}" if run.errors else "")
    )
    return run


def _proxy(
    config: Config, home: Path, origin_ca: Path
) -> AbstractContextManager[RunningProxy | None]:
    if config.policy is None:
        return contextlib.nullcontext()
    policy = home / "policy.yaml"
    policy.write_text(config.policy)
    return peers.reshape(home, origin_ca, policy)


def _proxy_cpu(proxy: RunningProxy | None) -> tuple[float, float] | None:
    """The proxy's CPU seconds used, and spent waiting for a core, so far."""
    if proxy is None:
        return None
    return (
        peers.group_cpu_seconds(proxy.pgid),
        procs.group_runqueue_seconds(proxy.pgid),
    )


def _client_tls(ca: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    context.set_alpn_protocols(["http/1.1"])
    return context


def _as_run(
    config: Config,
    rtt: float,
    round_number: int,
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
            for kind in ("new", "reused", "pipelined", "multiplexed")
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
        config=config.name,
        rtt=rtt,
        round=round_number,
        requests=len(fetches),
        transactions_s=[f.transaction for f in fetches],
        browser_queue_s=[f.queue_wait for f in fetches],
        body_s=[f.done - f.head for f in fetches],
        browser_new=sum(1 for f in fetches if f.new_connection),
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
        f"{args.repeat} rounds, configurations interleaved within each; figures pool the rounds"
        if args.repeat > 1
        else "one round"
    )
    rtts = ", ".join(f"{rtt * 1000:g} ms" for rtt in args.rtts)
    return f"""\
- Origin: nginx (1 worker) on {ORIGIN_HOST}, TLS, ALPN h2 and http/1.1, keep-alive for the whole
  run. Browsers and proxies reach it through a relay on {RELAY_HOST} (labkit/relay.py in a
  process of its own) emulating RTT {rtts} between the proxy (or the direct browser) and the
  origin: half the RTT each way on every byte, and one RTT before a new connection reaches the
  origin (`Link.rtt(rtt, connect_delay=rtt)`). Browsers talk to the proxy over plain loopback.
- Load: {args.browsers} browsers (bench/capacity/client.py, HTTP/1.1, {args.per_host}
  connections per host, TLS through CONNECT to the proxy), each loading a page of {page.requests}
  files ({page.requests - 1} small stylesheets, scripts and images, {page.total_bytes / 1024:.0f}
  KB) {args.pages} times: the HTML, then all subresources at once; {low:g}-{high:g} s between a
  browser's loads (seeded), starts spread over the first pause. {rounds}.
- Configurations: direct (no proxy); reshape `{{}}` (mitmproxy's own upstream connections, one
  per browser connection); reshape's pool with `max_connections_per_host: 6` and
  `pipeline_depth: 0`, `pipeline_depth: 8` (both `http2: false`), or `http2: true`. reshape is
  one process, started afresh for every run (cold connections).
- Browser queue: time a request waited for one of its browser's own busy connections. Proxy
  queue: reshape_requests_queued_total over requests the pool sent; average wait over all of
  them (reshape_request_queue_seconds). Connection mix: reshape_upstream_requests_total by
  connection kind; for direct, the browsers' new/reused; for reshape {{}}, new = upstream
  connections opened (reshape_upstream_connections_opened_total), reused = the rest. Origin
  connections: what the relay opened to nginx (in all / most at once).
- Transaction: from the moment the page wants a request to its response head, at the browser
  (so it includes the browser's queue). Proxy transaction: reshape_transaction_seconds (request
  received -> first response byte, at the proxy). Marks scale with the RTT.
- Proxy CPU per request: reshape's CPU time over the run; CPU wait: the time its threads were
  ready to run but had no core (/proc schedstat), i.e. CPU that other work took from it."""


def _versions() -> dict[str, str]:
    nginx = subprocess.run(
        ["/usr/sbin/nginx", "-v"], capture_output=True, text=True, timeout=30, check=False
    )
    return {
        "nginx": (nginx.stderr or nginx.stdout).strip() or "unknown",
        "mitmproxy": importlib.metadata.version("mitmproxy"),
        "reshape": importlib.metadata.version("reshape"),
        "uvloop (browsers, relay)": importlib.metadata.version("uvloop"),
        "Python": platform.python_version(),
    }


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
