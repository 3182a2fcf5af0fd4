"""bench/queueing's emulated network link (labkit/relay.py), in a process of its own.

In its own process the relay's event loop never waits for the load generator's (nor the other
way round), so the emulated delays stay what they were set to. The parent talks to it over
stdin/stdout, one line each way:

    python -m bench.queueing.relay LISTEN_HOST TARGET_HOST TARGET_PORT --rtt S [--connect-delay S]
    → "listening PORT" once it accepts connections
    ← "stats"  → one JSON line: accepted, open, max_open (since the last "stats"), bytes
    EOF on stdin ends it.

`relay_process` starts it (in a process group of its own) and always stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import selectors
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import uvloop

from labkit import processes
from labkit.relay import Link, Relay

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT = 20.0


@dataclass(frozen=True)
class RelayCounts:
    """Connections the relay made to its target: in all, open now, most open at once."""

    accepted: int
    open: int
    max_open: int
    bytes_up: int
    bytes_down: int


class RelayProcess:
    def __init__(self, process: subprocess.Popen[str], host: str, port: int) -> None:
        self.process = process
        self.host = host
        self.port = port

    def counts(self) -> RelayCounts:
        """The counters now; the next call's max_open counts from here."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write("stats\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError("the relay process ended")
        return RelayCounts(**json.loads(line))


@contextlib.contextmanager
def relay_process(
    listen_host: str, target: tuple[str, int], rtt: float, connect_delay: float, log: Path
) -> Iterator[RelayProcess]:
    argv = [
        sys.executable,
        "-m",
        "bench.queueing.relay",
        listen_host,
        target[0],
        str(target[1]),
        "--rtt",
        str(rtt),
        "--connect-delay",
        str(connect_delay),
    ]
    with log.open("w") as errors:
        process = processes.spawn(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            cwd=REPO,
        )
    try:
        assert process.stdout is not None
        ready = _readline(process, START_TIMEOUT)
        if not ready.startswith("listening "):
            raise RuntimeError(f"the relay did not start: {ready!r}; see {log}")
        yield RelayProcess(process, listen_host, int(ready.split()[1]))
    finally:
        with contextlib.suppress(OSError):
            if process.stdin is not None:
                process.stdin.close()  # the relay's cue to stop
        processes.stop(process, 5, ask=False)


def _readline(process: subprocess.Popen[str], timeout: float) -> str:
    """The child's first line, or "" if it says nothing within `timeout`."""
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            return ""
    return process.stdout.readline().strip()


async def _serve(args: argparse.Namespace) -> None:
    link = Link.rtt(args.rtt, connect_delay=args.connect_delay)
    relay = Relay(args.listen_host, (args.target_host, args.target_port), link)
    await relay.start()
    print(f"listening {relay.port}", flush=True)
    loop = asyncio.get_running_loop()
    commands = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(commands), sys.stdin)
    try:
        while line := await commands.readline():
            if line.strip() == b"stats":
                stats = relay.stats
                counts = RelayCounts(
                    stats.accepted, stats.open, stats.max_open, stats.bytes_up, stats.bytes_down
                )
                stats.max_open = stats.open
                print(json.dumps(counts.__dict__), flush=True)
    finally:
        await relay.stop()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.queueing.relay")
    parser.add_argument("listen_host")
    parser.add_argument("target_host")
    parser.add_argument("target_port", type=int)
    parser.add_argument("--rtt", type=float, default=0.0)
    parser.add_argument("--connect-delay", type=float, default=0.0)
    args = parser.parse_args()
    uvloop.run(_serve(args))


if __name__ == "__main__":
    main()
