"""A client connection that has ended leaves nothing behind in the proxy's memory.

Found by a black-box review (2026-12-04): every client connection that sent a request was kept
for good, ~100 KB for an HTTPS client (CONNECT, TLS, HTTP/2, one request): the engine join kept
each client's engine connection in weak-keyed dictionaries whose values referred back to their
keys (reshape/mitm/patches/engine_join.py). The proxy's memory grew with every client, its
gauges and file descriptors back at their baseline; mitmdump's stayed flat. Here: clients of
one request each, a first batch to reach the proxy's steady state, then a second as large,
whose clients must not add what they used to (~30 MB for 300 of them, ~100 KB each)."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import httpx
import pytest

from labkit.origins import Origin
from tests.support.memory import rss_bytes
from tests.support.reshape_process import REPO, RunningProxy, StartProxy

WARM_UP, MEASURED = 300, 300
CONCURRENT = 50
# What 300 finished clients may still add (allocator slack, caches filling up: 1-4 MB here);
# the leak added ~30 MB for them.
ALLOWED_GROWTH = 10 << 20


@pytest.fixture
def site_root(tmp_path: Path) -> Path:
    root = tmp_path / "www"
    root.mkdir()
    (root / "ok.txt").write_text("ok\n")
    return root


async def clients(proxy: RunningProxy, url: str, count: int) -> None:
    """`count` clients, each its own connection (a CONNECT tunnel, TLS, HTTP/2) for one GET."""
    context = ssl.create_default_context(cafile=str(proxy.ca_cert))

    async def one() -> None:
        async with httpx.AsyncClient(proxy=proxy.proxy_url, verify=context, http2=True) as c:
            response = await c.get(url, timeout=20)
            assert response.status_code == 200, response.text

    for _ in range(0, count, CONCURRENT):
        await asyncio.gather(*(one() for _ in range(CONCURRENT)))


@pytest.mark.slow
def test_finished_client_connections_are_freed(
    start_reshape: StartProxy, https_origin: Origin
) -> None:
    proxy = start_reshape(policy=REPO / "policies/pooled.yaml")
    url = https_origin.url("/ok.txt")
    asyncio.run(clients(proxy, url, WARM_UP))
    before = rss_bytes(proxy.process.pid)
    asyncio.run(clients(proxy, url, MEASURED))
    grown = rss_bytes(proxy.process.pid) - before
    assert grown < ALLOWED_GROWTH, f"{grown / 2**20:.1f} MB more after {MEASURED} clients"
