"""A process's resident memory, read from /proc, for tests that bound what a transfer costs."""

from __future__ import annotations

import threading
import time
from pathlib import Path


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class RssPeak:
    """A process's resident memory while the `with` block runs, sampled every 50 ms: `before`
    (on entry) and `peak` bytes."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.before = self.peak = 0
        self._done = threading.Event()
        self._sampler = threading.Thread(target=self._sample)

    def __enter__(self) -> RssPeak:
        self.before = self.peak = rss_bytes(self.pid)
        self._sampler.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._sampler.join()

    def _sample(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, rss_bytes(self.pid))
            time.sleep(0.05)
