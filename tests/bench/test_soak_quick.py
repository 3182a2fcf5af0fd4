"""bench/soak: the verdict on made-up samples, and a short real run (slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.loadgen.runner import LoadResult
from bench.soak.report import HEADING, Sample, section, verdict
from tests.support.quick_bench import run_quick, skip_without_go

MIB = 1024 * 1024


def _load(failed: int = 0, requests: int = 1000) -> LoadResult:
    return LoadResult(
        requests=requests,
        errors=failed,
        warmup_errors=0,
        rps=100.0,
        p50_ms=10.0,
        p90_ms=20.0,
        p99_ms=30.0,
        max_ms=40.0,
        bytes=requests * 20_000,
        connects=10,
        duration_s=10.0,
        error_samples=("status 502",) * min(failed, 3),
    )


def _samples(rss_mib: list[float], fds: int = 40) -> list[Sample]:
    return [Sample(float(i), int(r * MIB), fds) for i, r in enumerate(rss_mib)]


def _verdict(samples: list[Sample], **overrides: object):  # type: ignore[no-untyped-def]
    arguments: dict[str, object] = {
        "measured_from": 0.0,
        "measured_to": 1e9,
        "fds_before": 16,
        "fds_after": 16,
        "client_errors": 0.0,
        "bad_outcomes": 0.0,
    }
    arguments.update(overrides)
    load = arguments.pop("load", _load())
    return verdict(samples, load, **arguments)  # type: ignore[arg-type]


def test_flat_memory_no_errors_and_fds_back_pass() -> None:
    result = _verdict(_samples([90, 100, 101, 100, 102, 101, 100, 101, 102, 101]))
    assert result.passed, result.reasons
    assert result.fds_peak == 40


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"fds_after": 30}, "open fds 30 after the load, 16 before"),
        ({"client_errors": 2.0}, "2 client errors"),
        ({"bad_outcomes": 1.0}, "1 requests that did not end ok"),
        ({"load": _load(failed=3)}, "3 requests failed"),
        ({"load": _load(requests=0)}, "no request was measured"),
    ],
)
def test_each_criterion_can_fail(overrides: dict[str, object], reason: str) -> None:
    result = _verdict(_samples([100] * 10), **overrides)
    assert not result.passed
    assert any(reason in r for r in result.reasons), result.reasons


def test_growing_memory_fails_and_warmup_growth_does_not() -> None:
    growing = _verdict(_samples([100, 100, 110, 120, 130, 140, 150, 160, 170, 180]))
    assert not growing.passed
    assert "memory grew" in growing.reasons[0]
    # Growth confined to the first fifth (caches filling) is not held against the run.
    warming = _verdict(_samples([50, 60, 100, 100, 101, 100, 101, 100, 101, 101]))
    assert warming.passed, warming.reasons


def test_the_section_states_the_verdict_and_figures() -> None:
    samples = _samples([100] * 10)
    text = section(
        _verdict(samples),
        _load(),
        samples,
        connections=500,
        duration=180,
        command="python -m bench.soak --connections 500 --duration 180",
        facts={"cores (nproc)": "2"},
        notes=["a note"],
    )
    assert text.startswith(HEADING + "\n")
    assert "**PASS**" in text and "| open fds before / peak / after | 16 / 40 / 16 |" in text
    assert "500 concurrent client connections for 180 s" in text


@pytest.mark.slow
def test_a_short_soak_passes(tmp_path: Path) -> None:
    skip_without_go()
    quick = run_quick(
        "soak",
        tmp_path,
        *("--connections", "20", "--duration", "4", "--warmup", "1", "--sample", "0.5"),
        "--no-record",
        timeout=180,
    )
    figures = json.loads(quick.figures.read_text())
    assert figures["verdict"]["passed"], figures["verdict"]
    assert figures["load"]["requests"] > 0
    assert len(figures["samples"]) >= 5
    assert "**PASS**" in quick.stdout
    assert not quick.results.exists()
