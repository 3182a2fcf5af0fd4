"""The processes the lab starts (origins, proxies, browsers, relays, Prometheus), started and
stopped one way, for the tests and the benches alike.

Each runs in a process group of its own (`spawn`), so that stopping it reaches the workers and
helpers it forked (`stop`: SIGTERM to it, then SIGKILL to the whole group), and its output goes
to a log whose tail explains a failed start (`start`, `running`). `free_port` and `accepts` are
the loopback side of starting a server: a port to give it, and whether it serves yet.

Written here rather than taken from mirakuru, the maintained library for this: mirakuru starts
the child with `preexec_fn=os.setsid`, which Python documents as unsafe in a process with threads
(the tests' scripted origins and the benches' relays are threads); its stop raises when the exit
status is not the expected one, which a cleanup path must not; start and stop share one timeout;
and its errors would still need the log tails added by every caller.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
_POLL_SECONDS = 0.02
_TAIL_LINES = 40


class ProcessStartError(RuntimeError):
    """A process exited, or was not ready in time; the message has its command and the tail of
    its logs."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` (IPv4 or IPv6) that nothing is bound to at the moment of asking."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def accepts(host: str, port: int, timeout: float = 0.5) -> bool:
    """Whether a TCP connection to host:port is accepted now."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def spawn(argv: Sequence[str], **popen: Any) -> subprocess.Popen[Any]:
    """`subprocess.Popen(argv, **popen)` in a process group of its own (stdin /dev/null unless
    given), for `stop` to reach whatever it forks."""
    popen.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.Popen(argv, start_new_session=True, **popen)


def start(
    name: str,
    argv: Sequence[str],
    *,
    log: Path,
    is_ready: Callable[[], bool],
    timeout: float = START_TIMEOUT,
    logs: Sequence[Path] = (),
    error: type[ProcessStartError] = ProcessStartError,
    **popen: Any,
) -> subprocess.Popen[bytes]:
    """`argv` spawned with its output (stdout and stderr) in `log`, returned once `is_ready()`.

    Raises `error` (after stopping it) if it exits first or is not ready within `timeout`
    seconds; the message carries the tails of `log` and of its other `logs`, each emptied first
    so that it shows this run's lines only.
    """
    for path in [log, *logs]:
        path.write_bytes(b"")
    with log.open("wb") as sink:
        process: subprocess.Popen[bytes] = spawn(
            argv, stdout=sink, stderr=subprocess.STDOUT, **popen
        )
    wait_ready(name, process, is_ready=is_ready, timeout=timeout, logs=[log, *logs], error=error)
    return process


def wait_ready(
    name: str,
    process: subprocess.Popen[Any],
    *,
    is_ready: Callable[[], bool],
    timeout: float = START_TIMEOUT,
    logs: Sequence[Path] = (),
    error: type[ProcessStartError] = ProcessStartError,
) -> None:
    """Returns once `is_ready()`; raises `error` (after stopping `process`) if it exits first or
    is not ready within `timeout` seconds, with its command and the tails of its `logs`."""
    try:
        deadline = time.monotonic() + timeout
        while not is_ready():
            status = process.poll()
            if status is not None:
                problem = f"exited with status {status} before it was ready"
            elif time.monotonic() > deadline:
                problem = f"was not ready within {timeout:.0f} s"
            else:
                time.sleep(_POLL_SECONDS)
                continue
            command = " ".join(map(str, process.args))
            raise error(f"{name} {problem} ({command}):\n{log_tails(logs)}")
    except BaseException:
        stop(process)
        raise


@contextmanager
def running(
    name: str,
    argv: Sequence[str],
    *,
    log: Path,
    is_ready: Callable[[], bool],
    stop_timeout: float = STOP_TIMEOUT,
    **start_options: Any,
) -> Iterator[subprocess.Popen[bytes]]:
    """`start`, then `stop` when the block ends, also when it raises."""
    process = start(name, argv, log=log, is_ready=is_ready, **start_options)
    try:
        yield process
    finally:
        stop(process, stop_timeout)


def stop(process: subprocess.Popen[Any], timeout: float = STOP_TIMEOUT, *, ask: bool = True) -> int:
    """Stops `process` and its process group, reaps it and returns its exit status.

    SIGTERM to it (unless not `ask`: the caller already asked it to end its own way), up to
    `timeout` seconds for it to exit, then SIGKILL to the whole group: the helpers and workers it
    forked are in it, even after it exited itself.
    """
    if process.poll() is None:
        if ask:
            process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    return process.wait()


def kill_processes_with_argument(argument: str) -> None:
    """SIGKILL to every process with `argument` among its command-line arguments: a process that
    left its group (Chromium started by Playwright has one of its own), found by a marker."""
    marker = argument.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            arguments = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in arguments:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)


def log_tails(logs: Sequence[Path], lines: int = _TAIL_LINES) -> str:
    """The last `lines` lines of each log that has any, each under its name."""
    parts = []
    for log in logs:
        try:
            text = log.read_text(errors="replace").splitlines()[-lines:]
        except FileNotFoundError:
            continue
        if text:
            parts.append(f"--- {log.name} ---\n" + "\n".join(text))
    return "\n".join(parts) or "(no output)"


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET
