"""The report as text, for a terminal."""

from __future__ import annotations

from reshape.report import display
from reshape.report.analysis import ALPHA, MEASURES, Estimate, Report


def text_report(report: Report) -> str:
    arms = list(report.data.arms)
    described = [
        f"{a} (policy {', '.join(sorted(report.data.arms[a].policies)) or 'not recorded'})"
        for a in arms
    ]
    lines = [
        f"experiment {report.data.experiment} — {report.data.source}",
        f"arms: {'; '.join(described)}; reference: {report.reference}; [95% intervals]",
        "",
    ]
    width = max(len(display.title(m)) for m in MEASURES) + 2
    column = 30
    lines.append("".ljust(width) + "".join(a.ljust(column) for a in arms).rstrip())
    for measure in MEASURES:
        cells = []
        for arm in arms:
            estimate: Estimate = report.estimates[arm][measure.key]
            cells.append(
                display.with_interval(estimate.value, estimate.interval, measure).ljust(column)
            )
        lines.append(display.title(measure).ljust(width) + "".join(cells).rstrip())
    for compared in report.comparisons:
        lines += ["", f"{compared.arm} − {compared.reference}: difference [95% interval], p-value"]
        for measure in MEASURES:
            if measure.key == "requests":
                continue
            comparison = compared.comparisons[measure.key]
            mark = "  significant" if compared.significant[measure.key] else ""
            test = f"({comparison.test})" if comparison.p_value is not None else ""
            lines.append(
                f"  {display.title(measure).ljust(width)}"
                f"{display.difference(comparison, measure).ljust(36)}"
                f"{display.p_value(comparison.p_value)} {test}{mark}".rstrip()
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
