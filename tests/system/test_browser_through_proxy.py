"""Headless Chromium, configured only with the proxy and reshape's CA, loads a multi-origin page."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from labkit.browser import load_page
from labkit.origins import hypercorn_origin, nginx_origin
from labkit.pki import OriginPKI
from labkit.sites import Site, build_multi_origin_site
from tests.support.reshape_process import StartProxy


@pytest.fixture
def three_origin_site(tmp_path: Path, origin_pki: OriginPKI) -> Iterator[Site]:
    """HTTPS on three hosts: nginx with h2, hypercorn with h2, nginx with HTTP/1.1 only."""
    roots = {name: tmp_path / name for name in ("main", "static", "cdn")}
    for root in roots.values():
        root.mkdir()
    with ExitStack() as stack:
        tls = {host: origin_pki.issue([host]) for host in ("127.0.0.2", "127.0.0.3", "127.0.0.4")}
        origins = {
            "main": stack.enter_context(
                nginx_origin(roots["main"], "127.0.0.2", tls=tls["127.0.0.2"], http2=True)
            ),
            "static": stack.enter_context(
                hypercorn_origin(roots["static"], "127.0.0.3", tls=tls["127.0.0.3"])
            ),
            "cdn": stack.enter_context(
                nginx_origin(roots["cdn"], "127.0.0.4", tls=tls["127.0.0.4"])
            ),
        }
        yield build_multi_origin_site(
            roots, {name: origin.url("") for name, origin in origins.items()}, resources=36
        )


@pytest.mark.browser
def test_chromium_loads_every_resource_intact_through_reshape(
    start_reshape: StartProxy, three_origin_site: Site
) -> None:
    site = three_origin_site
    assert len(site.resources) >= 30
    assert len({url.split("/")[2] for url in site.resources}) >= 3
    proxy = start_reshape()
    # Chromium trusts reshape's CA and nothing else: every HTTPS response passed through reshape.
    page = load_page(site.page_url, proxy=proxy.listen, trusted_cas=[proxy.ca_cert])
    received = {resource.url: resource.sha256 for resource in page.resources}
    assert received == site.resources
    assert {resource.status for resource in page.resources} == {200}
    assert page.load_ms > 0
    requests = proxy.metric("reshape_requests_total", outcome="ok")
    assert requests == len(site.resources)
    assert proxy.metric("reshape_requests_total", client_proto="h2", outcome="ok") > 0
