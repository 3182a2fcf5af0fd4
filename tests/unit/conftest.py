"""Unit tests run without network and without processes: a test that opens an inet socket (or
resolves a name) or starts a process fails, also when it catches the error. Tests that need
either belong in tests/system/ (or tests/hardening/, tests/bench/).

Sockets are pytest-socket's guard (AF_UNIX stays allowed: asyncio's event loop wakes itself
through a unix socketpair). Processes: pytest-socket has no counterpart, so every way the
standard library starts one is replaced for the duration of each test phase.
"""

from __future__ import annotations

import _posixsubprocess
import os
import socket
import subprocess
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import pytest_socket

# Everything that ends in fork/exec: subprocess (and so asyncio's subprocesses, os.popen),
# multiprocessing (fork_exec directly, or os.fork), os.system, os.spawn* (os.fork), pty (os.fork,
# os.forkpty), and posix_spawn.
PROCESS_STARTERS: tuple[tuple[object, str], ...] = (
    (subprocess.Popen, "_execute_child"),
    (_posixsubprocess, "fork_exec"),
    (os, "fork"),
    (os, "forkpty"),
    (os, "posix_spawn"),
    (os, "posix_spawnp"),
    (os, "system"),
)


class ProcessBlockedError(RuntimeError):
    """A unit test tried to start a process."""


@contextmanager
def no_network_no_processes() -> Iterator[list[str]]:
    """Inet sockets, name lookups and new processes raise inside the block; the list it yields
    names every attempt, so that one the code under test swallowed still fails the test."""
    attempts: list[str] = []
    with pytest.MonkeyPatch.context() as patch:
        # Put back on exit what was there before, whatever pytest-socket did meanwhile.
        for name in ("socket", "getaddrinfo", "gethostbyname"):
            patch.setattr(socket, name, getattr(socket, name))
        # pytest-socket's own teardown hook lifts its guard before fixtures are finalised;
        # fixtures of unit tests stay guarded too.
        patch.setattr(pytest_socket, "_remove_restrictions", lambda: None)
        for owner, name in PROCESS_STARTERS:
            patch.setattr(owner, name, _refusal(name, attempts))
        pytest_socket.disable_socket(allow_unix_socket=True)
        patch.setattr(socket, "socket", _recording_socket(socket.socket, attempts))
        for name in ("getaddrinfo", "gethostbyname"):
            patch.setattr(socket, name, _recording(name, getattr(socket, name), attempts))
        yield attempts


def _refusal(name: str, attempts: list[str]) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        attempts.append(name)
        raise ProcessBlockedError(
            f"a unit test tried to start a process ({name}): move it to tests/system/"
        )

    return refuse


def _recording_socket(guarded: type[socket.socket], attempts: list[str]) -> type[socket.socket]:
    """pytest-socket's guarded class, noting each inet socket before it refuses it."""

    class RecordingSocket(guarded):  # type: ignore[valid-type, misc]
        def __new__(cls, family: int = -1, *args: Any, **kwargs: Any) -> RecordingSocket:
            if family != socket.AF_UNIX:
                attempts.append(f"socket.socket(family={family!r})")
            return super().__new__(cls, family, *args, **kwargs)

    return RecordingSocket


def _recording(name: str, blocked: Callable[..., Any], attempts: list[str]) -> Callable[..., Any]:
    def record(*args: Any, **kwargs: Any) -> Any:
        attempts.append(f"socket.{name}{args!r}")
        return blocked(*args, **kwargs)

    return record


def _guarded(item: pytest.Item) -> Generator[None, object, object]:
    with no_network_no_processes() as attempts:
        result = yield
    if attempts:
        pytest.fail(
            f"{item.nodeid} opened a socket or started a process (unit tests do neither; "
            f"tests/system/ is for those): {', '.join(attempts)}",
            pytrace=False,
        )
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _guarded(item))
