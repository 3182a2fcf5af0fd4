"""What the benches' tests share: running a bench's --quick variant end to end, as a user would."""

from __future__ import annotations

import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.loadgen.runner import LoadgenError, go_binary

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class QuickRun:
    stdout: str
    results: Path  # the --results it was given, for checking what it recorded (or did not)
    figures: Path  # the --json it wrote


def run_bench(bench: str, argv: list[str], *, timeout: float) -> str:
    """The stdout of `python -m bench.<bench> <argv>`; fails the test unless it exits 0 within
    `timeout` seconds."""
    process = subprocess.Popen(
        [sys.executable, "-m", f"bench.{bench}", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # SIGTERM, not SIGKILL: the bench then stops the proxies and origins it started.
        process.terminate()
        stdout, stderr = process.communicate(timeout=60)
        pytest.fail(f"bench.{bench} {shlex.join(argv)} took over {timeout:g} s:\n{stderr}")
    assert process.returncode == 0, stderr[-5000:]
    return stdout


def run_quick(bench: str, tmp_path: Path, *options: str, timeout: float) -> QuickRun:
    """`python -m bench.<bench> --quick <options>`, its results and figures under tmp_path; fails
    the test unless it exits 0 within `timeout` seconds."""
    results = tmp_path / "RESULTS.md"
    figures = tmp_path / "figures.json"
    argv = ["--quick", *options, "--results", str(results), "--json", str(figures)]
    return QuickRun(run_bench(bench, argv, timeout=timeout), results, figures)


def skip_without_go() -> None:
    """Skips the test when there is no Go toolchain to build bench/loadgen with."""
    try:
        go_binary()
    except LoadgenError as error:
        pytest.skip(str(error))
