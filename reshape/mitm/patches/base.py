"""What every patch of mitmproxy's internals shares: install, uninstall, the version guard.

A patch replaces attributes of mitmproxy's modules and classes (methods, module globals) with its
own and can put the originals back. It refuses to install on a mitmproxy version it was not
checked on, or on a release of another library it replaces the internals of (h2) that it was
not checked on: a silently wrong patch would corrupt traffic, a refusal is one line at start-up.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from typing import Any, ClassVar

import mitmproxy.version

from reshape.base.errors import ReshapeError

# The mitmproxy releases whose source every patch here was read against and tested on.
CHECKED_ON = ("12.2.3",)


class PatchError(ReshapeError):
    """A patch cannot be installed (an unchecked mitmproxy version, or installed twice)."""


Replacement = tuple[Any, str, Any]  # (owner: module or class, attribute name, new value)


class Patch:
    """One change to mitmproxy's internals. Subclasses say what they replace in
    `replacements()`, which runs at install time (so wrappers wrap what is there then)."""

    checked_on: Sequence[str] = CHECKED_ON
    # Other libraries whose internals the patch replaces: package → releases it was checked on.
    libraries_checked_on: ClassVar[Mapping[str, Sequence[str]]] = {}

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, bool, Any]] | None = None

    @property
    def name(self) -> str:
        return type(self).__name__

    @property
    def installed(self) -> bool:
        return self._saved is not None

    def replacements(self) -> Iterable[Replacement]:
        raise NotImplementedError

    def install(self) -> None:
        version = mitmproxy.version.VERSION
        if version not in self.checked_on:
            raise PatchError(
                f"patch {self.name} was checked on mitmproxy {', '.join(self.checked_on)}, "
                f"not {version}: pin mitmproxy or re-check the patch"
            )
        for package, releases in self.libraries_checked_on.items():
            version = importlib.metadata.version(package)
            if version not in releases:
                raise PatchError(
                    f"patch {self.name} was checked on {package} {', '.join(releases)}, "
                    f"not {version}: pin {package} or re-check the patch"
                )
        if self._saved is not None:
            raise PatchError(f"patch {self.name} is already installed")
        saved = []
        for owner, attribute, value in list(self.replacements()):
            # A class attribute that was inherited is deleted again on uninstall, not copied down.
            own = attribute in vars(owner)
            saved.append((owner, attribute, own, vars(owner).get(attribute)))
            setattr(owner, attribute, value)
        self._saved = saved

    def uninstall(self) -> None:
        if self._saved is None:
            return
        for owner, attribute, own, original in reversed(self._saved):
            if own:
                setattr(owner, attribute, original)
            else:
                delattr(owner, attribute)
        self._saved = None


class Patches:
    """The patches of one process, installed together and removed in reverse order (patches of
    the same method wrap one another)."""

    def __init__(self, patches: Iterable[Patch]) -> None:
        self.patches = list(patches)

    def install(self) -> None:
        done: list[Patch] = []
        try:
            for patch in self.patches:
                patch.install()
                done.append(patch)
        except BaseException:
            for patch in reversed(done):
                patch.uninstall()
            raise

    def uninstall(self) -> None:
        for patch in reversed(self.patches):
            patch.uninstall()

    def __enter__(self) -> Patches:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstall()


def relay(
    commands_: Generator[Any, Any, Any], change: Callable[[Any], Sequence[Any]]
) -> Generator[Any, Any, Any]:
    """Pass on the commands of a wrapped layer method, and each reply back to it, as `change`
    has them: `change(command)` returns what to yield in the command's place — the command
    itself, a replacement, or extra commands before it (the reply to the last goes back).
    Returns what the wrapped method returns."""
    reply = None
    while True:
        try:
            command = commands_.send(reply)
        except StopIteration as stop:
            return stop.value
        *extra, last = change(command)
        for before in extra:  # noqa: UP028 (`yield from` a list would choke on replies)
            yield before
        reply = yield last
