"""The report for programs: one JSON document (`--json`) or CSV rows (`--csv`).

Values are in base units (seconds, ratios 0-1, bytes, requests), as each measure's `unit` says;
intervals are 95%; p-values two-sided; `significant` is Holm's decision at 5% family-wise.

JSON: `{experiment, source, reference, level, alpha, measures: {key: {title, unit}}, arms: {arm:
{policies, estimates: {key: {value, low, high}}}}, comparisons: [{arm, reference, measures: {key:
{difference, low, high, p_value, test, significant}}}]}`; a value that cannot be known is null.

CSV: one row per arm and measure (`row` = `estimate`) and per compared arm and measure (`row` =
`comparison`), columns `row, arm, reference, measure, unit, value, low, high, p_value, test,
significant`; for a comparison `value` is the difference and low/high its interval.
"""

from __future__ import annotations

import csv
import io
from typing import Any

from reshape.report.analysis import ALPHA, MEASURES, Report
from reshape.report.stats import LEVEL, Interval

CSV_COLUMNS = (
    "row",
    "arm",
    "reference",
    "measure",
    "unit",
    "value",
    "low",
    "high",
    "p_value",
    "test",
    "significant",
)


def _bounds(interval: Interval | None) -> tuple[float | None, float | None]:
    return (interval.low, interval.high) if interval is not None else (None, None)


def report_document(report: Report) -> dict[str, Any]:
    arms = {}
    for name, data in report.data.arms.items():
        estimates = {}
        for measure in MEASURES:
            estimate = report.estimates[name][measure.key]
            low, high = _bounds(estimate.interval)
            estimates[measure.key] = {"value": estimate.value, "low": low, "high": high}
        arms[name] = {"policies": sorted(data.policies), "estimates": estimates}
    comparisons = []
    for compared in report.comparisons:
        measures = {}
        for measure in MEASURES:
            if measure.key == "requests":
                continue
            comparison = compared.comparisons[measure.key]
            low, high = _bounds(comparison.interval)
            measures[measure.key] = {
                "difference": comparison.difference,
                "low": low,
                "high": high,
                "p_value": comparison.p_value,
                "test": comparison.test,
                "significant": compared.significant[measure.key],
            }
        comparisons.append(
            {"arm": compared.arm, "reference": compared.reference, "measures": measures}
        )
    return {
        "experiment": report.data.experiment,
        "source": report.data.source,
        "reference": report.reference,
        "level": LEVEL,
        "alpha": ALPHA,
        "measures": {m.key: {"title": m.title, "unit": m.base_unit} for m in MEASURES},
        "arms": arms,
        "comparisons": comparisons,
    }


def csv_text(report: Report) -> str:
    document = report_document(report)
    units = {key: m["unit"] for key, m in document["measures"].items()}
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for arm, content in document["arms"].items():
        for key, estimate in content["estimates"].items():
            writer.writerow(
                {"row": "estimate", "arm": arm, "measure": key, "unit": units[key], **estimate}
            )
    for compared in document["comparisons"]:
        for key, result in compared["measures"].items():
            writer.writerow(
                {
                    "row": "comparison",
                    "arm": compared["arm"],
                    "reference": compared["reference"],
                    "measure": key,
                    "unit": units[key],
                    "value": result["difference"],
                    "low": result["low"],
                    "high": result["high"],
                    "p_value": result["p_value"],
                    "test": result["test"],
                    "significant": result["significant"],
                }
            )
    return buffer.getvalue()
