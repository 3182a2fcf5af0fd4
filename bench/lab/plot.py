"""Line charts as SVG, turned into PNG by the lab's own Chromium (labkit.browser.render_svgs).

No plotting library: matplotlib is not a dependency, and the lab already drives a browser that
renders SVG faithfully, fonts included. A chart is one or more panels side by side sharing a
y axis label; each panel has series (points with an interval), horizontal reference lines and
vertical markers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape
from pathlib import Path

from labkit.browser import SvgRender, render_svgs

WIDTH, PANEL_HEIGHT = 1000, 460
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf", "#7f7f7f")
_MARGIN = {"left": 70, "right": 20, "top": 78, "bottom": 95}
_GAP = 50


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
    """Renders every chart to its PNG path (one browser launch for all)."""
    jobs = []
    for png, chart in charts.items():
        png.parent.mkdir(parents=True, exist_ok=True)
        svg = png.with_suffix(".svg")
        svg.write_text(to_svg(chart))
        jobs.append(SvgRender(svg, png, WIDTH, PANEL_HEIGHT))
    if jobs:
        try:
            render_svgs(jobs)
        finally:
            for job in jobs:
                job.svg.unlink(missing_ok=True)


def to_svg(chart: Chart) -> str:
    count = len(chart.panels)
    inner = WIDTH - _MARGIN["left"] - _MARGIN["right"] - _GAP * (count - 1)
    panel_width = inner / count
    top, bottom = _MARGIN["top"], PANEL_HEIGHT - _MARGIN["bottom"]
    values = [
        v
        for panel in chart.panels
        for s in panel.series
        for p in s.points
        for v in (p.y, p.low, p.high)
        if v is not None and math.isfinite(v)
    ] + [r.y for panel in chart.panels for r in panel.references]
    y_ticks = _ticks(0.0, max(values, default=1.0))
    y_max = y_ticks[-1]
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{PANEL_HEIGHT}" '
        'font-family="DejaVu Sans, Liberation Sans, Arial, sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{PANEL_HEIGHT}" fill="#fff"/>',
        _text(WIDTH / 2, 22, chart.title, size=16, anchor="middle", weight="bold"),
        _text(WIDTH / 2, 40, chart.subtitle, size=12, anchor="middle", fill="#555"),
        _text(
            16,
            (top + bottom) / 2,
            chart.y_label,
            anchor="middle",
            rotate=-90,
        ),
    ]
    legend: dict[str, tuple[str, bool, bool]] = {}
    for index, panel in enumerate(chart.panels):
        left = _MARGIN["left"] + index * (panel_width + _GAP)
        right = left + panel_width
        xs = panel.x_ticks or sorted({p.x for s in panel.series for p in s.points} | {0.0})
        x_min, x_max = min(xs), max(xs)
        span = (x_max - x_min) or 1.0
        pad = span * 0.04

        def x_of(
            x: float, lo: float = x_min, sp: float = span, pd: float = pad, at: float = left
        ) -> float:
            return at + (x - lo + pd) / (sp + 2 * pd) * panel_width

        def y_of(y: float) -> float:
            return bottom - y / y_max * (bottom - top)

        parts.append(_text((left + right) / 2, top - 6, panel.title, anchor="middle", size=13))
        for tick in y_ticks:
            parts.append(_line(left, y_of(tick), right, y_of(tick), "#e5e5e5"))
            if index == 0:
                parts.append(_text(left - 6, y_of(tick) + 4, _fmt(tick), anchor="end"))
        for tick in xs:
            parts.append(_line(x_of(tick), bottom, x_of(tick), bottom + 4, "#333"))
            parts.append(_text(x_of(tick), bottom + 18, _fmt(tick), anchor="middle"))
        parts.append(_line(left, bottom, right, bottom, "#333"))
        parts.append(_line(left, top, left, bottom, "#333"))
        parts.append(_text((left + right) / 2, bottom + 36, panel.x_label, anchor="middle"))
        for x, label in panel.markers:
            parts.append(_line(x_of(x), top, x_of(x), bottom, "#999", dash="2,3"))
            parts.append(_text(x_of(x) + 4, top + 12, label, fill="#666", size=11))
        for reference in panel.references:
            y = y_of(reference.y)
            parts.append(_line(left, y, right, y, reference.color, dash="7,4", width=1.5))
            legend.setdefault(reference.name, (reference.color, True, False))
        for number, series in enumerate(panel.series):
            ordered = sorted(series.points, key=lambda p: p.x)
            if not ordered:
                continue
            # Series side by side around each x, a few pixels apart, so whiskers do not overlap.
            shift = (number - (len(panel.series) - 1) / 2) * 5
            path = " ".join(f"{x_of(p.x) + shift:.1f},{y_of(p.y):.1f}" for p in ordered)
            dash = ' stroke-dasharray="6,3"' if series.dashed else ""
            parts.append(
                f'<polyline points="{path}" fill="none" stroke="{series.color}" '
                f'stroke-width="2"{dash}/>'
            )
            for p in ordered:
                cx, cy = x_of(p.x) + shift, y_of(p.y)
                if p.low is not None and p.high is not None:
                    parts.append(_line(cx, y_of(p.low), cx, y_of(p.high), series.color))
                    for y in (p.low, p.high):
                        parts.append(_line(cx - 3, y_of(y), cx + 3, y_of(y), series.color))
                parts.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="3" fill="{series.color}"/>')
            legend.setdefault(series.name, (series.color, series.dashed, True))
    parts.append(_legend(legend, PANEL_HEIGHT - 30))
    parts.append("</svg>")
    return "\n".join(parts)


def _legend(entries: dict[str, tuple[str, bool, bool]], y: float) -> str:
    items = []
    x = _MARGIN["left"]
    for name, (color, dashed, dot) in entries.items():
        dash = ' stroke-dasharray="6,3"' if dashed else ""
        items.append(
            f'<line x1="{x}" y1="{y}" x2="{x + 24}" y2="{y}" stroke="{color}" '
            f'stroke-width="2"{dash}/>'
        )
        if dot:
            items.append(f'<circle cx="{x + 12}" cy="{y}" r="3" fill="{color}"/>')
        items.append(_text(x + 30, y + 4, name))
        x += 64 + 7.5 * len(name)  # line, gap, text (about 7.5 px a character), gap
        if x > WIDTH - 160:
            x = _MARGIN["left"]
            y += 18
    return "\n".join(items)


def _ticks(low: float, high: float, count: int = 6) -> list[float]:
    """Round tick values from `low` covering `high`."""
    if high <= low:
        high = low + 1
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    ticks = [low]
    while ticks[-1] < high:
        ticks.append(ticks[-1] + step)
    return ticks


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 10 or value == int(value) else f"{value:g}"


def _line(
    x1: float, y1: float, x2: float, y2: float, color: str, dash: str = "", width: float = 1
) -> str:
    dashed = f' stroke-dasharray="{dash}"' if dash else ""
    return (
        f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{color}" '
        f'stroke-width="{width}"{dashed}/>'
    )


def _text(
    x: float,
    y: float,
    text: str,
    *,
    anchor: str = "start",
    size: int = 12,
    fill: str = "#222",
    weight: str = "normal",
    rotate: int = 0,
) -> str:
    transform = f' transform="rotate({rotate} {x:.1f} {y:.1f})"' if rotate else ""
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-size="{size}" '
        f'fill="{fill}" font-weight="{weight}"{transform}>{escape(text)}</text>'
    )
