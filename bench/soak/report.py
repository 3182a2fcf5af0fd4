"""bench/soak's verdict and its RESULTS.md section: pure functions over the samples of a run.

Pass criteria (all must hold):
- no request failed (the load generator checks every status and body length) and reshape counted
  no client error and no request outcome but `ok`;
- memory is flat: the median RSS of the last fifth of the measured window is at most
  `max(MEMORY_SLACK_FRACTION, MEMORY_SLACK_BYTES)` above the median of its second fifth (the
  first fifth is warm-up of caches: certificates, TLS sessions, pools);
- open fds come back to where they were before the load, once the load has ended and the pool's
  idle timeout has passed.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from bench.loadgen.runner import LoadResult

HEADING = "## Soak (bench/soak)"
MEMORY_SLACK_FRACTION = 0.10
MEMORY_SLACK_BYTES = 20 * 1024 * 1024


@dataclass(frozen=True)
class Sample:
    """reshape's process at one moment: seconds since the load started, RSS and open fds."""

    seconds: float
    rss_bytes: int
    fds: int


@dataclass(frozen=True)
class Verdict:
    passed: bool
    reasons: tuple[str, ...]
    rss_early: int
    rss_late: int
    fds_before: int
    fds_peak: int
    fds_after: int


def verdict(
    samples: Sequence[Sample],
    load: LoadResult,
    *,
    measured_from: float,
    measured_to: float,
    fds_before: int,
    fds_after: int,
    client_errors: float,
    bad_outcomes: float,
) -> Verdict:
    """Whether the run passed, and why not. `measured_from`/`measured_to` bound the measured
    window (seconds since the load started)."""
    window = [s for s in samples if measured_from <= s.seconds <= measured_to]
    reasons: list[str] = []
    fifth = max(1, len(window) // 5)
    early = window[fifth : 2 * fifth] or window[:1]
    late = window[-fifth:]
    rss_early = int(statistics.median(s.rss_bytes for s in early)) if early else 0
    rss_late = int(statistics.median(s.rss_bytes for s in late)) if late else 0
    if len(window) < 5:
        reasons.append(f"only {len(window)} samples in the measured window (need 5)")
    allowed = max(rss_early * MEMORY_SLACK_FRACTION, MEMORY_SLACK_BYTES)
    if rss_late - rss_early > allowed:
        reasons.append(
            f"memory grew {mib(rss_late - rss_early)} MiB during the load "
            f"(allowed {mib(int(allowed))} MiB)"
        )
    if load.failed:
        reasons.append(f"{load.failed} requests failed: {', '.join(load.error_samples[:3])}")
    if load.requests == 0:
        reasons.append("no request was measured")
    if client_errors:
        reasons.append(f"reshape counted {client_errors:g} client errors")
    if bad_outcomes:
        reasons.append(f"reshape counted {bad_outcomes:g} requests that did not end ok")
    if fds_after > fds_before:
        reasons.append(f"open fds {fds_after} after the load, {fds_before} before")
    return Verdict(
        passed=not reasons,
        reasons=tuple(reasons),
        rss_early=rss_early,
        rss_late=rss_late,
        fds_before=fds_before,
        fds_peak=max((s.fds for s in samples), default=fds_before),
        fds_after=fds_after,
    )


def mib(n: int) -> str:
    return f"{n / 1024 / 1024:.1f}"


def section(
    verdict_: Verdict,
    load: LoadResult,
    samples: Sequence[Sample],
    *,
    connections: int,
    duration: float,
    command: str,
    facts: dict[str, str],
    notes: Sequence[str],
) -> str:
    """The "Soak" section of bench/RESULTS.md."""
    rss = [s.rss_bytes for s in samples]
    lines = [
        HEADING,
        "",
        f"`{command}` — {connections} concurrent client connections for {duration:g} s through "
        "reshape with every reshaping behaviour on (shared pool with pipelining, dynamic TLS "
        "records, trailers with a synthesized Content-Digest), HTTPS to nginx on loopback; "
        "closed loop, one request in flight per connection (bench/loadgen).",
        "",
        f"**{'PASS' if verdict_.passed else 'FAIL'}**"
        + ("" if verdict_.passed else ": " + "; ".join(verdict_.reasons)),
        "",
        "| figure | value |",
        "| --- | --- |",
        f"| requests measured | {load.requests} |",
        f"| failed requests | {load.failed} |",
        f"| requests/s | {load.rps:.0f} |",
        f"| latency p50 / p99 / max ms | {load.p50_ms:.0f} / {load.p99_ms:.0f} / "
        f"{load.max_ms:.0f} |",
        f"| connections opened by the clients | {load.connects} |",
        f"| RSS min / max MiB | {mib(min(rss, default=0))} / {mib(max(rss, default=0))} |",
        f"| RSS early / late in the window MiB | {mib(verdict_.rss_early)} / "
        f"{mib(verdict_.rss_late)} |",
        f"| open fds before / peak / after | {verdict_.fds_before} / {verdict_.fds_peak} / "
        f"{verdict_.fds_after} |",
        f"| samples | {len(samples)} |",
        "",
        "RSS over the run (MiB, one value per tenth of the samples): "
        + ", ".join(mib(s.rss_bytes) for s in samples[:: max(1, len(samples) // 10)]),
        "",
    ]
    lines += [f"- {key}: {value}" for key, value in facts.items()]
    lines += [f"- {note}" for note in notes]
    return "\n".join(lines) + "\n"
