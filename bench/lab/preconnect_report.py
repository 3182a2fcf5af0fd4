"""Tables and charts of the lab's `preconnect` experiment (its section is lab_report's)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from statistics import median

from bench.lab.plot import Chart
from bench.lab.report import (
    Run,
    markdown_table,
    plt_charts,
    plt_tables,
    summaries,
)
from bench.lab.runner import Cell

BASELINE = "preconnect-off"


def preconnect_tables(run: Run) -> dict[str, str]:
    """Per page: load time per origin variant, config and RTT (the plt experiment's tables)."""
    return plt_tables(run)


def preconnect_overview(run: Run) -> str:
    """Per origin variant and RTT: each mode's median load time against off, the connections
    the origins accepted, and the warm connections used and wasted."""
    stats = summaries(run.loads)
    header = [
        "origins",
        "RTT",
        "config",
        "median ms",
        "vs off",
        "origin conns",
        "preconnects used",
        "preconnects unused",
        "wasted share",
    ]
    rows = []
    for page in run.experiment.pages:
        for variant in run.experiment.variants:
            for link in run.experiment.links:
                base = stats.get(Cell(variant, page, BASELINE, link))
                for config in [c.name for c in run.configs]:
                    cell = Cell(variant, page, config, link)
                    loads = [x for x in run.loads if x.cell == cell and x.error is None]
                    own = stats.get(cell)
                    used = sum(x.preconnects_used for x in loads)
                    unused = sum(x.preconnects_unused for x in loads)
                    rows.append(
                        [
                            variant,
                            link,
                            run.label(config),
                            f"{own.median:,.0f}" if own else "failed",
                            _change(own.median, base.median)
                            if own and base and config != BASELINE
                            else "",
                            _typical([x.origin_connections for x in loads]),
                            _typical([x.preconnects_used for x in loads]),
                            _typical([x.preconnects_unused for x in loads]),
                            f"{unused / (used + unused):.0%}" if used + unused else "-",
                        ]
                    )
    return (
        "Policies: `upstream: {}` and `preconnect: {mode: M}`, every other knob at its default "
        "(static: 2 connections per origin on first sight; learned: min_confidence 0.75, rule "
        "history, at most 2 per origin). Preconnect against off, per load (medians; `origin "
        "conns`: connections the origins accepted, warm ones included; `wasted share`: unused / "
        "all warm connections over the cell's loads, the PromQL expression in "
        "policies/README.md):\n\n" + markdown_table(header, rows)
    )


def preconnect_charts(run: Run, directory: Path) -> dict[Path, Chart]:
    """The plt experiment's charts, under this experiment's names."""
    charts = {}
    for path, chart in plt_charts(run, directory).items():
        page = path.stem.removeprefix("lab-plt-")
        charts[directory / f"lab-preconnect-{page}.png"] = dataclasses.replace(
            chart, title=f"preconnect: {page}"
        )
    return charts


def _typical(values: list[int]) -> str:
    return f"{median(values):g}" if values else "-"


def _change(value: float, base: float) -> str:
    return f"{(value / base - 1) * 100:+.0f}%" if base else "-"
