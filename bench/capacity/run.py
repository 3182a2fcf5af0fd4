"""bench/capacity: how many users a default-style Apache serves, 2 vs 6 connections per browser.

The experiment of the Apache prefork load test (user capacity fell by 60% when browsers went
from 2 to 6 connections per host), rebuilt on loopback, with reshape's shared pool in front:

- Apache (Debian's apache2, prefork, a small `MaxRequestWorkers`, keep-alive on with a 5 s
  timeout) serves a generated page of ~140 small resources on 127.0.0.2, over plain HTTP.
- Simulated users (bench/capacity/users.py) load the page, think 1-3 s, and load it again, each
  over K keep-alive connections. A step runs N users for a fixed time; it meets the goal when
  90% of its page loads are correct and take at most 2 s.
- Capacity is the largest N that meets the goal, found per configuration by a bounded search
  (bench/capacity/search.py); the configurations' steps are interleaved round by round, then
  the capacity C and C+1 are run once more.

Configurations: direct with 2 and with 6 connections per user; through reshape with 6 per user
and `max_connections_per_host: 2` (HTTP/2 off, and on); through plain reshape (`{}`) with 6.
Each has its own Apache (and reshape), started once and stopped at the end.

Run it as `python -m bench.capacity` (see its `--help`).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import uvloop

from bench import runs
from bench.capacity import procs, report
from bench.capacity.apache import ApacheError, ApacheSettings, RunningApache, apache
from bench.capacity.apache import ensure_installed as ensure_apache
from bench.capacity.metrics import Samples, scrape
from bench.capacity.report import RERUN, SEARCH, ConfigResult, StepSummary
from bench.capacity.search import CapacitySearch
from bench.capacity.site import Page, build_page
from bench.capacity.users import StepPlan, StepResult, run_step
from bench.overhead import peers
from bench.overhead.peers import ProxyStartError, RunningProxy
from labkit.pki import OriginPKI

BENCH = runs.Bench("capacity")
say = BENCH.say
ORIGIN_HOST = "127.0.0.2"
# Pause between steps: connections of the last step are closed and Apache's workers free.
SETTLE_SECONDS = 1.0
# A step that misses its goal while the proxy or the users spent this much of each second
# waiting for a core (other work on the machine had it) is run again, at most MAX_REPEATS times:
# its verdict would be about the machine's other work, not about Apache or reshape.
CONTENDED = 0.2
MAX_REPEATS = 2


@dataclass(frozen=True)
class Config:
    name: str
    label: str
    per_host: int  # browser connections per host
    policy: str | None  # reshape's policy for the one origin; None = no proxy
    origin_limit: str  # what caps the connections to Apache, for the table


def _pool_policy(http2: bool) -> str:
    knobs = f"max_connections_per_host: 2, pipeline_depth: 0, http2: {str(http2).lower()}"
    return f"version: 1\ndefault: capped\npolicies:\n  capped:\n    upstream: {{{knobs}}}\n"


PLAIN_POLICY = "version: 1\ndefault: plain\npolicies:\n  plain: {}\n"
CONFIGS = {
    c.name: c
    for c in (
        Config("direct-2", "direct, 2/user", 2, None, "2 per user"),
        Config("direct-6", "direct, 6/user", 6, None, "6 per user"),
        Config("reshape-pool", "reshape pool", 6, _pool_policy(False), "2 (pool)"),
        Config("reshape-pool-h2", "reshape pool, http2: true", 6, _pool_policy(True), "2 (pool)"),
        Config("reshape-plain", "reshape {}", 6, PLAIN_POLICY, "6 per user"),
    )
}
BASELINE = "direct-2"


@dataclass
class Lane:
    """One configuration while the run goes on: its servers and its search."""

    config: Config
    apache: RunningApache
    proxy: RunningProxy | None
    search: CapacitySearch
    steps: list[StepSummary]

    @property
    def admin(self) -> tuple[str, int] | None:
        return ("127.0.0.1", self.proxy.ports[1]) if self.proxy else None


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.capacity",
        description="User capacity of a prefork Apache with 2 and 6 connections per browser, "
        "direct and through reshape's pool.",
    )
    parser.add_argument("--configs", help=f"comma-separated, from {','.join(CONFIGS)} (all)")
    parser.add_argument("--max-workers", type=int, default=8, help="Apache MaxRequestWorkers")
    parser.add_argument("--keepalive-timeout", type=float, default=5.0, help="Apache, seconds")
    parser.add_argument("--resources", type=int, default=140, help="subresources on the page")
    parser.add_argument("--start", type=int, help="users in the first step (2; --quick: 1)")
    parser.add_argument("--limit", type=int, default=32, help="most users a step may have")
    parser.add_argument("--max-steps", type=int, help="search steps per configuration (9)")
    parser.add_argument("--duration", type=float, help="measured seconds per step (15)")
    parser.add_argument("--warmup", type=float, help="unmeasured seconds first (3)")
    parser.add_argument("--think", help="think time range, seconds (2,4; --quick: 1,2)")
    parser.add_argument("--goal", type=float, default=2.0, help="good page load, seconds (2)")
    parser.add_argument("--goal-share", type=float, default=0.9, help="share of good pages")
    parser.add_argument("--page-timeout", type=float, help="abandon a page load after (10)")
    parser.add_argument("--no-rerun", action="store_true", help="skip re-running C and C+1")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="smoke test: one short step each")
    runs.add_output_arguments(parser, figures="step")
    args = parser.parse_args(argv)

    args.configs = runs.chosen_configs(parser, args.configs, CONFIGS)
    quick = args.quick
    args.start = args.start or (1 if quick else 2)
    args.max_steps = args.max_steps or (1 if quick else 9)
    args.duration = args.duration or (3.0 if quick else 15.0)
    args.warmup = args.warmup if args.warmup is not None else (1.0 if quick else 3.0)
    args.page_timeout = args.page_timeout or (5.0 if quick else 10.0)
    args.rerun = not (args.no_rerun or quick)
    try:
        low, high = (float(v) for v in (args.think or ("1,2" if quick else "2,4")).split(","))
    except ValueError:
        parser.error("--think: two numbers, e.g. 1,3")
    args.think = (low, high)
    if not 0 <= low <= high or args.max_workers < 1 or args.limit < args.start or args.start < 1:
        parser.error("need 0 <= think low <= high, --max-workers >= 1, 1 <= --start <= --limit")
    if args.duration <= 0 or args.page_timeout <= 0 or not 0 < args.goal_share <= 1:
        parser.error("--duration and --page-timeout must be positive, --goal-share in (0, 1]")
    return args


def main(argv: Sequence[str]) -> int:
    return BENCH.main(argv, parse_args, _run, (ProxyStartError, ApacheError))


def _run(args: argparse.Namespace, command: str) -> int:
    apache_version = ensure_apache(say)
    facts = runs.machine()
    started = datetime.datetime.now(datetime.UTC)
    notes = BENCH.busy_machine_notes()
    # Apache's children run as www-data and must reach the files and their logs.
    with BENCH.workdir(args.workdir, mode=0o711) as workdir:
        www = workdir / "www"
        page = build_page(www, resources=args.resources, seed=args.seed)
        pki = OriginPKI(workdir / "pki")  # reshape wants an --upstream-ca; Apache is plain HTTP
        settings = ApacheSettings(args.max_workers, args.keepalive_timeout)
        with contextlib.ExitStack() as stack:
            lanes = [
                _start_lane(stack, config, args, workdir, www, pki.ca_cert_path, settings)
                for config in args.configs
            ]
            _search(lanes, args, page)
            if args.rerun:
                _rerun(lanes, args, page)
        addresses = [(lane.apache.host, lane.apache.port) for lane in lanes]
        addresses += [("127.0.0.1", p) for lane in lanes if lane.proxy for p in lane.proxy.ports]
    facts["load average at end"] = runs.load_average()

    results = [
        ConfigResult(
            lane.config.name,
            lane.config.label,
            lane.config.per_host,
            lane.config.origin_limit,
            lane.search,
            tuple(lane.steps),
        )
        for lane in lanes
    ]
    tables = [
        report.capacity_table(results, BASELINE),
        "Every step:\n\n" + report.steps_table(results),
    ]
    findings = _findings(results)
    print(tables[0])
    print()
    print(tables[1])
    for line in findings:
        print(line)
    failed = [r for r in results if r.errors]
    for result in failed:
        samples = sorted({e for s in result.steps for e in s.error_samples})[:3]
        say(f"{result.label}: {result.errors} pages with errors, e.g. {samples}")
        notes.append(f"FAILED page loads (errors, not timeouts) in {result.label}: {result.errors}")
    busy = BENCH.still_accepting(addresses)
    if args.json:
        args.json.write_text(json.dumps([_as_json(r) for r in results], indent=2))
    if runs.publish(
        args,
        report.HEADING,
        report.section(
            heading=report.HEADING,
            when=started.strftime("%Y-%m-%d %H:%M UTC"),
            command=command,
            setup=_setup_text(args, page),
            tables=tables,
            findings=findings,
            notes=[*notes, *_explanations(args)],
            facts={**facts, **_versions(apache_version)},
        ),
    ):
        say(f"recorded in {args.results}")
    return 1 if failed or busy else 0


def _start_lane(
    stack: contextlib.ExitStack,
    config: Config,
    args: argparse.Namespace,
    workdir: Path,
    www: Path,
    origin_ca: Path,
    settings: ApacheSettings,
) -> Lane:
    home = workdir / config.name
    home.mkdir()
    say(f"starting Apache for {config.name}")
    server = stack.enter_context(apache(www, ORIGIN_HOST, home / "apache", settings))
    proxy = None
    if config.policy is not None:
        policy = home / "policy.yaml"
        policy.write_text(config.policy)
        (home / "reshape").mkdir()
        say(f"starting reshape for {config.name}")
        proxy = stack.enter_context(peers.reshape(home / "reshape", origin_ca, policy))
    search = CapacitySearch(args.start, args.limit, args.max_steps)
    return Lane(config, server, proxy, search, [])


def _search(lanes: list[Lane], args: argparse.Namespace, page: Page) -> None:
    """Round by round, each configuration's next step, until every search is over."""
    round_number = 0
    while True:
        due = [(lane, users) for lane in lanes if (users := lane.search.next_users()) is not None]
        if not due:
            return
        round_number += 1
        for lane, users in due:
            step = _verdict(lane, users, SEARCH, args, page, round_number)
            lane.search.record(users, step.passed)


def _rerun(lanes: list[Lane], args: argparse.Namespace, page: Page) -> None:
    """Once more at each capacity C and at C+1, interleaved: how firm the boundary is."""
    for offset in (0, 1):
        for lane in lanes:
            capacity = lane.search.capacity
            if capacity == 0 or capacity + offset > args.limit:
                continue
            _verdict(lane, capacity + offset, RERUN, args, page, None)


def _verdict(
    lane: Lane,
    users: int,
    phase: str,
    args: argparse.Namespace,
    page: Page,
    round_number: int | None,
) -> StepSummary:
    """A step, run again (boundedly) while it misses its goal under contention."""
    step = _step(lane, users, phase, args, page, round_number)
    for _ in range(MAX_REPEATS):
        if not step.contended:
            break
        say("  missed while waiting for CPU other work had: running it again")
        step = _step(lane, users, phase, args, page, round_number)
    return step


def _step(
    lane: Lane,
    users: int,
    phase: str,
    args: argparse.Namespace,
    page: Page,
    round_number: int | None,
) -> StepSummary:
    config = lane.config
    proxy = ("127.0.0.1", lane.proxy.ports[0]) if lane.proxy else None
    plan = StepPlan(
        users=users,
        per_host=config.per_host,
        page_url=lane.apache.url(page.path),
        sizes=page.sizes,
        proxy=proxy,
        warmup=args.warmup,
        duration=args.duration,
        think=args.think,
        page_timeout=args.page_timeout,
        goal=args.goal,
        seed=args.seed,
    )
    before = scrape(lane.admin) if lane.admin else None
    result = uvloop.run(run_step(plan, _probe(lane)))
    metrics = scrape(lane.admin) - before if lane.admin and before else None
    summary = _summary(config, phase, args, result, metrics)
    where = f"round {round_number}" if round_number else phase
    say(
        f"{where}: {config.name} {users} users: {summary.pages} pages, "
        f"{100 * summary.good_share:.0f}% good, p90 {summary.p90_s:.2f} s, "
        f"{summary.requests_per_s:.0f} req/s"
        + (f", proxy {summary.proxy_cores:.2f} cores" if summary.proxy_cores is not None else "")
        + f" -> {'met' if summary.passed else 'missed'}"
        + (f"; errors {summary.errors}: {list(summary.error_samples)}" if summary.errors else "")
    )
    time.sleep(SETTLE_SECONDS)
    lane.steps.append(summary)
    return summary


def _probe(lane: Lane) -> Callable[[], dict[str, float]]:
    def probe() -> dict[str, float]:
        values = {"apache": peers.group_cpu_seconds(lane.apache.pgid)}
        if lane.proxy is not None:
            values["proxy"] = peers.group_cpu_seconds(lane.proxy.pgid)
            values["proxy_wait"] = procs.group_runqueue_seconds(lane.proxy.pgid)
        return values

    return probe


def _summary(
    config: Config,
    phase: str,
    args: argparse.Namespace,
    result: StepResult,
    metrics: Samples | None,
) -> StepSummary:
    window = result.window_seconds
    queued_share = h2 = None
    if metrics is not None:
        origin_connections = int(metrics.sum("reshape_upstream_connections_opened_total"))
        h2 = int(metrics.sum("reshape_upstream_connections_opened_total", proto="h2"))
        sent = metrics.sum("reshape_upstream_requests_total")
        if sent:
            queued_share = metrics.sum("reshape_requests_queued_total") / sent
    else:
        origin_connections = result.connections_opened
    proxy_cpu = result.probes.get("proxy")
    proxy_wait = result.probes.get("proxy_wait")
    proxy_waiting = None if proxy_wait is None else proxy_wait / window
    client_waiting = result.probes.get("client_wait", 0.0) / window
    passed = result.good_share >= args.goal_share
    return StepSummary(
        config=config.name,
        users=result.plan.users,
        phase=phase,
        passed=passed,
        pages=len(result.pages),
        good_share=result.good_share,
        p50_s=result.percentile(0.5),
        p90_s=result.percentile(0.9),
        requests_per_s=result.requests / window,
        origin_connections=origin_connections,
        timeouts=result.timeouts,
        errors=result.errors,
        error_samples=tuple(result.error_samples()),
        proxy_cores=None if proxy_cpu is None else proxy_cpu / window,
        proxy_waiting=proxy_waiting,
        apache_cores=result.probes.get("apache", 0.0) / window,
        client_cores=result.probes.get("client", 0.0) / window,
        client_waiting=client_waiting,
        contended=not passed and max(client_waiting, proxy_waiting or 0.0) >= CONTENDED,
        queued_share=queued_share,
        h2_connections=h2,
        load_average=os.getloadavg()[0],
    )


def _findings(results: Sequence[ConfigResult]) -> list[str]:
    by_name = {r.config: r for r in results}
    lines = []
    two, six = by_name.get("direct-2"), by_name.get("direct-6")
    if two and six and two.search.capacity:
        drop = 1 - six.search.capacity / two.search.capacity
        measured = two.search.exact and six.search.exact
        lines.append(
            f"direct: with 6 connections per user Apache serves {_users(six.search)}, with 2 "
            f"{_users(two.search)}: "
            + (f"{100 * drop:.0f}% fewer" if measured else "not decided (search cut short)")
            + " (the Apache study: 230 -> 90 users, -60%)"
        )
    for name in ("reshape-pool", "reshape-pool-h2"):
        pool = by_name.get(name)
        if pool and two:
            if not (pool.search.exact and two.search.exact):
                verdict = "not decided (search cut short)"
            else:
                verdict = "yes" if pool.search.capacity >= two.search.capacity else "NO"
            versus_six = f", direct 6/user {six.search.label()}" if six else ""
            lines.append(
                f"{pool.label} (6 per user, 2 to Apache): {_users(pool.search)} vs direct "
                f"2/user {two.search.label()}{versus_six}: restores the 2-connection capacity: "
                + verdict
            )
        if pool:
            per_request = [
                1000 * step.proxy_cores / step.requests_per_s
                for step in pool.steps
                if step.proxy_cores is not None and step.requests_per_s > 0
            ]
            if per_request:
                cost = statistics.median(per_request)
                lines.append(
                    f"{pool.label}: {cost:.1f} ms of proxy CPU per request (median over its "
                    f"steps), so one core carries at most ~{1000 / cost:.0f} requests/s"
                )
        if pool and name == "reshape-pool-h2":
            h2 = sum(s.h2_connections or 0 for s in pool.steps)
            lines.append(
                f"{pool.label}: {h2} HTTP/2 connections opened; Apache over plain http speaks "
                "HTTP/1.1 only, so this row is a second run of the pool with HTTP/1.1"
            )
    plain = by_name.get("reshape-plain")
    if plain and six:
        lines.append(
            f"reshape {{}} (6 per user, mitmproxy's own upstream connections): "
            f"{_users(plain.search)} vs direct 6/user {six.search.label()}"
        )
    return lines


def _users(search: CapacitySearch) -> str:
    return f"{search.label()} user" + ("" if search.label() == "1" else "s")


def _setup_text(args: argparse.Namespace, page: Page) -> str:
    low, high = args.think
    rerun = "; then each configuration once more at C and at C+1" if args.rerun else ""
    users = "user" if args.start == 1 else "users"
    return f"""\
- Origin: Debian's apache2 over plain HTTP, one private instance per configuration on
  {ORIGIN_HOST}: prefork MPM, `MaxRequestWorkers {args.max_workers}` (all started up front),
  `KeepAlive On`, `KeepAliveTimeout {args.keepalive_timeout:g}`, `MaxKeepAliveRequests 100`,
  `ListenBacklog 511`. The study had 256 workers; see the notes for this machine's scale.
- Page: {page.requests} files, the HTML and {page.requests - 1} stylesheets, scripts and PNGs
  of 0.3-30 KB, {page.total_bytes / 1024:.0f} KB in all (generated, seed {args.seed}).
- Users: asyncio HTTP/1.1 browsers (bench/capacity/client.py, on uvloop), each with K keep-alive
  connections to the host. A user loads the page (the HTML, then all its subresources at once
  over its K connections), thinks {low:g}-{high:g} s (uniform, seeded) and loads it again.
  Think times are compressed (people read a page for longer) so that a few users make a load,
  but stay below the keep-alive timeout, so a user's connections stay open between its pages.
  Starts are spread over the first think time; {args.warmup:g} s of warm-up, then
  {args.duration:g} s measured per step; a page load is abandoned after {args.page_timeout:g} s.
- Goal of a step: at least {100 * args.goal_share:.0f}% of the page loads started in the
  measured window are correct (every response a 200 of the right size) and take at most
  {args.goal:g} s.
- Capacity C: the largest user count meeting the goal. Search per configuration: from
  {args.start} {users}, doubling until a step misses, then bisecting; at most {args.max_steps}
  steps and {args.limit} users. Configurations take turns, one step each per round{rerun}.
  A step that misses its goal while the proxy or the users spent {CONTENDED:g} s or more of
  each second waiting for a core (other work on the machine had it; /proc schedstat) is run
  again, at most {MAX_REPEATS} times, and the last run decides.
- reshape: `reshape run` with the configuration's policy, one process, started once; the pool
  rows use `upstream: {{max_connections_per_host: 2, pipeline_depth: 0, http2: false|true}}`.
- Users, reshape and Apache share the machine's 2 cores. Queued %: requests that waited for one
  of the pool's connections (reshape_requests_queued_total over reshape_upstream_requests_total).
  New conns to Apache: opened during the step by the browsers (direct) or by reshape (its
  metrics). Cores: CPU time over the measured window, per process group. Proxy CPU wait: the
  time its threads were ready to run but had no core, per second (/proc schedstat): CPU that
  other work on the machine took from it; client CPU wait, the same for the users' process."""


def _explanations(args: argparse.Namespace) -> list[str]:
    workers = args.max_workers
    return [
        "Why 6 connections cost capacity: prefork gives each connection a whole process for as "
        "long as it is open, idle keep-alive time included, and the keep-alive timeout "
        f"({args.keepalive_timeout:g} s) is longer than the think time, so a user's connections "
        f"stay open between pages: {workers} workers hold {workers // 2} users at 2 connections "
        f"but {workers // 6} at 6. The next user's connections are accepted by the kernel and "
        "wait in the listen backlog until a worker's connection ends; the request sent on such "
        "a connection, and its page, stall for seconds. Capacities can exceed workers / K "
        "because `MaxKeepAliveRequests 100` ends every connection after 100 requests, which "
        "frees a worker for the backlog: with 2 connections and pages of ~20 ms that churn "
        "carries a few more users; with 6 it does not. CPU is not what runs out (Apache cores).",
        "Why the pool helps: reshape opens at most 2 connections to Apache for all its users "
        "together and queues the other requests itself, so Apache's workers are never the limit "
        "whatever the browsers open.",
        "The proxy's own limit: reshape is one Python process spending a few ms of CPU per "
        "request (mitmproxy's HTTP handling, the hop to its pool, the pool), so it tops out "
        "near one core: a few hundred requests/s, a handful of users of this page at this think "
        "time. Through reshape, capacity ends where that CPU runs out, not where Apache's "
        "workers do: direct capacity grows with MaxRequestWorkers, reshape's does not. "
        f"MaxRequestWorkers {workers} puts Apache's 2-connection capacity within what one "
        "reshape process carries on this machine; with many more workers (the study had 256) "
        "the reshape rows would measure the proxy's CPU, not Apache. Other work on the machine "
        "takes CPU from reshape first, being the only CPU-bound process in these steps (see the "
        "load average per step); a proxy deployed on cores of its own would not share them "
        "with the origin and the users.",
        "HTTP/2: Apache 2.4's mod_http2 does not serve h2 under the prefork MPM (checked by hand "
        "on this machine: with TLS and `Protocols h2 http/1.1`, an ALPN offer of h2 is answered "
        "http/1.1), and reshape negotiates h2 only by ALPN, so over plain http the http2: true "
        "row runs HTTP/1.1 too: a second measurement of the same pool.",
    ]


def _versions(apache_version: str) -> dict[str, str]:
    return {
        "apache2": apache_version,
        "mitmproxy": importlib.metadata.version("mitmproxy"),
        "reshape": importlib.metadata.version("reshape"),
        "uvloop (users)": importlib.metadata.version("uvloop"),
        "Python": platform.python_version(),
    }


def _as_json(result: ConfigResult) -> dict[str, object]:
    return {
        "config": result.config,
        "label": result.label,
        "per_host": result.per_host,
        "capacity": result.search.capacity,
        "capacity_label": result.search.label(),
        "steps": [asdict(step) for step in result.steps],
    }


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
