from __future__ import annotations

import pytest

from reshape.app.admin import AdminContent, AdminServer, pac_file
from reshape.base.addresses import ListenAddress

PROXY = ListenAddress("127.0.0.1", 8080)


def server(listen: ListenAddress = PROXY, healthy: bool = True):
    content = AdminContent(
        proxy_address=listen,
        ca_pem=b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        render_metrics=lambda: (b"reshape_up 1\n", "text/plain; version=0.0.4"),
        is_healthy=lambda: healthy,
    )
    return AdminServer(ListenAddress("127.0.0.1", 0), content)


def get(admin: AdminServer, target: str, method: str = "GET", host: str = "127.0.0.1:9464"):
    return admin.respond(f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())


def test_metrics() -> None:
    status, headers, body = get(server(), "/metrics")
    assert status == 200 and body == b"reshape_up 1\n"
    assert headers["Content-Type"].startswith("text/plain")


@pytest.mark.parametrize(("healthy", "status"), [(True, 200), (False, 503)])
def test_healthz(healthy: bool, status: int) -> None:
    assert get(server(healthy=healthy), "/healthz")[0] == status


def test_pac_names_the_listen_address() -> None:
    status, headers, body = get(server(), "/proxy.pac")
    assert status == 200
    assert headers["Content-Type"] == "application/x-ns-proxy-autoconfig"
    assert b'return "PROXY 127.0.0.1:8080";' in body


def test_pac_for_a_wildcard_listener_uses_the_host_the_browser_reached() -> None:
    admin = server(ListenAddress("0.0.0.0", 3128))
    body = get(admin, "/proxy.pac", host="gw.corp.test:9464")[2]
    assert b'"PROXY gw.corp.test:3128"' in body
    body = get(admin, "/proxy.pac", host="[2001:db8::1]:9464")[2]
    assert b'"PROXY [2001:db8::1]:3128"' in body


def test_pac_brackets_ipv6() -> None:
    assert b'"PROXY [::1]:8080"' in pac_file("::1", 8080)


def test_ca_pem_is_the_certificate_only() -> None:
    status, headers, body = get(server(), "/ca.pem")
    assert status == 200 and headers["Content-Type"] == "application/x-pem-file"
    assert b"PRIVATE KEY" not in body and body.startswith(b"-----BEGIN CERTIFICATE-----")


def test_head_has_no_body_and_query_strings_are_ignored() -> None:
    assert get(server(), "/healthz?x=1", method="HEAD")[2] == b""
    assert get(server(), "/healthz?x=1")[0] == 200


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"POST /metrics HTTP/1.1\r\n\r\n", 405),
        (b"GET /nope HTTP/1.1\r\n\r\n", 404),
        (b"GET /mitmproxy-ca.pem HTTP/1.1\r\n\r\n", 404),
        (b"garbage\r\n\r\n", 400),
        (b"GET / SPDY/3\r\n\r\n", 400),
    ],
)
def test_errors(head: bytes, status: int) -> None:
    assert server().respond(head)[0] == status
