"""bench/runs.py: what every bench run shares."""

from __future__ import annotations

import argparse
import os
import signal
from collections.abc import Sequence
from pathlib import Path

import pytest

from bench.runs import RESULTS_HEADER, Bench, WorkdirError, replace_section

HEADING = "## Some bench (bench/some)"
SECTION = f"{HEADING}\n\nnew figures\n"
BENCH = Bench("some")


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ("", RESULTS_HEADER + "\n" + SECTION),
        ("# Results\n\n## Other\n\nkept\n", "# Results\n\n## Other\n\nkept\n\n" + SECTION),
        (
            f"# Results\n\n## A\n\na\n\n{HEADING}\n\nold\n\n## B\n\nb\n",
            f"# Results\n\n## A\n\na\n\n{SECTION}\n## B\n\nb\n",
        ),
        (f"# Results\n\n{HEADING}\n\nold\nold\n", f"# Results\n\n{SECTION}"),
    ],
    ids=["new-file", "appended", "between-others", "last"],
)
def test_replace_section_touches_only_its_own(document: str, expected: str) -> None:
    assert replace_section(document, HEADING, SECTION) == expected


def test_replace_section_without_a_header_starts_a_new_file_with_the_section() -> None:
    assert replace_section("\n", HEADING, SECTION, header=None) == SECTION


def test_a_given_workdir_must_be_empty_unless_told_otherwise(tmp_path: Path) -> None:
    (tmp_path / "left over").touch()
    with pytest.raises(WorkdirError, match="is not empty"), BENCH.workdir(tmp_path):
        pass
    with BENCH.workdir(tmp_path, must_be_empty=False) as workdir:
        assert workdir == tmp_path.resolve()


def test_a_temporary_workdir_is_removed_at_the_end() -> None:
    with BENCH.workdir(None, mode=0o711) as workdir:
        assert workdir.name.startswith("reshape-some-")
        assert workdir.stat().st_mode & 0o777 == 0o711
    assert not workdir.exists()


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    return argparse.Namespace(argv=list(argv))


def test_main_passes_the_command_and_turns_an_expected_failure_into_status_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    previous = signal.getsignal(signal.SIGTERM)
    try:

        def run(args: argparse.Namespace, command: str) -> int:
            assert command == "python -m bench.some --quick 'a b'"
            raise ConnectionError("origin would not start")

        assert BENCH.main(["--quick", "a b"], _parse, run, (ConnectionError,)) == 1
        assert capsys.readouterr().err == "some: FAILED: origin would not start\n"

        def terminated(args: argparse.Namespace, command: str) -> int:
            os.kill(os.getpid(), signal.SIGTERM)
            return 0

        # SIGTERM unwinds like Ctrl-C, so that every context manager stops what it started.
        with pytest.raises(SystemExit) as exited:
            BENCH.main([], _parse, terminated, ())
        assert exited.value.code == 128 + signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, previous)
