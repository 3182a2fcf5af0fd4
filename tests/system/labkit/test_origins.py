from __future__ import annotations

import hashlib
import ssl
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import httpx
import pytest

from labkit.origins import Origin, OriginStartError, hypercorn_origin, nginx_origin
from labkit.pki import IssuedCert, OriginPKI
from labkit.processes import accepts
from tests.unit.labkit.test_origins import BLOB, write_root

OriginFactory = Callable[..., AbstractContextManager[Origin]]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> OriginPKI:
    return OriginPKI(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_root(tmp_path_factory.mktemp("root"))


def _client(pki: OriginPKI, *, http2: bool) -> httpx.Client:
    return httpx.Client(http2=http2, verify=ssl.create_default_context(cafile=pki.ca_cert_path))


def test_nginx_http_serves_files_intact(root: Path) -> None:
    with nginx_origin(root, "127.0.0.2") as origin:
        assert (origin.scheme, origin.protocols) == ("http", ("http/1.1",))
        response = httpx.get(origin.url("/blob.bin"))
        css = httpx.get(origin.url("style.css"))
    assert response.status_code == 200
    assert hashlib.sha256(response.content).digest() == hashlib.sha256(BLOB).digest()
    assert response.headers["content-length"] == str(len(BLOB))
    assert "content-encoding" not in response.headers
    assert css.headers["content-type"] == "text/css"


def test_nginx_https_offers_only_http1_by_default(root: Path, pki: OriginPKI) -> None:
    with (
        nginx_origin(root, "127.0.0.4", tls=pki.issue(["127.0.0.4"])) as origin,
        _client(pki, http2=True) as client,
    ):
        response = client.get(origin.url("/blob.bin"))
    assert origin.scheme == "https"
    assert response.http_version == "HTTP/1.1"
    assert response.content == BLOB


def test_nginx_http2_negotiates_h2(root: Path, pki: OriginPKI) -> None:
    with (
        nginx_origin(root, "127.0.0.5", tls=pki.issue(["127.0.0.5"]), http2=True) as origin,
        _client(pki, http2=True) as client,
    ):
        response = client.get(origin.url("/blob.bin"))
        index = client.get(origin.url("/sub/"))
        access_log = origin.access_log.read_text() if origin.access_log else ""
    assert origin.protocols == ("h2", "http/1.1")
    assert response.http_version == "HTTP/2"
    assert response.content == BLOB
    assert index.headers["content-type"] == "text/html"
    assert '"GET /blob.bin HTTP/2.0" 200' in access_log


def test_hypercorn_negotiates_h2_and_serves_http1(root: Path, pki: OriginPKI) -> None:
    cert = pki.issue(["127.0.0.3"])
    with hypercorn_origin(root, "127.0.0.3", tls=cert) as origin:
        with _client(pki, http2=True) as client:
            h2 = client.get(origin.url("/blob.bin"))
            missing = client.get(origin.url("/nope.css"))
            head = client.head(origin.url("/style.css"))
        with _client(pki, http2=False) as client:
            h1 = client.get(origin.url("/sub/"))
    assert origin.protocols == ("h2", "http/1.1")
    assert h2.http_version == "HTTP/2"
    assert h2.content == BLOB
    assert h2.headers["content-type"] == "application/octet-stream"
    assert h2.headers["content-length"] == str(len(BLOB))
    assert missing.status_code == 404
    assert head.headers["content-length"] == str(len("body { color: red }\n"))
    assert head.content == b""
    assert h1.http_version == "HTTP/1.1"
    assert h1.text == "<!doctype html><title>sub</title>\n"


def test_hypercorn_plain_http(root: Path) -> None:
    with hypercorn_origin(root, "127.0.0.6") as origin:
        response = httpx.get(origin.url("/style.css"))
    assert origin.scheme == "http"
    assert response.headers["content-type"] == "text/css"


def test_both_origins_send_the_same_validators_for_a_file(root: Path) -> None:
    """Last-Modified and ETag as nginx makes them: a browser caches both origins' files alike."""
    with nginx_origin(root, "127.0.0.2") as nginx, hypercorn_origin(root, "127.0.0.6") as hyper:
        answers = [httpx.get(origin.url("/style.css")).headers for origin in (nginx, hyper)]
    assert answers[0]["last-modified"] == answers[1]["last-modified"]
    assert answers[0]["etag"] == answers[1]["etag"]


@pytest.mark.parametrize("origin_factory", [nginx_origin, hypercorn_origin])
def test_stopped_on_exit_even_after_an_exception(root: Path, origin_factory: OriginFactory) -> None:
    with pytest.raises(KeyError), origin_factory(root, "127.0.0.7") as origin:
        assert accepts(origin.host, origin.port)
        raise KeyError("body failed")
    assert not accepts(origin.host, origin.port)


@pytest.mark.parametrize("origin_factory", [nginx_origin, hypercorn_origin])
def test_start_failure_carries_the_server_error(
    root: Path, tmp_path: Path, origin_factory: OriginFactory
) -> None:
    missing = IssuedCert(tmp_path / "absent.crt.pem", tmp_path / "absent.key.pem")
    with (
        pytest.raises(OriginStartError, match="absent.crt.pem|No such file"),
        origin_factory(root, "127.0.0.8", tls=missing),
    ):
        pass


def test_nginx_keeps_logs_in_a_given_workdir(root: Path, tmp_path: Path) -> None:
    with nginx_origin(root, "127.0.0.9", workdir=tmp_path / "nginx") as origin:
        httpx.get(origin.url("/style.css"))
    assert (tmp_path / "nginx" / "nginx.conf").exists()
    assert '"GET /style.css HTTP/1.1" 200' in (tmp_path / "nginx" / "access.log").read_text()
