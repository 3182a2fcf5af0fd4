"""What every bench run shares: the project's virtualenv (`use_repo_venv`, for each suite's
__main__), its entry point, its output options, its work directory, the machine it ran on, and its
section of bench/RESULTS.md.

bench/overhead, bench/queueing, bench/capacity, bench/soak and bench/ttfb each name themselves once
(`Bench("overhead")`) and get from it their messages, their `main` (SIGTERM unwinds like Ctrl-C,
an expected failure is one "FAILED: …" line and exit status 1), their work directory and the
check for servers left running; the options, the machine's facts, tool versions and the
RESULTS.md section replacement are plain functions.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from labkit.processes import accepts

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / ".venv"
RESULTS = REPO / "bench" / "RESULTS.md"
RESULTS_HEADER = """# Benchmark results

Each section is written by the benchmark named in its title and replaced whole when that benchmark
runs again; edit the benchmark, not its section.
"""


def use_repo_venv(module: str) -> None:
    """Re-executes `python -m <module>` with the project's virtualenv unless this is it: a bench
    needs its pinned packages and the tools it installs (reshape, mitmdump, hypercorn)."""
    if Path(sys.prefix).resolve() == VENV.resolve():
        return
    python = VENV / "bin" / "python"
    if not python.exists():
        sys.exit(f"{module}: {python} is missing; run `make venv` first")
    os.execv(python, [str(python), "-m", module, *sys.argv[1:]])


class WorkdirError(Exception):
    """The --workdir given cannot hold this run."""


@dataclass(frozen=True)
class Bench:
    """One benchmark, by the name of its package under bench/ (`overhead` for bench/overhead/)."""

    name: str

    def say(self, message: str) -> None:
        print(f"{self.name}: {message}", file=sys.stderr, flush=True)

    def main(
        self,
        argv: Sequence[str],
        parse_args: Callable[[Sequence[str]], argparse.Namespace],
        run: Callable[[argparse.Namespace, str], int],
        failures: tuple[type[Exception], ...],
    ) -> int:
        """`run(args, command)`'s exit status, or 1 after one "FAILED: …" line on a failure the
        bench expects (`failures`: a server that would not start, …; a --workdir it cannot use).

        `command` is the command line as run, for the RESULTS.md section.
        """
        args = parse_args(argv)
        command = shlex.join(["python", "-m", f"bench.{self.name}", *argv])
        unwind_on_sigterm()
        expected: tuple[type[Exception], ...] = (WorkdirError, *failures)
        try:
            return run(args, command)
        except expected as error:
            self.say(f"FAILED: {error}")
            return 1

    def busy_machine_notes(self) -> list[str]:
        """A note, said now and for the section's notes, if other work is loading the machine."""
        cores = len(os.sched_getaffinity(0))
        load = os.getloadavg()[0]
        if load <= cores / 2:
            return []
        note = (
            f"Load average {load:.2f} on {cores} cores when the run started: other work was "
            "competing with this benchmark; compare rows within this run only."
        )
        self.say(note)
        return [note]

    def still_accepting(self, addresses: Sequence[tuple[str, int]]) -> list[str]:
        """Which of the servers' addresses still accept connections once all are stopped (said, so
        that a server left running fails the run)."""
        busy = [f"{host}:{port}" for host, port in addresses if accepts(host, port)]
        if busy:
            self.say(f"still accepting connections after the run: {', '.join(busy)}")
        return busy

    @contextlib.contextmanager
    def workdir(
        self, given: Path | None, *, mode: int | None = None, must_be_empty: bool = True
    ) -> Iterator[Path]:
        """`given` (created if missing; unless told otherwise refused if not empty, so that no
        earlier run's files mix with this one's), or a temporary directory removed at the end.

        `mode`: the temporary directory's, for servers that drop root privileges and must still
        reach their own subdirectories.
        """
        if given is not None:
            given.mkdir(parents=True, exist_ok=True)
            if must_be_empty and any(given.iterdir()):
                raise WorkdirError(f"--workdir {given} is not empty")
            yield given.resolve()
            return
        path = Path(tempfile.mkdtemp(prefix=f"reshape-{self.name}-"))
        if mode is not None:
            path.chmod(mode)
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)


def unwind_on_sigterm() -> None:
    """Proxies and origins run in sessions of their own, out of reach of a signal to ours: on
    SIGTERM, unwind like on Ctrl-C, so that every context manager stops what it started."""
    signal.signal(signal.SIGTERM, _exit_on_signal)


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def add_output_arguments(parser: argparse.ArgumentParser, figures: str) -> None:
    """--no-record, --results, --json (every `figures`' figures) and --workdir, last in --help."""
    parser.add_argument("--no-record", action="store_true", help="do not write bench/RESULTS.md")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the RESULTS.md to update")
    parser.add_argument("--json", type=Path, help=f"also write every {figures}'s figures here")
    parser.add_argument("--workdir", type=Path, help="keep configs and logs here (default: temp)")


def chosen_configs[T](
    parser: argparse.ArgumentParser, names: str | None, configs: Mapping[str, T]
) -> list[T]:
    """The configurations a comma-separated --configs value names, in its order without repeats;
    all of them if it is None; a usage error (exit 2) for a name not in `configs`."""
    wanted = names.split(",") if names else list(configs)
    unknown = sorted(set(wanted) - set(configs))
    if unknown or not wanted:
        parser.error(f"--configs: unknown {unknown}; choose from {','.join(configs)}")
    return [configs[name] for name in dict.fromkeys(wanted)]


def machine() -> dict[str, str]:
    """The machine's facts for a section, the load average at the start among them."""
    cpuinfo = _read("/proc/cpuinfo")
    model = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
    meminfo = re.search(r"^MemTotal:\s*(\d+) kB", _read("/proc/meminfo"), re.MULTILINE)
    return {
        "cores (nproc)": str(len(os.sched_getaffinity(0))),
        "CPU": model.group(1).strip() if model else platform.processor() or "unknown",
        "kernel": f"{platform.system()} {platform.release()}",
        "memory": f"{int(meminfo.group(1)) / 1024 / 1024:.1f} GiB" if meminfo else "unknown",
        "load average at start": load_average(),
    }


def load_average() -> str:
    """The 1, 5 and 15-minute load averages, as the facts give them."""
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def commit_of(checkout: Path) -> str:
    """The short commit a checkout is at (with `+` if its work tree has changes), or `?`."""

    def git(*argv: str) -> str | None:
        done = subprocess.run(
            ["git", "-C", str(checkout), *argv], capture_output=True, text=True, check=False
        )
        return done.stdout.strip() if done.returncode == 0 else None

    head = git("rev-parse", "--short", "HEAD")
    if head is None:
        return "?"
    return head + ("+" if git("status", "--porcelain", "--untracked-files=no") else "")


def first_line(argv: list[str]) -> str:
    """The first line a command prints (its version, say), or why there is none."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except OSError as error:
        return f"unknown ({error})"
    out = (done.stdout or done.stderr).strip()
    return out.splitlines()[0] if out else "unknown"


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def replace_section(
    document: str, heading: str, new_section: str, *, header: str | None = RESULTS_HEADER
) -> str:
    """`document` with the section under `heading` replaced by `new_section` (appended if absent).

    A section runs from its heading to the next level-2 heading or the end; everything else is
    kept byte for byte. An empty document becomes `header` and the section (the section alone
    if `header` is None).
    """
    if not document.strip():
        return new_section if header is None else header + "\n" + new_section
    start = re.search(rf"^{re.escape(heading)}[ \t]*$", document, re.MULTILINE)
    if start is None:
        return document.rstrip("\n") + "\n\n" + new_section
    following = re.search(r"^## ", document[start.end() :], re.MULTILINE)
    end = start.end() + following.start() if following else len(document)
    rest = document[end:]
    return document[: start.start()] + new_section + ("\n" + rest if rest else "")


def publish(
    args: argparse.Namespace, heading: str, section: str, *, header: str | None = RESULTS_HEADER
) -> bool:
    """Writes `section` into the --results file unless --no-record (the options
    `add_output_arguments` adds); whether it did."""
    if args.no_record:
        return False
    record(args.results, heading, section, header=header)
    return True


def record(
    path: Path, heading: str, new_section: str, *, header: str | None = RESULTS_HEADER
) -> None:
    """Writes `new_section` into the results file at `path` (see `replace_section`)."""
    document = path.read_text() if path.exists() else ""
    path.write_text(replace_section(document, heading, new_section, header=header))
