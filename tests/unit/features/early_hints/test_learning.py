"""PageLoads and HintTable: which requests a page load used, and what the next load is told."""

from __future__ import annotations

import pytest

from reshape.features.early_hints.learning import (
    FinishedLoad,
    HintTable,
    PageLoads,
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


def same_origin(
    loads: PageLoads,
    path: str,
    dest: str,
    *,
    client: str = "10.0.0.1",
    referer: str = PAGE_REFERER,
    method: str = "GET",
    now: float = 1.0,
) -> None:
    loads.subresource(
        client,
        origin=WWW,
        path=path,
        method=method,
        dest=dest,
        referer=referer,
        referer_origin=WWW,
        now=now,
    )


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
    ended = loads.document(client, PAGE, WWW, now)
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
    [ended] = loads.document("10.0.0.1", "https://www.example/other", WWW, 1.0)
    assert ended == FinishedLoad(PAGE, (CSS, JS, preconnect_link(CDN), FONT, preconnect_link(IMG)))


def test_only_the_pages_own_static_resources_fetched_by_get_from_the_page_are_preloads() -> None:
    loads = PageLoads()
    loads.document("10.0.0.1", PAGE, WWW, 0.0)
    same_origin(loads, "/api/feed.json", "empty")  # XHR: not preloadable
    same_origin(loads, "/static/x.css", "style", method="POST")
    same_origin(loads, "/static/y.css", "style", referer=f"{WWW}/static/site.css")  # from a CSS
    same_origin(loads, "/static/z.css", None)  # type: ignore[arg-type]  # no Fetch Metadata
    other_origin(loads, CDN, referer_origin="https://elsewhere.example:443")  # not this page's
    other_origin(loads, IMG, referer_origin=None)  # no Referer
    [ended] = loads.document("10.0.0.1", PAGE, WWW, 1.0)
    assert ended.used == ()


def test_requests_of_other_clients_and_after_the_window_do_not_count() -> None:
    loads = PageLoads(window=5.0)
    loads.document("10.0.0.1", PAGE, WWW, 0.0)
    same_origin(loads, "/static/site.css", "style", client="10.0.0.2")
    same_origin(loads, "/static/app.js?v=3", "script", now=5.5)
    ended = loads.document("10.0.0.2", PAGE, WWW, 6.0)  # ends 10.0.0.1's: older than the window
    assert ended == [FinishedLoad(PAGE, ())]


def test_open_loads_are_bounded_the_oldest_ending_first() -> None:
    loads = PageLoads(max_clients=2)
    loads.document("a", PAGE, WWW, 0.0)
    loads.document("b", PAGE, WWW, 0.1)
    assert loads.document("c", PAGE, WWW, 0.2) == [FinishedLoad(PAGE, ())]


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
    ],
)
def test_a_path_that_cannot_be_a_preload_is_never_one(path: str, dest: str) -> None:
    assert preload_link(path, dest) is None


def learn(table: HintTable, *used: str, max_misses: int = 2) -> None:
    table.learn(FinishedLoad(PAGE, used), max_misses=max_misses)


def hints(
    table: HintTable, min_loads: int = 2, max_preloads: int = 8, max_preconnects: int = 4
) -> list[str]:
    return table.links(
        PAGE, min_loads=min_loads, max_preloads=max_preloads, max_preconnects=max_preconnects
    )


def test_a_link_is_hinted_once_min_loads_used_it_preloads_first() -> None:
    table = HintTable()
    learn(table, preconnect_link(CDN), CSS, JS)
    assert hints(table) == []
    assert hints(table, min_loads=1) == [CSS, JS, preconnect_link(CDN)]
    learn(table, preconnect_link(CDN), CSS)
    assert hints(table) == [CSS, preconnect_link(CDN)]
    assert table.links("https://www.example/", min_loads=1, max_preloads=8, max_preconnects=4) == []


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
        learn(table, CSS, JS, FONT, preconnect_link(CDN), preconnect_link(IMG))
    assert hints(table, max_preloads=2, max_preconnects=1) == [CSS, JS, preconnect_link(CDN)]
    assert hints(table, max_preloads=0, max_preconnects=0) == []


def test_memory_is_bounded_per_document_and_in_documents() -> None:
    table = HintTable(max_documents=2, max_links=2)
    learn(table, CSS, JS, FONT)
    assert hints(table, min_loads=1) == [CSS, JS]  # FONT found no room
    for n in range(2):
        table.learn(FinishedLoad(f"https://www.example/{n}", (CSS,)), max_misses=2)
    assert len(table) == 2
    assert hints(table, min_loads=1) == []  # the least recently learned went first
