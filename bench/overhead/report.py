"""bench/overhead's results: the comparison table, the versions, and the RESULTS.md section.

Pure functions over `Measurement`s, so the table and the section can be checked without a run.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from bench import runs
from bench.loadgen.runner import LoadResult

HEADING = "## Overhead (bench/overhead)"
COLUMNS = (
    "config",
    "scheme",
    "req/s",
    "p50 ms",
    "p99 ms",
    "added p50 ms",
    "added p99 ms",
    "vs mitmdump",
    "vs squid",
    "proxy CPU ms/req",
    "proxy cores",
    "errors",
    "connects",
)


@dataclass(frozen=True)
class Measurement:
    """Every round of one configuration over one scheme; figures are medians over the rounds."""

    config: str
    label: str
    scheme: str
    runs: tuple[LoadResult, ...]
    # The proxy's CPU seconds (all its processes) over each run's measured window; none for direct.
    proxy_cpu_s: tuple[float, ...] = ()

    @property
    def rps(self) -> float:
        return statistics.median(run.rps for run in self.runs)

    @property
    def p50_ms(self) -> float:
        return statistics.median(run.p50_ms for run in self.runs)

    @property
    def p99_ms(self) -> float:
        return statistics.median(run.p99_ms for run in self.runs)

    @property
    def cpu_ms_per_request(self) -> float | None:
        """The proxy's CPU time per request: what a request costs, however busy the machine."""
        if not self.proxy_cpu_s:
            return None
        per_request = [
            1000 * cpu / run.requests
            for cpu, run in zip(self.proxy_cpu_s, self.runs, strict=True)
            if run.requests
        ]
        return statistics.median(per_request) if per_request else None

    @property
    def cores(self) -> float | None:
        """CPU cores the proxy kept busy on average while measured."""
        if not self.proxy_cpu_s:
            return None
        busy = [
            cpu / run.duration_s
            for cpu, run in zip(self.proxy_cpu_s, self.runs, strict=True)
            if run.duration_s > 0
        ]
        return statistics.median(busy) if busy else None

    @property
    def errors(self) -> int:
        """Failed requests over all rounds, warmup included: any is a failed benchmark."""
        return sum(run.failed for run in self.runs)

    @property
    def connects(self) -> int:
        """Connections opened per round (at most): above `-c` means the peer closed some."""
        return max(run.connects for run in self.runs)


def _find(measurements: Sequence[Measurement], config: str, scheme: str) -> Measurement | None:
    return next((m for m in measurements if m.config == config and m.scheme == scheme), None)


def _ms(value: float) -> str:
    if abs(value) < 10:
        return f"{value:.2f}"
    if abs(value) < 100:
        return f"{value:.1f}"
    return f"{value:.0f}"


def _added(value: float, base: Measurement | None, own: Measurement) -> str:
    if base is None or base is own:
        return "-"
    return ("+" if value >= 0 else "") + _ms(value)


def _rps(m: Measurement) -> str:
    """Median req/s, with the range over rounds when there were several: how noisy the run was."""
    if len(m.runs) == 1:
        return f"{m.rps:,.0f}"
    rates = [run.rps for run in m.runs]
    return f"{m.rps:,.0f} ({min(rates):,.0f}–{max(rates):,.0f})"


def _ratio(own: Measurement, peer: Measurement | None) -> str:
    if peer is None or peer.rps <= 0:
        return "-"
    return f"{own.rps / peer.rps:.2f}x"


def table_rows(measurements: Sequence[Measurement]) -> list[tuple[str, ...]]:
    """One row of COLUMNS per measurement, with added latency and ratios within its scheme."""
    rows: list[tuple[str, ...]] = []
    for m in measurements:
        direct = _find(measurements, "direct", m.scheme)
        rows.append(
            (
                m.label,
                m.scheme,
                _rps(m),
                _ms(m.p50_ms),
                _ms(m.p99_ms),
                _added(m.p50_ms - direct.p50_ms, direct, m) if direct else "-",
                _added(m.p99_ms - direct.p99_ms, direct, m) if direct else "-",
                _ratio(m, _find(measurements, "mitmdump", m.scheme)),
                _ratio(m, _find(measurements, "squid", m.scheme)),
                "-" if m.cpu_ms_per_request is None else f"{m.cpu_ms_per_request:.3f}",
                "-" if m.cores is None else f"{m.cores:.2f}",
                str(m.errors),
                str(m.connects),
            )
        )
    return rows


def markdown_table(measurements: Sequence[Measurement]) -> str:
    rows = [COLUMNS, *table_rows(measurements)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]

    def line(cells: Sequence[str]) -> str:
        padded = (cell.ljust(width) for cell, width in zip(cells, widths, strict=True))
        return "| " + " | ".join(padded) + " |"

    separator = "| " + " | ".join("-" * w for w in widths) + " |"
    return "\n".join([line(rows[0]), separator, *(line(row) for row in rows[1:])])


def target_lines(measurements: Sequence[Measurement]) -> list[str]:
    """The issues' targets: reshape ≥ plain mitmdump, the pool ≥ 1.5× mitmdump, and workers
    scaling with cores.

    Besides req/s, which a busy machine skews, each comparison gives CPU time per request, which
    it skews much less.
    """
    lines = []
    for scheme in ("http", "https", "h2"):
        reshape = _find(measurements, "reshape", scheme)
        mitmdump = _find(measurements, "mitmdump", scheme)
        if reshape and mitmdump and mitmdump.rps > 0:
            ratio = reshape.rps / mitmdump.rps
            verdict = "met" if ratio >= 1 else "NOT met"
            lines.append(
                f"reshape / mitmdump, {scheme}: {ratio:.2f}x req/s (target >= 1: {verdict})"
                + _cpu_ratio(reshape, mitmdump)
            )
        pooled = _find(measurements, "reshape-pooled", scheme)
        if pooled and mitmdump and mitmdump.rps > 0:
            ratio = pooled.rps / mitmdump.rps
            lines.append(
                f"reshape (upstream pool) / mitmdump, {scheme}: {ratio:.2f}x req/s (target >= 1.5:"
                f" {'met' if ratio >= 1.5 else 'NOT met'})" + _cpu_ratio(pooled, mitmdump)
            )
        if reshape and pooled and reshape.rps > 0:
            lines.append(
                f"reshape (upstream pool) / reshape, {scheme}: {pooled.rps / reshape.rps:.2f}x"
                " req/s — policies/pooled.yaml's pool against the default policy's"
                + _cpu_ratio(pooled, reshape)
            )
        workers = _find(measurements, "reshape-w2", scheme)
        if reshape and workers and reshape.rps > 0:
            lines.append(
                f"reshape --workers 2 / reshape, {scheme}: {workers.rps / reshape.rps:.2f}x req/s"
                f" on {len(os.sched_getaffinity(0))} cores shared with the load generator and"
                f" nginx; {workers.cores or 0:.2f} vs {reshape.cores or 0:.2f} cores busy"
                + _cpu_ratio(workers, reshape)
            )
    return lines


def _cpu_ratio(own: Measurement, peer: Measurement) -> str:
    if own.cpu_ms_per_request is None or not peer.cpu_ms_per_request:
        return ""
    return f"; {own.cpu_ms_per_request / peer.cpu_ms_per_request:.2f}x CPU per request"


def versions(go: str, squid: str | None) -> dict[str, str]:
    found = {
        "nginx": runs.first_line(["/usr/sbin/nginx", "-v"]),
        "mitmproxy": importlib.metadata.version("mitmproxy"),
        "reshape": runs.package_version("reshape"),
        "Python": platform.python_version(),
        "Go (loadgen)": runs.first_line([go, "version"]),
    }
    if squid:
        found["squid"] = squid
    return found


def section(
    *,
    when: str,
    command: str,
    setup: str,
    machine_facts: dict[str, str],
    version_facts: dict[str, str],
    measurements: Sequence[Measurement],
    notes: Sequence[str],
    profiles: Sequence[str] = (),
) -> str:
    """The whole RESULTS.md section, heading included, ending in one newline."""
    facts = "\n".join(
        f"- {key}: {value}" for key, value in {**machine_facts, **version_facts}.items()
    )
    targets = "\n".join(f"- {line}" for line in target_lines(measurements))
    if targets:
        targets = f"Targets from the issue:\n\n{targets}"
    extra = "\n".join(f"- {note}" for note in notes)
    if extra:
        extra = f"Notes:\n\n{extra}"
    parts = [
        HEADING,
        f"Recorded {when} with `{command}`.",
        f"Setup:\n\n{setup}",
        markdown_table(measurements),
        targets,
        extra,
        "\n".join(profiles),
        f"Machine and versions:\n\n{facts}",
    ]
    return "\n\n".join(part for part in parts if part) + "\n"
