"""The report's charts, drawn by matplotlib: one per measure, and the latency distributions.

Per measure: each arm's estimate as a bar with its 95% interval, the value written on the bar,
labelled axes, a note of the comparisons Holm found significant. Latency: the whole distribution
of each arm (empirical CDF from the log; cumulative bucket counts from Prometheus) on a log time
axis, with the p50 and p95 lines. Each arm keeps its colour in every chart.

Figures are made with matplotlib's object API (no pyplot state, the Agg backend), so several
reports in one process never share a figure; PNG for `--plot DIR`, SVG inside `--html`.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.typing import RcKeyType

from reshape.report import display
from reshape.report.analysis import MEASURES, Measure, Report

# Colour-blind-safe (Okabe-Ito); the reference arm gets the first.
COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")
STYLE: dict[RcKeyType, Any] = {
    "font.family": "DejaVu Sans",  # shipped with matplotlib: the same everywhere
    "font.size": 11,
    "axes.titlesize": 13,
    "axes.labelsize": 11,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "svg.fonttype": "path",  # text as outlines: the SVG needs no font installed
}
NOTE_COLOUR = "#555555"
SIZE = (7.0, 4.2)  # inches
DPI = 110


@dataclass(frozen=True)
class Chart:
    slug: str  # for file names: "connections", "latency-distribution", …
    title: str
    figure: Figure


def arm_colours(report: Report) -> dict[str, str]:
    names = [report.reference, *(a for a in report.data.arms if a != report.reference)]
    return {name: COLOURS[i % len(COLOURS)] for i, name in enumerate(names)}


def _figure() -> Figure:
    figure = Figure(figsize=SIZE, dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def measure_chart(report: Report, measure: Measure) -> Chart | None:
    """Bars with interval whiskers, one per arm with a value; None if no arm has one."""
    arms = [arm for arm in report.data.arms if report.estimates[arm][measure.key].value is not None]
    if not arms:
        return None
    colours = arm_colours(report)
    figure = _figure()
    axes = figure.add_subplot()
    values, lows, highs, labels = [], [], [], []
    for arm in arms:
        estimate = report.estimates[arm][measure.key]
        assert estimate.value is not None
        value = display.scaled(estimate.value, measure)
        interval = estimate.interval
        values.append(value)
        labels.append(display.number(estimate.value, measure))
        lows.append(value - display.scaled(interval.low, measure) if interval else 0.0)
        highs.append(display.scaled(interval.high, measure) - value if interval else 0.0)
    positions = np.arange(len(arms))
    axes.bar(
        positions,
        values,
        yerr=[lows, highs],
        capsize=6,
        color=[colours[a] for a in arms],
        error_kw={"elinewidth": 1.4, "ecolor": "#333333"},
        width=0.6,
    )
    for position, value, high, label in zip(positions, values, highs, labels, strict=True):
        axes.annotate(  # above the whisker, not on it
            label,
            xy=(position, value + high),
            xytext=(0, 4),
            textcoords="offset points",
            ha="center",
            va="bottom",
        )
    axes.set_xticks(positions, arms)
    axes.set_xlabel("arm")
    axes.set_ylabel(measure.axis)
    axes.set_ylim(bottom=0)
    axes.margins(y=0.2)
    chart_title = f"{report.data.experiment}: {measure.title}"
    figure.suptitle(chart_title)
    notes = ["whiskers: 95% interval"]
    for compared in report.comparisons:
        if compared.significant.get(measure.key):
            notes.append(f"{compared.arm} differs from {compared.reference} (Holm, 5%)")
    axes.set_title("; ".join(notes), fontsize=9, color=NOTE_COLOUR)
    return Chart(measure.key.replace("_", "-"), chart_title, figure)


def _distribution(report: Report, arm: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(latency in ms, share of requests at or below it), for a step line."""
    data = report.data.arms[arm]
    if data.latencies:
        values = np.sort(np.asarray(data.latencies)) * 1000
        return values, np.arange(1, len(values) + 1) / len(values)
    histogram = data.histogram
    if histogram is not None and histogram.total > 0:
        bounds = np.asarray(histogram.bounds)
        finite = np.isfinite(bounds)
        shares = np.asarray(histogram.counts)[finite] / histogram.total
        return bounds[finite] * 1000, shares
    return None


def latency_chart(report: Report) -> Chart | None:
    """Each arm's latency distribution; None without latencies."""
    curves = {}
    for arm in report.data.arms:
        curve = _distribution(report, arm)
        if curve is not None:
            curves[arm] = curve
    if not curves:
        return None
    colours = arm_colours(report)
    figure = _figure()
    axes = figure.add_subplot()
    for arm, (x, y) in curves.items():
        positive = x > 0
        axes.step(x[positive], y[positive], where="post", color=colours[arm], label=arm, lw=2)
    smallest = min(float(x[x > 0].min()) for x, _ in curves.values() if np.any(x > 0))
    axes.set_xscale("log")
    axes.set_xlim(left=max(smallest / 1.5, 1e-3))
    axes.set_ylim(0, 1.02)
    for share in (0.5, 0.95):
        axes.axhline(share, color="#999999", lw=0.8, ls="--")
        axes.annotate(
            f"p{round(share * 100)}",
            xy=(1, share),
            xycoords=("axes fraction", "data"),
            xytext=(-4, 3),
            textcoords="offset points",
            ha="right",
            fontsize=9,
            color=NOTE_COLOUR,
        )
    axes.set_xlabel("transaction latency (ms, log scale)")
    axes.set_ylabel("share of requests at or below")
    chart_title = f"{report.data.experiment}: latency distribution"
    figure.suptitle(chart_title)
    axes.legend(title="arm", loc="lower right")
    if any(report.data.arms[a].latencies for a in curves):
        note = "empirical CDF of every request"
    else:
        note = "cumulative histogram buckets (as Prometheus keeps them)"
    axes.set_title(note, fontsize=9, color=NOTE_COLOUR)
    return Chart("latency-distribution", chart_title, figure)


def charts(report: Report) -> Iterator[Chart]:
    """The latency distributions, then one chart per measure with a value."""
    # The style applies to these figures only; matplotlib's global settings stay as they were.
    with matplotlib.rc_context(STYLE):
        latency = latency_chart(report)
        if latency is not None:
            yield latency
        for measure in MEASURES:
            chart = measure_chart(report, measure)
            if chart is not None:
                yield chart


def image(chart: Chart, image_format: str) -> bytes:
    buffer = io.BytesIO()
    with matplotlib.rc_context(STYLE):
        chart.figure.savefig(buffer, format=image_format, metadata=_metadata(image_format))
    return buffer.getvalue()


def _metadata(image_format: str) -> dict[str, str | None]:
    # No creation date or software version in the files: the same report gives the same bytes.
    if image_format == "svg":
        return {"Date": None, "Creator": None}
    return {"Software": None}


def write_plots(report: Report, directory: Path) -> list[Path]:
    """One PNG per chart into `directory`, named after the experiment and the chart."""
    directory.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", report.data.experiment)
    written = []
    for chart in charts(report):
        path = directory / f"{name}-{chart.slug}.png"
        path.write_bytes(image(chart, "png"))
        written.append(path)
    return written
