"""bench/soak: many concurrent client connections through reshape for a long time, on loopback,
with every reshaping behaviour on; reshape's RSS and open fds sampled throughout.

nginx (HTTP/1.1 only, so the pool pipelines) serves one 20 KB file over HTTPS on 127.0.0.71;
reshape runs the policy below; bench/loadgen holds `--connections` keep-alive connections through
CONNECT tunnels, one request in flight on each, for `--duration` seconds after a warm-up. Once
the load ends, the bench waits for the pool's idle timeout and reads the fds again. Pass criteria
are in bench/soak/report.py. Default: 1,000 connections for 10 minutes; `--quick`: 100 for 30 s.

Run it as `python -m bench.soak` (see its `--help`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from bench import runs
from bench.loadgen import runner
from bench.loadgen.runner import LoadgenError, LoadResult
from bench.overhead import peers
from bench.overhead.peers import ProxyStartError
from bench.soak import report
from bench.soak.report import Sample
from labkit.origins import OriginStartError, nginx_origin
from labkit.pki import OriginPKI

BENCH = runs.Bench("soak")
say = BENCH.say
REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".bench-cache"
ORIGIN_HOST = "127.0.0.71"
FILE_NAME = "soak.bin"
FILE_SIZE = 20_000
IDLE_TIMEOUT = 5.0
POLICY = f"""version: 1
default: soak
policies:
  soak:
    upstream: {{max_connections_per_host: 6, pipeline_depth: 4, idle_timeout: {IDLE_TIMEOUT}}}
    tls_records: {{mode: dynamic}}
    trailers: {{mode: auto, synthesize: [content-digest]}}
"""


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--connections", type=int, help="client connections (default 1000)")
    parser.add_argument("--duration", type=float, help="measured seconds (default 600)")
    parser.add_argument("--warmup", type=float, help="unmeasured seconds first (default 10)")
    parser.add_argument("--sample", type=float, default=2, help="seconds between samples")
    parser.add_argument(
        "--quick", action="store_true", help="defaults of 100 connections for 30 s (5 s warm-up)"
    )
    runs.add_output_arguments(parser, "sample")
    args = parser.parse_args(argv)
    defaults = (100, 30.0, 5.0) if args.quick else (1000, 600.0, 10.0)
    for name, default in zip(("connections", "duration", "warmup"), defaults, strict=True):
        if getattr(args, name) is None:
            setattr(args, name, default)
    if args.connections < 1 or args.duration <= 0 or args.sample <= 0 or args.warmup < 0:
        parser.error("--connections, --duration and --sample must be positive")
    return args


def main(argv: Sequence[str]) -> int:
    return BENCH.main(argv, parse_args, _run, (ProxyStartError, OriginStartError, LoadgenError))


def _run(args: argparse.Namespace, command: str) -> int:
    binary = runner.build(CACHE)
    notes = BENCH.busy_machine_notes()
    facts = runs.machine()
    with BENCH.workdir(args.workdir, mode=0o711) as workdir:
        pki = OriginPKI(workdir / "pki")
        www = workdir / "www"
        www.mkdir()
        (www / FILE_NAME).write_bytes(os.urandom(FILE_SIZE))
        policy = workdir / "soak.yaml"
        policy.write_text(POLICY)
        tls = pki.issue([ORIGIN_HOST])
        with (
            nginx_origin(www, ORIGIN_HOST, tls=tls, workdir=workdir / "nginx") as origin,
            peers.reshape(workdir, pki.ca_cert_path, policy) as proxy,
        ):
            admin = f"http://127.0.0.1:{proxy.ports[1]}"
            pid = proxy.pgid  # one process: `reshape run` without --workers
            fds_before = _fds(pid)
            say(f"{args.connections} connections for {args.duration:g} s; fds {fds_before}")
            samples, load = _load(args, binary, proxy, origin.url(f"/{FILE_NAME}"), pid)
            say(f"load done: {load.requests} requests, {load.failed} failed; waiting for idle")
            fds_after = _settled_fds(pid, fds_before, IDLE_TIMEOUT * 3 + 10)
            metrics = _scrape(admin)
        result = report.verdict(
            samples,
            load,
            measured_from=args.warmup,
            measured_to=args.warmup + args.duration,
            fds_before=fds_before,
            fds_after=fds_after,
            client_errors=_total(metrics, "reshape_client_errors_total"),
            bad_outcomes=_total(metrics, "reshape_requests_total", exclude='outcome="ok"'),
        )
    say("PASS" if result.passed else "FAIL: " + "; ".join(result.reasons))
    text = report.section(
        result,
        load,
        samples,
        connections=args.connections,
        duration=args.duration,
        command=command,
        facts={**facts, "reshape": runs.first_line([str(REPO / ".venv/bin/reshape"), "--version"])},
        notes=notes,
    )
    print(text)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "verdict": asdict(result),
                    "load": asdict(load),
                    "samples": [asdict(s) for s in samples],
                },
                indent=1,
            )
        )
    runs.publish(args, report.HEADING, text)
    return 0 if result.passed else 1


def _load(
    args: argparse.Namespace,
    binary: Path,
    proxy: peers.RunningProxy,
    url: str,
    pid: int,
) -> tuple[list[Sample], LoadResult]:
    """Runs the load generator while a thread samples reshape every `args.sample` seconds."""
    samples: list[Sample] = []
    done = threading.Event()
    started = time.monotonic()

    def sample() -> None:
        while not done.wait(args.sample):
            samples.append(Sample(time.monotonic() - started, _rss(pid), _fds(pid)))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    argv = [
        str(binary),
        "-url", url,
        "-proxy", proxy.url,
        "-cacert", str(proxy.https_ca),
        "-c", str(args.connections),
        "-d", f"{args.duration}s",
        "-warmup", f"{args.warmup}s",
        "-n", str(10**12),
        "-size", str(FILE_SIZE),
        "-timeout", "60s",
    ]  # fmt: skip
    try:
        done_run = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=args.warmup + args.duration + 180,
            check=False,
        )
    except subprocess.TimeoutExpired as error:
        raise LoadgenError(f"loadgen did not finish: {' '.join(argv)}") from error
    finally:
        done.set()
        sampler.join(args.sample + 5)
    if done_run.returncode != 0:
        raise LoadgenError(f"loadgen exited with {done_run.returncode}: {done_run.stderr[-500:]}")
    return samples, LoadResult.from_report(json.loads(done_run.stdout))


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _settled_fds(pid: int, target: int, seconds: float) -> int:
    """reshape's open fds once back at `target`, or after `seconds` (least of a few samples:
    the process opens some for a moment now and then)."""
    deadline = time.monotonic() + seconds
    while True:
        counts = []
        for _ in range(5):
            counts.append(_fds(pid))
            time.sleep(0.1)
        if min(counts) <= target or time.monotonic() > deadline:
            return min(counts)
        time.sleep(1)


def _scrape(admin: str) -> str:
    with urllib.request.urlopen(f"{admin}/metrics", timeout=10) as response:
        return response.read().decode()


def _total(metrics: str, name: str, exclude: str | None = None) -> float:
    """Sum of the samples of `name` (all label values), leaving out series containing `exclude`."""
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith(name) and (exclude is None or exclude not in line):
            total += float(line.rsplit(" ", 1)[1])
    return total
