"""How the report shows a number: the measure's display unit and a sensible number of digits.

Values are kept in base units (seconds, shares 0-1, bytes); only what people read is scaled.
"""

from __future__ import annotations

from reshape.report.analysis import Measure
from reshape.report.stats import Comparison, Interval

NA = "n/a"


def scaled(value: float, measure: Measure) -> float:
    if measure.unit == "ms":
        return value * 1000
    if measure.unit == "%":
        return value * 100
    return value


def number(value: float, measure: Measure, signed: bool = False) -> str:
    value = scaled(value, measure)
    if measure.key == "requests":
        text = f"{value:.0f}"
    elif measure.key == "connections":
        text = f"{value:.3f}"
    elif abs(value) >= 100:
        text = f"{value:.0f}"
    else:
        text = f"{value:.3g}"
    return f"+{text}" if signed and not text.startswith("-") else text


def with_interval(value: float | None, interval: Interval | None, measure: Measure) -> str:
    if value is None:
        return NA
    text = number(value, measure)
    if interval is not None:
        text += f" [{number(interval.low, measure)}, {number(interval.high, measure)}]"
    return text


def title(measure: Measure) -> str:
    return f"{measure.title} ({measure.unit})" if measure.unit else measure.title


def p_value(p: float | None) -> str:
    if p is None:
        return "p=n/a"
    return f"p={p:.3g}" if p >= 1e-4 else f"p={p:.1e}"


def difference(comparison: Comparison, measure: Measure) -> str:
    if comparison.difference is None:
        return NA
    text = number(comparison.difference, measure, signed=True)
    if comparison.interval is not None:
        low, high = comparison.interval.low, comparison.interval.high
        text += f" [{number(low, measure, signed=True)}, {number(high, measure, signed=True)}]"
    return text
