"""gRPC through reshape: a call's messages go both ways at once (reshape/upstream/h2.py
`_head_while_sending`), a body without a length streams from its head
(reshape/features/request_streaming), and a stream may outlast the origin read timeout while
the client is still sending.

A real gRPC client and server (grpcio), the client told to use the proxy (CONNECT, then TLS with
reshape's certificate for the origin). Each client below waits for an answer before it sends
its next message: a proxy that held the request body, or the answer until the body's end, would
leave it waiting for ever (here, for `WAIT` seconds, then the test fails).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from labkit.pki import OriginPKI
from tests.support.grpc_origin import WAIT, GrpcOrigin, channel_through, method
from tests.support.reshape_process import RunningProxy, StartProxy

HOST = "127.0.0.124"
POLICIES = {
    "plain": "version: 1\ndefault: p\npolicies:\n  p: {}\n",
    "pooled": "version: 1\ndefault: p\npolicies:\n  p: {upstream: {max_connections_per_host: 2}}\n",
}
# Through the pool, the policy's own read timeout; without it, --origin-read-timeout.
SHORT_READ_TIMEOUT = {
    "plain": "version: 1\ndefault: p\npolicies:\n  p: {}\n",
    "pooled": "version: 1\ndefault: p\npolicies:\n  p: {upstream: {read_timeout: 1}}\n",
}
CALL_TIMEOUT = 30.0


def started(start_reshape: StartProxy, tmp_path: Path, policy: str, *extra: str) -> RunningProxy:
    path = tmp_path / "policy.yaml"
    path.write_text(policy)
    return start_reshape(*extra, policy=path)


def ping_pong(channel: grpc.Channel, count: int, pause: float = 0.0) -> list[bytes]:
    """A `Bidi` call whose client sends its next message only once the last one's answer has
    come (and `pause` seconds after it); the answers it got."""
    answered: queue.Queue[bytes] = queue.Queue()

    def messages() -> Iterator[bytes]:
        for number in range(count):
            if number:
                try:
                    answered.get(timeout=WAIT)
                except queue.Empty:
                    return  # no answer: the call ends with what came
                time.sleep(pause)
            yield b"m%d" % number

    answers = []
    for answer in channel.stream_stream(method("Bidi"))(messages(), timeout=CALL_TIMEOUT):
        answers.append(answer)
        answered.put(answer)
    return answers


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_a_grpc_call_is_answered_message_by_message(
    start_reshape: StartProxy, tmp_path: Path, origin_pki: OriginPKI, policy: str
) -> None:
    proxy = started(start_reshape, tmp_path, POLICIES[policy])
    with (
        GrpcOrigin(HOST, origin_pki.issue([HOST])) as origin,
        channel_through(proxy.proxy_url, proxy.ca_cert, origin.target) as channel,
    ):
        assert ping_pong(channel, 3) == [b"echo:m0", b"echo:m1", b"echo:m2"]
        # The origin's messages as they come: it sends each only once the client has the last.
        counted = []
        for message in channel.unary_stream(method("Count"))(b"3", timeout=CALL_TIMEOUT):
            counted.append(message)
            origin.ack()
        assert counted == [b"0", b"1", b"2"]
        # And the client's stream, answered at its end.
        collect = channel.stream_unary(method("Collect"))
        assert collect(iter([b"a", b"b"]), timeout=CALL_TIMEOUT) == b"a+b"
        assert origin.received == {"Bidi": 3, "Count": 1, "Collect": 2}


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_a_grpc_call_whose_server_speaks_first_reaches_it_before_the_client_sends(
    start_reshape: StartProxy, tmp_path: Path, origin_pki: OriginPKI, policy: str
) -> None:
    # The call's head alone must reach the origin: its client sends nothing until the
    # origin's greeting has come. On a connection already open and idle (the second call),
    # nothing else would carry the head out.
    proxy = started(start_reshape, tmp_path, POLICIES[policy])
    greeted = threading.Event()

    def messages() -> Iterator[bytes]:
        if greeted.wait(WAIT):
            yield b"m0"

    with (
        GrpcOrigin(HOST, origin_pki.issue([HOST])) as origin,
        channel_through(proxy.proxy_url, proxy.ca_cert, origin.target) as channel,
    ):
        assert ping_pong(channel, 1) == [b"echo:m0"]  # the connection is open and idle now
        answers = []
        for answer in channel.stream_stream(method("Greet"))(messages(), timeout=CALL_TIMEOUT):
            answers.append(answer)
            greeted.set()
        assert answers == [b"hello", b"echo:m0"]
        assert origin.received["Greet"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_a_grpc_call_the_origin_ends_while_the_client_sends_gets_its_status(
    start_reshape: StartProxy, tmp_path: Path, origin_pki: OriginPKI, policy: str
) -> None:
    # The origin reads one message and ends the call (its status in the trailers) while the
    # client's stream is still open: the client gets the status then, not when it stops
    # sending; and the stream's end on the proxy's side leaves the connection serving.
    proxy = started(start_reshape, tmp_path, POLICIES[policy])
    call_over = threading.Event()
    waited: list[bool] = []

    def messages() -> Iterator[bytes]:
        yield b"first"
        waited.append(call_over.wait(WAIT))  # True: the status came while the stream was open

    with (
        GrpcOrigin(HOST, origin_pki.issue([HOST])) as origin,
        channel_through(proxy.proxy_url, proxy.ca_cert, origin.target) as channel,
    ):
        with pytest.raises(grpc.RpcError) as failed:
            for _ in channel.stream_stream(method("Refuse"))(messages(), timeout=CALL_TIMEOUT):
                pass
        call_over.set()
        assert failed.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]
        assert failed.value.details() == "no such thing"  # type: ignore[attr-defined]
        assert ping_pong(channel, 2) == [b"echo:m0", b"echo:m1"]
    assert waited == [True]


@pytest.mark.slow
@pytest.mark.parametrize("policy", SHORT_READ_TIMEOUT)
def test_a_grpc_stream_outlasts_the_read_timeout_while_the_client_sends(
    start_reshape: StartProxy, tmp_path: Path, origin_pki: OriginPKI, policy: str
) -> None:
    # The origin's read timeout is 1 s. A client stream that takes 2.4 s is the client's
    # time, not the origin's: its answer comes (not a 504); and an origin silent for 1.5 s
    # because it waits for the client's next message is not cut off.
    proxy = started(
        start_reshape, tmp_path, SHORT_READ_TIMEOUT[policy], "--origin-read-timeout", "1"
    )

    def slowly(count: int) -> Iterator[bytes]:
        for number in range(count):
            time.sleep(0.6)
            yield b"%d" % number

    with (
        GrpcOrigin(HOST, origin_pki.issue([HOST])) as origin,
        channel_through(proxy.proxy_url, proxy.ca_cert, origin.target) as channel,
    ):
        collect = channel.stream_unary(method("Collect"))
        assert collect(slowly(4), timeout=CALL_TIMEOUT) == b"0+1+2+3"
        assert ping_pong(channel, 2, pause=1.5) == [b"echo:m0", b"echo:m1"]
