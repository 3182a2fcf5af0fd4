"""One 400 per bad request (issue 15, finding 8): a control character or an obs-fold in
Content-Length or Transfer-Encoding is refused by mitmproxy's framing check and by reshape's
control-character check alike; the client must get one answer, the counter rise by one, the
origin see nothing. Both paths: policy {} and a pooled policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.clients import exchange
from tests.support.faulty_origins import FaultyOrigin
from tests.support.reshape_process import StartProxy

POLICIES = {
    "direct": "version: 1\ndefault: p\npolicies:\n  p: {}\n",
    "pooled": "version: 1\ndefault: p\npolicies:\n  p:\n    upstream: {}\n",
}

# (name, framing fields, body, kind counted)
CASES = [
    ("te_control", "Transfer-Encoding: chunked\x01\r\n", b"0\r\n\r\n", "smuggling"),
    ("te_obs_fold", "Transfer-Encoding:\r\n chunked\r\n", b"0\r\n\r\n", "smuggling"),
    ("cl_control", "Content-Length: 3\x01\r\n", b"abc", "smuggling"),
    ("cl_obs_fold", "Content-Length: 3\r\n 3\r\n", b"abc", "smuggling"),
    ("cl_nul", "Content-Length: 3\x00\r\n", b"abc", "smuggling"),
    ("other_field_control", "Content-Length: 3\r\nX-A: a\x01b\r\n", b"abc", "malformed"),
]


def responses_in(data: bytes) -> list[bytes]:
    """The status lines of the HTTP/1.1 responses in `data`, each read with its body."""
    statuses = []
    while data.startswith(b"HTTP/1.1 "):
        head, _, rest = data.partition(b"\r\n\r\n")
        statuses.append(head.split(b"\r\n", 1)[0])
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")[1:]
            if line.lower().startswith(b"content-length:")
        )
        data = rest[length:]
    assert data == b"", data[:200]  # nothing after the answers but the close
    return statuses


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_a_bad_framing_field_gets_one_400_and_one_count(
    start_reshape: StartProxy, tmp_path: Path, policy: str
) -> None:
    policy_path = tmp_path / "policy.yaml"
    policy_path.write_text(POLICIES[policy])
    proxy = start_reshape(policy=policy_path)
    host, port = proxy.listen.split(":")
    with FaultyOrigin("127.0.0.63") as origin:
        address = f"{origin.host}:{origin.port}"
        expected: dict[str, float] = {"smuggling": 0, "malformed": 0}
        for name, fields, body, kind in CASES:
            request = (
                f"POST http://{address}/bad/{name} HTTP/1.1\r\nHost: {address}\r\n{fields}\r\n"
            ).encode() + body
            answer = exchange(host, int(port), request)
            assert responses_in(answer) == [b"HTTP/1.1 400 Bad Request"], (name, answer[:400])
            expected[kind] += 1
            counted = proxy.settled_metrics("reshape_client_errors_total", "kind", expected)
            assert counted == expected, name
        # A good request afterwards is served: the origin is up, and saw none of the bad ones.
        good = exchange(
            host,
            int(port),
            f"GET http://{address}/echo/good HTTP/1.1\r\nHost: {address}\r\n"
            "Connection: close\r\n\r\n".encode(),
        )
        assert [s[:12] for s in responses_in(good)] == [b"HTTP/1.1 200"], good[:300]
    assert [path for _, path in origin.seen] == ["/echo/good"]
    assert "Traceback" not in proxy.log()
