"""The learned table in the confdir: survives restarts, shared by the workers of one proxy.

One JSON file (`preconnect.json`, versioned, see table.py). Each worker learns into its own copy
and keeps the page loads it learned since it last merged; `merge` then, under an exclusive
flock on a lock file beside it, reads the file, learns those loads into what it read, writes the
result atomically (temporary file, fsync, rename) and returns it as the worker's new copy. Every
load is thus learned into the shared table exactly once, whatever the number of workers, and a
reader never sees a half-written file. The work per merge is bounded by the table's limits.

With several workers, the parts of page loads (assembly.py) wait in the same file, under
`parts`, until they can be put together; the merge that finds a navigation settled learns it.

A file that cannot be read or is not a table is logged and treated as empty (and replaced at the
next merge): losing what was learned costs some warm connections, never the proxy.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from reshape.features.preconnect.assembly import Learned, NavigationParts
from reshape.features.preconnect.table import DEFAULT_HALF_LIFE, OriginTable

log = logging.getLogger("reshape.preconnect")

FILE_NAME = "preconnect.json"


class TableStore:
    def __init__(
        self,
        path: Path,
        *,
        max_first_parties: int = 1000,
        max_origins: int = 50,
        half_life: float = DEFAULT_HALF_LIFE,
    ) -> None:
        self.path = path
        self.lock_path = path.with_name(path.name + ".lock")
        self.max_first_parties = max_first_parties
        self.max_origins = max_origins
        self.half_life = half_life

    def empty(self) -> OriginTable:
        return OriginTable(
            max_first_parties=self.max_first_parties,
            max_origins=self.max_origins,
            half_life=self.half_life,
        )

    def load(self) -> OriginTable:
        """The table as last written; empty (with a warning) if it cannot be read."""
        return self._read()[0]

    def merge(
        self,
        learned: Sequence[Learned],
        parts: Sequence[Learned] = (),
        *,
        now: float = 0.0,
        settle_after: float | None = None,
    ) -> OriginTable:
        """Learn `learned` into the shared file, add `parts` to the waiting parts and, with
        `settle_after`, learn the navigations that have settled by `now`; returns the table.
        OSError if the confdir cannot be written (the caller keeps its own copy and tries
        again later)."""
        with self._locked():
            table, waiting = self._read()
            changed = bool(learned or parts) or not self.path.exists()
            for each in learned:
                table.learn(each.outcome, max_misses=each.max_misses)
            for part in parts:
                waiting.add(part)
            if settle_after is not None:
                for each in waiting.settled(now, settle_after):
                    table.learn(each.outcome, max_misses=each.max_misses)
                    changed = True
            if changed:
                self._write(table, waiting)
            return table

    def _read(self) -> tuple[OriginTable, NavigationParts]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return self.empty(), NavigationParts()
        except OSError as e:
            log.warning("preconnect: cannot read %s (%s); starting empty", self.path, e)
            return self.empty(), NavigationParts()
        try:
            data = json.loads(raw.decode("utf-8"))
            table = OriginTable.from_json(
                data,
                max_first_parties=self.max_first_parties,
                max_origins=self.max_origins,
                half_life=self.half_life,
            )
        except (ValueError, TypeError, RecursionError) as e:
            log.warning(
                "preconnect: %s is not a preconnect table (%s); starting empty", self.path, e
            )
            return self.empty(), NavigationParts()
        return table, NavigationParts.from_json(data.get("parts"))

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _write(self, table: OriginTable, parts: NavigationParts) -> None:
        document = {**table.to_json(), "parts": parts.to_json()}
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(document, f, separators=(",", ":"))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
