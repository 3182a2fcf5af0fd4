"""Where a proxy's CPU goes under a bench's load: py-spy profiles, summed up for RESULTS.md.

`recording(pid, seconds, out)` samples a process (and its children: workers) with py-spy for the
measured window; `summary(raw)` reads the collapsed stacks py-spy wrote and says which parts of
the code the samples fell in (self time, by the file of the innermost frame: mitmproxy's layers,
its hook dispatch, the engine, TLS, the event loop, ...) and which functions took the most, self
and inclusive. Samples with no Python frame (the process idle, waiting in epoll) are counted
apart, so the shares are of the time the proxy was busy. py-spy samples without stopping the
process (`--nonblocking`, so the figures of the same window stay honest) and then may catch a
deep stack only in part: the self shares are exact, the inclusive ones lower bounds.
"""

from __future__ import annotations

import collections
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from labkit import processes

PY_SPY = Path(__file__).resolve().parent.parent / ".venv" / "bin" / "py-spy"
RATE = 200  # samples per second

# Where a sample's innermost frame is → what the time was spent on (first match wins).
CATEGORIES: tuple[tuple[str, str], ...] = (
    ("mitmproxy's hook dispatch", r"mitmproxy/addonmanager|mitmproxy/hooks"),
    ("mitmproxy's HTTP parsing", r"mitmproxy/net/|h11/"),
    ("mitmproxy's layers", r"mitmproxy/proxy/|mitmproxy/http\.py|mitmproxy/connection"),
    ("TLS (pyOpenSSL, ssl)", r"\(OpenSSL/|\(ssl\.py|\(cryptography/"),
    ("HTTP/2 (h2, hpack)", r"\((?:h2|hpack|hyperframe)/"),
    ("reshape: engine", r"reshape/upstream/"),
    ("reshape: join and patches", r"reshape/mitm/"),
    ("reshape: addons and policy", r"reshape/features/|reshape/policy/|reshape/base/"),
    ("metrics (prometheus_client)", r"prometheus_client/"),
    ("event loop, sockets (asyncio)", r"asyncio/|uvloop|selectors"),
)
_PLACE = re.compile(r"\(([^()]*?)(?::\d+)?\)$")
_TRIM = re.compile(r".*site-packages/|.*?/lib/python3\.\d+/|.*/(?=(?:reshape|bench|labkit)/)")


@contextmanager
def recording(pid: int, seconds: float, out: Path) -> Iterator[None]:
    """py-spy samples `pid` (and its subprocesses) for `seconds` while the block runs; the raw
    stacks are in `out` afterwards (empty if py-spy could not attach)."""
    process = processes.spawn(
        [
            str(PY_SPY),
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(max(1, round(seconds))),
            "--rate",
            str(RATE),
            "--format",
            "raw",
            "--output",
            str(out),
            "--nonblocking",
            "--subprocesses",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        try:
            process.wait(timeout=seconds + 30)
        except subprocess.TimeoutExpired:
            processes.stop(process)


@dataclass(frozen=True)
class Summary:
    busy: int  # samples with a Python frame
    idle: int  # samples without (waiting in the event loop's poll)
    by_category: list[tuple[str, int]]
    by_function_self: list[tuple[str, int]]
    by_function_inclusive: list[tuple[str, int]]


def summary(raw: Path, top: int = 12) -> Summary:
    categories: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    busy = idle = 0
    for line in raw.read_text().splitlines() if raw.exists() else ():
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_short(frame) for frame in stack.split(";") if frame]
        python = [frame for frame in frames if "(" in frame]
        if not python:
            idle += count
            continue
        busy += count
        innermost = python[-1]
        own[innermost] += count
        categories[_category(innermost)] += count
        for frame in set(python):
            inclusive[frame] += count
    # Frames under nearly every sample (the event loop's run, the entry point) say nothing.
    telling = [(f, n) for f, n in inclusive.most_common() if n < 0.9 * busy]
    return Summary(busy, idle, categories.most_common(), own.most_common(top), telling[:top])


def markdown(title: str, result: Summary) -> str:
    """The summary as RESULTS.md text: shares of the busy samples."""
    if not result.busy:
        return f"{title}: no samples (py-spy could not attach).\n"

    def share(count: int) -> str:
        return f"{100 * count / result.busy:.1f}%"

    lines = [
        f"{title} — py-spy, {RATE} Hz, {result.busy} busy samples "
        f"({share(result.idle)} more idle, not counted):",
        "",
        "| where the time went (innermost frame) | share |",
        "| --- | --- |",
        *(f"| {name} | {share(count)} |" for name, count in result.by_category),
        "",
        "| function (self) | share | function (inclusive, at least) | share |",
        "| --- | --- | --- | --- |",
    ]
    for (own, own_n), (incl, incl_n) in zip(
        result.by_function_self, result.by_function_inclusive, strict=False
    ):
        lines.append(f"| `{own}` | {share(own_n)} | `{incl}` | {share(incl_n)} |")
    return "\n".join(lines) + "\n"


def _short(frame: str) -> str:
    """`func (/long/path/site-packages/pkg/mod.py:12)` → `func (pkg/mod.py)`."""
    return _PLACE.sub(lambda m: f"({_TRIM.sub('', m.group(1), count=1)})", frame).strip()


def _category(frame: str) -> str:
    for name, pattern in CATEGORIES:
        if re.search(pattern, frame):
            return name
    return "other (Python, stdlib)"
