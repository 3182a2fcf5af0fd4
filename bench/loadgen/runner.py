"""Builds and runs bench/loadgen, the Go load generator, and reads its JSON report."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "bench" / "loadgen"
# Go installed from the upstream tarball is not always on PATH.
_GO_FALLBACK = Path("/usr/local/go/bin/go")
# Slack on top of warmup + duration before a run counts as hung: connects, the last request in
# flight (bounded by the loadgen's own per-request timeout) and the report.
_RUN_SLACK_SECONDS = 60.0


class LoadgenError(RuntimeError):
    """The load generator could not be built, or did not produce a report."""


@dataclass(frozen=True)
class LoadResult:
    """One measured run: counts over the measurement window, latencies in milliseconds."""

    requests: int
    errors: int
    warmup_errors: int
    rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    bytes: int
    connects: int
    duration_s: float
    error_samples: tuple[str, ...]

    @classmethod
    def from_report(cls, report: dict[str, Any]) -> LoadResult:
        latency = report["latency_ms"]
        return cls(
            requests=int(report["requests"]),
            errors=int(report["errors"]),
            warmup_errors=int(report["warmup_errors"]),
            rps=float(report["rps"]),
            p50_ms=float(latency["p50"]),
            p90_ms=float(latency["p90"]),
            p99_ms=float(latency["p99"]),
            max_ms=float(latency["max"]),
            bytes=int(report["bytes"]),
            connects=int(report["connects"]),
            duration_s=float(report["duration_s"]),
            error_samples=tuple(str(sample) for sample in report.get("error_samples") or ()),
        )

    @property
    def failed(self) -> int:
        """Requests that failed, during warmup or measurement."""
        return self.errors + self.warmup_errors


def go_binary() -> str:
    found = shutil.which("go") or (str(_GO_FALLBACK) if _GO_FALLBACK.exists() else None)
    if found is None:
        raise LoadgenError("`go` not found on PATH or at /usr/local/go/bin/go (Go 1.19 or later)")
    return found


def build(cache: Path) -> Path:
    """Builds the loadgen into `cache` unless a build newer than every source file is there."""
    binary = cache / "loadgen"
    sources = [*SOURCE.glob("*.go"), SOURCE / "go.mod"]
    newest = max(path.stat().st_mtime for path in sources)
    if binary.exists() and binary.stat().st_mtime >= newest:
        return binary
    cache.mkdir(parents=True, exist_ok=True)
    # bench/loadgen is its own module (standard library only), so build inside it.
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"}
    done = subprocess.run(
        [go_binary(), "build", "-C", str(SOURCE), "-o", str(binary.resolve()), "."],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise LoadgenError(f"go build of bench/loadgen failed:\n{done.stdout}{done.stderr}")
    return binary


@dataclass(frozen=True)
class Running:
    """A load generator that was started; `finish` collects its report."""

    process: subprocess.Popen[str]
    argv: tuple[str, ...]
    timeout: float


def start(
    binary: Path,
    *,
    url: str,
    proxy: str | None,
    cacert: Path | None,
    connections: int,
    duration: float,
    warmup: float,
    size: int,
    max_requests: int,
    h2_streams: int | None = None,
) -> Running:
    """Starts one closed-loop run of `connections` keep-alive connections, bounded by time and
    count: `warmup` seconds unmeasured, then `duration` seconds measured. With `h2_streams` the
    connections speak HTTP/2 (https only), that many requests in flight on each."""
    argv = [
        str(binary),
        "-url",
        url,
        "-c",
        str(connections),
        "-d",
        f"{duration}s",
        "-warmup",
        f"{warmup}s",
        "-n",
        str(max_requests),
        "-size",
        str(size),
    ]
    if proxy:
        argv += ["-proxy", proxy]
    if h2_streams is not None:
        argv += ["-h2", "-streams", str(h2_streams)]
    if cacert:
        argv += ["-cacert", str(cacert)]
    process = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    return Running(process, tuple(argv), warmup + duration + _RUN_SLACK_SECONDS)


def abort(running: Running) -> None:
    """Stops a run whose report is no longer wanted."""
    running.process.kill()
    running.process.communicate()


def finish(running: Running) -> LoadResult:
    """Waits for the run's report; a run that overstays its bound is killed."""
    try:
        stdout, stderr = running.process.communicate(timeout=running.timeout)
    except subprocess.TimeoutExpired as error:
        raise LoadgenError(f"loadgen did not finish: {' '.join(running.argv)}") from error
    finally:
        if running.process.poll() is None:
            abort(running)
    if running.process.returncode != 0:
        raise LoadgenError(f"loadgen exited with {running.process.returncode}: {stderr.strip()}")
    try:
        return LoadResult.from_report(json.loads(stdout))
    except (ValueError, KeyError, TypeError) as error:
        raise LoadgenError(f"unreadable loadgen report ({error}): {stdout[:500]}") from error
