"""Early hints end to end: `reshape run` → nginx over TLS on loopback; clients that show every
1xx (h2 over the CONNECT tunnel, curl) and headless Chromium, which acts on the 103."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest

from labkit.browser import BrowserSession
from labkit.origins import Origin, nginx_origin
from labkit.pki import OriginPKI
from labkit.relay import Link, relays
from tests.support.clients import H2Answer, curl_heads, h2_get, statuses_in
from tests.support.reshape_process import RunningProxy, StartProxy

pytestmark = pytest.mark.slow

# Old enough that a browser may keep the files a while (nginx sends their mtime as Last-Modified).
PUBLISHED = 1_700_000_000
PAGE_HTML = (
    '<!doctype html><html><head><link rel="stylesheet" href="/static/site.css">'
    '<script src="/static/app.js" defer></script></head>'
    '<body><img src="{cdn}/logo.png"></body></html>'
)


@dataclass
class Site:
    www: Origin  # behind a 50 ms link
    cdn: Origin
    html: bytes
    nearby_www: Origin  # the same server on loopback: it answers within SendEarlyHints' wait

    @property
    def page(self) -> str:
        return self.www.url("/index.html")


@pytest.fixture
def site(tmp_path: Path, origin_pki: OriginPKI) -> Iterator[Site]:
    roots = {name: tmp_path / name for name in ("www", "cdn")}
    with ExitStack() as stack:
        # Also valid for 127.0.0.4, where a slow link is put in front of it.
        www_tls = origin_pki.issue(["127.0.0.2", "127.0.0.4"], name="www")
        nginx = stack.enter_context(
            nginx_origin(roots["www"], "127.0.0.2", tls=www_tls, http2=True)
        )
        # The page's origin 50 ms away: a 103 waits SendEarlyHints' delay (10 ms) and is not sent
        # once the response is there, which nginx on loopback gives at once.
        link = stack.enter_context(relays()).add(
            "127.0.0.4", (nginx.host, nginx.port), Link.rtt(0.05)
        )
        www = dataclasses.replace(nginx, host="127.0.0.4", port=link.port)
        cdn = stack.enter_context(
            nginx_origin(roots["cdn"], "127.0.0.3", tls=origin_pki.issue(["127.0.0.3"]), http2=True)
        )
        html = PAGE_HTML.format(cdn=cdn.url("").rstrip("/")).encode()
        files = {
            roots["www"] / "index.html": html,
            roots["www"] / "static" / "site.css": b"body { color: #222 }\n",
            roots["www"] / "static" / "app.js": b"window.appRan = true;\n",
            roots["cdn"] / "logo.png": b"\x89PNG" + bytes(200),
        }
        for path, body in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(body)
            os.utime(path, (PUBLISHED, PUBLISHED))
        yield Site(www, cdn, html, nginx)


def policy(tmp_path: Path, early_hints: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(
        "version: 1\ndefault: hinted\npolicies:\n"
        f"  hinted: {{upstream: {{http2: true}}, early_hints: {early_hints}}}\n"
    )
    return path


def navigate(proxy: RunningProxy, site: Site, www: Origin | None = None) -> H2Answer:
    answer = h2_get(
        proxy,
        www or site.www,
        "/index.html",
        {"accept": "text/html", "sec-fetch-dest": "document", "sec-fetch-mode": "navigate"},
    )
    assert answer.status == 200
    assert answer.body == site.html
    return answer


def load(proxy: RunningProxy, site: Site, www: Origin | None = None) -> H2Answer:
    """A page load as Chromium makes it: the document, then what the HTML names."""
    www = www or site.www
    document = navigate(proxy, site, www)
    page = www.url("/index.html")
    for path, dest in (("/static/site.css", "style"), ("/static/app.js", "script")):
        fetched = h2_get(proxy, www, path, {"sec-fetch-dest": dest, "referer": page})
        assert fetched.status == 200
    cross = {"sec-fetch-dest": "image", "referer": site.www.url("/")}
    assert h2_get(proxy, site.cdn, "/logo.png", cross).status == 200
    return document


def test_the_third_load_of_a_page_is_told_at_once_what_the_first_two_needed(
    start_reshape: StartProxy, site: Site, tmp_path: Path
) -> None:
    proxy = start_reshape(policy=policy(tmp_path, "{mode: learned}"))
    assert load(proxy, site).informational == []
    assert load(proxy, site).informational == []  # min_loads 2: one load learned so far
    third = load(proxy, site)
    cdn_origin = f"https://{site.cdn.host}:{site.cdn.port}"
    assert third.informational == [
        {
            b":status": b"103",
            b"link": (
                b"</static/site.css>; rel=preload; as=style, "
                b"</static/app.js>; rel=preload; as=script, "
                + f"<{cdn_origin}>; rel=preconnect".encode()
            ),
        }
    ]
    assert proxy.metric("reshape_early_hints_total", policy="hinted") == 1
    # The subresources themselves are never hinted, nor is a request no document is loading.
    css = h2_get(proxy, site.www, "/static/site.css", {"sec-fetch-dest": "style"})
    assert css.informational == []


def test_no_103_once_the_response_is_there(
    start_reshape: StartProxy, site: Site, tmp_path: Path
) -> None:
    """An origin that answers within the wait before a 103 (which Chromium needs, see
    SendEarlyHints) gets its response sent alone: a 103 after it would say nothing."""
    proxy = start_reshape(policy=policy(tmp_path, "{mode: learned, min_loads: 1}"))
    for _ in range(3):
        assert load(proxy, site, site.nearby_www).informational == []
    assert proxy.metric("reshape_early_hints_total", policy="hinted") == 0
    assert len(load(proxy, site).informational) == 0  # learned from this load on
    assert len(load(proxy, site).informational) == 1


def test_only_what_answers_as_a_public_resource_of_its_kind_is_ever_preloaded(
    start_reshape: StartProxy, site: Site, tmp_path: Path
) -> None:
    """A client sending requests a page would not (a page as a script, a missing stylesheet)
    cannot make the proxy hint them to the next user."""
    proxy = start_reshape(policy=policy(tmp_path, "{mode: learned, min_loads: 1}"))
    for _ in range(2):
        navigate(proxy, site)
        forged = {"referer": site.page}
        h2_get(proxy, site.www, "/index.html?as=script", {**forged, "sec-fetch-dest": "script"})
        missing = h2_get(proxy, site.www, "/missing.css", {**forged, "sec-fetch-dest": "style"})
        assert missing.status == 404
        fetched = h2_get(proxy, site.www, "/static/site.css", {**forged, "sec-fetch-dest": "style"})
        assert fetched.status == 200
    assert navigate(proxy, site).informational == [
        {b":status": b"103", b"link": b"</static/site.css>; rel=preload; as=style"}
    ]


def test_no_103_without_the_knob_nor_to_an_http1_client(
    start_reshape: StartProxy, site: Site, tmp_path: Path
) -> None:
    off = start_reshape(policy=policy(tmp_path, "{mode: off}"))
    for _ in range(3):
        assert load(off, site).informational == []
    assert off.metric("reshape_early_hints_total", policy="hinted") == 0
    off.stop()

    proxy = start_reshape(policy=policy(tmp_path, "{mode: learned, min_loads: 1}"))
    load(proxy, site)
    load(proxy, site)
    # curl shows every response head it reads: over HTTP/1.1 only the 200 comes.
    assert statuses_in(curl_heads(proxy, site.page, "--http1.1")) == ["HTTP/1.1 200 OK"]
    # The same page over HTTP/2 is hinted (min_loads 1).
    assert statuses_in(curl_heads(proxy, site.page, "--http2")) == ["HTTP/2 103", "HTTP/2 200"]


@pytest.mark.browser
def test_chromium_fetches_what_the_103_names_while_the_page_is_on_its_way(
    start_reshape: StartProxy, site: Site, tmp_path: Path
) -> None:
    proxy = start_reshape(policy=policy(tmp_path, "{mode: learned}"))
    with BrowserSession([proxy.ca_cert]) as browser:
        # The page's origin 50 ms away: the 103 comes 40 ms before the HTML.
        loads = [
            browser.load(site.page, proxy=proxy.listen, resource_timing=True) for _ in range(5)
        ]
    for loaded in loads:  # every load complete and intact, hinted or not
        assert {r.url.rsplit("/", 1)[1]: r.status for r in loaded.resources} == {
            "index.html": 200,
            "site.css": 200,
            "app.js": 200,
            "logo.png": 200,
        }
    plain = {"site.css": "link", "app.js": "script", "logo.png": "img"}
    # The page's own resources (Chromium's favicon request may finish before the timings are read).
    initiators = [
        {
            name: t.initiator_type
            for t in loaded.timings
            if (name := t.url.rsplit("/", 1)[1]) in plain
        }
        for loaded in loads
    ]
    hinted = {"site.css": "early-hints", "app.js": "early-hints", "logo.png": "img"}
    assert initiators[:2] == [plain, plain]
    # From the third on, a 103 each time, and Chromium takes the stylesheet and the script from
    # its preloads (it dropped 3 of 7 such 103s sent at once, before SendEarlyHints waited).
    assert initiators[2:] == [hinted, hinted, hinted], initiators
    assert proxy.metric("reshape_early_hints_total", policy="hinted") == 3
