"""PageLoads and HintTable: which requests a page load used, and what the next load is told."""

from __future__ import annotations

import pytest

from reshape.features.early_hints.learning import (
    Candidate,
    FinishedLoad,
    HintTable,
    PageLoads,
    fits,
    preconnect_link,
    preload_link,
)

WWW = "https://www.example:443"
PAGE = "https://www.example/news/index.html?edition=uk"
PAGE_REFERER = PAGE
CDN = "https://cdn.example:443"
IMG = "https://img.example:8443"

CSS = "</static/site.css>; rel=preload; as=style"
JS = "</static/app.js?v=3>; rel=preload; as=script"
FONT = "</fonts/body.woff2>; rel=preload; as=font; crossorigin"
CDN_LINK = f"<{CDN}>; rel=preconnect"
IMG_LINK = f"<{IMG}>; rel=preconnect"


def same_origin(
    loads: PageLoads,
    path: str,
    dest: str,
    *,
    client: str = "10.0.0.1",
    referer: str = PAGE_REFERER,
    method: str = "GET",
    now: float = 1.0,
    answered: bool = True,
) -> Candidate | None:
    """A request of the page's origin; if it may be a preload and `answered`, its response
    fits and confirms it."""
    candidate = loads.subresource(
        client,
        origin=WWW,
        path=path,
        method=method,
        dest=dest,
        referer=referer,
        referer_origin=WWW,
        now=now,
    )
    if candidate is not None and answered:
        PageLoads.confirm(candidate)
    return candidate


def other_origin(
    loads: PageLoads,
    origin: str,
    *,
    client: str = "10.0.0.1",
    referer_origin: str | None = WWW,
    now: float = 1.0,
) -> None:
    loads.subresource(
        client,
        origin=origin,
        path="/x.png",
        method="GET",
        dest="image",
        referer=f"{WWW}/",
        referer_origin=referer_origin,
        now=now,
    )


def one_load(loads: PageLoads, now: float, *, client: str = "10.0.0.1") -> list[FinishedLoad]:
    ended = loads.document(client, PAGE, WWW, now, max_misses=2)
    same_origin(loads, "/static/site.css", "style", client=client, now=now + 0.1)
    same_origin(loads, "/static/app.js?v=3", "script", client=client, now=now + 0.1)
    other_origin(loads, CDN, client=client, now=now + 0.2)
    return ended


def test_a_load_ends_when_its_client_starts_the_next_and_names_what_it_used() -> None:
    loads = PageLoads()
    assert one_load(loads, 0.0) == []
    same_origin(loads, "/fonts/body.woff2", "font", now=0.3)
    other_origin(loads, CDN, now=0.4)  # once per origin
    other_origin(loads, IMG, now=0.5)
    [ended] = loads.document("10.0.0.1", "https://www.example/other", WWW, 1.0, max_misses=2)
    assert ended == FinishedLoad(PAGE, (CSS, JS, CDN_LINK, FONT, IMG_LINK))


def test_only_the_pages_own_static_resources_fetched_by_get_from_the_page_are_preloads() -> None:
    loads = PageLoads()
    loads.document("10.0.0.1", PAGE, WWW, 0.0, max_misses=2)
    same_origin(loads, "/api/feed.json", "empty")  # XHR: not preloadable
    same_origin(loads, "/static/x.css", "style", method="POST")
    same_origin(loads, "/static/y.css", "style", referer=f"{WWW}/static/site.css")  # from a CSS
    same_origin(loads, "/static/z.css", None)  # type: ignore[arg-type]  # no Fetch Metadata
    other_origin(loads, CDN, referer_origin="https://elsewhere.example:443")  # not this page's
    other_origin(loads, IMG, referer_origin=None)  # no Referer
    [ended] = loads.document("10.0.0.1", PAGE, WWW, 1.0, max_misses=2)
    assert ended.used == ()


def test_requests_of_other_clients_and_after_the_window_do_not_count() -> None:
    loads = PageLoads(window=5.0)
    loads.document("10.0.0.1", PAGE, WWW, 0.0, max_misses=2)
    same_origin(loads, "/static/site.css", "style", client="10.0.0.2")
    same_origin(loads, "/static/app.js?v=3", "script", now=5.5)
    ended = loads.document(
        "10.0.0.2", PAGE, WWW, 6.0, max_misses=2
    )  # ends 10.0.0.1's: older than the window
    assert ended == [FinishedLoad(PAGE, ())]


def test_open_loads_are_bounded_the_oldest_ending_first() -> None:
    loads = PageLoads(max_clients=2)
    loads.document("a", PAGE, WWW, 0.0, max_misses=2)
    loads.document("b", PAGE, WWW, 0.1, max_misses=2)
    assert loads.document("c", PAGE, WWW, 0.2, max_misses=2) == [FinishedLoad(PAGE, ())]


def test_a_possible_preload_counts_only_once_its_response_fits() -> None:
    loads = PageLoads()
    loads.document("10.0.0.1", PAGE, WWW, 0.0, max_misses=2)
    unanswered = same_origin(loads, "/static/site.css", "style", answered=False)
    assert unanswered is not None and unanswered.dest == "style" and unanswered.link == CSS
    same_origin(loads, "/static/app.js?v=3", "script")
    late = same_origin(loads, "/fonts/body.woff2", "font", answered=False)
    [ended] = loads.document("10.0.0.1", PAGE, WWW, 1.0, max_misses=2)
    assert ended.used == (JS,)
    assert late is not None
    PageLoads.confirm(late)  # its load has ended: lost, not counted towards the next one
    [next_load] = loads.document("10.0.0.1", PAGE, WWW, 2.0, max_misses=2)
    assert next_load.used == ()


@pytest.mark.parametrize(
    ("dest", "status", "content_type", "cache_control", "expected"),
    [
        ("style", 200, "text/css", None, True),
        ("style", 200, "text/css; charset=utf-8", "max-age=3600, public", True),
        ("script", 200, "application/javascript", None, True),
        ("script", 200, "Text/JavaScript", None, True),
        ("font", 200, "font/woff2", None, True),
        ("style", 200, "text/html", None, False),  # a page, not a stylesheet
        ("script", 200, "text/css", None, False),
        ("script", 302, "text/javascript", None, False),  # e.g. /logout answering a redirect
        ("style", 304, "text/css", None, False),
        ("style", 200, None, None, False),
        ("style", 200, "text/css", "no-store", False),  # the browser may not keep it
        ("style", 200, "text/css", "max-age=60, Private", False),  # one user's
        ("image", 200, "image/png", None, False),
    ],
)
def test_what_fits_a_preload(
    dest: str, status: int, content_type: str | None, cache_control: str | None, expected: bool
) -> None:
    assert fits(dest, status, content_type, cache_control, False) is expected
    assert not fits(dest, status, content_type, cache_control, True)  # sets a cookie


def test_an_origin_that_cannot_be_written_in_a_link_is_never_a_preconnect() -> None:
    assert preconnect_link("https://cdn.example:443") == "<https://cdn.example:443>; rel=preconnect"
    assert preconnect_link("https://a>; rel=preload; as=script, <x:1") is None
    loads = PageLoads()
    loads.document("10.0.0.1", PAGE, WWW, 0.0, max_misses=2)
    other_origin(loads, "https://a b:443")
    [ended] = loads.document("10.0.0.1", PAGE, WWW, 1.0, max_misses=2)
    assert ended.used == ()


@pytest.mark.parametrize(
    ("path", "dest"),
    [
        ("/a>b.css", "style"),
        ("/a b.js", "script"),
        ("/a,b.js", "script"),
        ("//evil.example/x.js", "script"),
        ("relative.js", "script"),
        ("/" + "a" * 600 + ".js", "script"),
        ("/x.png", "image"),
        ("/a\udcff.css", "style"),  # a byte mitmproxy decoded with surrogateescape
        ("/caf\u00e9.css", "style"),
        ('/a"b.css', "style"),
        ("/a;b.css", "style"),
        ("/a\tb.css", "style"),
    ],
)
def test_a_path_that_cannot_be_a_preload_is_never_one(path: str, dest: str) -> None:
    assert preload_link(path, dest) is None


def learn(
    table: HintTable, *used: str, max_misses: int = 2, hinted: frozenset[str] = frozenset()
) -> None:
    table.learn(FinishedLoad(PAGE, used, max_misses, hinted))


def hints(
    table: HintTable,
    min_loads: int = 2,
    max_preloads: int = 8,
    max_preconnects: int = 4,
    *,
    document: str = PAGE,
    verify_every: int = 1000,
) -> list[str]:
    return table.links(
        document,
        min_loads=min_loads,
        max_preloads=max_preloads,
        max_preconnects=max_preconnects,
        verify_every=verify_every,
    )


def test_a_link_is_hinted_once_min_loads_used_it_preloads_first() -> None:
    table = HintTable()
    learn(table, CDN_LINK, CSS, JS)
    assert hints(table) == []
    assert hints(table, min_loads=1) == [CSS, JS, CDN_LINK]
    learn(table, CDN_LINK, CSS)
    assert hints(table) == [CSS, CDN_LINK]
    assert hints(table, document="https://www.example/", min_loads=1) == []


def test_a_link_missed_max_misses_loads_in_a_row_is_forgotten() -> None:
    table = HintTable()
    for _ in range(3):
        learn(table, CSS, JS)
    learn(table, CSS)  # JS missed once: still hinted
    assert hints(table) == [CSS, JS]
    learn(table, CSS, JS)  # a hit resets the misses
    learn(table, CSS)
    learn(table, CSS)  # two misses in a row
    assert hints(table, min_loads=1) == [CSS]


def test_caps_on_what_one_103_names() -> None:
    table = HintTable()
    for _ in range(2):
        learn(table, CSS, JS, FONT, CDN_LINK, IMG_LINK)
    assert hints(table, max_preloads=2, max_preconnects=1) == [CSS, JS, CDN_LINK]
    assert hints(table, max_preloads=0, max_preconnects=0) == []


def test_memory_is_bounded_per_document_and_in_documents() -> None:
    table = HintTable(max_documents=2, max_links=2)
    learn(table, CSS, JS, FONT)
    assert hints(table, min_loads=1) == [CSS, JS]  # FONT found no room
    for n in range(2):
        table.learn(FinishedLoad(f"https://www.example/{n}", (CSS,)))
    assert len(table) == 2
    assert hints(table, min_loads=1) == []  # the least recently learned went first


def test_a_hinted_load_says_nothing_of_its_preloads_a_verifying_load_does() -> None:
    table = HintTable()
    learn(table, CSS, JS, CDN_LINK)
    learn(table, CSS, JS, CDN_LINK)
    sent = hints(table, verify_every=3)
    assert sent == [CSS, JS, CDN_LINK]
    # The page dropped JS, but the browser fetched it anyway: the 103 named it.
    for _ in range(4):
        learn(table, CSS, JS, hinted=frozenset({CSS, JS}))
    # CDN_LINK is no preload: it missed four times (max_misses 2) and is gone.
    assert hints(table, verify_every=3) == [CSS, JS]  # the 2nd hinted load
    assert hints(table, verify_every=3) == []  # the 3rd: no preloads, a load to learn from
    learn(table, CSS)
    learn(table, CSS)  # and the next verifying load (here by hand): JS missed twice in a row
    assert hints(table, verify_every=3) == [CSS]


def test_a_load_records_at_most_max_links_and_a_long_url_starts_none() -> None:
    loads = PageLoads(max_links=2)
    loads.document("10.0.0.1", PAGE, WWW, 0.0, max_misses=2)
    for n in range(5):
        other_origin(loads, f"https://cdn{n}.example:443")
    [ended] = loads.document("10.0.0.1", PAGE + "x" * 3000, WWW, 1.0, max_misses=2)
    assert len(ended.used) == 2
    other_origin(loads, CDN)
    assert loads.document("10.0.0.1", PAGE, WWW, 2.0, max_misses=2) == []


def test_the_misses_rule_is_the_loads_own() -> None:
    table = HintTable()
    learn(table, CSS, JS)
    learn(table, CSS, max_misses=1)
    assert hints(table, min_loads=1) == [CSS]
