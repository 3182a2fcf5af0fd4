"""reshape/app/admin.py on a real loopback socket: every path, GET and HEAD, the metrics formats
(Prometheus text, OpenMetrics) and gzip as prometheus_client negotiates them, bad requests."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import pkcs12
from prometheus_client import CollectorRegistry, Counter, Gauge

from labkit.pki import OriginPKI
from reshape.app.admin import AdminContent, AdminServer
from reshape.base.addresses import ListenAddress
from reshape.features.onboarding.downloads import CaDownloads

PROXY = ListenAddress("127.0.0.1", 8080)
ADMIN_PATHS = ["/metrics", "/healthz", "/proxy.pac", "/ca.pem"]
PATHS = [*ADMIN_PATHS, "/", "/cert/pem", "/cert/cer", "/cert/p12"]
OPENMETRICS = "application/openmetrics-text; version=1.0.0"


def registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Gauge("reshape_test_up", "a gauge", registry=registry).set(1)
    requests = Counter("reshape_test_requests", "a counter", ["outcome"], registry=registry)
    requests.labels("ok").inc(3)
    return registry


@pytest.fixture
def ca(origin_pki: OriginPKI) -> x509.Certificate:
    return x509.load_pem_x509_certificate(origin_pki.ca_cert_path.read_bytes())


async def started(
    ca: x509.Certificate, listen: ListenAddress = PROXY, healthy: bool = True
) -> tuple[AdminServer, str]:
    content = AdminContent(
        proxy_address=listen,
        ca=CaDownloads.of(ca),
        registry=registry(),
        is_healthy=lambda: healthy,
    )
    admin = AdminServer(ListenAddress("127.0.0.1", 0), content)
    address = await admin.start()
    return admin, f"http://{address}"


@pytest.fixture
async def admin(ca: x509.Certificate) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    server, url = await started(ca)
    async with httpx.AsyncClient(base_url=url) as client:
        yield client, url
    await server.stop()


async def test_metrics_default_is_prometheus_text(admin: tuple[httpx.AsyncClient, str]) -> None:
    client, _ = admin
    response = await client.get("/metrics", headers={"Accept-Encoding": "identity"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert "content-encoding" not in response.headers
    assert "reshape_test_up 1.0" in response.text
    assert 'reshape_test_requests_total{outcome="ok"} 3.0' in response.text
    assert "# EOF" not in response.text


async def test_metrics_openmetrics_when_asked(admin: tuple[httpx.AsyncClient, str]) -> None:
    client, _ = admin
    # What Prometheus itself sends.
    accept = (
        "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
        "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
    )
    response = await client.get(
        "/metrics", headers={"Accept": accept, "Accept-Encoding": "identity"}
    )
    assert response.headers["content-type"].startswith(OPENMETRICS)
    assert response.text.endswith("# EOF\n")
    assert 'reshape_test_requests_total{outcome="ok"} 3.0' in response.text
    assert "Accept" in response.headers["vary"]


@pytest.mark.parametrize("accept", [None, OPENMETRICS])
async def test_metrics_gzip_when_accepted(
    admin: tuple[httpx.AsyncClient, str], accept: str | None
) -> None:
    _, url = admin
    headers = {"Accept-Encoding": "gzip"} | ({"Accept": accept} if accept else {})
    async with httpx.AsyncClient() as client:
        request = client.build_request("GET", f"{url}/metrics", headers=headers)
        response = await client.send(request, stream=True)
        compressed = b"".join([chunk async for chunk in response.aiter_raw()])
    assert response.headers["content-encoding"] == "gzip"
    assert int(response.headers["content-length"]) == len(compressed)
    text = gzip.decompress(compressed).decode()
    assert "reshape_test_up 1.0" in text
    assert text.endswith("# EOF\n") == (accept is not None)


async def test_metrics_name_filter(admin: tuple[httpx.AsyncClient, str]) -> None:
    client, _ = admin
    response = await client.get("/metrics", params={"name[]": "reshape_test_up"})
    assert "reshape_test_up 1.0" in response.text and "reshape_test_requests" not in response.text


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    "headers",
    [{}, {"Accept": OPENMETRICS, "Accept-Encoding": "gzip"}],
    ids=["plain", "openmetrics-gzip"],
)
async def test_head_is_get_without_the_body(
    admin: tuple[httpx.AsyncClient, str], path: str, headers: dict[str, str]
) -> None:
    _, url = admin
    host, port = url.removeprefix("http://").rsplit(":", 1)
    headers = {"Host": f"{host}:{port}", "Accept-Encoding": "identity"} | headers
    async with httpx.AsyncClient() as client:
        request = client.build_request("GET", f"{url}{path}", headers=headers)
        get = await client.send(request, stream=True)
        body = b"".join([chunk async for chunk in get.aiter_raw()])
    # HEAD on a raw socket: nothing after the head, however long the GET's body.
    reader, writer = await asyncio.open_connection(host, int(port))
    lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    writer.write(f"HEAD {path} HTTP/1.1\r\n{lines}Connection: close\r\n\r\n".encode())
    raw = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, after = raw.partition(b"\r\n\r\n")
    assert after == b""
    status_line, *header_lines = head.decode().split("\r\n")
    assert status_line == f"HTTP/1.1 {get.status_code} {get.reason_phrase}"
    head_headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in header_lines)}
    assert int(head_headers["content-length"]) == len(body) > 0
    for name in ("content-type", "content-encoding", "content-disposition", "cache-control"):
        assert head_headers.get(name) == get.headers.get(name), name


async def test_health(ca: x509.Certificate) -> None:
    for healthy, status in ((True, 200), (False, 503)):
        server, url = await started(ca, healthy=healthy)
        async with httpx.AsyncClient() as client:
            assert (await client.get(f"{url}/healthz")).status_code == status
        await server.stop()


async def test_pac_names_the_listen_address(admin: tuple[httpx.AsyncClient, str]) -> None:
    client, _ = admin
    response = await client.get("/proxy.pac")
    assert response.headers["content-type"] == "application/x-ns-proxy-autoconfig"
    assert 'return "PROXY 127.0.0.1:8080";' in response.text


async def test_pac_for_a_wildcard_listener_uses_the_host_the_browser_reached(
    ca: x509.Certificate,
) -> None:
    server, url = await started(ca, ListenAddress("0.0.0.0", 3128))
    async with httpx.AsyncClient(base_url=url) as client:
        response = await client.get("/proxy.pac", headers={"Host": "gw.corp.test:9464"})
        assert '"PROXY gw.corp.test:3128"' in response.text
        response = await client.get("/proxy.pac", headers={"Host": "[2001:db8::1]:9464"})
        assert '"PROXY [2001:db8::1]:3128"' in response.text
    await server.stop()


async def test_onboarding_and_the_ca_in_three_forms(
    admin: tuple[httpx.AsyncClient, str], ca: x509.Certificate
) -> None:
    client, url = admin
    page = await client.get("/")
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    for form in ("pem", "cer", "p12"):
        assert f'href="cert/{form}"' in page.text
    assert f"{url}/proxy.pac" in page.text and "127.0.0.1:8080" in page.text
    pem = (await client.get("/cert/pem")).content
    assert x509.load_pem_x509_certificate(pem) == ca and b"PRIVATE" not in pem
    assert (await client.get("/ca.pem")).content == pem
    assert x509.load_der_x509_certificate((await client.get("/cert/cer")).content) == ca
    p12 = pkcs12.load_pkcs12((await client.get("/cert/p12")).content, None)
    assert p12.key is None and [c.certificate for c in p12.additional_certs] == [ca]


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", 405),
        (b"DELETE / HTTP/1.1\r\nHost: x\r\n\r\n", 405),
        (b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n", 404),
        (b"GET /mitmproxy-ca.pem HTTP/1.1\r\nHost: x\r\n\r\n", 404),
        (b"GET /cert/key HTTP/1.1\r\nHost: x\r\n\r\n", 404),
        (b"garbage\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X-Long: " + b"a" * 9000 + b"\r\n\r\n", 431),
    ],
)
async def test_bad_requests(ca: x509.Certificate, request_bytes: bytes, status: int) -> None:
    server, url = await started(ca)
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(request_bytes)
    first = await asyncio.wait_for(reader.readline(), 10)
    writer.close()
    await server.stop()
    if status == 431:  # Tornado closes a connection whose head is too large, without an answer
        assert first == b""
        return
    assert first.split(b" ")[1] == str(status).encode(), first
