"""An HTTP/1.1 origin's keep-alive terms (its `Keep-Alive` field), kept by the pool: real
clients → reshape → relay (a distant origin) → Node.js's own HTTP server, or Debian's Apache.

With a 1 s keep-alive timeout both say `Keep-Alive: timeout=1`; Apache closes an idle
connection 1 s after its answer, Node 20 a second later (tests/support/node_origin.py). With a
limit of 3 requests per connection Node says `max=3` each time and takes 3; Apache
(MaxKeepAliveRequests 3) counts down from `max=3` and takes 4."""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from bench.capacity.apache import APACHE, ApacheSettings, apache
from labkit.relay import Link, Relay, RelayThread, relays
from tests.support.node_origin import NodeOrigin, node_origin
from tests.support.reshape_process import RunningProxy, StartProxy

pytestmark = pytest.mark.slow

RTT = 0.2  # proxy ↔ origin
ORIGINS = ["node", "apache"]


@dataclass(frozen=True)
class Served:
    host: str
    port: int
    closes_idle_after: float  # seconds after its answer
    takes: int  # requests on one connection
    node: NodeOrigin | None  # Node logs its connections


@contextmanager
def origin_of(
    kind: str, tmp_path: Path, *, keep_alive_timeout: float, max_requests: int
) -> Iterator[Served]:
    if kind == "node":
        with node_origin(
            tmp_path / "node",
            "127.0.0.2",
            keep_alive_timeout=keep_alive_timeout,
            max_requests_per_socket=max_requests,
        ) as node:
            yield Served(node.host, node.port, keep_alive_timeout + 1, max_requests or 10**9, node)
        return
    if not APACHE.exists():
        pytest.skip("apache2 is not installed (tests/install-system-deps.sh installs it)")
    settings = ApacheSettings(
        max_request_workers=4,
        keepalive_timeout=keep_alive_timeout,
        max_keepalive_requests=max_requests or 1000,
    )
    # Apache's children (www-data) must pass through every parent of its directories, which
    # pytest's tmp_path (0700, under root's) does not let them.
    with tempfile.TemporaryDirectory(prefix="reshape-apache-") as place:
        Path(place).chmod(0o711)
        root, workdir = Path(place) / "www", Path(place) / "work"
        root.mkdir()
        for name in ("page", "orders", *(f"r{i}" for i in range(12))):
            (root / name).write_text(f"/{name}\n")
        with apache(root, "127.0.0.2", workdir, settings) as running:
            takes = settings.max_keepalive_requests + 1
            yield Served(running.host, running.port, keep_alive_timeout, takes, None)


def answer_of(served: Served, method: str, path: str, size: int) -> str:
    """What the origin's answer says: Node names the request, Apache serves the file."""
    return f"{method} {path} {size}\n" if served.node is not None else f"{path}\n"


@pytest.fixture
def relay_thread() -> Iterator[RelayThread]:
    with relays() as thread:
        yield thread


def behind_a_link(
    start_reshape: StartProxy,
    tmp_path: Path,
    relay_thread: RelayThread,
    served: Served,
    upstream: str,
) -> tuple[RunningProxy, Relay, str]:
    """reshape, its policy's `upstream:` knobs `upstream`, and the origin behind a link of
    RTT (the relay counts the origin's connections); and the origin's URL through the link."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        f"version: 1\ndefault: pooled\npolicies:\n  pooled:\n    upstream: {upstream}\n"
    )
    relay = relay_thread.add("127.0.0.15", (served.host, served.port), Link.rtt(RTT))
    return start_reshape(policy=policy), relay, f"http://127.0.0.15:{relay.port}"


@pytest.mark.parametrize("kind", ORIGINS)
def test_a_post_after_an_idle_spell_finds_no_connection_its_origin_is_closing(
    start_reshape: StartProxy, tmp_path: Path, relay_thread: RelayThread, kind: str
) -> None:
    """A POST sent as the origin's keep-alive timeout ends reaches it on a new connection: the
    pool closed the idle one first, as the origin asked. Before, the pool kept the connection
    for its own 60 s idle timeout, wrote the POST to it as the origin closed it, and the
    client got a 502 (a POST is never sent twice)."""
    with origin_of(kind, tmp_path, keep_alive_timeout=1.0, max_requests=0) as served:
        proxy, relay, base = behind_a_link(
            start_reshape,
            tmp_path,
            relay_thread,
            served,
            "{max_connections_per_host: 1, idle_timeout: 60}",
        )

        async def browse() -> list[httpx.Response]:
            async with httpx.AsyncClient(proxy=proxy.proxy_url, timeout=30) as client:
                first = await client.get(f"{base}/page")
                answered = time.monotonic()
                # The origin closes `closes_idle_after` after it sent the answer, which took
                # RTT/2 to come: the POST leaves ~RTT/2 before the origin's FIN can reach the
                # proxy, and reaches the origin ~RTT/2 after its close (mid-race).
                wait = served.closes_idle_after - RTT / 2 - 0.02
                await asyncio.sleep(wait - (time.monotonic() - answered))
                second = await client.post(f"{base}/orders", content=b"{}")
                return [first, second]

        responses = asyncio.run(browse())
        assert [r.status_code for r in responses] == [200, 200], responses[-1].text
        assert responses[1].text == answer_of(served, "POST", "/orders", 2)
        assert relay.stats.accepted == 2  # the POST's on a connection of its own
        # The pool closed the first before the origin's timeout; the POST's is still open.
        closed = "reshape_upstream_connections_closed_total"
        assert proxy.metric(closed, reason="origin_idle_timeout") == 1
        assert proxy.metric(closed, reason="lost") == 0
        if served.node is not None:
            connections = served.node.connections()
            assert [c.requests for c in connections] == [[("GET", "/page")], [("POST", "/orders")]]
            assert connections[0].client_closed  # the proxy closed it before Node did
    assert proxy.metric("reshape_requests_total", outcome="ok") == 2


@pytest.mark.parametrize("kind", ORIGINS)
def test_a_pipeline_stops_at_the_requests_its_origin_takes_on_a_connection(
    start_reshape: StartProxy, tmp_path: Path, relay_thread: RelayThread, kind: str
) -> None:
    """The pool pipelines no more onto a connection than its origin takes, so nothing goes
    again (Node answers requests pipelined past its limit with 503s behind its close). Before,
    the fourth of each pipeline went unanswered behind the close and again elsewhere."""
    with origin_of(kind, tmp_path, keep_alive_timeout=5.0, max_requests=3) as served:
        proxy, relay, base = behind_a_link(
            start_reshape,
            tmp_path,
            relay_thread,
            served,
            "{max_connections_per_host: 1, pipeline_depth: 4}",
        )

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
        assert [r.text for r in responses] == [
            answer_of(served, "GET", f"/r{i}", 0) for i in range(12)
        ]
        assert relay.stats.accepted >= 12 / served.takes
        if served.node is not None:
            connections = served.node.connections()
            assert all(len(c.requests) <= 3 for c in connections), connections
            assert sorted(url for c in connections for _, url in c.requests) == sorted(
                f"/r{i}" for i in range(12)
            )
    assert proxy.metric("reshape_upstream_retries_total") == 0
    assert proxy.metric("reshape_upstream_requests_total") == 12  # each sent once
    assert proxy.metric("reshape_upstream_requests_total", connection="pipelined") > 0
    closed = "reshape_upstream_connections_closed_total"
    assert proxy.metric(closed, reason="request_limit") >= 12 / served.takes - 1
