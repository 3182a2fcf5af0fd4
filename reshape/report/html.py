"""The report as one self-contained HTML page (`--html FILE`): the tables and the charts.

Everything is inside the file — style inline, charts as SVG data URIs, no script, nothing
fetched — so it can be mailed, attached to a ticket or opened offline and looks the same.
"""

from __future__ import annotations

import base64
from html import escape

from reshape.report import display
from reshape.report.analysis import ALPHA, MEASURES, Report
from reshape.report.charts import arm_colours, charts, image

STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; color: #1d2330; max-width: 64rem;
       margin: 2rem auto; padding: 0 1rem; }
h1 { font-size: 1.5rem; margin-bottom: .2rem; }
h2 { font-size: 1.15rem; margin-top: 2rem; }
.source { color: #555; margin-top: 0; }
table { border-collapse: collapse; margin: .6rem 0; }
th, td { padding: .3rem .7rem; border-bottom: 1px solid #d8dde6; text-align: left; }
td.number { font-variant-numeric: tabular-nums; }
.swatch { display: inline-block; width: .8em; height: .8em; border-radius: 2px;
          margin-right: .35em; vertical-align: baseline; }
.significant { font-weight: 600; color: #8a3b00; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(28rem, 1fr));
          gap: 1rem; }
figure { margin: 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #e4e7ee; }
figcaption { color: #555; font-size: .9rem; }
.notes { color: #555; font-size: .9rem; }
"""


def _arm_heading(arm: str, colour: str, policies: str) -> str:
    return (
        f'<th><span class="swatch" style="background:{colour}"></span>{escape(arm)}'
        f"<br><small>policy {escape(policies)}</small></th>"
    )


def html_report(report: Report) -> str:
    data = report.data
    colours = arm_colours(report)
    arms = list(data.arms)
    head = "".join(
        _arm_heading(
            arm, colours[arm], ", ".join(sorted(data.arms[arm].policies)) or "not recorded"
        )
        for arm in arms
    )
    rows = []
    for measure in MEASURES:
        cells = "".join(
            '<td class="number">'
            + escape(
                display.with_interval(
                    report.estimates[arm][measure.key].value,
                    report.estimates[arm][measure.key].interval,
                    measure,
                )
            )
            + "</td>"
            for arm in arms
        )
        rows.append(f"<tr><th>{escape(display.title(measure))}</th>{cells}</tr>")
    sections = [
        f'<h2>Arms</h2>\n<table id="estimates"><tr><th>measure [95% interval]</th>{head}</tr>\n'
        + "\n".join(rows)
        + "\n</table>"
    ]
    for compared in report.comparisons:
        lines = []
        for measure in MEASURES:
            if measure.key == "requests":
                continue
            comparison = compared.comparisons[measure.key]
            significant = compared.significant[measure.key]
            verdict = (
                '<span class="significant">significant</span>' if significant else "not significant"
            )
            lines.append(
                f"<tr><th>{escape(display.title(measure))}</th>"
                f'<td class="number">{escape(display.difference(comparison, measure))}</td>'
                f'<td class="number">{escape(display.p_value(comparison.p_value))}</td>'
                f"<td>{escape(comparison.test or '')}</td><td>{verdict}</td></tr>"
            )
        title = f"{compared.arm} − {compared.reference}"
        table_id = f"compare-{escape(compared.arm)}"
        sections.append(
            f'<h2>{escape(title)}</h2>\n<table class="comparison" id="{table_id}">'
            "<tr><th>measure</th><th>difference [95% interval]</th><th>p-value</th>"
            "<th>test</th><th>Holm, 5% family-wise</th></tr>\n" + "\n".join(lines) + "\n</table>"
        )
    figures = []
    for chart in charts(report):
        svg = base64.b64encode(image(chart, "svg")).decode()
        figures.append(
            f'<figure id="chart-{chart.slug}"><img alt="{escape(chart.title)}" '
            f'src="data:image/svg+xml;base64,{svg}"><figcaption>{escape(chart.title)}'
            "</figcaption></figure>"
        )
    sections.append('<h2>Charts</h2>\n<div class="charts">\n' + "\n".join(figures) + "\n</div>")
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>reshape report: {escape(data.experiment)}</title>
<style>{STYLE}</style>
</head>
<body>
<h1>Experiment {escape(data.experiment)}</h1>
<p class="source">{escape(data.source)}; reference arm {escape(report.reference)};
95% intervals; significance by Holm's procedure at {ALPHA:.0%} family-wise per arm.</p>
{chr(10).join(sections)}
<p class="notes">Latency p-values test the whole distribution (the p50 and p95 rows share one).
Requests are treated as independent; requests of one client are not, so with few clients the
p-values are too small. The statistics are described in <code>pydoc reshape.report</code>.</p>
</body>
</html>
"""
