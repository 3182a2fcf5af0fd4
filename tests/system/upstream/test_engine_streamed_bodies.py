"""A request body that streams (past mitmproxy's `stream_large_bodies`, 1 MiB) reaches an HTTP/2
origin as it arrives, not when the next piece comes or the flow-control window fills: an upload
that pauses must not leave its last bytes sitting in the proxy."""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from labkit.pki import OriginPKI
from tests.support.faulty_origins import FaultyOrigin
from tests.support.reshape_process import StartProxy

POLICIES = {
    "plain": "version: 1\ndefault: p\npolicies:\n  p: {}\n",
    "pooled": "version: 1\ndefault: p\npolicies:\n  p: {upstream: {max_connections_per_host: 2}}\n",
}
FIRST = 1_500_000  # over stream_large_bodies: mitmproxy streams it on
REST = 1_000


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_a_paused_upload_reaches_an_h2_origin_up_to_its_last_byte(
    start_reshape: StartProxy, tmp_path: Path, origin_pki: OriginPKI, policy: str
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICIES[policy])
    proxy = start_reshape(policy=path)
    with FaultyOrigin("127.0.0.123", tls=origin_pki.issue(["127.0.0.123"])) as origin:
        arrived_during_pauses: list[int] = []

        def pause_until(size: int) -> None:
            deadline = time.monotonic() + 2
            while origin.received.get("/upload/done", 0) < size and time.monotonic() < deadline:
                time.sleep(0.02)
            arrived_during_pauses.append(origin.received.get("/upload/done", 0))

        def upload() -> Iterator[bytes]:
            yield b"a" * FIRST
            pause_until(FIRST)
            # A small piece, well within the window, after the origin has gone quiet.
            yield b"b" * REST
            pause_until(FIRST + REST)
            yield b"c" * REST

        trust = ssl.create_default_context(cafile=str(proxy.ca_cert))
        with httpx.Client(http2=True, proxy=proxy.proxy_url, verify=trust, timeout=30) as http:
            # The origin answers 5 s after the head: nothing comes back while the body streams.
            response = http.post(origin.url("/upload/done?delay=5"), content=upload())
        assert (response.status_code, response.text) == (200, "done")
        assert arrived_during_pauses == [FIRST, FIRST + REST]
        assert origin.received["/upload/done"] == FIRST + 2 * REST
