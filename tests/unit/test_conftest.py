"""tests/unit/conftest.py: its guard fails a unit test that opens an inet socket, looks up a name
or starts a process, in any test phase and also when the test swallows the error; unix sockets
and asyncio's event loop stay allowed. Run on a small test file with pytester, in this process
(a subprocess is just what a unit test may not start)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

OFFENDERS = """
import asyncio
import contextlib
import multiprocessing
import os
import socket
import subprocess

import pytest


def test_an_event_loop_and_a_unix_socketpair_are_fine():
    asyncio.run(asyncio.sleep(0))
    left, right = socket.socketpair()
    left.close()
    right.close()


def test_an_inet_socket():
    socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()


def test_a_connection_whose_error_is_swallowed():
    with contextlib.suppress(Exception):
        socket.create_connection(("127.0.0.1", 9), timeout=1).close()


def test_a_name_lookup():
    socket.getaddrinfo("localhost", 80)


@pytest.fixture
def listening():
    with socket.socket(socket.AF_INET6) as server:
        yield server


def test_a_socket_in_a_fixture(listening):
    pass


def test_a_subprocess():
    subprocess.run(["true"], check=True)


def test_a_subprocess_whose_error_is_swallowed():
    with contextlib.suppress(Exception):
        subprocess.run(["true"], check=True)


def test_an_asyncio_subprocess():
    async def run():
        process = await asyncio.create_subprocess_exec("true")
        await process.wait()

    asyncio.run(run())


def test_a_fork():
    if os.fork() == 0:
        os._exit(0)


def test_multiprocessing():
    worker = multiprocessing.get_context("spawn").Process(target=print)
    worker.start()
    worker.join()


def test_os_system():
    assert os.system("true") == 0
"""


GUARD_SAYS = ("SocketBlockedError", "ProcessBlockedError", "opened a socket or started a process")


@pytest.fixture
def outcomes(pytester: pytest.Pytester) -> dict[str, str]:
    """Each test of OFFENDERS → "passed", or the phase that failed ("setup", "call") when it
    failed because of the guard."""
    pytester.makeconftest(Path(__file__).with_name("conftest.py").read_text())
    pytester.makepyfile(test_offenders=OFFENDERS)
    loop_scope = "asyncio_default_fixture_loop_scope=function"
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-o", loop_scope)
    found: dict[str, str] = {}
    for report in result.reprec.getreports("pytest_runtest_logreport"):
        name = report.nodeid.split("::")[-1]
        if report.failed:
            assert any(words in report.longreprtext for words in GUARD_SAYS), report.longreprtext
            found.setdefault(name, report.when)
        elif report.when == "call":
            found.setdefault(name, report.outcome)
    return found


def test_only_unix_sockets_and_the_event_loop_pass(outcomes: dict[str, str]) -> None:
    assert outcomes == {
        "test_an_event_loop_and_a_unix_socketpair_are_fine": "passed",
        "test_an_inet_socket": "call",
        "test_a_connection_whose_error_is_swallowed": "call",
        "test_a_name_lookup": "call",
        "test_a_socket_in_a_fixture": "setup",
        "test_a_subprocess": "call",
        "test_a_subprocess_whose_error_is_swallowed": "call",
        "test_an_asyncio_subprocess": "call",
        "test_a_fork": "call",
        "test_multiprocessing": "call",
        "test_os_system": "call",
    }
