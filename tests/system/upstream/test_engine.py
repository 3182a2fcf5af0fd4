"""The upstream engine end to end: real clients → reshape → relay (counts connections) → origin."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from labkit.origins import hypercorn_origin, nginx_origin
from labkit.pki import OriginPKI
from labkit.relay import Link, RelayThread, relays
from tests.support.clients import exchange, h2_burst
from tests.support.memory import RssPeak
from tests.support.reshape_process import RunningProxy, StartProxy
from tests.support.scripted_origins import (
    CloseNotifyOrigin,
    DrainingH2Origin,
    EarlyAnswerOrigin,
    InterimThenReadAllOrigin,
    PipelineBreakingOrigin,
    ReadCountingH2Origin,
    ScriptedOrigin,
    SlowOrigin,
)

RESOURCES = 60
BROWSERS = 10


def policy_file(tmp_path: Path, upstream: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(
        f"version: 1\ndefault: pooled\npolicies:\n  pooled:\n    upstream: {upstream}\n"
    )
    return path


def resource(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest() * (64 + i * 17)


def resource_at(path: str) -> bytes:
    """The body of `/r<i>.bin`."""
    return resource(int(path.removeprefix("/r").removesuffix(".bin")))


@pytest.fixture
def site(tmp_path: Path) -> Path:
    root = tmp_path / "www"
    root.mkdir()
    for i in range(RESOURCES):
        (root / f"r{i}.bin").write_bytes(resource(i))
    return root


@pytest.fixture
def relay_thread() -> Iterator[RelayThread]:
    with relays() as thread:
        yield thread


async def browse(
    proxy: RunningProxy,
    base: str,
    *,
    connections: int = 6,
    trust: Path | None = None,
    http2: bool = False,
) -> list[bytes]:
    """One simulated browser: `connections` parallel connections, all resources once."""
    verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=trust) if trust else False
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    async with httpx.AsyncClient(
        proxy=proxy.proxy_url, limits=limits, verify=verify, http2=http2, timeout=60
    ) as client:
        responses = await asyncio.gather(
            *(client.get(f"{base}/r{i}.bin") for i in range(RESOURCES))
        )
    failed = [(r.status_code, r.text[:200]) for r in responses if r.status_code != 200]
    assert not failed, failed
    return [r.content for r in responses]


def browsers(proxy: RunningProxy, base: str, **kwargs: object) -> None:
    async def all_browsers() -> list[list[bytes]]:
        return await asyncio.gather(*(browse(proxy, base, **kwargs) for _ in range(BROWSERS)))

    for bodies in asyncio.run(all_browsers()):
        assert bodies == [resource(i) for i in range(RESOURCES)]


@pytest.mark.slow
def test_per_host_cap_holds_across_all_clients(
    start_reshape: StartProxy, site: Path, tmp_path: Path, relay_thread: RelayThread
) -> None:
    with nginx_origin(site, "127.0.0.2") as origin:
        relay = relay_thread.add("127.0.0.12", (origin.host, origin.port))
        proxy = start_reshape(policy=policy_file(tmp_path, "{max_connections_per_host: 2}"))
        browsers(proxy, f"http://127.0.0.12:{relay.port}")
    assert relay.stats.max_open <= 2
    assert relay.stats.accepted <= 2  # kept alive and shared by all 60 client connections
    total = BROWSERS * RESOURCES
    assert proxy.metric("reshape_upstream_requests_total") == total
    assert proxy.metric("reshape_upstream_requests_total", connection="new") == relay.stats.accepted
    assert proxy.metric("reshape_requests_queued_total") > 0
    assert proxy.metric("reshape_request_queue_seconds_count") == total
    assert proxy.metric("reshape_requests_total", outcome="ok") == total


@pytest.mark.slow
def test_h2_origin_gets_one_connection_for_everyone(
    start_reshape: StartProxy,
    site: Path,
    tmp_path: Path,
    origin_pki: OriginPKI,
    relay_thread: RelayThread,
) -> None:
    with hypercorn_origin(site, "127.0.0.3", tls=origin_pki.issue(["127.0.0.13"])) as origin:
        relay = relay_thread.add("127.0.0.13", (origin.host, origin.port))
        proxy = start_reshape(policy=policy_file(tmp_path, "{max_connections_per_host: 6}"))
        base = f"https://127.0.0.13:{relay.port}"
        # HTTP/1.1 and HTTP/2 clients alike share the one upstream connection.
        browsers(proxy, base, trust=proxy.ca_cert)
        browsers(proxy, base, trust=proxy.ca_cert, http2=True)
    assert relay.stats.accepted == 1
    assert proxy.metric("reshape_upstream_connections_opened_total", proto="h2") == 1
    assert proxy.metric("reshape_upstream_requests_total", connection="multiplexed") > 0


@pytest.mark.slow
def test_pipelining_carries_most_requests_and_survives_early_closes(
    start_reshape: StartProxy, site: Path, tmp_path: Path, relay_thread: RelayThread
) -> None:
    # nginx ends every connection after 7 responses: pipelines are cut short again and again.
    # The link's 20 ms round trip keeps a queue in front of the two connections, as a distant
    # origin does: with none, how much gets pipelined depends on how fast this machine serves
    # each request (a third to four fifths of the sends, run alone), not on the pool.
    with nginx_origin(site, "127.0.0.2", keepalive_requests=7) as origin:
        relay = relay_thread.add("127.0.0.14", (origin.host, origin.port), Link.rtt(0.02))
        proxy = start_reshape(
            policy=policy_file(tmp_path, "{max_connections_per_host: 2, pipeline_depth: 8}")
        )
        browsers(proxy, f"http://127.0.0.14:{relay.port}")
        served = (origin.access_log or Path()).read_text().splitlines()
    total = BROWSERS * RESOURCES
    pipelined = proxy.metric("reshape_upstream_requests_total", connection="pipelined")
    assert proxy.metric("reshape_requests_total", outcome="ok") == total
    # Every response arrived intact (browsers() checked the bytes), and the origin answered each
    # request once: the requests pipelined behind an announced close go again, but nginx never
    # read them (it lingers on close, labkit/origins.py, and neither the relay nor the proxy
    # drops an answer that reached it: tests/system/labkit/test_relay.py, test_wire.py).
    retries = proxy.metric("reshape_upstream_retries_total")
    sent = proxy.metric("reshape_upstream_requests_total")  # the requests sent again included
    assert len(served) == total
    assert relay.stats.max_open <= 2
    assert pipelined / sent >= 0.5, proxy.metrics()
    assert retries > 0


@pytest.mark.slow
def test_queue_overflow_and_timeout_give_503_with_retry_after(
    start_reshape: StartProxy, tmp_path: Path
) -> None:
    with SlowOrigin("127.0.0.6", delay=1.0) as origin:
        proxy = start_reshape(
            policy=policy_file(
                tmp_path, "{max_connections_per_host: 1, max_queue: 2, queue_timeout: 1.5}"
            )
        )
        url = f"http://{origin.host}:{origin.port}/"

        async def fire() -> list[httpx.Response]:
            async with httpx.AsyncClient(proxy=proxy.proxy_url, timeout=30) as client:
                return await asyncio.gather(*(client.get(url) for _ in range(6)))

        responses = asyncio.run(fire())
    statuses = sorted(r.status_code for r in responses)
    rejected = [r for r in responses if r.status_code == 503]
    assert statuses.count(200) >= 2 and rejected, statuses
    assert all(r.headers["retry-after"].isdigit() for r in rejected)
    assert all(b"reshape:" in r.content for r in rejected)
    assert proxy.metric("reshape_upstream_queue_rejected_total", reason="queue_full") >= 1
    assert proxy.metric("reshape_requests_total", outcome="rejected") == len(rejected)


@pytest.mark.slow
def test_a_100_mb_download_streams_with_flat_memory(
    start_reshape: StartProxy, tmp_path: Path
) -> None:
    root = tmp_path / "big"
    root.mkdir()
    size = 100 * 1024 * 1024
    with (root / "100mb.bin").open("wb") as f:
        f.write(os.urandom(1024 * 1024) * 100)
    expected = hashlib.sha256((root / "100mb.bin").read_bytes()).hexdigest()
    with nginx_origin(root, "127.0.0.2") as origin:
        proxy = start_reshape(policy=policy_file(tmp_path, "{}"))
        # A slow reader: the proxy must hold back the origin, not buffer for the client.
        with RssPeak(proxy.process.pid) as rss:
            result = subprocess.run(
                [
                    "bash",
                    "-c",
                    f"curl -sSf --proxy {proxy.proxy_url} --limit-rate 50M "
                    f"{origin.url('/100mb.bin')} | sha256sum",
                ],
                capture_output=True,
                text=True,
                timeout=120,
            )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[0] == expected
    assert rss.peak - rss.before < 50 * 1024 * 1024, (rss.before, rss.peak)
    assert proxy.metric("reshape_response_bytes_total") == size


def test_post_head_and_body_written_apart_reach_the_origin_in_one_segment(
    start_reshape: StartProxy, site: Path, tmp_path: Path
) -> None:
    import socket

    with nginx_origin(site, "127.0.0.2") as origin:
        proxy = start_reshape(policy=policy_file(tmp_path, "{}"))
        capture = tmp_path / "lo.pcap"
        tshark = subprocess.Popen(
            ["tshark", "-q", "-i", "lo", "-f", f"tcp dst port {origin.port}", "-w", str(capture)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            _wait_for_capture(tshark)
            body = b'{"tile": [1, 2, 3], "zoom": 12}'
            host, port = proxy.listen.split(":")
            with socket.create_connection((host, int(port))) as client:
                head = (
                    f"POST {origin.url('/r1.bin')} HTTP/1.1\r\n"
                    f"Host: {origin.host}:{origin.port}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n"
                )
                client.sendall(head.encode())
                time.sleep(0.05)
                client.sendall(body)
                assert client.recv(65536).startswith(b"HTTP/1.1 405")  # nginx: no POST to files
            time.sleep(0.5)
        finally:
            tshark.terminate()
            tshark.wait(10)
        segments = subprocess.run(
            [
                "tshark",
                "-r",
                str(capture),
                "-Y",
                "tcp.len > 0",
                "-T",
                "fields",
                "-e",
                "tcp.payload",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
    payloads = [bytes.fromhex(s) for s in segments]
    posts = [p for p in payloads if p.startswith(b"POST ")]
    assert len(posts) == 1, payloads
    assert posts[0].endswith(body)
    assert proxy.metric("reshape_post_coalesced_total") == 1


def test_a_burst_read_in_one_piece_starts_reaching_the_origin_before_the_proxy_is_through_it(
    start_reshape: StartProxy, tmp_path: Path, origin_pki: OriginPKI
) -> None:
    # A browser's 90 requests in one write: the proxy turns them into requests one at a time
    # (well over the engine's 3 ms coalescing window in all; 40 of these small heads were not
    # always, once the engine's HTTP/2 took less CPU: the origin read them as 39 and 1 before,
    # 50 and 40 of 90 after), and the first leave while it works on the rest, so the origin
    # reads them in more than one piece. Every answer to its own stream.
    proxy = start_reshape(policy=policy_file(tmp_path, "{}"))
    paths = [f"/tile-{i:02d}.png" for i in range(90)]
    with ReadCountingH2Origin("127.0.0.2", origin_pki.issue(["127.0.0.2"])) as origin:
        host, port = proxy.listen.split(":")
        via = ((host, int(port)), (origin.host, origin.port), proxy.ca_cert)
        assert h2_burst(*via, ["/warm"]) == {"/warm": (200, b"/warm")}
        origin.requests_per_read.clear()
        answers = h2_burst(*via, paths)
    assert answers == {path: (200, path.encode()) for path in paths}
    assert sum(origin.requests_per_read) == len(paths)
    assert len(origin.requests_per_read) >= 2, origin.requests_per_read


def _wait_for_capture(tshark: subprocess.Popen[bytes]) -> None:
    assert tshark.stderr is not None
    deadline = time.monotonic() + 20
    line = b""
    while time.monotonic() < deadline and b"Capturing on" not in line:
        line = tshark.stderr.readline()
        if tshark.poll() is not None:
            raise AssertionError("tshark exited: " + line.decode())
    time.sleep(0.3)


@pytest.mark.slow
def test_an_origins_close_notify_ends_its_connection(
    start_reshape: StartProxy, tmp_path: Path, origin_pki: OriginPKI
) -> None:
    # An asyncio origin ends an idle connection with TLS close_notify and waits up to 30 s
    # for the TCP close. The engine took that connection as open and wrote the next request
    # to it, which the origin dropped: a POST got a 502 (or waited the 30 s), a GET 30 s late.
    proxy = start_reshape(policy=policy_file(tmp_path, "{}"))
    trust = ssl.create_default_context(cafile=proxy.ca_cert)
    with (
        CloseNotifyOrigin("127.0.0.102", origin_pki.issue(["127.0.0.102"]), idle=0.3) as origin,
        httpx.Client(proxy=proxy.proxy_url, verify=trust, timeout=40) as client,
    ):
        assert client.get(origin.url("/first")).text == "GET"
        time.sleep(1.0)  # the origin has sent close_notify
        started = time.monotonic()
        answer = client.post(origin.url("/order"), content=b"qty=1")
        assert (answer.status_code, answer.text) == (200, "POST")
        assert time.monotonic() - started < 5
        assert client.get(origin.url("/again")).text == "GET"
    assert [method for _, method, _ in origin.requests] == ["GET", "POST", "GET"]
    assert origin.requests[1][0] == 2  # the POST went once, on a new connection


@pytest.mark.slow
@pytest.mark.parametrize("last_stream_id", [0, 2**31 - 1])
def test_an_h2_origin_that_says_goaway_before_any_request_is_a_failed_connect(
    start_reshape: StartProxy, tmp_path: Path, origin_pki: OriginPKI, last_stream_id: int
) -> None:
    # SETTINGS and GOAWAY in one write, before any request (a server shutting down; 2^31 - 1
    # is RFC 9113 §6.8's graceful first GOAWAY). The pool took the connection as ready and gave
    # it the request again and again without yielding: the proxy froze at 100% CPU.
    proxy = start_reshape(policy=policy_file(tmp_path, "{queue_timeout: 5}"))
    tls = origin_pki.issue(["127.0.0.101"])
    trust = ssl.create_default_context(cafile=proxy.ca_cert)
    with (
        DrainingH2Origin("127.0.0.101", tls, last_stream_id=last_stream_id) as origin,
        httpx.Client(proxy=proxy.proxy_url, verify=trust, timeout=20) as client,
    ):
        for path in ("/a", "/b"):
            started = time.monotonic()
            answer = client.get(origin.url(path))
            assert answer.status_code == 502
            assert "GOAWAY" in answer.text
            assert time.monotonic() - started < 4  # not the queue timeout's 503
    assert origin.requests == 0  # nothing was sent on a connection the origin had closed
    assert 1 <= origin.connections <= 2
    assert proxy.metric("reshape_requests_total", outcome="upstream_error") == 2


@pytest.mark.slow
def test_h2_goaway_sends_unprocessed_streams_elsewhere(
    start_reshape: StartProxy,
    site: Path,
    tmp_path: Path,
    origin_pki: OriginPKI,
    relay_thread: RelayThread,
) -> None:
    # nginx sends GOAWAY after every 50 requests on a connection (keepalive_requests applies
    # to HTTP/2): streams above the last one it will process must go again, none lost.
    tls = origin_pki.issue(["127.0.0.15"])
    with nginx_origin(site, "127.0.0.5", tls=tls, http2=True, keepalive_requests=50) as origin:
        relay = relay_thread.add("127.0.0.15", (origin.host, origin.port))
        proxy = start_reshape(policy=policy_file(tmp_path, "{}"))
        browsers(proxy, f"https://127.0.0.15:{relay.port}", trust=proxy.ca_cert)
    total = BROWSERS * RESOURCES
    assert proxy.metric("reshape_requests_total", outcome="ok") == total
    assert relay.stats.accepted >= total // 50
    assert proxy.metric("reshape_upstream_connections_opened_total", proto="h2") >= total // 50


@pytest.mark.slow
def test_an_origin_that_breaks_pipelines_loses_nothing_and_is_no_longer_pipelined_to(
    start_reshape: StartProxy, tmp_path: Path
) -> None:
    with PipelineBreakingOrigin("127.0.0.7", per_connection=5, body_for=resource_at) as origin:
        proxy = start_reshape(
            policy=policy_file(tmp_path, "{max_connections_per_host: 2, pipeline_depth: 8}")
        )
        browsers(proxy, f"http://{origin.host}:{origin.port}")
        pipelined_at_the_end = proxy.metric(
            "reshape_upstream_requests_total", connection="pipelined"
        )
        # Once marked, later requests are not pipelined any more.
        browsers(proxy, f"http://{origin.host}:{origin.port}")
    total = BROWSERS * RESOURCES
    assert proxy.metric("reshape_requests_total", outcome="ok") == 2 * total
    assert proxy.metric("reshape_upstream_pipelining_disabled_total") == 1
    assert proxy.metric("reshape_upstream_requests_total", connection="pipelined") == (
        pipelined_at_the_end
    )
    # Every response was intact (checked by browsers()); the origin answered each request once
    # or, for a request it read but dropped unanswered, once more on another connection.
    assert len(origin.served) >= 2 * total


@pytest.mark.slow
def test_a_client_that_leaves_the_queue_frees_its_place(
    start_reshape: StartProxy, tmp_path: Path
) -> None:
    import socket

    with SlowOrigin("127.0.0.6", delay=2.0) as origin:
        proxy = start_reshape(
            policy=policy_file(
                tmp_path, "{max_connections_per_host: 1, max_queue: 1, queue_timeout: 10}"
            )
        )
        host, port = proxy.listen.split(":")
        request = (
            f"GET http://{origin.host}:{origin.port}/ HTTP/1.1\r\n"
            f"Host: {origin.host}:{origin.port}\r\n\r\n"
        ).encode()
        first = socket.create_connection((host, int(port)))
        first.sendall(request)  # takes the one connection for 2 s
        time.sleep(0.3)
        leaver = socket.create_connection((host, int(port)))
        leaver.sendall(request)  # queued: the queue is now full
        time.sleep(0.3)
        leaver.close()  # ... and leaves it
        time.sleep(0.3)
        third = socket.create_connection((host, int(port)))
        third.sendall(request)  # finds the place the leaver gave back
        assert first.recv(4096).startswith(b"HTTP/1.1 200")
        third.settimeout(10)
        assert third.recv(4096).startswith(b"HTTP/1.1 200")
        first.close()
        third.close()
    assert proxy.metric("reshape_upstream_queue_rejected_total") == 0


def test_tls_sessions_to_origins_are_resumed(
    start_reshape: StartProxy, site: Path, tmp_path: Path, origin_pki: OriginPKI
) -> None:
    with nginx_origin(site, "127.0.0.8", tls=origin_pki.issue(["127.0.0.8"])) as origin:
        proxy = start_reshape(policy=policy_file(tmp_path, "{idle_timeout: 0.05}"))
        trust = ssl.create_default_context(cafile=proxy.ca_cert)
        for i in range(3):
            with httpx.Client(proxy=proxy.proxy_url, verify=trust) as client:
                response = client.get(origin.url(f"/r{i}.bin"))
                assert response.content == resource(i), (response.status_code, response.text)
            time.sleep(0.5)  # past idle_timeout: the pool closes the connection in between
    assert proxy.metric("reshape_upstream_tls_handshakes_total") == 3
    assert proxy.metric("reshape_upstream_tls_handshakes_total", resumed="yes") >= 2


@pytest.mark.slow
@pytest.mark.parametrize("method", ["PUT", "POST"])
def test_an_origin_that_refuses_an_upload_early_is_answered_to_the_client_once(
    start_reshape: StartProxy, tmp_path: Path, method: str
) -> None:
    # 8 MB: more than the sockets between proxy and origin hold, so writing the body fails once
    # the origin has answered and closed; its answer must still reach the client.
    body = os.urandom(1 << 20) * 8
    with EarlyAnswerOrigin("127.0.0.8") as origin:
        proxy = start_reshape(policy=policy_file(tmp_path, "{max_connections_per_host: 2}"))
        response = httpx.request(
            method, origin.url("/upload"), content=body, proxy=proxy.proxy_url, timeout=60
        )
    assert response.status_code == 413, response.text
    assert response.content == EarlyAnswerOrigin.ANSWER
    assert len(origin.heads) == 1  # answered, so never sent again, not even the idempotent PUT


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["{max_connections_per_host: 2}", "{share: false}"])
def test_an_early_answer_reaches_a_client_that_has_paused_its_upload(
    start_reshape: StartProxy, tmp_path: Path, policy: str
) -> None:
    # The client sends the start of an upload the proxy streams (its length is over
    # `stream_large_bodies`), then waits: the origin's answer must not wait for the client's
    # next bytes (which may never come) to reach it.
    with EarlyAnswerOrigin("127.0.0.8") as origin:
        proxy = start_reshape(policy=policy_file(tmp_path, policy))
        host, port = proxy.proxy_url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=20) as client:
            client.sendall(
                f"POST {origin.url('/upload')} HTTP/1.1\r\nHost: {origin.host}:{origin.port}\r\n"
                f"Content-Length: {8 << 20}\r\n\r\n".encode()
                + b"x" * 65536
            )
            answer = b""
            while EarlyAnswerOrigin.ANSWER not in answer:
                data = client.recv(65536)  # times out (20 s) if the answer waits
                if not data:
                    break
                answer += data
    assert answer.startswith(b"HTTP/1.1 413"), answer
    assert EarlyAnswerOrigin.ANSWER in answer
    assert len(origin.heads) == 1


@pytest.mark.slow
def test_an_interim_response_during_an_upload_is_not_taken_for_an_early_answer(
    start_reshape: StartProxy, tmp_path: Path
) -> None:
    body = os.urandom(1 << 20) * 8
    with InterimThenReadAllOrigin("127.0.0.8") as origin:
        proxy = start_reshape(policy=policy_file(tmp_path, "{max_connections_per_host: 2}"))
        response = httpx.post(
            origin.url("/upload"), content=body, proxy=proxy.proxy_url, timeout=60
        )
    assert response.status_code == 200, response.text
    assert response.text == hashlib.sha256(body).hexdigest()
    assert origin.received == [len(body)]


@pytest.mark.slow
def test_nginx_refusing_an_upload_before_its_body_is_answered_to_the_client(
    start_reshape: StartProxy, tmp_path: Path, site: Path
) -> None:
    # nginx refuses a body over its client_max_body_size (1 MiB) with a 413 once the head is
    # read (a chunked one, of no stated length, with a 405 for the PUT to a static file), then
    # reads on and discards the body (lingering close): the answer must reach the client
    # whether or not we stop sending, as it does without a proxy.
    body = os.urandom(1 << 20) * 8
    with nginx_origin(site, "127.0.0.9", workdir=tmp_path / "nginx") as origin:
        direct = httpx.put(origin.url("/r0.bin"), content=body, timeout=60)
        proxy = start_reshape(policy=policy_file(tmp_path, "{max_connections_per_host: 2}"))
        response = httpx.put(origin.url("/r0.bin"), content=body, proxy=proxy.proxy_url, timeout=60)
    assert direct.status_code == 413, direct.text
    assert response.status_code == direct.status_code, response.text


class ReadToCloseOrigin(ScriptedOrigin):
    """An HTTP/1.0 origin: its answer has no length, its body ends with the connection."""

    BODY = b"A" * 5000

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + self.BODY)
        await writer.drain()
        writer.close()


@pytest.mark.parametrize("policy", ["{max_connections_per_host: 2}", "{share: false}"])
def test_an_http10_client_gets_a_body_without_a_length_unframed_to_the_close(
    start_reshape: StartProxy, tmp_path: Path, policy: str
) -> None:
    # HTTP/1.0 has no chunked coding (RFC 9112 §6.1): such a client was sent the body chunked
    # and read "1388\r\nAAAA...0\r\n\r\n", 5,013 bytes for 5,000 (mitmdump sends it as is).
    with ReadToCloseOrigin("127.0.0.8") as origin:
        proxy = start_reshape(policy=policy_file(tmp_path, policy))
        host, port = proxy.proxy_url.removeprefix("http://").split(":")
        # Read to the close, as an HTTP/1.0 client reads.
        answer = exchange(host, int(port), f"GET {origin.url('/')} HTTP/1.0\r\n\r\n".encode())
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert b"transfer-encoding" not in head.lower()
    assert body == ReadToCloseOrigin.BODY
