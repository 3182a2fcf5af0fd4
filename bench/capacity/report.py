"""bench/capacity's results: the capacity table, the table of every step, the RESULTS.md section.

Pure functions over `StepSummary`s and searches, so tables and sections can be checked without a
run. `section` serves bench/queueing too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from bench.capacity.search import CapacitySearch

HEADING = "## Capacity (bench/capacity)"
SEARCH, RERUN = "search", "re-run"


@dataclass(frozen=True)
class StepSummary:
    """One step of one configuration: what its users saw and what the servers spent."""

    config: str
    users: int
    phase: str  # SEARCH or RERUN
    passed: bool
    pages: int
    good_share: float  # pages good (no error) and within the goal
    p50_s: float
    p90_s: float
    requests_per_s: float
    origin_connections: int  # connections opened to Apache during the step
    timeouts: int  # pages abandoned after the page timeout
    errors: int  # pages with a wrong status or size, or a failed connection
    error_samples: tuple[str, ...]
    proxy_cores: float | None
    # Time the proxy's threads were ready to run but got no core, per second of the window
    # (several threads can wait at once): CPU that other work took from it.
    proxy_waiting: float | None
    apache_cores: float
    client_cores: float
    client_waiting: float  # the same as proxy_waiting, for the simulated users' process
    # Missed the goal while the proxy or the users waited for cores other work had: the step
    # was run again (see `repeated`).
    contended: bool
    queued_share: float | None  # requests that waited for a pooled connection (reshape's)
    h2_connections: int | None
    load_average: float  # the machine's 1-minute load average at the end of the step


@dataclass(frozen=True)
class ConfigResult:
    config: str
    label: str
    per_host: int
    origin_limit: str  # what caps the connections to Apache
    search: CapacitySearch
    steps: tuple[StepSummary, ...]

    def at(self, users: int, phase: str = SEARCH) -> StepSummary | None:
        """The step that gave the verdict for `users` in `phase` (the last one run)."""
        return next(
            (s for s in reversed(self.steps) if s.users == users and s.phase == phase), None
        )

    @property
    def errors(self) -> int:
        return sum(s.errors for s in self.steps)


def _seconds(value: float) -> str:
    return "timeout" if math.isinf(value) else f"{value:.2f}"


def _cores(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _verdict(step: StepSummary | None) -> str:
    if step is None:
        return "-"
    return f"{'ok' if step.passed else 'FAIL'} ({100 * step.good_share:.0f}%)"


def capacity_table(results: Sequence[ConfigResult], baseline: str) -> str:
    """One row per configuration: its capacity and what the steps around it looked like."""
    base = next((r for r in results if r.config == baseline), None)
    header = (
        "config",
        "browser conns/user",
        "conns to Apache",
        "capacity (users)",
        f"vs {base.label if base else baseline}",
        "re-run at C / C+1",
        "p90 page s at C",
        "req/s at C",
        "proxy cores at C",
        "first failing step",
        "steps",
        "errors",
    )
    rows = [header]
    for result in results:
        capacity = result.search.capacity
        at = result.at(capacity)
        ceiling = result.search.ceiling
        failing = result.at(ceiling) if ceiling is not None else None
        ratio = "-"
        if base is not None and base.search.capacity > 0:
            ratio = f"{capacity / base.search.capacity:.2f}x"
        rerun = (
            f"{_verdict(result.at(capacity, RERUN))} / {_verdict(result.at(capacity + 1, RERUN))}"
        )
        first_failing = "-"
        if failing is not None:
            first_failing = (
                f"{failing.users} users: {100 * failing.good_share:.0f}% good, "
                f"p90 {_seconds(failing.p90_s)} s"
                + (f", proxy {failing.proxy_cores:.2f} cores" if failing.proxy_cores else "")
                + (
                    f" (+{failing.proxy_waiting:.2f} waiting)"
                    if failing.proxy_waiting is not None
                    else ""
                )
            )
        rows.append(
            (
                result.label,
                str(result.per_host),
                result.origin_limit,
                result.search.label(),
                ratio,
                rerun if capacity else "-",
                _seconds(at.p90_s) if at else "-",
                f"{at.requests_per_s:.0f}" if at else "-",
                _cores(at.proxy_cores) if at else "-",
                first_failing,
                str(sum(1 for s in result.steps if s.phase == SEARCH)),
                str(result.errors),
            )
        )
    return _markdown(rows)


def steps_table(results: Sequence[ConfigResult]) -> str:
    """Every step, in the order of each configuration's search, re-runs last."""
    header = (
        "config",
        "users",
        "phase",
        "goal",
        "pages",
        "good %",
        "p50 s",
        "p90 s",
        "req/s",
        "new conns to Apache",
        "queued %",
        "proxy cores",
        "proxy CPU wait",
        "Apache cores",
        "client cores",
        "client CPU wait",
        "timeouts",
        "errors",
        "load avg",
    )
    rows = [header]
    for result in results:
        for step in result.steps:
            rows.append(
                (
                    result.label,
                    str(step.users),
                    step.phase + (" (contended, run again)" if step.contended else ""),
                    "met" if step.passed else "missed",
                    str(step.pages),
                    f"{100 * step.good_share:.0f}",
                    _seconds(step.p50_s),
                    _seconds(step.p90_s),
                    f"{step.requests_per_s:.0f}",
                    str(step.origin_connections),
                    "-" if step.queued_share is None else f"{100 * step.queued_share:.0f}",
                    _cores(step.proxy_cores),
                    _cores(step.proxy_waiting),
                    f"{step.apache_cores:.2f}",
                    f"{step.client_cores:.2f}",
                    f"{step.client_waiting:.2f}",
                    str(step.timeouts),
                    str(step.errors),
                    f"{step.load_average:.1f}",
                )
            )
    return _markdown(rows)


def _markdown(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    separator = "| " + " | ".join("-" * w for w in widths) + " |"
    return "\n".join([line(rows[0]), separator, *(line(row) for row in rows[1:])])


def section(
    *,
    heading: str,
    when: str,
    command: str,
    setup: str,
    tables: Sequence[str],
    findings: Sequence[str],
    notes: Sequence[str],
    facts: dict[str, str],
) -> str:
    """A whole RESULTS.md section, heading included, ending in one newline."""
    parts = [heading, f"Recorded {when} with `{command}`.", f"Setup:\n\n{setup}", *tables]
    if findings:
        parts.append("Findings:\n\n" + "\n".join(f"- {line}" for line in findings))
    if notes:
        parts.append("Notes:\n\n" + "\n".join(f"- {line}" for line in notes))
    parts.append(
        "Machine and versions:\n\n" + "\n".join(f"- {key}: {value}" for key, value in facts.items())
    )
    return "\n\n".join(parts) + "\n"
