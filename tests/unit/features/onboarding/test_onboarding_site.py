"""reshape/features/onboarding/: the CA in three forms, the page, the routes, the addon on flows."""

from __future__ import annotations

import datetime
import html
import re
from html.parser import HTMLParser

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import NameOID
from mitmproxy import http
from mitmproxy.test import tflow

from reshape.base.addresses import ListenAddress
from reshape.features.onboarding.addon import ONBOARDING_HOST, Onboarding
from reshape.features.onboarding.downloads import CaDownloads
from reshape.features.onboarding.page import PLATFORMS
from reshape.features.onboarding.site import OnboardingSite, reachable_at


@pytest.fixture(scope="module")
def certificate() -> x509.Certificate:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "reshape test <CA> & co")])
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )


@pytest.fixture(scope="module")
def site(certificate: x509.Certificate) -> OnboardingSite:
    return OnboardingSite(CaDownloads.of(certificate))


class Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: dict[str, str] = {}  # id → href
        self.details: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if tag == "a" and attributes.get("id"):
            self.links[str(attributes["id"])] = str(attributes.get("href"))
        if tag == "details":
            self.details.append(str(attributes.get("id")))


def test_the_three_forms_are_the_certificate_and_never_a_key(
    certificate: x509.Certificate,
) -> None:
    forms = CaDownloads.of(certificate).forms
    assert x509.load_pem_x509_certificate(forms["pem"].body) == certificate
    assert x509.load_der_x509_certificate(forms["cer"].body) == certificate
    p12 = pkcs12.load_pkcs12(forms["p12"].body, None)
    # No key, so the certificate is a bag of its own, as in mitmproxy's mitmproxy-ca-cert.p12.
    assert p12.key is None and p12.cert is None
    assert [c.certificate for c in p12.additional_certs] == [certificate]
    assert b"PRIVATE KEY" not in forms["pem"].body
    assert {f.filename for f in forms.values()} == {
        "reshape-ca-cert.pem",
        "reshape-ca-cert.cer",
        "reshape-ca-cert.p12",
    }


def test_the_page_offers_the_three_forms_and_every_platform(
    site: OnboardingSite, certificate: x509.Certificate
) -> None:
    reply = site.reply("/", proxy="127.0.0.1:8080", pac_url="http://127.0.0.1:9464/proxy.pac")
    assert reply is not None and reply.status == 200
    assert reply.headers["Content-Type"] == "text/html; charset=utf-8"
    page = reply.body.decode()
    parser = Links()
    parser.feed(page)
    assert parser.links == {"get-pem": "cert/pem", "get-cer": "cert/cer", "get-p12": "cert/p12"}
    assert parser.details == [p.key for p in PLATFORMS]
    assert {p.key for p in PLATFORMS} == {
        "chromium",
        "firefox",
        "android",
        "ios",
        "windows",
        "macos",
        "linux",
    }
    fingerprint = certificate.fingerprint(hashes.SHA256()).hex(":").upper()
    assert fingerprint in page
    assert html.escape(certificate.subject.rfc4514_string()) in page  # the subject, escaped
    assert "<CA>" not in page
    assert "127.0.0.1:8080" in page and "http://127.0.0.1:9464/proxy.pac" in page
    assert not re.search(r"<(script|link)\b|src=", page)  # self-contained
    assert "$" not in page.replace("$HOME", "")  # every placeholder filled


@pytest.mark.parametrize("form", ["pem", "cer", "p12"])
def test_downloads_are_attachments(site: OnboardingSite, form: str) -> None:
    reply = site.reply(f"/cert/{form}", proxy="p:1")
    assert reply is not None and reply.status == 200
    assert reply.headers["Content-Disposition"] == f'attachment; filename="reshape-ca-cert.{form}"'
    assert reply.body == site.downloads.forms[form].body


@pytest.mark.parametrize("path", ["/cert/key", "/cert/", "/index.html", "/mitmproxy-ca.pem"])
def test_other_paths_are_not_the_sites(site: OnboardingSite, path: str) -> None:
    assert site.reply(path, proxy="p:1") is None


@pytest.mark.parametrize(
    ("listen", "reached", "expected"),
    [
        ("127.0.0.1:9464", "127.0.0.1", "127.0.0.1:9464"),
        ("0.0.0.0:9464", "10.1.2.3", "10.1.2.3:9464"),
        ("127.0.0.1:9464", "10.1.2.3", None),  # loopback is no use to a client elsewhere
        ("10.0.0.5:9464", "10.0.0.5", "10.0.0.5:9464"),
    ],
)
def test_reachable_at(listen: str, reached: str, expected: str | None) -> None:
    host, port = listen.rsplit(":", 1)
    found = reachable_at(ListenAddress(host, int(port)), reached)
    assert (str(found) if found else None) == expected


def onboarding(site: OnboardingSite) -> Onboarding:
    return Onboarding(site, ListenAddress("127.0.0.1", 9464))


def flow_to(host: str, path: str = "/", method: str = "GET") -> http.HTTPFlow:
    flow = tflow.tflow()
    flow.request.host = host
    flow.request.path = path
    flow.request.method = method
    flow.client_conn.sockname = ("127.0.0.1", 8080)
    return flow


def test_the_addon_answers_at_its_name_without_an_origin(site: OnboardingSite) -> None:
    flow = flow_to(ONBOARDING_HOST.upper() + ".", "/?from=test")
    onboarding(site).requestheaders(flow)
    assert flow.response is not None and flow.response.status_code == 200
    assert b'href="cert/p12"' in flow.response.content
    assert b"127.0.0.1:8080" in flow.response.content  # where this client reached the proxy
    flow = flow_to(ONBOARDING_HOST, "/cert/cer")
    onboarding(site).requestheaders(flow)
    assert flow.response is not None and flow.response.content == site.downloads.forms["cer"].body


def test_head_has_the_gets_length_and_no_body(site: OnboardingSite) -> None:
    flow = flow_to(ONBOARDING_HOST, "/cert/p12", method="HEAD")
    onboarding(site).requestheaders(flow)
    assert flow.response is not None and flow.response.raw_content == b""
    assert flow.response.headers["Content-Length"] == str(len(site.downloads.forms["p12"].body))


@pytest.mark.parametrize(("method", "path", "status"), [("POST", "/", 405), ("GET", "/nope", 404)])
def test_errors_at_the_name(site: OnboardingSite, method: str, path: str, status: int) -> None:
    flow = flow_to(ONBOARDING_HOST, path, method)
    onboarding(site).requestheaders(flow)
    assert flow.response is not None and flow.response.status_code == status


def test_other_hosts_and_answered_flows_are_left_alone(site: OnboardingSite) -> None:
    flow = flow_to("example.com")
    onboarding(site).requestheaders(flow)
    assert flow.response is None
    flow = flow_to(ONBOARDING_HOST)
    flow.response = http.Response.make(407)
    onboarding(site).requestheaders(flow)
    assert flow.response.status_code == 407  # e.g. proxy authentication came first


def test_connect_to_the_name_is_accepted_without_connecting(site: OnboardingSite) -> None:
    flow = flow_to(ONBOARDING_HOST, method="CONNECT")
    flow.request.port = 443
    onboarding(site).http_connect(flow)
    assert flow.response is not None and flow.response.status_code == 200
    assert "content-length" not in flow.response.headers  # RFC 9110: none on a 2xx CONNECT
    other = flow_to("example.com", method="CONNECT")
    onboarding(site).http_connect(other)
    assert other.response is None
