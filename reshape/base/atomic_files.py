"""Writing files that other processes may read at the same moment (the files under `--confdir`).

Two reshape processes started at once on one confdir (workers, or two services sharing it) both
write the trust bundle and may both find the CA missing. A file is therefore written whole under a
temporary name in the same directory, with its final mode, flushed to disk, and renamed over the
old one: a reader opens the old file or the new one, never half of one (rename is atomic within
a file system). `exclusive` serialises a check-then-create between processes.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


def write_atomically(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace `path` with `data` in one rename; the file has `mode` before it appears. OSError
    if it cannot be written (nothing is left behind then)."""
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


@contextlib.contextmanager
def exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `lock_path` (created 0600 if missing) for the `with` block; the
    lock is released when the process ends, however it ends."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
