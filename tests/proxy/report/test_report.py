"""`reshape report` on request logs written here, and its errors (no proxy needed)."""

from __future__ import annotations

import csv
import io
import json
import random
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from reshape.base.errors import UsageError
from reshape.report import build_report
from reshape.report.charts import write_plots
from reshape.report.sources import parse_duration
from reshape.report.text import text_report
from tests.support.reshape_process import REPO, RESHAPE, free_port


def write_log(path: Path, arms: dict[str, tuple[str, float]], per_arm: int, seed: int) -> None:
    """`arms`: name → (policy, share of requests on a new connection)."""
    rng = random.Random(seed)
    with path.open("w") as handle:
        for _ in range(per_arm):
            for arm, (policy, new_share) in arms.items():
                record = {
                    "time": "2026-01-01T00:00:00.000Z",
                    "policy": policy,
                    "arm": f"exp:{arm}",
                    "experiment": "exp",
                    "outcome": "ok" if rng.random() > 0.01 else "upstream_error",
                    "transaction_seconds": rng.expovariate(100),
                    "upstream_connection": "new" if rng.random() < new_share else "reused",
                    "queued": None,
                    "bytes": 1000 + rng.randint(0, 10),
                }
                handle.write(json.dumps(record) + "\n")
        handle.write('{"time": "2026-01-01T00:00:00.000Z", "arm": "exp:control", "pol')  # cut
        handle.write("\n")
        handle.write(json.dumps({"arm": "other:x", "policy": "p"}) + "\n")


def reshape(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RESHAPE, *args], capture_output=True, text=True, cwd=REPO, timeout=60)


def test_a_planted_difference_is_found_and_an_a_a_split_is_not(tmp_path: Path) -> None:
    planted = tmp_path / "planted.jsonl"
    write_log(planted, {"control": ("direct", 0.9), "treatment": ("pooled", 0.1)}, 300, 1)
    report = build_report("exp", log=planted)
    [comparison] = report.comparisons
    assert comparison.comparisons["connections"].p_value < 1e-10
    assert comparison.significant["connections"]
    assert report.estimates["control"]["requests"].value == 300  # the cut line is skipped

    same = tmp_path / "aa.jsonl"
    write_log(same, {"control": ("direct", 0.5), "treatment": ("direct", 0.5)}, 300, 2)
    report = build_report("exp", log=same)
    assert not any(report.comparisons[0].significant.values())
    text = text_report(report)
    assert "significant at 5% family-wise (Holm): none" in text
    assert "queue share (%)" in text and "n/a" in text  # the log does not know queueing


def test_plots_are_readable_png_charts(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    write_log(log, {"control": ("a", 0.5), "treatment": ("b", 0.2)}, 50, 3)
    paths = write_plots(build_report("exp", log=log), tmp_path / "plots")
    assert {p.name for p in paths} >= {
        "exp-connections.png",
        "exp-latency-p50.png",
        "exp-latency-distribution.png",
    }
    for path in paths:
        with Image.open(path) as image:
            assert image.format == "PNG" and image.width >= 600 and image.height >= 350
            colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
        assert colours is not None and len(colours) > 20  # text, bars, axes: not blank
    with Image.open(tmp_path / "plots" / "exp-connections.png") as image:
        pixels = {tuple(p) for p in np.asarray(image.convert("RGB")).reshape(-1, 3)}
    assert {(0x00, 0x72, 0xB2), (0xE6, 0x9F, 0x00)} <= pixels  # both arms' bars


def test_json_and_csv_carry_every_measure_in_base_units(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    write_log(log, {"control": ("a", 0.5), "treatment": ("b", 0.2)}, 200, 6)
    result = reshape("report", "--experiment", "exp", "--log", str(log), "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)  # the JSON alone on stdout, no table
    assert document["reference"] == "control" and set(document["arms"]) == {"control", "treatment"}
    assert document["measures"]["latency_p50"]["unit"] == "seconds"
    control = document["arms"]["control"]["estimates"]
    assert control["requests"]["value"] == 200
    assert 0 < control["latency_p50"]["low"] < control["latency_p50"]["value"] < 0.1
    assert control["queue_share"] == {"value": None, "low": None, "high": None}
    (comparison,) = document["comparisons"]
    connections = comparison["measures"]["connections"]
    assert connections["significant"] is True and connections["p_value"] < 1e-6
    assert connections["test"] == "two-proportion z"
    assert comparison["measures"]["bytes"]["test"] == "Welch t"

    result = reshape("report", "--experiment", "exp", "--log", str(log), "--csv")
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert len(rows) == 2 * 7 + 6  # an estimate per arm and measure, a comparison per measure
    by_key = {(r["row"], r["arm"], r["measure"]): r for r in rows}
    row = by_key[("comparison", "treatment", "connections")]
    assert row["reference"] == "control" and row["significant"] == "True"
    assert float(row["value"]) == pytest.approx(connections["difference"])
    assert by_key[("estimate", "control", "requests")]["value"] == "200"

    out = tmp_path / "out"
    result = reshape(
        "report", "--experiment", "exp", "--log", str(log),
        "--json", str(out.with_suffix(".json")), "--csv", str(out.with_suffix(".csv")),
    )  # fmt: skip
    assert result.returncode == 0 and "upstream connections per request" in result.stdout
    assert json.loads(out.with_suffix(".json").read_text()) == document
    both = reshape("report", "--experiment", "exp", "--log", str(log), "--json", "--csv")
    assert both.returncode == 2 and "cannot both go to stdout" in both.stderr


def test_html_is_one_self_contained_page(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    write_log(log, {"control": ("a", 0.5), "treatment": ("b", 0.2)}, 100, 8)
    page = tmp_path / "report.html"
    result = reshape("report", "--experiment", "exp", "--log", str(log), "--html", str(page))
    assert result.returncode == 0, result.stderr
    html = page.read_text()
    assert "<title>reshape report: exp</title>" in html
    assert html.count('src="data:image/svg+xml;base64,') >= 6
    assert not re.search(r"<script|<link|src=\"(?!data:)|url\(", html)  # nothing fetched
    assert 'id="compare-treatment"' in html and "two-proportion z" in html


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30),
        ("15m", 900),
        ("1h30m", 5400),
        ("1d", 86400),
        ("1w", 604800),
        ("2y", 2 * 365 * 86400),
        ("1w2d3h4m5s6ms", 604800 + 2 * 86400 + 3 * 3600 + 4 * 60 + 5.006),
        ("500ms", 0.5),
        ("90", 90),
        ("1.5", 1.5),
    ],
)
def test_since_accepts_what_prometheus_accepts(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "1h1h", "1m1h", "h", "1.5h", "-1s", "0s", "10 minutes"])
def test_since_refuses_what_prometheus_refuses(text: str) -> None:
    with pytest.raises(UsageError, match="--since: expected a duration as Prometheus writes it"):
        parse_duration(text)


def test_cli_prints_the_report(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    write_log(log, {"control": ("a", 0.5), "treatment": ("b", 0.2)}, 100, 4)
    result = reshape("report", "--experiment", "exp", "--log", str(log), "--plot", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "upstream connections per request" in result.stdout
    assert "wrote " in result.stdout


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (["--experiment", "nope", "--log", "LOG"], 2, "unknown experiment 'nope'"),
        (["--experiment", "exp", "--log", "MISSING"], 2, "cannot read --log"),
        (["--experiment", "exp", "--log", "LOG", "--since", "10 minutes"], 2, "--since"),
        (["--experiment", "exp", "--log", "LOG", "--since", "1w"], 1, "no requests of experiment"),
        (
            ["--experiment", "exp", "--prometheus", "PROM", "--prometheus-header", "nocolon"],
            2,
            "expected 'NAME: VALUE'",
        ),
        (
            ["--experiment", "exp", "--log", "LOG", "--prometheus-token-file", "LOG"],
            2,
            "need --prometheus",
        ),
        (["--experiment", "exp", "--log", "LOG", "--since", "1h"], 1, "no requests of experiment"),
        (["--experiment", "exp", "--prometheus", "PROM"], 1, "cannot reach Prometheus at"),
        (["--experiment", "exp", "--prometheus", "ftp://x"], 2, "expected an http(s) URL"),
    ],
)
def test_clear_errors(tmp_path: Path, args: list[str], status: int, message: str) -> None:
    log = tmp_path / "log.jsonl"
    write_log(log, {"control": ("a", 0.5)}, 5, 5)  # all in 2026-01-01, long ago for --since 1h
    unreachable = f"http://127.0.0.1:{free_port()}"
    replaced = [
        {"LOG": str(log), "MISSING": str(tmp_path / "absent"), "PROM": unreachable}.get(a, a)
        for a in args
    ]
    result = reshape("report", *replaced)
    assert result.returncode == status
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.stderr


def test_credentials_in_the_url_are_never_printed(tmp_path: Path) -> None:
    unreachable = f"http://admin:hunter2%21@127.0.0.1:{free_port()}/prom"
    result = reshape("report", "--experiment", "exp", "--prometheus", unreachable)
    assert result.returncode == 1
    assert "hunter2" not in result.stderr + result.stdout and "admin" not in result.stderr
    assert f"cannot reach Prometheus at http://127.0.0.1:{unreachable.rsplit(':', 1)[1]}" in (
        result.stderr
    )
    bad = reshape("report", "--experiment", "exp", "--prometheus", "ftp://u:hunter2@x/")
    assert bad.returncode == 2 and "hunter2" not in bad.stderr


def test_a_missing_report_extra_is_one_line(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    write_log(log, {"control": ("a", 0.5)}, 5, 5)
    # scipy absent: Python refuses to import a module whose sys.modules entry is None.
    program = (
        "import sys; sys.modules['scipy'] = None; from reshape.cli import main; "
        f"sys.exit(main(['report', '--experiment', 'exp', '--log', {str(log)!r}]))"
    )
    result = subprocess.run(
        [RESHAPE[0], "-c", program], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("reshape: error: reshape report needs the report extra")
    assert "pip install 'reshape[report]'" in line and "scipy is missing" in line
