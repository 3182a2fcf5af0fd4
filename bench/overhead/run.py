"""bench/overhead: requests/s and added latency of reshape as a forward proxy, beside its peers.

One nginx origin on 127.0.0.2 serves a 1 KB file over http and https. Each configuration —
`direct` (no proxy), `squid`, plain `mitmdump`, `reshape` and `reshape --workers 2` — is started in
turn, loaded by bench/loadgen (closed loop, keep-alive HTTP/1.1) over both schemes, and stopped.
With `--schemes ...,h2` a third origin speaks HTTP/2 and the load does too (--streams requests in
flight per connection, as a browser multiplexes one origin's requests).
With --repeat the configurations are interleaved round by round and medians are reported.
The table goes to stdout and, unless --no-record, into bench/RESULTS.md.

Run it as `python -m bench.overhead` (see its `--help`).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import random
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import profiles, runs
from bench.loadgen import runner
from bench.loadgen.runner import LoadgenError, LoadResult
from bench.overhead import peers, report
from bench.overhead.peers import ProxyStartError, RunningProxy, SquidBinary
from bench.overhead.report import Measurement
from labkit.origins import Origin, OriginStartError, nginx_origin
from labkit.pki import OriginPKI

BENCH = runs.Bench("overhead")
say = BENCH.say
REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".bench-cache"
DEFAULT_POLICY = REPO / "reshape" / "policy" / "default.yaml"
ORIGIN_HOST = "127.0.0.2"
FILE_NAME = "1k.bin"

ALL_CONFIGS = ("direct", "squid", "mitmdump", "reshape", "reshape-pooled", "reshape-w2")
# Rows of another reshape checkout (--baseline): the same policies, in the same run.
BASELINE_CONFIGS = ("baseline", "baseline-pooled")
PYTHON_PROXIES = ("mitmdump", "reshape", "reshape-pooled", "reshape-w2", *BASELINE_CONFIGS)
QUICK_CONFIGS = ("direct", "squid", "mitmdump", "reshape")
# The origin never closes a keep-alive connection during a run: when nginx closes one that Squid
# has bumped (pinned to a client connection), Squid relays the last response with
# `Connection: keep-alive`, then closes the client's connection, and the request already sent on it
# fails. That is Squid's behaviour, not the overhead this bench measures.
ORIGIN_KEEPALIVE_REQUESTS = 1_000_000_000
LABELS = {"reshape-w2": "reshape --workers 2", "reshape-pooled": "reshape (upstream pool)"}
# The upstream pool's own policy (policies/pooled.yaml), against the default policy's.
POOLED_POLICY = REPO / "policies" / "pooled.yaml"
# `h2`: HTTPS with HTTP/2 on both sides (an h2 origin, --streams requests in flight per client
# connection, as a browser multiplexes); opt-in, so a default run stays comparable with older ones.
SCHEMES = ("http", "https", "h2")
DEFAULT_SCHEMES = ("http", "https")
# Squid relays HTTP/1.1 only: it has no h2 row.
NO_H2 = ("squid",)


@dataclass(frozen=True)
class Lab:
    """What every configuration is started with."""

    workdir: Path
    origin_ca: Path
    policy: Path
    squid: SquidBinary | None
    # Another reshape checkout with its own .venv, for the baseline rows; None: no such rows.
    baseline: Path | None = None


ProxyStarter = Callable[[Lab, Path], AbstractContextManager[RunningProxy | None]]


@contextlib.contextmanager
def _no_proxy(lab: Lab, workdir: Path) -> Iterator[RunningProxy | None]:
    yield None


def _squid(lab: Lab, workdir: Path) -> AbstractContextManager[RunningProxy]:
    assert lab.squid is not None
    return peers.squid(workdir, lab.origin_ca, lab.squid)


def _mitmdump(lab: Lab, workdir: Path) -> AbstractContextManager[RunningProxy]:
    return peers.mitmdump(workdir, lab.origin_ca)


def _reshape(workers: int, policy: Path | None = None) -> ProxyStarter:
    def start(lab: Lab, workdir: Path) -> AbstractContextManager[RunningProxy]:
        return peers.reshape(workdir, lab.origin_ca, policy or lab.policy, workers)

    return start


def _baseline(pooled: bool) -> ProxyStarter:
    """The baseline checkout's reshape, with its own copy of the policy (default or pooled)."""

    def start(lab: Lab, workdir: Path) -> AbstractContextManager[RunningProxy]:
        assert lab.baseline is not None
        policy = POOLED_POLICY if pooled else DEFAULT_POLICY
        return peers.reshape(workdir, lab.origin_ca, policy, 1, checkout=lab.baseline)

    return start


STARTERS: dict[str, ProxyStarter] = {
    "direct": _no_proxy,
    "squid": _squid,
    "mitmdump": _mitmdump,
    "reshape": _reshape(1),
    "reshape-pooled": _reshape(1, POOLED_POLICY),
    "reshape-w2": _reshape(2),
    "baseline": _baseline(pooled=False),
    "baseline-pooled": _baseline(pooled=True),
}


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.overhead",
        description="Requests/s and added latency of reshape and its peers as forward proxies.",
    )
    parser.add_argument(
        "--configs",
        help=f"comma-separated, from {','.join(ALL_CONFIGS)} (default: all; "
        f"--quick: {','.join(QUICK_CONFIGS)})",
    )
    parser.add_argument(
        "--schemes",
        default=",".join(DEFAULT_SCHEMES),
        help="from http,https,h2 (default http,https); h2: HTTPS with HTTP/2 to the proxy and "
        "from it to an h2 origin",
    )
    parser.add_argument("--duration", type=float, help="measured seconds per row (default 10)")
    parser.add_argument("--warmup", type=float, help="unmeasured seconds first (default 2)")
    parser.add_argument(
        "--connections",
        type=int,
        default=10,
        help="requests in flight: keep-alive connections (http, https), streams in all (h2)",
    )
    parser.add_argument(
        "--streams", type=int, default=10, help="h2: requests in flight on each connection"
    )
    parser.add_argument("--repeat", type=int, default=1, help="interleaved rounds (medians)")
    parser.add_argument("--size", type=int, default=1024, help="response body bytes")
    parser.add_argument(
        "--max-requests", type=int, default=5_000_000, help="bound on requests per row"
    )
    parser.add_argument("--policy", type=Path, default=DEFAULT_POLICY, help="reshape's policy")
    parser.add_argument("--quick", action="store_true", help="smoke test: 2 s rows, fewer configs")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another reshape checkout (with its own .venv): measured in the same run as the "
        "rows `baseline` and `baseline-pooled` (the default and pooled policies)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="record a py-spy profile of each Python proxy in its first measured window per "
        "scheme; the breakdown goes beside the figures",
    )
    runs.add_output_arguments(parser, figures="run")
    args = parser.parse_args(argv)

    configs = (
        args.configs.split(",") if args.configs else (QUICK_CONFIGS if args.quick else ALL_CONFIGS)
    )
    known = (*ALL_CONFIGS, *BASELINE_CONFIGS) if args.baseline else ALL_CONFIGS
    unknown = sorted(set(configs) - set(known))
    schemes = args.schemes.split(",")
    if unknown or not configs:
        parser.error(f"--configs: unknown {unknown}; choose from {','.join(known)}")
    if args.baseline is not None and not (args.baseline / ".venv" / "bin" / "reshape").exists():
        parser.error(f"--baseline: {args.baseline}/.venv/bin/reshape is missing (make venv there)")
    if set(schemes) - set(SCHEMES) or not schemes:
        parser.error(f"--schemes: from {','.join(SCHEMES)}")
    args.configs = list(dict.fromkeys(configs))
    args.schemes = list(dict.fromkeys(schemes))
    args.duration = args.duration or (2.0 if args.quick else 10.0)
    args.warmup = args.warmup if args.warmup is not None else (0.5 if args.quick else 2.0)
    if args.duration <= 0 or args.warmup < 0 or args.connections < 1 or args.repeat < 1:
        parser.error("--duration, --connections and --repeat must be positive")
    if args.streams < 1 or args.connections % args.streams:
        parser.error("--streams must be positive and divide --connections")
    return args


def main(argv: Sequence[str]) -> int:
    return BENCH.main(argv, parse_args, _run, (ProxyStartError, OriginStartError, LoadgenError))


def _run(args: argparse.Namespace, command: str) -> int:
    say("building bench/loadgen")
    loadgen = runner.build(CACHE)
    squid = peers.find_squid(CACHE, say) if "squid" in args.configs else None
    if squid is not None and not squid.can_bump:
        say(f"{squid.path} cannot ssl-bump: squid https rows are CONNECT tunnels")
    if any(c.startswith("reshape") for c in args.configs) and not args.policy.exists():
        raise ProxyStartError(f"reshape policy {args.policy} does not exist")
    machine_facts = runs.machine()
    started = datetime.datetime.now(datetime.UTC)
    notes = BENCH.busy_machine_notes()

    # Squid drops root privileges and must be able to reach its own subdirectory.
    with BENCH.workdir(args.workdir, mode=0o711) as workdir:
        pki = OriginPKI(workdir / "pki")
        www = workdir / "www"
        www.mkdir()
        (www / FILE_NAME).write_bytes(random.Random(1024).randbytes(args.size))
        baseline = args.baseline.resolve() if args.baseline else None
        lab = Lab(workdir, pki.ca_cert_path, args.policy.resolve(), squid, baseline)
        tls = pki.issue([ORIGIN_HOST])
        origin = functools.partial(
            nginx_origin, www, ORIGIN_HOST, keepalive_requests=ORIGIN_KEEPALIVE_REQUESTS
        )
        # One nginx per scheme asked for; https and h2 apart, as an origin offering h2 would put
        # the pool's https rows on HTTP/2 upstream.
        kinds: dict[str, dict[str, Any]] = {
            "http": {},
            "https": {"tls": tls},
            "h2": {"tls": tls, "http2": True},
        }
        with contextlib.ExitStack() as origins_running:
            origins = {
                scheme: origins_running.enter_context(
                    origin(workdir=workdir / f"nginx-{scheme}", **kinds[scheme])
                )
                for scheme in args.schemes
            }
            measurements, addresses, profile_texts = _measure(args, lab, loadgen, origins)
        addresses += [(ORIGIN_HOST, origin.port) for origin in origins.values()]
    machine_facts["load average at end"] = runs.load_average()

    print(report.markdown_table(measurements))
    for line in report.target_lines(measurements):
        print(line)
    failed = [m for m in measurements if m.errors]
    for m in failed:
        samples = {s for run in m.runs for s in run.error_samples}
        say(f"{m.label} {m.scheme}: {m.errors} failed requests, e.g. {sorted(samples)[:3]}")
        notes.append(f"FAILED requests in {m.label} {m.scheme}: {m.errors}")
    busy = BENCH.still_accepting(addresses)
    if args.json:
        args.json.write_text(json.dumps([_as_json(m) for m in measurements], indent=2))
    if runs.publish(
        args,
        report.HEADING,
        report.section(
            when=started.strftime("%Y-%m-%d %H:%M UTC"),
            command=command,
            setup=_setup_text(args, squid),
            machine_facts=machine_facts,
            version_facts=report.versions(runner.go_binary(), squid.version if squid else None),
            measurements=measurements,
            notes=notes,
            profiles=profile_texts,
        ),
    ):
        say(f"recorded in {args.results}")
    return 1 if failed or busy else 0


def _as_json(m: Measurement) -> dict[str, object]:
    cpu: Sequence[float | None] = m.proxy_cpu_s or [None] * len(m.runs)
    return {
        "config": m.config,
        "label": m.label,
        "scheme": m.scheme,
        "runs": [
            {**asdict(run), "proxy_cpu_s": seconds}
            for run, seconds in zip(m.runs, cpu, strict=True)
        ],
    }


def _measure(
    args: argparse.Namespace, lab: Lab, loadgen: Path, origins: dict[str, Origin]
) -> tuple[list[Measurement], list[tuple[str, int]], list[str]]:
    """Every round, every config, every scheme; each proxy is started once per round.

    Returns the measurements, every address a proxy listened on, and (--profile) the profile
    breakdowns of the Python proxies' first rounds.
    """
    profile_texts: list[str] = []
    runs: dict[tuple[str, str], list[LoadResult]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    labels: dict[tuple[str, str], str] = {}
    addresses: list[tuple[str, int]] = []
    for round_number in range(1, args.repeat + 1):
        for config in args.configs:
            schemes = [s for s in args.schemes if not (s == "h2" and config in NO_H2)]
            if not schemes:
                continue
            workdir = lab.workdir / f"{config}-{round_number}"
            workdir.mkdir()
            say(f"round {round_number}/{args.repeat}: starting {config}")
            with STARTERS[config](lab, workdir) as proxy:
                if proxy is not None:
                    addresses.extend(("127.0.0.1", port) for port in proxy.ports)
                for scheme in schemes:
                    key = (config, scheme)
                    profile = None
                    if args.profile and round_number == 1 and config in PYTHON_PROXIES:
                        profile = workdir / f"profile-{scheme}.txt"
                    result, proxy_cpu_s = _load(
                        args, loadgen, origins[scheme], proxy, lab.origin_ca, profile
                    )
                    if profile is not None:
                        title = f"{_label(config, scheme, proxy, lab)}, {scheme}"
                        profile_texts.append(profiles.markdown(title, profiles.summary(profile)))
                    runs.setdefault(key, []).append(result)
                    if proxy_cpu_s is not None:
                        cpu.setdefault(key, []).append(proxy_cpu_s)
                    labels[key] = _label(config, scheme, proxy, lab)
                    say(
                        f"  {config} {scheme}: {result.rps:,.0f} req/s, p50 {result.p50_ms} ms,"
                        f" p99 {result.p99_ms} ms, errors {result.failed},"
                        f" connects {result.connects}"
                        + (f", proxy CPU {proxy_cpu_s:.2f} s" if proxy_cpu_s is not None else "")
                    )
    measurements = [
        Measurement(
            config,
            labels[(config, scheme)],
            scheme,
            tuple(runs[(config, scheme)]),
            tuple(cpu.get((config, scheme), ())),
        )
        for config in args.configs
        for scheme in args.schemes
        if (config, scheme) in runs
    ]
    return measurements, addresses, profile_texts


def _load(
    args: argparse.Namespace,
    loadgen: Path,
    origin: Origin,
    proxy: RunningProxy | None,
    origin_ca: Path,
    profile: Path | None = None,
) -> tuple[LoadResult, float | None]:
    """One load run, and the proxy's CPU seconds over its measured window (None if direct);
    with `profile`, py-spy samples the proxy over that window into it."""
    h2 = "h2" in origin.protocols
    cacert = None
    if origin.scheme == "https":
        cacert = proxy.https_ca if proxy else origin_ca
    started = time.monotonic()
    running = runner.start(
        loadgen,
        url=origin.url(FILE_NAME),
        proxy=proxy.url if proxy else None,
        cacert=cacert,
        connections=args.connections // args.streams if h2 else args.connections,
        duration=args.duration,
        warmup=args.warmup,
        size=args.size,
        max_requests=args.max_requests,
        h2_streams=args.streams if h2 else None,
    )
    proxy_cpu_s = None
    try:
        if proxy is not None:
            # The loadgen's window opens `warmup` after its start, give or take its start-up.
            _sleep_until(started + args.warmup)
            before = peers.group_cpu_seconds(proxy.pgid)
            sampled = (
                profiles.recording(proxy.pgid, args.duration, profile)
                if profile is not None
                else contextlib.nullcontext()
            )
            with sampled:
                _sleep_until(started + args.warmup + args.duration)
                proxy_cpu_s = peers.group_cpu_seconds(proxy.pgid) - before
    except BaseException:
        runner.abort(running)
        raise
    return runner.finish(running), proxy_cpu_s


def _sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.monotonic()))


def _label(config: str, scheme: str, proxy: RunningProxy | None, lab: Lab) -> str:
    label = LABELS.get(config, config)
    if config in BASELINE_CONFIGS and lab.baseline is not None:
        kind = "upstream pool" if config == "baseline-pooled" else "default policy"
        label = f"reshape at {runs.commit_of(lab.baseline)} ({kind})"
    if scheme != "http" and proxy is not None and proxy.https_mode != peers.INTERCEPTED:
        label += f" ({proxy.https_mode})"
    return label


def _setup_text(args: argparse.Namespace, squid: SquidBinary | None) -> str:
    squid_https = (
        "ssl-bump (peek, stare, bump) with its own CA, origin certificate verified"
        if squid and squid.can_bump
        else "CONNECT tunnel only, no interception (this squid cannot ssl-bump)"
    )
    rounds = (
        f"{args.repeat} rounds interleaved; figures are medians over the rounds, with req/s's range"
        " in brackets"
        if args.repeat > 1
        else "one round"
    )
    h2_rows = (
        f"""
  h2 rows: HTTPS with HTTP/2 on both sides, {args.connections // args.streams} connection(s)
  with {args.streams} requests in flight on each, to an nginx that speaks h2 (Squid, HTTP/1.1
  only, has none)."""
        if "h2" in args.schemes
        else ""
    )
    return f"""\
- Load: bench/loadgen, a closed loop of {args.connections} keep-alive HTTP/1.1 connections, each
  GETting one {args.size:,}-byte file again and again; every response's status and length checked,
  failures counted, never retried. {args.warmup:g} s warmup, then {args.duration:g} s measured per
  row; configurations one after another, {rounds}.{h2_rows}
- Origin: nginx, 1 worker, on {ORIGIN_HOST}, told not to close keep-alive connections during a
  run; proxies listen on 127.0.0.1.
- https rows are intercepted: TLS from the client to the proxy under the proxy's CA, and from the
  proxy to the origin, verified against the origins' CA. Squid https: {squid_https}.
- Peers: Squid with `cache deny all` and 1 worker; mitmdump with no addons and `-q`; reshape is
  `reshape run --policy {_relative(args.policy)}`.
- Added latency: the row's p50/p99 minus direct's, same scheme. Ratios: the row's req/s over the
  peer's, same scheme. In a closed loop latency ≈ connections ÷ throughput, so both say much the
  same thing. Proxy CPU: user + system time of all the proxy's processes over the measured window.
- `connects`: connections the client opened per row (the largest over rounds); more than
  {args.connections} means the proxy closed some. (With nginx's default of closing a connection
  after a number of requests, Squid ssl-bump fails one request per closed connection: Squid relays
  the origin's last response with `Connection: keep-alive`, then closes the client's connection.)
- **The load generator, the proxy and nginx share the same cores**: every proxy competes with the
  load generator for CPU, and the direct rows measure the load generator and nginx, not a
  network."""


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
