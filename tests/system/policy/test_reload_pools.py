"""A reload that changes a policy's `upstream:` knobs: the old pool's connections do not stay
beside the new pool's, so the origin never holds more than the cap for longer than the old
pool's requests last."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from pathlib import Path

import httpx

from tests.support.reshape_process import StartProxy
from tests.support.scripted_origins import ScriptedOrigin
from tests.system.policy.test_reload_under_load import replace_file, wait_for


class CountingOrigin(ScriptedOrigin):
    """HTTP/1.1 keep-alive, each answer after 0.2 s; counts its connections open now and most."""

    def __init__(self, host: str) -> None:
        super().__init__(host)
        self.lock = threading.Lock()
        self.open = 0
        self.most_open = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with self.lock:
            self.open += 1
            self.most_open = max(self.most_open, self.open)
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                await asyncio.sleep(0.2)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        finally:
            with self.lock:
                self.open -= 1


def policy(idle_timeout: int) -> str:
    knobs = f"{{max_connections_per_host: 2, http2: false, idle_timeout: {idle_timeout}}}"
    return f"version: 1\ndefault: p\npolicies:\n  p: {{upstream: {knobs}}}\n"


def load(proxy_url: str, url: str) -> list[int]:
    statuses: list[int] = []

    def one() -> None:
        with httpx.Client(proxy=proxy_url, timeout=10) as client:
            statuses.append(client.get(url).status_code)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    return statuses


def test_reloads_that_change_the_knobs_never_leave_more_than_the_cap_at_the_origin(
    start_reshape: StartProxy, tmp_path: Path
) -> None:
    # Each reload changed only the idle timeout; the old pools kept their idle connections for
    # theirs: after 6 reloads 12 connections were open to an origin whose cap was 2 throughout.
    path = tmp_path / "policy.yaml"
    path.write_text(policy(300))
    proxy = start_reshape(policy=path)
    with CountingOrigin("127.0.0.125") as origin:
        url = origin.url("/")
        for reload in range(1, 4):
            assert load(proxy.proxy_url, url) == [200] * 4
            replace_file(path, policy(300 + reload))
            if reload % 2:
                proxy.process.send_signal(signal.SIGHUP)
            wait_for(proxy, "ok", reload)
            deadline = time.monotonic() + 5
            while origin.open and time.monotonic() < deadline:
                time.sleep(0.05)
            assert origin.open == 0  # the old pool's idle connections closed with the reload
        assert load(proxy.proxy_url, url) == [200] * 4
        assert origin.most_open == 2
