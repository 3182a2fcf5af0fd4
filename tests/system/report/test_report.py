"""`reshape report` as a command, on request logs written here: its outputs (text, JSON, CSV,
HTML) and its errors (no proxy needed)."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
from pathlib import Path

import pytest

from labkit.processes import free_port
from tests.support.reshape_process import REPO, RESHAPE
from tests.unit.report.test_report import write_log


def reshape(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RESHAPE, *args], capture_output=True, text=True, cwd=REPO, timeout=60)


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
