"""`reshape run --workers 2`: every per-host cap holds for all workers together (the supervisor's
budget broker, reshape/upstream/budget/), against an origin that counts its open connections
while many simulated browsers load through the proxy."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.origin_sockets import origin_connections_by_process
from tests.support.reshape_process import RunningProxy, StartProxy
from tests.support.scripted_origins import ScriptedOrigin
from tests.system.app.test_supervisor import wait_healthy, worker_pids

ORIGIN_HOST = "127.0.0.93"
BROWSERS = 10
CONNECTIONS_PER_BROWSER = 6  # what a browser opens to one proxy
REQUESTS_PER_CONNECTION = 5
LOAD_TIMEOUT = 120.0


class CountingOrigin(ScriptedOrigin):
    """Keep-alive HTTP/1.1, each request answered `ok` after `delay` seconds; counts the
    connections open at once as its kernel sees them: from accept until the peer's FIN (or
    reset) has arrived, looked at as each new connection begins.

    Not until this loop has read that FIN: the proxy closes a connection before the broker
    hands its slot to another worker, but this loop (on a thread beside the test's clients)
    can begin the new connection before it reads the old one's end, or only read it when an
    answer is due (a dead worker's connections, `delay` later).
    """

    def __init__(self, host: str, delay: float) -> None:
        super().__init__(host)
        self.delay = delay
        self.most_open = 0
        self.connections = 0
        self._peers: dict[int, socket.socket] = {}  # per connection, a copy to peek with

    @property
    def open(self) -> int:
        return sum(1 for peer in list(self._peers.values()) if not _peer_closed(peer))

    def reset_most_open(self) -> None:
        self.most_open = self.open

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        fd = writer.get_extra_info("socket").fileno()
        self._peers[number] = socket.socket(fileno=os.dup(fd))
        self.most_open = max(self.most_open, self.open)
        try:
            while True:
                try:
                    await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                await asyncio.sleep(self.delay)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        finally:
            self._peers.pop(number).close()
            writer.close()


def _peer_closed(peer: socket.socket) -> bool:
    """Whether the peer's FIN (or a reset) has arrived: only the end is left to read."""
    try:
        return peer.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


@pytest.fixture
def origin() -> Iterator[CountingOrigin]:
    with CountingOrigin(ORIGIN_HOST, delay=0.02) as running:
        yield running


def policy(tmp_path: Path, knobs: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(f"version: 1\ndefault: p\npolicies:\n  p: {knobs}\n")
    return path


def browse(
    proxy: RunningProxy,
    origin: CountingOrigin,
    connections: int = BROWSERS * CONNECTIONS_PER_BROWSER,
    requests: int = REQUESTS_PER_CONNECTION,
) -> list[str]:
    """`connections` client connections at once, each sending `requests` one after the other
    (keep-alive); the outcome of every request ("200", or the error)."""
    host, port = proxy.listen.rsplit(":", 1)
    outcomes: list[str] = []

    def connection(n: int) -> None:
        client = http.client.HTTPConnection(host, int(port), timeout=60)
        try:
            for i in range(requests):
                client.request("GET", origin.url(f"/{n}/{i}"))
                response = client.getresponse()
                body = response.read()
                outcomes.append(str(response.status) if body == b"ok" else f"body {body!r}")
        except (OSError, http.client.HTTPException) as e:
            outcomes.append(repr(e))
        finally:
            client.close()

    threads = [threading.Thread(target=connection, args=(n,)) for n in range(connections)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + LOAD_TIMEOUT
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    assert not any(thread.is_alive() for thread in threads), "the load did not finish in time"
    return outcomes


def serving_processes(proxy: RunningProxy) -> set[int]:
    """The processes that logged a completed request (--log-format json --log-requests)."""
    pids = set()
    for line in proxy.log().splitlines():
        if line.startswith("{") and '"status"' in line:
            pids.add(json.loads(line)["process"])
    return pids


START = ("--workers", "2", "--log-format", "json", "--log-requests")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("knobs", "cap"),
    [
        ("{upstream: {max_connections_per_host: 2}}", 2),
        ("{}", 6),  # no upstream: section: the browser-like limits, 6 per host
    ],
    ids=["pooled-2", "default-6"],
)
def test_two_workers_never_put_more_than_the_cap_on_an_origin(
    start_reshape: StartProxy, origin: CountingOrigin, tmp_path: Path, knobs: str, cap: int
) -> None:
    proxy = start_reshape(*START, policy=policy(tmp_path, knobs))
    outcomes = browse(proxy, origin)
    assert outcomes == ["200"] * BROWSERS * CONNECTIONS_PER_BROWSER * REQUESTS_PER_CONNECTION, {
        o for o in outcomes if o != "200"
    }
    assert len(serving_processes(proxy)) == 2, "both workers served browsers"
    # Without the shared budget each worker would keep its own cap: twice it at the origin.
    assert origin.most_open == cap
    # The supervisor's /metrics says the workers waited for each other's slots; once the load
    # is over nobody waits (a wait its pool has no request for is called off a moment later).
    assert proxy.metric("reshape_upstream_budget_waits_total") > 0
    deadline = time.monotonic() + 5
    while proxy.metric("reshape_upstream_budget_waiting") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert proxy.metric("reshape_upstream_budget_waiting") == 0


@pytest.mark.slow
def test_busy_workers_ask_for_slots_per_connection_not_per_request(
    start_reshape: StartProxy, origin: CountingOrigin, tmp_path: Path
) -> None:
    """Ten clients keep both workers busy under the default cap of 6: each worker's queue
    empties and fills again all the time while it waits for a slot the other holds. Its wait
    stands (it is its share of the cap) instead of being called off and asked again per
    request, which cost CPU on every request."""
    origin.delay = 0.0
    proxy = start_reshape(*START, policy=policy(tmp_path, "{}"))
    requests = 10 * 100
    assert browse(proxy, origin, connections=10, requests=100) == ["200"] * requests
    assert origin.most_open <= 6
    assert proxy.metric("reshape_upstream_budget_waits_total") < requests / 10


@pytest.mark.slow
def test_the_slots_of_a_worker_that_dies_come_back(
    start_reshape: StartProxy, origin: CountingOrigin, tmp_path: Path
) -> None:
    # A short queue timeout: a request that found no slot would fail, not wait for an idle
    # timeout to free one.
    knobs = "{upstream: {max_connections_per_host: 2, queue_timeout: 5, idle_timeout: 300}}"
    proxy = start_reshape(*START, policy=policy(tmp_path, knobs))
    assert set(browse(proxy, origin)) == {"200"}
    # One connection or two: a slot can be between workers as the load ends (a worker closed
    # its idle connection for the other, whose wait is then called off: the slot is free).
    holders = origin_connections_by_process(origin.host, origin.port)
    assert 1 <= sum(holders.values()) <= 2, holders
    # A worker that holds a slot dies; the kernel closes its origin connection, the broker
    # sees its socket close.
    victim = max(holders, key=lambda pid: (holders[pid], pid))
    os.kill(victim, signal.SIGKILL)
    # Load again once the supervisor has replaced it (the connections a dying worker's
    # listener had queued are reset with it: tests/system/app/test_supervisor.py).
    wait_replaced(proxy, victim)
    # The dead worker's gauges went with it: the most per origin stayed at its last value.
    survivors = sum(n for pid, n in holders.items() if pid != victim)
    assert proxy.metric("reshape_upstream_connections_per_host_max") == survivors
    assert proxy.metric("reshape_upstream_connections_active") == survivors
    origin.reset_most_open()
    assert set(browse(proxy, origin)) == {"200"}
    # Both slots were to be had again (a leaked one would have left the load one connection).
    assert origin.most_open == 2
    assert proxy.stop() == 0


@pytest.mark.slow
def test_the_slots_of_a_worker_killed_mid_request_come_back(
    start_reshape: StartProxy, origin: CountingOrigin, tmp_path: Path
) -> None:
    knobs = "{upstream: {max_connections_per_host: 2, queue_timeout: 5, idle_timeout: 300}}"
    proxy = start_reshape(*START, policy=policy(tmp_path, knobs))
    origin.delay = 3.0
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(browse, proxy, origin, 4, 1)
        # Both slots carry a request the origin is still answering when a holder dies.
        deadline = time.monotonic() + 10
        while origin.open < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        holders = origin_connections_by_process(origin.host, origin.port)
        assert sum(holders.values()) == 2, holders
        victim = sorted(holders)[0]
        os.kill(victim, signal.SIGKILL)
        origin.delay = 0.02
        outcomes = slow.result(LOAD_TIMEOUT)
    # The victim's clients lose their requests with it (their connections reset); whatever
    # the survivor had is answered, none turned away for want of a slot.
    assert len(outcomes) == 4, outcomes
    assert {o for o in outcomes if o.isdigit()} <= {"200"}, outcomes
    wait_replaced(proxy, victim)
    origin.reset_most_open()
    assert set(browse(proxy, origin)) == {"200"}
    assert origin.most_open == 2
    assert proxy.stop() == 0


def wait_replaced(proxy: RunningProxy, victim: int) -> None:
    """Until the supervisor has replaced the killed worker `victim`, and answers healthy."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pids = worker_pids(proxy)
        if victim not in pids and len(pids) == 2:
            break
        time.sleep(0.1)
    wait_healthy(proxy)
