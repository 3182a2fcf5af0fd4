"""The table and the RESULTS.md section of bench/ttfb."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from bench.ttfb.browser import PageTiming

HEADING = "## TTFB and record sizes (bench/ttfb)"
BASELINE = "reshape-16k"
# (column, PageTiming attribute, whether to show the difference to 16 KB records)
METRICS = (
    ("first bytes usable", "first_bytes_ms", True),
    ("response head", "response_start_ms", False),
    ("head → first bytes", "head_to_first_bytes_ms", True),
    ("FCP", "fcp_ms", True),
    ("HTML done", "html_end_ms", False),
    ("load", "load_ms", False),
)


@dataclass(frozen=True)
class Row:
    """Every load of one configuration over one link."""

    link: str
    config: str
    timings: tuple[PageTiming, ...]
    failures: int

    def median(self, field: str) -> float | None:
        values = [getattr(t, field) for t in self.timings]
        return statistics.median(values) if values else None


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _delta(row: Row, baseline: Row | None, field: str) -> str:
    own, base = row.median(field), baseline.median(field) if baseline else None
    if row is baseline or own is None or base is None:
        return "-"
    return f"{own - base:+,.0f}"


def table(rows: Sequence[Row]) -> str:
    header = ["link", "config", "loads"]
    for name, _, with_delta in METRICS:
        header.append(f"{name} ms")
        if with_delta:
            header.append("Δ vs 16k")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        baseline = next((r for r in rows if r.link == row.link and r.config == BASELINE), None)
        cells = [row.link, row.config, f"{len(row.timings)}/{len(row.timings) + row.failures}"]
        for _, field, with_delta in METRICS:
            cells.append(_ms(row.median(field)))
            if with_delta:
                cells.append(_delta(row, baseline, field))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def section(
    *, when: str, command: str, setup: str, rows: Sequence[Row], notes: str, facts: dict[str, str]
) -> str:
    """The whole RESULTS.md section, heading included, ending in one newline."""
    listed = "\n".join(f"- {key}: {value}" for key, value in facts.items())
    parts = [
        HEADING,
        f"Recorded {when} with `{command}`; medians over the loads.",
        f"Setup:\n\n{setup}",
        table(rows),
        f"What it shows and what it does not:\n\n{notes}",
        f"Machine and versions:\n\n{listed}",
    ]
    return "\n\n".join(parts) + "\n"
