"""CPU accounting of a process group from /proc, beyond the CPU time it used.

Used by bench/capacity and bench/queueing to show how much CPU other work on a shared machine
kept from the proxy they measure.
"""

from __future__ import annotations

from pathlib import Path


def group_runqueue_seconds(pgid: int) -> float:
    """Time the threads of process group `pgid` spent ready to run but waiting for a core.

    From /proc/PID/task/TID/schedstat (its second field, nanoseconds): how much CPU the machine's
    other work kept from the proxy."""
    total_ns = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            if int(text[text.rindex(")") + 2 :].split()[2]) != pgid:  # field 5, pgrp
                continue
            for schedstat in (stat.parent / "task").glob("*/schedstat"):
                total_ns += int(schedstat.read_text().split()[1])
        except (OSError, ValueError, IndexError):
            continue  # exited meanwhile
    return total_ns / 1e9


def own_runqueue_seconds() -> float:
    """The same for this process's own threads."""
    total_ns = 0
    for schedstat in Path("/proc/self/task").glob("*/schedstat"):
        try:
            total_ns += int(schedstat.read_text().split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return total_ns / 1e9
