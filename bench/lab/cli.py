"""bench/lab: reproducible page-load experiments with a real browser over emulated networks.

    python -m bench.lab list                the experiments
    python -m bench.lab run NAME            run one fully; tables to stdout, section in RESULTS.md,
                                            plots in bench/plots/
    python -m bench.lab run --quick NAME    a short version (what the test suite runs)
    python -m bench.lab run --profile NAME  also record the proxy the experiment profiles with
                                            py-spy and publish the breakdown (gateway)
    python -m bench.lab run NAME --pages app --variants h2 --rtts 100 --configs direct,mitmdump
        --profile --profiled mitmdump       a part of an experiment: some of its pages, origin
                                            variants, RTTs, configurations; another proxy profiled
    python -m bench.lab report --json FILE  tables, plots and RESULTS.md section again, from the
                                            --json record of a run

Everything runs on loopback: origins (nginx, hypercorn) on 127.0.0.2 …, proxies on 127.0.0.1,
and user-space relays in between that emulate the links (labkit/relay.py): latency per
direction, bandwidth per connection and shared per origin, and a connection set-up delay (one
RTT for the TCP handshake). Not emulated: loss, jitter, reordering, queueing delay, and TCP slow
start or congestion control of the emulated path.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from bench import runs
from bench.lab.experiments import NAMES, Experiment, UnknownConfigError, experiment
from bench.lab.gateway_report import gateway_charts, gateway_overview, gateway_tables
from bench.lab.network import network
from bench.lab.plot import write_pngs
from bench.lab.preconnect_report import (
    preconnect_charts,
    preconnect_overview,
    preconnect_tables,
)
from bench.lab.profile import Profiler, ProfilerError
from bench.lab.report import (
    Run,
    booster_charts,
    booster_overview,
    booster_tables,
    heading,
    plt_charts,
    plt_overview,
    plt_tables,
    section,
)
from bench.lab.runner import GroupCpu, run_loads, run_warm_loads
from bench.lab.sites import hosts_for
from bench.overhead.peers import ProxyStartError
from labkit.browser import BrowserSession, PageLoadError
from labkit.origins import OriginStartError
from labkit.relay import Link, relays

REPO = Path(__file__).resolve().parents[2]
PLOTS = REPO / "bench" / "plots"


def say(message: str) -> None:
    print(f"lab: {message}", file=sys.stderr, flush=True)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.lab",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="show the experiments")
    run = commands.add_parser("run", help="run one experiment")
    run.add_argument("name", choices=NAMES)
    run.add_argument("--quick", action="store_true", help="a short version, for the test suite")
    run.add_argument("--reps", type=int, help="repetitions of every cell (default 5; quick 1)")
    run.add_argument(
        "--no-record",
        action="store_true",
        help="write neither bench/RESULTS.md nor plots (unless --plots is given)",
    )
    run.add_argument("--json", type=Path, help="also write the run's record (every load) here")
    run.add_argument("--workdir", type=Path, help="keep origins' roots, logs, proxies' files here")
    run.add_argument(
        "--profile",
        action="store_true",
        help="record the profiled proxy (gateway: pooled) with py-spy during the page loads and "
        "publish its breakdown by function and by area",
    )
    run.add_argument(
        "--profiled", metavar="CONFIG", help="with --profile: record this configuration instead"
    )
    for option, what in (
        ("--pages", "pages"),
        ("--variants", "origin variants (h1, h2)"),
        ("--rtts", "RTTs in ms"),
        ("--configs", "configurations"),
    ):
        run.add_argument(
            option, type=_names, metavar="A,B", help=f"only these of the experiment's {what}"
        )
    report = commands.add_parser("report", help="publish a run again from its --json record")
    report.add_argument("--json", type=Path, required=True, help="a record from run --json")
    report.add_argument("--no-record", action="store_true", help="do not write RESULTS.md")
    for command in (run, report):
        command.add_argument(
            "--results", type=Path, default=runs.RESULTS, help="the results file to update"
        )
        command.add_argument(
            "--plots", type=Path, help=f"where PNG plots go (default {_rel(PLOTS)})"
        )
    args = parser.parse_args(argv)
    if args.command == "run" and args.reps is not None and args.reps < 1:
        parser.error("--reps must be at least 1")
    if args.command == "run" and args.profile and experiment(args.name).profiled is None:
        parser.error(f"--profile: the {args.name} experiment profiles no proxy")
    if args.command == "run" and args.profiled and not args.profile:
        parser.error("--profiled: only with --profile")
    if args.command == "run":
        chosen = experiment(args.name, quick=args.quick)
        for option, given, known in (
            ("--pages", args.pages, chosen.pages),
            ("--variants", args.variants, chosen.variants),
            ("--rtts", args.rtts and [f"{rtt} ms" for rtt in args.rtts], chosen.links),
        ):
            unknown = [name for name in given or () if name not in known]
            if unknown:
                parser.error(
                    f"{option}: {', '.join(unknown)} not in {args.name} (it has {', '.join(known)})"
                )
    return args


def _names(text: str) -> list[str]:
    """A comma-separated list option: its non-empty items."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError("an empty list")
    return names


def _part(chosen: Experiment, args: argparse.Namespace) -> Experiment:
    """The experiment cut down to the pages, variants, RTTs and profiled proxy asked for."""
    if args.reps is not None:
        chosen = dataclasses.replace(chosen, reps=args.reps)
    if args.pages:
        chosen = dataclasses.replace(
            chosen, pages=tuple(p for p in chosen.pages if p in args.pages)
        )
    if args.variants:
        variants = tuple(v for v in chosen.variants if v in args.variants)
        chosen = dataclasses.replace(chosen, variants=variants)
    if args.rtts:
        wanted = {f"{rtt} ms" for rtt in args.rtts}
        links = {name: link for name, link in chosen.links.items() if name in wanted}
        chosen = dataclasses.replace(chosen, links=links)
    if args.profiled:
        chosen = dataclasses.replace(chosen, profiled=args.profiled)
    if args.configs:
        chosen = dataclasses.replace(chosen, only_configs=tuple(args.configs))
    return chosen


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    if args.command == "list":
        for name in NAMES:
            full, quick = experiment(name), experiment(name, quick=True)
            print(f"{name}: {full.summary}.")
            print(f"    full: {_count(full)}; --quick: {_count(quick)}")
        return 0
    runs.unwind_on_sigterm()
    if args.command == "run" and args.workdir is not None and _not_empty(args.workdir):
        say(
            f"FAILED: --workdir {args.workdir} is not an empty directory: the lab puts "
            "origins' roots and proxies' files there; give a new or an empty one"
        )
        return 2
    if args.command == "report":
        return _publish(Run.from_json(json.loads(args.json.read_text())), args)
    try:
        return _run(args, shlex.join(["python", "-m", "bench.lab", *argv]))
    except UnknownConfigError as error:
        say(f"FAILED: {error}")
        return 2
    except (ProxyStartError, OriginStartError, PageLoadError, ProfilerError) as error:
        say(f"FAILED: {error}")
        return 1


def _run(args: argparse.Namespace, command: str) -> int:
    chosen = _part(experiment(args.name, quick=args.quick), args)
    facts = runs.machine()
    load = os.getloadavg()[0]
    if load > len(os.sched_getaffinity(0)) / 2:
        say(f"load average {load:.2f}: other work competes with the lab; compare within a run")
    started = datetime.datetime.now(datetime.UTC)
    clock = time.monotonic()
    with (
        _workdir(args.workdir) as workdir,
        relays() as relay_thread,
        network(workdir, relay_thread) as net,
    ):
        say(f"starting origins for {', '.join(chosen.variants)} in {workdir}")
        for variant in chosen.variants:
            net.start_origins(variant, hosts_for(chosen.pages), chosen.pages)
        configs = chosen.configs(workdir, net.pages)
        if args.profile and chosen.profiled not in {c.name for c in configs}:
            raise UnknownConfigError(f"--profiled: {chosen.profiled} is not a configuration run")
        say(f"starting {len(configs)} configurations: {', '.join(c.name for c in configs)}")
        for config in configs:
            net.start_proxy(config, Link())
        cells = chosen.cells(net.pages, configs)
        cas = [net.pki.ca_cert_path]
        cas += [e.proxy.https_ca for e in net.endpoints.values() if e.proxy is not None]
        say(f"{len(cells)} cells x {chosen.reps} repetitions = {len(cells) * chosen.reps} loads")
        group_cpu: list[GroupCpu] = []
        profiler = Profiler(workdir / "profile") if args.profile else None
        with BrowserSession(cas) as browser:
            try:
                if chosen.warm:
                    loads, group_cpu = run_warm_loads(
                        net,
                        browser,
                        cells,
                        chosen.links,
                        chosen.reps,
                        chosen.name,
                        profiler=profiler,
                        profiled=chosen.profiled,
                    )
                else:
                    loads = run_loads(
                        net,
                        browser,
                        cells,
                        chosen.links,
                        chosen.reps,
                        chosen.name,
                        every_host_warm=not chosen.quick,
                    )
            finally:
                if profiler is not None:
                    profiler.close()
        pages = net.pages
    facts["load average at end"] = " ".join(f"{v:.2f}" for v in os.getloadavg())
    run = Run(
        chosen,
        command,
        started.strftime("%Y-%m-%d %H:%M UTC"),
        (time.monotonic() - clock) / 60,
        loads,
        configs,
        pages,
        facts,
        group_cpu,
        profiler.profiles if profiler is not None else {},
    )
    if args.json:
        args.json.write_text(json.dumps(run.as_json(), indent=1))
    return _publish(run, args)


def _publish(run: Run, args: argparse.Namespace) -> int:
    """Tables to stdout, plots, and the RESULTS.md section; 1 if any load failed."""
    chosen = run.experiment
    if chosen.is_booster:
        tables, overview, charts_of = booster_tables(run), booster_overview(run), booster_charts
    elif chosen.name == "preconnect":
        tables, overview = preconnect_tables(run), preconnect_overview(run)
        charts_of = preconnect_charts
    elif chosen.name == "gateway":
        tables, overview, charts_of = gateway_tables(run), gateway_overview(run), gateway_charts
    else:
        tables, overview, charts_of = plt_tables(run), plt_overview(run), plt_charts
    for page, table in tables.items():
        print(f"\n## {chosen.name}: {page}\n\n{table}")
    print(f"\n## {chosen.name}\n\n{overview}")
    plots_dir = args.plots or (None if args.no_record else PLOTS)
    plots: dict[str, list[str]] = {}
    if plots_dir is not None:
        charts = charts_of(run, plots_dir)
        write_pngs(charts)
        for path in charts:
            # lab-<experiment>-<page>[-<what>].png: the longest page name it starts with.
            rest = path.stem.split("-", 2)[2]
            page = max((p for p in chosen.pages if rest == p or rest.startswith(f"{p}-")), key=len)
            plots.setdefault(page, []).append(
                os.path.relpath(path.resolve(), args.results.resolve().parent)
            )
        say(f"plots in {plots_dir}")
    part = _part_of(run)
    if part:
        say(f"a part of {chosen.name} ({part}): not recorded in {args.results}")
    elif runs.publish(args, heading(chosen.name), section(run, tables, plots, overview)):
        say(f"recorded in {args.results}")
    failed = sum(1 for load in run.loads if load.error is not None)
    if failed:
        say(f"{failed} of {len(run.loads)} loads failed")
    return 1 if failed else 0


def _part_of(run: Run) -> str:
    """What a run left out of its experiment ("" if nothing): a part never replaces the
    experiment's section of RESULTS.md."""
    chosen, full = run.experiment, experiment(run.experiment.name, quick=run.experiment.quick)
    left_out = [
        *(p for p in full.pages if p not in chosen.pages),
        *(v for v in full.variants if v not in chosen.variants),
        *(f"RTT {link}" for link in full.links if link not in chosen.links),
    ]
    if chosen.only_configs:
        left_out.append(f"configs other than {', '.join(chosen.only_configs)}")
    return "without " + ", ".join(left_out) if left_out else ""


def _count(chosen: Experiment) -> str:
    per_rep = len(chosen.variants) * len(chosen.links) * len(chosen.pages)
    return (
        f"{len(chosen.pages)} pages x {len(chosen.variants)} origin variants x "
        f"{len(chosen.links)} links ({per_rep} page settings, each under every configuration), "
        f"{chosen.reps} repetitions"
    )


def _not_empty(path: Path) -> bool:
    """Whether `path` holds anything (or is a file, or cannot be read): not a usable workdir."""
    try:
        return path.exists() and (not path.is_dir() or any(path.iterdir()))
    except OSError:
        return True


@contextlib.contextmanager
def _workdir(given: Path | None) -> Iterator[Path]:
    if given is not None:
        given.mkdir(parents=True, exist_ok=True)
        yield given.resolve()
        return
    with tempfile.TemporaryDirectory(prefix="reshape-lab-") as directory:
        yield Path(directory)


def _rel(path: Path) -> str:
    return os.path.relpath(path, REPO)
