"""The connections processes hold to an origin, as the kernel lists them (`ss -tnp`): what a
pool keeps open, per process."""

from __future__ import annotations

import re
import subprocess


def origin_connections_by_process(host: str, port: int) -> dict[int, int]:
    """Established connections to `host`:`port`, per process that holds them."""
    out = subprocess.run(
        ["ss", "-tnpH", "state", "established", "dst", f"{host}:{port}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    held: dict[int, int] = {}
    for pid in re.findall(r"pid=(\d+)", out):
        held[int(pid)] = held.get(int(pid), 0) + 1
    return held
