"""The lab's line charts, drawn by matplotlib in the style of `reshape report`'s charts.

A chart is one or more panels side by side sharing a y axis; each panel has series (points with
an interval, drawn as whiskers), horizontal reference lines and vertical markers. Figures use
matplotlib's object API and the Agg backend (no pyplot state), and `reshape report`'s style and
colours (reshape/report/charts.py), so the lab's charts and the report's look alike; PNGs carry no
date or version, so the same run gives the same bytes.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from reshape.report.charts import COLOURS, DPI, NOTE_COLOUR, STYLE

COLORS = COLOURS
PANEL_SIZE = (5.2, 4.6)  # inches per panel
MIN_WIDTH = 8.0  # inches: room for the title and the legend
_SPREAD = 0.012  # of the x range: series side by side around each x, so whiskers do not overlap
_PAD = 0.08  # of the x range, either side


@dataclass(frozen=True)
class Point:
    x: float
    y: float
    low: float | None = None  # interval around y, drawn as a whisker
    high: float | None = None


@dataclass(frozen=True)
class Series:
    name: str
    points: list[Point]
    color: str
    dashed: bool = False


@dataclass(frozen=True)
class Reference:
    """A horizontal line across the panel (a value that does not depend on x)."""

    name: str
    y: float
    color: str


@dataclass
class Panel:
    title: str
    x_label: str
    series: list[Series] = field(default_factory=list)
    references: list[Reference] = field(default_factory=list)
    markers: list[tuple[float, str]] = field(default_factory=list)  # vertical lines (x, label)
    x_ticks: list[float] | None = None


@dataclass
class Chart:
    title: str
    y_label: str
    panels: list[Panel]
    subtitle: str = ""


def write_pngs(charts: dict[Path, Chart]) -> None:
    """Draws every chart into its PNG path."""
    with matplotlib.rc_context(STYLE):
        for png, chart in charts.items():
            png.parent.mkdir(parents=True, exist_ok=True)
            figure(chart).savefig(png, format="png", metadata={"Software": None})


def figure(chart: Chart) -> Figure:
    count = len(chart.panels)
    width = max(MIN_WIDTH, PANEL_SIZE[0] * count)
    drawn = Figure(figsize=(width, PANEL_SIZE[1]), dpi=DPI, layout="constrained")
    FigureCanvasAgg(drawn)
    axes_list = drawn.subplots(1, count, sharey=True, squeeze=False)[0]
    for axes, panel in zip(axes_list, chart.panels, strict=True):
        _draw(axes, panel)
    axes_list[0].set_ylabel("\n".join(textwrap.wrap(chart.y_label, 40)))
    axes_list[0].set_ylim(bottom=0)
    # The subtitle (what the page is) wrapped to the figure's width, about 9 characters an inch.
    subtitle = textwrap.wrap(chart.subtitle, round(width * 9))
    drawn.suptitle("\n".join([chart.title, *subtitle]))
    handles, labels = [], []
    for axes in axes_list:
        for handle, label in zip(*axes.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    if handles:
        drawn.legend(handles, labels, loc="outside lower center", ncols=min(3, len(labels)))
    return drawn


def _draw(axes: Axes, panel: Panel) -> None:
    xs = panel.x_ticks or sorted({p.x for s in panel.series for p in s.points}) or [0.0]
    span = (max(xs) - min(xs)) or max(abs(xs[0]), 1.0)
    axes.set_xlim(min(xs) - _PAD * span, max(xs) + _PAD * span)
    for number, series in enumerate(panel.series):
        ordered = sorted(series.points, key=lambda p: p.x)
        if not ordered:
            continue
        shift = (number - (len(panel.series) - 1) / 2) * _SPREAD * span
        x = [p.x + shift for p in ordered]
        y = [p.y for p in ordered]
        below = [p.y - p.low if p.low is not None else 0.0 for p in ordered]
        above = [p.high - p.y if p.high is not None else 0.0 for p in ordered]
        axes.errorbar(
            x,
            y,
            yerr=[below, above],
            color=series.color,
            linestyle="--" if series.dashed else "-",
            marker="o",
            markersize=4,
            capsize=3,
            linewidth=1.6,
            label=series.name,
        )
    for reference in panel.references:
        axes.axhline(reference.y, color=reference.color, linestyle="--", label=reference.name)
    for x, label in panel.markers:
        axes.axvline(x, color=NOTE_COLOUR, linestyle=":", linewidth=1)
        axes.annotate(
            label,
            xy=(x, 1),
            xycoords=("data", "axes fraction"),
            xytext=(4, -12),
            textcoords="offset points",
            color=NOTE_COLOUR,
            fontsize=9,
        )
    if panel.x_ticks:
        axes.set_xticks(panel.x_ticks, [f"{t:g}" for t in panel.x_ticks])
    axes.set_title(panel.title)
    axes.set_xlabel(panel.x_label)
    axes.grid(axis="y", color="#e5e5e5")
