from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from labkit.browser import PageLoadError, load_page, trust_cas
from labkit.origins import Origin, hypercorn_origin, nginx_origin
from labkit.pki import OriginPKI
from labkit.processes import free_port
from labkit.sites import Site, build_multi_origin_site


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> OriginPKI:
    return OriginPKI(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, pki: OriginPKI) -> Iterator[Site]:
    """A site over nginx (h2), hypercorn (h2) and nginx (HTTP/1.1 only), all HTTPS."""
    roots = {name: tmp_path_factory.mktemp(name) for name in ("main", "static", "cdn")}
    with ExitStack() as stack:
        origins: dict[str, Origin] = {
            "main": stack.enter_context(
                nginx_origin(roots["main"], "127.0.0.2", tls=pki.issue(["127.0.0.2"]), http2=True)
            ),
            "static": stack.enter_context(
                hypercorn_origin(roots["static"], "127.0.0.3", tls=pki.issue(["127.0.0.3"]))
            ),
            "cdn": stack.enter_context(
                nginx_origin(roots["cdn"], "127.0.0.4", tls=pki.issue(["127.0.0.4"]))
            ),
        }
        yield build_multi_origin_site(
            roots, {name: origin.url("") for name, origin in origins.items()}
        )


@pytest.fixture(scope="module")
def page_origin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Origin]:
    """A plain-HTTP origin for the failure cases."""
    root = tmp_path_factory.mktemp("pages")
    (root / "broken.html").write_text(
        f'<!doctype html><img src="http://127.0.0.9:{free_port("127.0.0.9")}/gone.png">'
    )
    with nginx_origin(root, "127.0.0.6") as origin:
        yield origin


@pytest.mark.browser
def test_direct_load_fetches_every_resource_intact(site: Site, pki: OriginPKI) -> None:
    page = load_page(site.page_url, proxy=None, trusted_cas=[pki.ca_cert_path])
    received = {resource.url: resource.sha256 for resource in page.resources}
    assert received == site.resources
    assert {resource.status for resource in page.resources} == {200}
    assert page.load_ms > 0
    # The first paint can come a frame after the load event (244.0 ms against 243.5 once, on a
    # busy machine): both are measured, neither bounds the other.
    assert page.fcp_ms is None or page.fcp_ms > 0


@pytest.mark.browser
def test_untrusted_origin_ca_fails_visibly(site: Site, tmp_path: Path) -> None:
    stranger = OriginPKI(tmp_path / "stranger")
    with pytest.raises(PageLoadError, match="ERR_CERT_AUTHORITY_INVALID"):
        load_page(site.page_url, proxy=None, trusted_cas=[stranger.ca_cert_path])


@pytest.mark.browser
def test_unreachable_page_fails_visibly() -> None:
    url = f"http://127.0.0.7:{free_port('127.0.0.7')}/"
    with pytest.raises(PageLoadError, match="ERR_CONNECTION_REFUSED"):
        load_page(url, proxy=None, trusted_cas=[], timeout=20)


@pytest.mark.browser
def test_error_status_fails_visibly(page_origin: Origin) -> None:
    with pytest.raises(PageLoadError, match="answered 404"):
        load_page(page_origin.url("/missing.html"), proxy=None, trusted_cas=[], timeout=20)


@pytest.mark.browser
def test_failed_subresource_fails_visibly(page_origin: Origin) -> None:
    with pytest.raises(PageLoadError, match=r"1 request\(s\) failed:\n.*gone.png"):
        load_page(page_origin.url("/broken.html"), proxy=None, trusted_cas=[], timeout=20)


def test_trust_cas_adds_each_ca(tmp_path: Path, pki: OriginPKI) -> None:
    other = OriginPKI(tmp_path / "other")
    trust_cas(tmp_path / "nssdb", [pki.ca_cert_path, other.ca_cert_path])
    listing = subprocess.run(
        ["certutil", "-L", "-d", f"sql:{tmp_path / 'nssdb'}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "reshape-lab-0" in listing
    assert "reshape-lab-1" in listing
