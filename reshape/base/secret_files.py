"""Files that hold secrets (the CA key, the users file) must be private to their owner."""

from __future__ import annotations

import stat
from pathlib import Path


def secret_file_problem(label: str, path: Path, mode: int) -> str | None:
    """What is wrong with a secret file of `mode` (from stat) — not a regular file, or readable
    by group or others — said with `label` ("CA key") and the fix; None if nothing."""
    if not stat.S_ISREG(mode):
        return f"{label} {path} is not a regular file"
    if mode & 0o077:
        return (
            f"{label} {path} is readable by group or others (mode {stat.S_IMODE(mode):04o}); "
            f"fix with: chmod 600 {path}"
        )
    return None
