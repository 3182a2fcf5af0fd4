"""`reshape report`'s analysis, plots and --since, on request logs written here. The command, its
outputs and its errors: tests/system/report/test_report.py."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from reshape.base.errors import ReshapeError, UsageError
from reshape.cli import main
from reshape.report import build_report
from reshape.report.charts import write_plots
from reshape.report.export import report_document
from reshape.report.sources import parse_duration
from reshape.report.text import text_report


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


def test_lines_and_values_that_are_no_measure_are_skipped_and_said(tmp_path: Path) -> None:
    """A damaged log is reported from what is readable, and the report's heading says what was
    left out; a negative or non-finite latency or size is no measure (they made the medians NaN
    and the JSON output invalid)."""
    log = tmp_path / "log.jsonl"
    write_log(log, {"control": ("a", 0.5), "treatment": ("b", 0.5)}, 20, 4)
    bad = {"arm": "exp:treatment", "policy": "b", "outcome": "ok", "bytes": 10}
    with log.open("a") as handle:
        handle.write("garbage\n[1, 2]\n")
        handle.write(json.dumps({**bad, "transaction_seconds": -5}) + "\n")
        handle.write(json.dumps({**bad, "transaction_seconds": float("nan")}) + "\n")
    report = build_report("exp", log=log)
    assert report.data.source.endswith(
        "(skipped: 3 lines that are no request record; "
        "2 records' negative or non-finite latencies or sizes)"
    )  # the two added here and write_log's cut line, which is not the last
    assert report.estimates["treatment"]["requests"].value == 22
    json.dumps(report_document(report), allow_nan=False)  # every number is one


def test_a_file_of_no_records_says_so(tmp_path: Path) -> None:
    log, packed = tmp_path / "log.jsonl", tmp_path / "log.jsonl.gz"
    write_log(log, {"control": ("a", 0.5), "treatment": ("b", 0.2)}, 100, 6)
    packed.write_bytes(gzip.compress(log.read_bytes()))  # a rotated log, still compressed
    with pytest.raises(ReshapeError, match=r"none of its \d+ lines is a request record"):
        build_report("exp", log=packed)


def test_plots_into_a_file_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "log.jsonl"
    write_log(log, {"control": ("a", 0.5), "treatment": ("b", 0.2)}, 5, 5)
    (tmp_path / "a-file").write_text("x")
    status = main(
        ["report", "--experiment", "exp", "--log", str(log), "--plot", str(tmp_path / "a-file")]
    )
    assert status == 2
    assert "--plot " + str(tmp_path / "a-file") + ": not a directory" in capsys.readouterr().err


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
