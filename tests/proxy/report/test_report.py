"""`reshape report` on request logs written here, and its errors (no proxy needed)."""

from __future__ import annotations

import json
import random
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from reshape.report import build_report, text_report, write_plots
from tests.conftest import REPO, RESHAPE, free_port


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


def test_plots_are_png_files(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    write_log(log, {"control": ("a", 0.5), "treatment": ("b", 0.2)}, 50, 3)
    paths = write_plots(build_report("exp", log=log), tmp_path / "plots")
    assert {p.name for p in paths} >= {"exp-connections.png", "exp-latency-p50.png"}
    data = paths[0].read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    width, height = struct.unpack(">II", data[16:24])
    assert width > 100 and height > 100
    # The image data decompresses to one filter byte plus RGB per pixel per row.
    start = data.index(b"IDAT") + 4
    length = struct.unpack(">I", data[start - 8 : start - 4])[0]
    assert len(zlib.decompress(data[start : start + length])) == height * (1 + 3 * width)


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
