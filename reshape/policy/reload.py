"""The policy file in force, and reloading it on SIGHUP or when the file changes.

`PolicyHolder` is what every part of a proxy process reads instead of a policy file captured at
start-up: the chooser (for each new request), the metrics'
pre-created label values, the connection strategy. A reload swaps `holder.current` in one
assignment on the event loop, so a request sees either the old file or the new one, never a mix;
requests already in flight keep the selection stored on their flow (reshape/policy/chooser.py).

An invalid new file is refused: the old policy stays, the log says why (every problem, with its
line), and `reshape_policy_reloads_total{outcome="invalid"}` counts it.

Change detection is polling, not inotify: one `stat()` a second is cheap and bounded, sees
editors that replace the file (new inode) as well as ones that rewrite it in place (size or
mtime), and works on every file system. `FileSignature` and `ChangeDetector` are the sans-IO
part; `watch_file` is the asyncio driver.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from reshape.policy.decode import Problem
from reshape.policy.loader import PolicyFileError, parse_policy_text
from reshape.policy.schema import Policy, PolicyFile

log = logging.getLogger("reshape.policy")

POLL_SECONDS = 1.0
# Older files kept so that a request routed under a policy the reload removed still finds it.
KEEP_PREVIOUS = 4


@dataclass(frozen=True)
class FileSignature:
    """What identifies one version of a file without reading it."""

    inode: int
    size: int
    mtime_ns: int


def file_signature(path: Path) -> FileSignature | None:
    """The file's signature, or None if it cannot be stat'ed (missing, no permission)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return FileSignature(st.st_ino, st.st_size, st.st_mtime_ns)


class ChangeDetector:
    """Says when a polled signature differs from the last one seen."""

    def __init__(self, initial: FileSignature | None) -> None:
        self.last = initial

    def changed(self, signature: FileSignature | None) -> bool:
        if signature == self.last:
            return False
        self.last = signature
        return True


@dataclass(frozen=True)
class ReloadResult:
    ok: bool
    message: str


Listener = Callable[[PolicyFile, PolicyFile], None]  # (old, new)


class PolicyHolder:
    """The policy file in force in this process, and the ones it replaced recently."""

    def __init__(self, path: Path | None, initial: PolicyFile) -> None:
        self.path = path
        self.current = initial
        self.text: str | None = None  # the current file's text, once it has been reloaded
        self.generation = 0
        self.previous: list[PolicyFile] = []
        self._listeners: list[Listener] = []
        # Told every reload's outcome, "ok" or "invalid" (telemetry counts them).
        self._outcome_listeners: list[Callable[[str], None]] = []

    def on_outcome(self, listener: Callable[[str], None]) -> None:
        """Call `listener("ok")` or `listener("invalid")` after every reload."""
        self._outcome_listeners.append(listener)

    def on_change(self, listener: Listener) -> None:
        """Call `listener(old, new)` after each successful reload."""
        self._listeners.append(listener)

    def policy(self, name: str) -> Policy | None:
        """The policy called `name`: from the current file, else from a file it replaced (for a
        request selected before a reload removed its policy)."""
        for policy_file in (self.current, *self.previous):
            policy = policy_file.policies.get(name)
            if policy is not None:
                return policy
        return None

    def reload(self, reason: str) -> ReloadResult:
        """Read the file again; keep the old policy if the new one is invalid."""
        if self.path is None:
            return ReloadResult(False, "no policy file to reload")
        try:
            text = read_policy_text(self.path)
            new = parse_policy_text(text, self.path)
        except PolicyFileError as e:
            for outcome_listener in self._outcome_listeners:
                outcome_listener("invalid")
            log.error(
                "policy reload (%s) refused, keeping the previous policy:\n%s", reason, str(e)
            )
            return ReloadResult(False, str(e))
        old = self.current
        self.previous = [old, *self.previous][:KEEP_PREVIOUS]
        self.current, self.text = new, text
        self.generation += 1
        for listener in self._listeners:
            listener(old, new)
        for outcome_listener in self._outcome_listeners:
            outcome_listener("ok")
        message = (
            f"{self.path}: default {new.default!r}, {len(new.policies)} policies, "
            f"{len(new.rules)} rules, {len(new.experiments)} experiments"
        )
        log.info("policy reloaded (%s): %s", reason, message)
        return ReloadResult(True, message)


def read_policy_text(path: Path) -> str:
    """The file's text, or a PolicyFileError saying why it cannot be read."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PolicyFileError(path, [Problem(None, "", "no such file")]) from None
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise PolicyFileError(path, [Problem(None, "", f"cannot read: {reason}")]) from None


async def watch_file(
    path: Path,
    on_change: Callable[[], object],
    interval: float = POLL_SECONDS,
) -> None:
    """Call `on_change()` whenever the file's signature changes; runs until cancelled."""
    detector = ChangeDetector(file_signature(path))
    while True:
        await asyncio.sleep(interval)
        if detector.changed(file_signature(path)):
            on_change()


def watch_policy(
    holder: PolicyHolder,
    interval: float = POLL_SECONDS,
    after_sighup: Callable[[], object] | None = None,
) -> asyncio.Task[None]:
    """Reload `holder` on SIGHUP (then call `after_sighup`) and when its file changes; cancel the
    task to stop both."""
    assert holder.path is not None
    path = holder.path
    loop = asyncio.get_running_loop()

    def sighup() -> None:
        holder.reload("SIGHUP")
        if after_sighup is not None:
            after_sighup()

    loop.add_signal_handler(signal.SIGHUP, sighup)

    async def run() -> None:
        try:
            await watch_file(path, lambda: holder.reload("file changed"), interval)
        finally:
            loop.remove_signal_handler(signal.SIGHUP)

    return asyncio.create_task(run(), name="policy file watcher")
