"""Done-when: the onboarding page loads in headless Chromium through the proxy, at its
well-known name, and offers the CA in three forms; the PEM it downloads is what Chromium then
trusts for intercepted HTTPS."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import pkcs12

from reshape.features.onboarding.addon import ONBOARDING_HOST
from tests.support.browser_page import view_page
from tests.support.reshape_process import StartProxy

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_onboarding_page_in_chromium_through_the_proxy(
    start_reshape: StartProxy, tmp_path: Path
) -> None:
    proxy = start_reshape()
    ca = x509.load_pem_x509_certificate((proxy.confdir / "mitmproxy-ca-cert.pem").read_bytes())
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    view = view_page(
        f"http://{ONBOARDING_HOST}/",
        proxy=proxy.listen,
        screenshot=tmp_path / "onboarding.png",
        download=["#get-pem", "#get-cer", "#get-p12"],
        download_dir=downloads,
    )
    assert view.status == 200 and view.title == "reshape: install the CA"
    for platform in ("Chromium / Chrome", "Firefox", "Android", "iOS", "Windows", "macOS", "Linux"):
        assert platform in view.text
    assert proxy.listen in view.text  # how to point a browser at the proxy
    offered = {link["id"]: link["href"] for link in view.links if link["id"]}
    assert offered == {
        f"get-{form}": f"http://{ONBOARDING_HOST}/cert/{form}" for form in ("pem", "cer", "p12")
    }
    files = {d["filename"]: Path(d["path"]).read_bytes() for d in view.downloads}
    assert set(files) == {"reshape-ca-cert.pem", "reshape-ca-cert.cer", "reshape-ca-cert.p12"}
    assert x509.load_pem_x509_certificate(files["reshape-ca-cert.pem"]) == ca
    assert x509.load_der_x509_certificate(files["reshape-ca-cert.cer"]) == ca
    p12 = pkcs12.load_pkcs12(files["reshape-ca-cert.p12"], None)
    assert p12.key is None and [c.certificate for c in p12.additional_certs] == [ca]
    assert (tmp_path / "onboarding.png").stat().st_size > 10_000

    # The downloaded PEM, trusted as the page says, makes intercepted HTTPS valid in Chromium.
    secure = view_page(
        f"https://{ONBOARDING_HOST}/",
        proxy=proxy.listen,
        trusted_cas=[downloads / "reshape-ca-cert.pem"],
    )
    assert secure.status == 200 and "Install reshape's certificate authority" in secure.text
