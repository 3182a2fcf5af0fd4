"""A py-spy profile of one proxy during a lab run's page loads, summed into a breakdown.

`Profiler` samples a process with py-spy (`record --format raw --nonblocking`: the proxy is never
paused, so the loads it serves are timed as without a profiler) from `start` to `stop`, once per
group of loads, and adds each recording to a `Profile` per tag. A `Profile` keeps, per function
and per area (a package, or a module of mitmproxy's or reshape's own), the samples in which it
was running itself (self) and those in which it was anywhere on the stack (inclusive). py-spy
counts only samples in which the thread was busy, so the samples over the wall time recorded say
how much of one core the process used.
"""

from __future__ import annotations

import re
import signal
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from labkit import processes

PY_SPY = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "py-spy"
RATE = 100  # samples per second
_STOP_TIMEOUT = 30.0
_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")


class ProfilerError(RuntimeError):
    """py-spy could not record the process (not installed, not permitted, wrong process)."""


@dataclass
class Profile:
    """Samples of one process over some recordings: by function and by area, self and inclusive."""

    samples: int = 0
    seconds: float = 0.0  # wall time recorded
    rate: int = RATE
    functions_self: Counter[str] = field(default_factory=Counter)
    functions_inclusive: Counter[str] = field(default_factory=Counter)
    areas_self: Counter[str] = field(default_factory=Counter)
    areas_inclusive: Counter[str] = field(default_factory=Counter)
    # (function, its caller) -> samples in which the function itself was running: who pays for
    # the top self-time functions (a socket write from the client side or the origin side).
    callers: Counter[tuple[str, str]] = field(default_factory=Counter)

    @property
    def busy_share(self) -> float:
        """Busy samples over all the samples the wall time could hold: the core share used."""
        possible = self.seconds * self.rate
        return self.samples / possible if possible else 0.0

    def add_raw(self, text: str) -> None:
        """Adds py-spy's raw (collapsed) output: one `frame;frame;… count` line per stack."""
        for line in text.splitlines():
            stack, _, count_text = line.rpartition(" ")
            if not stack or not count_text.isdigit():
                continue
            count = int(count_text)
            frames = [_frame(frame) for frame in stack.split(";")]
            self.samples += count
            self.functions_self[frames[-1][0]] += count
            self.areas_self[frames[-1][1]] += count
            caller = frames[-2][0] if len(frames) > 1 else ""
            self.callers[(frames[-1][0], caller)] += count
            for function in {function for function, _ in frames}:
                self.functions_inclusive[function] += count
            for area in {area for _, area in frames}:
                self.areas_inclusive[area] += count

    def merged(self, other: Profile) -> Profile:
        return Profile(
            self.samples + other.samples,
            self.seconds + other.seconds,
            self.rate,
            self.functions_self + other.functions_self,
            self.functions_inclusive + other.functions_inclusive,
            self.areas_self + other.areas_self,
            self.areas_inclusive + other.areas_inclusive,
            self.callers + other.callers,
        )

    def as_json(self) -> dict[str, object]:
        return {
            "samples": self.samples,
            "seconds": self.seconds,
            "rate": self.rate,
            "functions_self": dict(self.functions_self),
            "functions_inclusive": dict(self.functions_inclusive),
            "areas_self": dict(self.areas_self),
            "areas_inclusive": dict(self.areas_inclusive),
            "callers": [[f, c, n] for (f, c), n in self.callers.items()],
        }

    @classmethod
    def from_json(cls, record: dict[str, object]) -> Profile:
        def counter(key: str) -> Counter[str]:
            value = record[key]
            assert isinstance(value, dict)
            return Counter({str(k): int(v) for k, v in value.items()})

        pairs = record.get("callers", [])
        assert isinstance(pairs, list)
        callers = Counter({(str(f), str(c)): int(n) for f, c, n in pairs})
        samples, seconds, rate = record["samples"], record["seconds"], record["rate"]
        assert isinstance(samples, int) and isinstance(seconds, float | int)
        assert isinstance(rate, int)
        return cls(
            samples,
            float(seconds),
            rate,
            counter("functions_self"),
            counter("functions_inclusive"),
            counter("areas_self"),
            counter("areas_inclusive"),
            callers,
        )


def area_of(file: str) -> str:
    """Where a frame's code lives, as a dotted name: mitmproxy's and reshape's modules by
    subpackage (`mitmproxy.proxy.layers.http`, `reshape.upstream`), anything else by package
    (`asyncio`, `h2`, `ssl`)."""
    path = file.removesuffix(".py")
    parts = [p for p in re.split(r"[/\\]", path) if p and p not in (".", "..")]
    if "site-packages" in parts:
        parts = parts[parts.index("site-packages") + 1 :]
    for top, depth in (("reshape", 2), ("mitmproxy", 2)):
        if top in parts:
            parts = parts[parts.index(top) :]
            if parts[1:3] == ["proxy", "layers"]:
                depth = 4
            elif parts[1:2] == ["proxy"]:
                depth = 3
            return ".".join(p for p in parts[:depth] if p != "__init__")
    if len(parts) > 1 and parts[-2].startswith("python3"):
        parts = parts[-1:]  # the standard library, by its module
    elif "lib" in parts:
        parts = parts[len(parts) - 1 - parts[::-1].index("lib") + 1 :]
    return parts[0] if parts else file


def _frame(text: str) -> tuple[str, str]:
    """(function key, area) of one py-spy frame, `function (file:line)`; lines are dropped."""
    match = _FRAME.match(text)
    if match is None:
        return text, text
    file = match["file"]
    return f"{match['function']} ({_short(file)})", area_of(file)


def _short(file: str) -> str:
    """The file as a reader finds it: from the package on (`mitmproxy/proxy/server.py`)."""
    for marker in ("site-packages/", "/reshape/", "/python3.12/"):
        if marker in file:
            kept = file[file.index(marker) + len(marker) :]
            return f"reshape/{kept}" if marker == "/reshape/" else kept
    return file


class Profiler:
    """py-spy recordings of one process, each added to the profile of its tag."""

    def __init__(self, workdir: Path, rate: int = RATE) -> None:
        if not PY_SPY.exists():
            raise ProfilerError(f"{PY_SPY} is missing: `make test-deps` installs py-spy")
        self.workdir = workdir
        self.rate = rate
        self.profiles: dict[str, Profile] = {}
        self._running: tuple[subprocess.Popen[bytes], Path, str, float] | None = None
        self._count = 0
        workdir.mkdir(parents=True, exist_ok=True)

    def start(self, pid: int, tag: str, now: float) -> None:
        """Starts recording `pid` for `tag`; `now` is a monotonic clock reading (wall time)."""
        assert self._running is None, "one recording at a time"
        self._count += 1
        output = self.workdir / f"profile-{self._count:03d}.txt"
        log = self.workdir / f"profile-{self._count:03d}.log"
        with log.open("wb") as sink:
            process = processes.spawn(
                [
                    str(PY_SPY),
                    *("record", "--pid", str(pid), "--rate", str(self.rate)),
                    *("--format", "raw", "--output", str(output), "--nonblocking"),
                ],
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        self._running = (process, output, tag, now)

    def stop(self, now: float) -> None:
        """Ends the recording and adds it to its tag's profile; ProfilerError if py-spy failed."""
        assert self._running is not None
        process, output, tag, started = self._running
        self._running = None
        if process.poll() is None:
            process.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
        try:
            process.wait(_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            processes.stop(process, 0, ask=False)
        if not output.exists():
            log = output.with_suffix(".log").read_text(errors="replace")
            raise ProfilerError(f"py-spy recorded nothing:\n{log[-2000:]}")
        profile = self.profiles.setdefault(tag, Profile(rate=self.rate))
        profile.add_raw(output.read_text())
        profile.seconds += now - started

    def close(self) -> None:
        """Stops a recording still running (a run that failed midway)."""
        if self._running is not None:
            processes.stop(self._running[0], 0, ask=False)
            self._running = None
