"""The report as text (for a terminal), and as PNG charts (`--plot DIR`)."""

from __future__ import annotations

import re
from pathlib import Path

from reshape.report import png
from reshape.report.analysis import ALPHA, MEASURES, Estimate, Measure, Report
from reshape.report.stats import Comparison, Interval

NA = "n/a"


def _scaled(value: float, measure: Measure) -> float:
    if measure.unit == "ms":
        return value * 1000
    if measure.unit == "%":
        return value * 100
    return value


def _number(value: float, measure: Measure, signed: bool = False) -> str:
    scaled = _scaled(value, measure)
    if measure.key == "requests":
        text = f"{scaled:.0f}"
    elif measure.key == "connections":
        text = f"{scaled:.3f}"
    elif abs(scaled) >= 100:
        text = f"{scaled:.0f}"
    else:
        text = f"{scaled:.3g}"
    return f"+{text}" if signed and not text.startswith("-") else text


def _with_interval(value: float | None, interval: Interval | None, measure: Measure) -> str:
    if value is None:
        return NA
    text = _number(value, measure)
    if interval is not None:
        text += f" [{_number(interval.low, measure)}, {_number(interval.high, measure)}]"
    return text


def _title(measure: Measure) -> str:
    return f"{measure.title} ({measure.unit})" if measure.unit else measure.title


def _p(p: float | None) -> str:
    if p is None:
        return "p=n/a"
    return f"p={p:.3g}" if p >= 1e-4 else f"p={p:.1e}"


def _difference(comparison: Comparison, measure: Measure) -> str:
    if comparison.difference is None:
        return NA
    text = _number(comparison.difference, measure, signed=True)
    if comparison.interval is not None:
        low, high = comparison.interval.low, comparison.interval.high
        text += f" [{_number(low, measure, signed=True)}, {_number(high, measure, signed=True)}]"
    return text


def text_report(report: Report) -> str:
    arms = list(report.data.arms)
    described = [f"{a} (policy {', '.join(sorted(report.data.arms[a].policies))})" for a in arms]
    lines = [
        f"experiment {report.data.experiment} — {report.data.source}",
        f"arms: {'; '.join(described)}; reference: {report.reference}; [95% intervals]",
        "",
    ]
    width = max(len(_title(m)) for m in MEASURES) + 2
    column = 30
    lines.append("".ljust(width) + "".join(a.ljust(column) for a in arms).rstrip())
    for measure in MEASURES:
        cells = []
        for arm in arms:
            estimate: Estimate = report.estimates[arm][measure.key]
            cells.append(_with_interval(estimate.value, estimate.interval, measure).ljust(column))
        lines.append(_title(measure).ljust(width) + "".join(cells).rstrip())
    for compared in report.comparisons:
        lines += ["", f"{compared.arm} − {compared.reference}: difference [95% interval], p-value"]
        for measure in MEASURES:
            if measure.key == "requests":
                continue
            comparison = compared.comparisons[measure.key]
            mark = "  significant" if compared.significant[measure.key] else ""
            test = f"({measure.test})" if comparison.p_value is not None else ""
            lines.append(
                f"  {_title(measure).ljust(width)}{_difference(comparison, measure).ljust(36)}"
                f"{_p(comparison.p_value)} {test}{mark}".rstrip()
            )
        names = [m.title for m in MEASURES if compared.significant.get(m.key)]
        lines.append(
            f"  significant at {ALPHA:.0%} family-wise (Holm): {', '.join(names) or 'none'}"
        )
    lines.append(
        "latency p-values test the whole distribution (the p50 and p95 rows share one); "
        "see `pydoc reshape.report` for the statistics"
    )
    return "\n".join(lines) + "\n"


def write_plots(report: Report, directory: Path) -> list[Path]:
    """One PNG per measure that has a value for some arm: each arm's estimate and interval."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for measure in MEASURES:
        bars = []
        for arm, by_measure in report.estimates.items():
            estimate = by_measure[measure.key]
            if estimate.value is None:
                continue
            interval = estimate.interval
            bars.append(
                png.Bar(
                    arm,
                    _scaled(estimate.value, measure),
                    _scaled(interval.low, measure) if interval else None,
                    _scaled(interval.high, measure) if interval else None,
                )
            )
        if not bars:
            continue
        slug = re.sub(r"[^a-z0-9]+", "-", measure.key.lower()).strip("-")
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", report.data.experiment)
        path = directory / f"{name}-{slug}.png"
        png.bar_chart(path, f"{report.data.experiment}: {_title(measure)}", bars)
        written.append(path)
    return written
