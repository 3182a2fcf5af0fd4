"""reshape's own answers to HEAD requests carry no body (RFC 9110 §9.3.2): the engine's 502 for
an origin it cannot reach (reshape/mitm/engine_channel.py) and the addons' answers, such as the
destinations addon's 403 (reshape/base/own_answers.py).

Found by a black-box review (2026-12-04): they came with their text as body on a connection
kept alive, so an HTTP/1.1 client read the text as the start of its next response ("illegal
status line"), and an HTTP/2 client's HEAD failed on a body its request could not have.
Clients here: h11 over a kept-alive connection (it reads a HEAD response as head only, as
browsers do), and httpx over HTTP/2 through a CONNECT tunnel."""

from __future__ import annotations

import socket
import ssl

import h11
import httpx
import pytest

from tests.support.reshape_process import REPO, RunningProxy, StartProxy

POLICIES = ["reshape/policy/default.yaml", "policies/pooled.yaml"]
CLOSED = "127.0.0.143:9"  # nothing listens there
METADATA = "169.254.169.254"  # refused by the destinations addon


def exchanges(proxy: RunningProxy, requests: list[tuple[str, str]]) -> list[tuple[int, bytes]]:
    """Each (method, absolute URL) in turn on one kept-alive connection: status and body of
    each answer, as an HTTP/1.1 client reads them."""
    host, port = proxy.listen.split(":")
    answers = []
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        conn = h11.Connection(h11.CLIENT)
        for method, url in requests:
            authority = url.split("/")[2]
            request = h11.Request(method=method, target=url, headers=[("Host", authority)])
            sock.sendall(conn.send(request) + conn.send(h11.EndOfMessage()))
            status, body = 0, b""
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(sock.recv(65536))
                elif isinstance(event, h11.Response):
                    status = event.status_code
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    break
            answers.append((status, body))
            conn.start_next_cycle()
    return answers


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_answers_to_head_have_no_body(start_reshape: StartProxy, policy: str) -> None:
    proxy = start_reshape(policy=REPO / policy)
    answers = exchanges(
        proxy,
        [
            ("HEAD", f"http://{CLOSED}/a"),
            ("GET", f"http://{CLOSED}/b"),
            ("HEAD", f"http://{METADATA}/c"),
            ("GET", f"http://{METADATA}/d"),
        ],
    )
    assert [status for status, _ in answers] == [502, 502, 403, 403]
    assert answers[0][1] == b"" and answers[2][1] == b""
    assert answers[1][1].startswith(b"reshape: could not connect to")
    assert answers[3][1].startswith(b"reshape: destination 169.254.169.254 is link-local")


@pytest.mark.slow
def test_an_http2_clients_head_to_an_unreachable_origin_gets_its_502(
    start_reshape: StartProxy,
) -> None:
    proxy = start_reshape(policy=REPO / "policies/pooled.yaml")
    context = ssl.create_default_context(cafile=str(proxy.ca_cert))
    with httpx.Client(proxy=proxy.proxy_url, verify=context, http2=True) as client:
        head = client.head(f"https://{CLOSED}/a")
        get = client.get(f"https://{CLOSED}/b")
    assert (head.status_code, head.http_version, head.content) == (502, "HTTP/2", b"")
    assert int(head.headers["content-length"]) > 0  # the length a GET's answer has
    assert get.status_code == 502 and get.content.startswith(b"reshape: could not connect")
