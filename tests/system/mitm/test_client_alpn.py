"""Which protocol reshape speaks to TLS clients (PreferH2ToClients in reshape/mitm/patches.py).

Without the shared pool mitmproxy connects to the origin first and mirrors its ALPN, so an
HTTP/1.1-only origin gets an HTTP/1.1 client (an HTTP/2 client would make mitmproxy open an origin
connection per request). With the pool, clients get HTTP/2 whatever the origin speaks.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from labkit.origins import Origin, nginx_origin
from labkit.pki import OriginPKI
from tests.support.reshape_process import StartProxy

BODY = b"x" * 4096


@pytest.fixture
def h1_tls_origin(tmp_path: Path, origin_pki: OriginPKI) -> Iterator[Origin]:
    root = tmp_path / "root"
    root.mkdir()
    (root / "page.txt").write_bytes(BODY)
    with nginx_origin(root, "127.0.0.4", tls=origin_pki.issue(["127.0.0.4"])) as origin:
        yield origin


@pytest.mark.parametrize(
    "policy_text",
    [
        "policies: {plain: {}}\ndefault: plain\n",
        "policies: {pooled: {upstream: {}}}\ndefault: pooled\n",
        "policies: {own: {upstream: {share: false}}}\ndefault: own\n",
    ],
    ids=["plain", "pooled", "unshared"],
)
def test_clients_get_h2_whatever_the_origin_speaks(
    start_reshape: StartProxy,
    h1_tls_origin: Origin,
    tmp_path: Path,
    policy_text: str,
) -> None:
    """The engine speaks whatever the origin speaks; towards the client reshape multiplexes."""
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\n" + policy_text)
    proxy = start_reshape(policy=policy)
    trust = ssl.create_default_context(cafile=proxy.ca_cert)
    with httpx.Client(http2=True, proxy=proxy.proxy_url, verify=trust) as client:
        responses = [client.get(h1_tls_origin.url("/page.txt")) for _ in range(3)]
    assert all(r.status_code == 200 and r.content == BODY for r in responses)
    assert [r.http_version for r in responses] == ["HTTP/2"] * 3
    # Either way, one origin connection carries the three requests.
    assert proxy.metric("reshape_upstream_connections_opened_total", proto="h1") == 1
