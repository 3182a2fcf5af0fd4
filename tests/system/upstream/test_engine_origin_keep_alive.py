"""An HTTP/1.1 origin's keep-alive terms (its `Keep-Alive` field), kept by the pool: real
clients → reshape → relay (a distant origin) → Node.js's own HTTP server.

Node states `Keep-Alive: timeout=1` with `keepAliveTimeout` 1 s (and closes a second later,
tests/support/node_origin.py), and `max=3` with `maxRequestsPerSocket` 3."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from labkit.relay import Link, RelayThread, relays
from tests.support.node_origin import node_origin
from tests.support.reshape_process import StartProxy

pytestmark = pytest.mark.slow

RTT = 0.2  # proxy ↔ origin


@pytest.fixture
def relay_thread() -> Iterator[RelayThread]:
    with relays() as thread:
        yield thread


def policy_file(tmp_path: Path, upstream: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(
        f"version: 1\ndefault: pooled\npolicies:\n  pooled:\n    upstream: {upstream}\n"
    )
    return path


def test_a_post_after_an_idle_spell_finds_no_connection_its_origin_is_closing(
    start_reshape: StartProxy, tmp_path: Path, relay_thread: RelayThread
) -> None:
    """A POST sent as the origin's keep-alive timeout ends reaches it on a new connection: the
    pool closed the idle one first, as the origin asked. Before, the pool kept the connection
    for its own 60 s idle timeout, wrote the POST to it as the origin closed it, and the
    client got a 502 (a POST is never sent twice)."""
    with node_origin(tmp_path / "node", "127.0.0.2", keep_alive_timeout=1.0) as origin:
        relay = relay_thread.add("127.0.0.15", (origin.host, origin.port), Link.rtt(RTT))
        proxy = start_reshape(
            policy=policy_file(tmp_path, "{max_connections_per_host: 1, idle_timeout: 60}")
        )
        base = f"http://127.0.0.15:{relay.port}"

        async def browse() -> list[httpx.Response]:
            async with httpx.AsyncClient(proxy=proxy.proxy_url, timeout=30) as client:
                first = await client.get(f"{base}/page")
                answered = time.monotonic()
                # Node closes 2 s after it sent the answer, which took RTT/2 to come: the POST
                # leaves ~RTT/2 before Node's FIN can reach the proxy, and reaches Node ~RTT/2
                # after its close (the middle of the race's window).
                await asyncio.sleep(2.0 - RTT / 2 - 0.02 - (time.monotonic() - answered))
                second = await client.post(f"{base}/orders", content=b"{}")
                return [first, second]

        responses = asyncio.run(browse())
        assert [r.status_code for r in responses] == [200, 200], responses[-1].text
        assert responses[1].text == "POST /orders 2\n"
        connections = origin.connections()
    assert [c.requests for c in connections] == [[("GET", "/page")], [("POST", "/orders")]]
    assert connections[0].client_closed  # the proxy closed it before Node did
    assert proxy.metric("reshape_requests_total", outcome="ok") == 2


def test_a_pipeline_stops_at_the_requests_its_origin_takes_on_a_connection(
    start_reshape: StartProxy, tmp_path: Path, relay_thread: RelayThread
) -> None:
    """Node takes 3 requests on a connection and answers those pipelined past them with 503s
    behind its close: the pool pipelines no more than that onto it, so nothing goes again.
    Before, the fourth of each pipeline went unanswered behind the close and again elsewhere."""
    with node_origin(
        tmp_path / "node", "127.0.0.2", keep_alive_timeout=5.0, max_requests_per_socket=3
    ) as origin:
        relay = relay_thread.add("127.0.0.15", (origin.host, origin.port), Link.rtt(RTT))
        proxy = start_reshape(
            policy=policy_file(tmp_path, "{max_connections_per_host: 1, pipeline_depth: 4}")
        )
        base = f"http://127.0.0.15:{relay.port}"

        async def browse() -> list[httpx.Response]:
            limits = httpx.Limits(max_connections=6)
            async with httpx.AsyncClient(
                proxy=proxy.proxy_url, limits=limits, timeout=30
            ) as client:
                # The first answer says what the origin takes; then a burst.
                first = await client.get(f"{base}/r0")
                rest = await asyncio.gather(*(client.get(f"{base}/r{i}") for i in range(1, 12)))
                return [first, *rest]

        responses = asyncio.run(browse())
        assert [r.status_code for r in responses] == [200] * 12
        assert [r.text for r in responses] == [f"GET /r{i} 0\n" for i in range(12)]
        connections = origin.connections()
    assert all(len(c.requests) <= 3 for c in connections), connections
    assert sorted(url for c in connections for _, url in c.requests) == sorted(
        f"/r{i}" for i in range(12)
    )
    assert proxy.metric("reshape_upstream_retries_total") == 0
    assert proxy.metric("reshape_upstream_requests_total", connection="pipelined") > 0
