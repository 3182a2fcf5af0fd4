"""Failing origins, both paths (mitmproxy's own connections: policy {}; the shared pool:
upstream {}), for what tests/system/upstream/test_engine.py does not cover already (GOAWAY, broken
pipelines, queue 503s): connection refused, connect and first-byte timeouts, responses cut
mid-body, HTTP/2 RST_STREAM, a POST whose connection dies unanswered. Then many clients at once,
some leaving early: each gets its own response, and the proxy's open files return to where they
were."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import ssl
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from labkit.pki import OriginPKI
from tests.support.faulty_origins import (
    BAD_HEADS,
    CUT_DECLARED,
    Backlog,
    FaultyOrigin,
    unreachable_address,
)
from tests.support.reshape_process import RunningProxy, StartProxy

TIMEOUTS = "{connect_timeout: 1, read_timeout: 1, idle_timeout: 1}"
POLICIES = {
    # Each client connection with its own origin connections (no pool).
    "unshared": "version: 1\ndefault: p\npolicies:\n  p:\n    upstream: {share: false}\n",
    "pooled": f"version: 1\ndefault: p\npolicies:\n  p:\n    upstream: {TIMEOUTS}\n",
}


def start(start_reshape: StartProxy, tmp_path: Path, policy: str) -> RunningProxy:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICIES[policy])
    return start_reshape(policy=path)


def client(proxy: RunningProxy, **kwargs: object) -> httpx.Client:
    return httpx.Client(proxy=proxy.proxy_url, timeout=15, **kwargs)  # type: ignore[arg-type]


@contextlib.contextmanager
def h2_origin_through(
    proxy: RunningProxy, origin_pki: OriginPKI, host: str, *, http2: bool = True
) -> Iterator[tuple[FaultyOrigin, httpx.Client]]:
    """An HTTP/2 FaultyOrigin on `host` and a client that reaches it through `proxy` (HTTP/2 to
    the proxy unless `http2` is False), trusting the proxy's CA."""
    with FaultyOrigin(host, tls=origin_pki.issue([host])) as origin:
        trust = ssl.create_default_context(cafile=str(proxy.ca_cert))
        with client(proxy, verify=trust, http2=http2) as http:
            yield origin, http


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_refused_and_cut_responses(start_reshape: StartProxy, tmp_path: Path, policy: str) -> None:
    proxy = start(start_reshape, tmp_path, policy)
    host, port = unreachable_address("127.0.0.63")
    with FaultyOrigin("127.0.0.64") as origin, client(proxy) as http:
        refused = http.get(f"http://{host}:{port}/")
        assert refused.status_code == 502, refused.text
        for path in ("/cut/length", "/cut/chunked"):
            # The client can tell: the body ends before its framing says it should.
            with (
                pytest.raises(httpx.RemoteProtocolError),
                http.stream("GET", origin.url(path)) as response,
            ):
                assert response.status_code == 200
                received = sum(len(piece) for piece in response.iter_raw())
                assert received < CUT_DECLARED
        # A POST whose connection dies before any answer is not sent again.
        dropped = http.post(origin.url("/drop"), content=b"pay once")
        assert dropped.status_code == 502, dropped.text
        assert "connection lost (the last attempt: " in dropped.text, dropped.text
        time.sleep(0.5)
        assert origin.count("/drop") == 1
        # A GET whose connection, opened for it, dies before any answer most likely reached the
        # origin (and broke it): it is not sent again, as in a browser (Chromium's rule).
        dropped_get = http.get(origin.url("/drop/get"))
        assert dropped_get.status_code == 502, dropped_get.text
        time.sleep(0.5)
        assert origin.count("/drop/get") == 1
        # On a connection that had served before, the same loss looks like the origin closing
        # it as the request left (RFC 9112 §9.3.1): it goes again once, on a new connection,
        # and no more (an origin that kills connections must not see it many times).
        assert http.get(origin.url("/echo/warm")).text == "warm"
        dropped_get = http.get(origin.url("/drop/get"))
        assert dropped_get.status_code == 502, dropped_get.text
        time.sleep(0.5)
        assert origin.count("/drop/get") == 1 + 2
        # And the proxy goes on serving.
        assert http.get(origin.url("/echo/after")).text == "after"


@pytest.mark.slow
def test_connect_and_first_byte_timeouts_of_the_pool(
    start_reshape: StartProxy, tmp_path: Path
) -> None:
    proxy = start(start_reshape, tmp_path, "pooled")
    with (
        Backlog("127.0.0.65") as backlog,
        FaultyOrigin("127.0.0.66") as origin,
        client(proxy) as http,
    ):
        started = time.monotonic()
        hung = http.get(f"http://{backlog.host}:{backlog.port}/")
        assert hung.status_code == 502, hung.text
        assert time.monotonic() - started < 5
        started = time.monotonic()
        silent = http.get(origin.url("/silent"))
        assert silent.status_code == 504, silent.text
        assert time.monotonic() - started < 5
        assert origin.count("/silent") == 1  # a GET with no answer at all is not retried here


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_h2_stream_reset_by_the_origin(
    start_reshape: StartProxy, tmp_path: Path, origin_pki: OriginPKI, policy: str
) -> None:
    proxy = start(start_reshape, tmp_path, policy)
    with h2_origin_through(proxy, origin_pki, "127.0.0.67") as (origin, http):
        reset = http.post(origin.url("/reset"), content=b"once")
        assert reset.status_code == 502, reset.text
        # The same origin connection keeps serving the other streams.
        assert http.get(origin.url("/echo/next")).text == "next"
    assert origin.count("/reset") == 1


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_a_post_the_h2_origin_refused_goes_again_if_its_body_was_held(
    start_reshape: StartProxy, tmp_path: Path, origin_pki: OriginPKI, policy: str
) -> None:
    # REFUSED_STREAM says the origin did not process the request (RFC 9113 §8.7): Chromium
    # sends it again whatever its method, and so does the pool when it still has the body.
    # A body over `stream_large_bodies` (1 MiB) streamed through: what left is gone.
    proxy = start(start_reshape, tmp_path, policy)
    with h2_origin_through(proxy, origin_pki, "127.0.0.67") as (origin, http):
        held = http.post(origin.url("/refuse-once/held"), content=b"x" * 1000)
        assert held.status_code == 200, held.text
        assert held.headers["x-echo"] == "held"
        streamed = http.post(origin.url("/refuse-once/streamed"), content=b"x" * (2 << 20))
        assert streamed.status_code == 502, streamed.text
        assert "REFUSED_STREAM" in streamed.text
    assert origin.count("/refuse-once/held") == 2  # refused, then answered
    assert origin.count("/refuse-once/streamed") == 1


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_an_h2_origins_malformed_response_head_never_reaches_the_client(
    start_reshape: StartProxy, tmp_path: Path, origin_pki: OriginPKI, policy: str
) -> None:
    # The engine's HTTP/2 connections check what origins send (its codec,
    # reshape/upstream/http2.py): a head RFC 9113 forbids is a 502, not a field relayed to an
    # HTTP/1.1 client, and the next request is served.
    proxy = start(start_reshape, tmp_path, policy)
    with h2_origin_through(proxy, origin_pki, "127.0.0.68", http2=False) as (origin, http):
        for kind in BAD_HEADS:
            bad = http.get(origin.url(f"/bad-head/{kind}"))
            assert bad.status_code == 502, (kind, bad.text)
            assert "x-injected" not in bad.headers and bad.text != "bad"
            assert http.get(origin.url(f"/echo/after-{kind}")).text == f"after-{kind}"
            # A stream error (RFC 9113 §8.1.1): that stream is reset, the request was answered
            # (badly) and is not sent again, the origin connection goes on.
            assert origin.count(f"/bad-head/{kind}") == 1
        post = http.post(origin.url("/bad-head/crlf?via=post"), content=b"once")
        assert post.status_code == 502, post.text
        assert "malformed response from the origin" in post.text
    assert origin.count("/bad-head/crlf?via=post") == 1  # not idempotent: never sent twice
    assert origin.connections == 1  # every stream error left the connection serving


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_an_h2_origins_broken_window_update_fails_its_stream_alone(
    start_reshape: StartProxy, tmp_path: Path, origin_pki: OriginPKI, policy: str
) -> None:
    # RFC 9113 §6.9, §6.9.1: a WINDOW_UPDATE of 0, or one overflowing a stream's window, is
    # that stream's error; the engine's codec closed the whole shared connection for it.
    proxy = start(start_reshape, tmp_path, policy)
    with h2_origin_through(proxy, origin_pki, "127.0.0.67") as (origin, http):
        for kind, says in (("zero", "WINDOW_UPDATE of 0"), ("overflow", "window above 2^31-1")):
            broken = http.get(origin.url(f"/bad-window/{kind}"))
            assert broken.status_code == 502 and says in broken.text, (kind, broken.text)
            assert http.get(origin.url(f"/echo/after-{kind}")).text == f"after-{kind}"
            assert origin.count(f"/bad-window/{kind}") == 1  # answered, if badly: sent once
    assert origin.connections == 1


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_each_response_reaches_its_own_client_and_no_fd_leaks(
    start_reshape: StartProxy, tmp_path: Path, policy: str
) -> None:
    proxy = start(start_reshape, tmp_path, policy)
    with FaultyOrigin("127.0.0.68") as origin:
        # Warm up with a small crowd of the same kind: what the process creates once (imports,
        # caches, the event loop's helpers) must not count as a leak.
        assert asyncio.run(crowd(proxy, origin, clients=5, requests=3))[0] == []
        time.sleep(3)  # past the pool's idle timeout (1 s)
        before, kinds_before = open_fds(proxy), fd_kinds(proxy)
        wrong, aborted, ok = asyncio.run(crowd(proxy, origin))
        assert wrong == [], wrong[:5]
        assert ok > 0 and aborted > 0
        fds = settle_fds(proxy, before)
    assert fds <= before, (before, fds, new_fd_kinds(proxy, kinds_before), open_sockets(proxy))


@pytest.mark.slow
def test_pool_connections_are_not_wedged_by_clients_that_leave(
    start_reshape: StartProxy, tmp_path: Path
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(
        "version: 1\ndefault: p\npolicies:\n  p:\n    upstream: "
        "{max_connections_per_host: 2, idle_timeout: 1, queue_timeout: 5}\n"
    )
    proxy = start_reshape(policy=path)
    with FaultyOrigin("127.0.0.73") as origin:
        with client(proxy) as http:
            assert http.get(origin.url("/echo/warm")).text == "warm"
        time.sleep(2)
        before = open_fds(proxy)
        # Leavers only: each request's client closes 50 ms after sending it.
        asyncio.run(crowd(proxy, origin, clients=20, requests=5, leavers=True, checkers=False))
        fds = settle_fds(proxy, before, seconds=8)
        with client(proxy) as http:
            after = http.get(origin.url("/echo/after"))
    assert (after.status_code, after.text) == (200, "after")
    assert fds <= before, (before, fds, open_sockets(proxy))


def open_fds(proxy: RunningProxy, samples: int = 5) -> int:
    """The proxy's open fds: the least of a few samples 0.1 s apart, as the process opens some
    for a moment now and then (a leak keeps the least count up)."""
    counts = []
    for _ in range(samples):
        counts.append(len(os.listdir(f"/proc/{proxy.process.pid}/fd")))
        time.sleep(0.1)
    return min(counts)


def fd_kinds(proxy: RunningProxy) -> Counter[str]:
    """The proxy's fds by kind (`socket`, `pipe`, `anon_inode:[eventfd]`, a path...)."""
    directory = f"/proc/{proxy.process.pid}/fd"
    kinds: Counter[str] = Counter()
    for fd in os.listdir(directory):
        with contextlib.suppress(FileNotFoundError):  # closed since the listing
            kinds[os.readlink(f"{directory}/{fd}").split(":[")[0]] += 1
    return kinds


def new_fd_kinds(proxy: RunningProxy, before: Counter[str]) -> dict[str, int]:
    return dict(fd_kinds(proxy) - before)


def open_sockets(proxy: RunningProxy) -> list[str]:
    """The proxy's TCP sockets other than listeners, as `ss` shows them (for a failure message)."""
    out = subprocess.run(["ss", "-tanp"], capture_output=True, text=True, check=False).stdout
    mine = f"pid={proxy.process.pid},"
    return [" ".join(line.split()[:5]) for line in out.splitlines() if mine in line][:20]


def settle_fds(proxy: RunningProxy, target: int, seconds: float = 15) -> int:
    """Open fds of the proxy once they are back to `target` (or after `seconds`)."""
    deadline = time.monotonic() + seconds
    fds = open_fds(proxy)
    while fds > target and time.monotonic() < deadline:
        time.sleep(0.25)
        fds = open_fds(proxy)
    return fds


async def crowd(
    proxy: RunningProxy,
    origin: FaultyOrigin,
    clients: int = 40,
    requests: int = 10,
    *,
    leavers: bool = True,
    checkers: bool = True,
) -> tuple[list[tuple[str, str]], int, int]:
    """`clients` concurrent clients, each `requests` GETs of a unique id with a random delay at
    the origin. Checkers are httpx clients that check every response is their own; leavers send
    each request on a raw connection and close it 50 ms later, while the origin is still delaying
    (or already sending) the answer. With both, every fifth client is a leaver.
    Returns (mismatches, aborted, ok)."""
    wrong: list[tuple[str, str]] = []
    counts = {"aborted": 0, "ok": 0}
    rng = random.Random(9)
    host, port = proxy.listen.rsplit(":", 1)

    def target() -> tuple[str, str]:
        ident = f"x{rng.randrange(10**12)}"
        return ident, origin.url(f"/echo/{ident}?delay={rng.choice((0, 0.01, 0.1, 0.3))}")

    async def leaver() -> None:
        for _ in range(requests):
            _, url = target()
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(f"GET {url} HTTP/1.1\r\nHost: {origin.host}\r\n\r\n".encode())
            await asyncio.sleep(0.05)
            writer.close()
            await writer.wait_closed()
            counts["aborted"] += 1

    async def checker() -> None:
        async with httpx.AsyncClient(proxy=proxy.proxy_url, timeout=20) as http:
            for _ in range(requests):
                ident, url = target()
                response = await http.get(url)
                if response.text != ident or response.headers.get("x-echo") != ident:
                    wrong.append((ident, response.text[:80]))
                else:
                    counts["ok"] += 1

    def leaves(c: int) -> bool:
        return leavers and (not checkers or c % 5 == 0)

    await asyncio.gather(*(leaver() if leaves(c) else checker() for c in range(clients)))
    return wrong, counts["aborted"], counts["ok"]


@pytest.mark.parametrize(("fault", "status"), [("connect", 502), ("first_byte", 504)])
def test_policies_without_upstream_time_out_as_the_options_say(
    start_reshape: StartProxy, tmp_path: Path, fault: str, status: int
) -> None:
    """A policy without `upstream:` gets the engine with a browser's limits and the timeouts of
    `--origin-connect-timeout` and `--origin-read-timeout` (mitmproxy's own connections, used
    for upgrades only, get them too: tests/hardening/test_mitm_timeouts.py)."""
    path = tmp_path / "policy.yaml"
    path.write_text("version: 1\ndefault: p\npolicies:\n  p: {}\n")
    timeout = 2.0
    flag = "--origin-connect-timeout" if fault == "connect" else "--origin-read-timeout"
    proxy = start_reshape(flag, str(timeout), policy=path)
    with Backlog("127.0.0.69") as backlog, FaultyOrigin("127.0.0.70") as origin:
        url = (
            f"http://{backlog.host}:{backlog.port}/"
            if fault == "connect"
            else origin.url("/silent")
        )
        with httpx.Client(proxy=proxy.proxy_url, timeout=timeout + 20) as http:
            response = http.get(url)
        assert response.status_code == status, response.text
        said = f"timed out after {timeout:g} s" if fault == "connect" else f"within {timeout:g} s"
        assert said in response.text
        if fault == "first_byte":
            assert origin.count("/silent") == 1
