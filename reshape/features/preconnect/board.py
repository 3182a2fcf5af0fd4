"""Where the workers of one proxy announce the navigations they saw begin.

One small file per client address in `<confdir>/preconnect-navigations/`, named by a hash of the
address, holding the client's latest navigation: first party and start. The worker that sees a
document request writes it (temporary file, rename: a reader sees the old or the new one whole);
a worker that gets a request from a client whose navigation it did not see reads it
(navigations.py `adopt`). Files older than a navigation can last are removed by `sweep`, so the
directory holds at most one file per client active in that time.

Reads and writes are a few hundred bytes on the local disk, done on the event loop: cheaper than a
thread hop, and a worker reads a client's file at most every `CHECK_SECONDS`
(reshape/features/preconnect/addon.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import time
from pathlib import Path

log = logging.getLogger("reshape.preconnect")

DIRECTORY_NAME = "preconnect-navigations"


class NavigationBoard:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, client: str) -> Path:
        return self.directory / (hashlib.sha256(client.encode()).hexdigest()[:24] + ".json")

    def publish(self, client: str, first_party: str, started: float) -> None:
        """Announce that `client` navigated to `first_party` at `started` (wall-clock time)."""
        record = json.dumps({"client": client, "first_party": first_party, "started": started})
        try:
            self.directory.mkdir(mode=0o700, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".nav.", dir=self.directory)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(record)
            os.replace(tmp, self._path(client))
        except OSError as e:
            log.warning("preconnect: cannot announce a navigation in %s: %s", self.directory, e)

    def lookup(self, client: str) -> tuple[str, float] | None:
        """The client's latest announced navigation (first party, start), if any."""
        try:
            data = json.loads(self._path(client).read_bytes())
            if data["client"] != client:
                return None  # a hash collision: not this client's
            return str(data["first_party"]), float(data["started"])
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def sweep(self, older_than: float) -> None:
        """Remove announcements (and left-over temporary files) older than `older_than` s."""
        limit = time.time() - older_than
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.directory):
                with contextlib.suppress(OSError):
                    if entry.stat().st_mtime < limit:
                        os.unlink(entry.path)
