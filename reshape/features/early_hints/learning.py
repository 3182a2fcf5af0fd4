"""What earlier loads of a page needed, as the Link values of a 103 for its next load (sans-IO).

A page load, as a proxy sees it (`PageLoads`): a client's document request starts it, and the
same client's later requests belong to it until the client starts another or `window` seconds
have passed. Of those requests, two kinds are worth telling the next load's browser early:

- a stylesheet, script or font of the page's own origin whose Referer is the page's URL, fetched
  with GET: a preload (`</app.css>; rel=preload; as=style`), fetched while the HTML is on its way;
- a request to another origin whose Referer is the page's origin (what a browser sends
  cross-origin under the default `strict-origin-when-cross-origin`): a preconnect
  (`<https://img.example:443>; rel=preconnect`), the tunnel and TLS ready before the page asks.

When a load ends, `HintTable` learns it for the document URL (query included): every link the
load used hits, every known link it did not use misses; `max_misses` misses in a row forget a
link. A link is hinted once it has `min_loads` hits, in the order loads first used it.

Why not the preconnect feature's table (reshape/features/preconnect/table.py): that one learns,
per first-party origin, which origins the proxy should open its own connections to and how many;
hints are per document URL, name resources, and go to the browser.

Memory is bounded: `max_clients` open loads (the oldest ended early), `max_documents` documents
(the least recently learned forgotten) × `max_links` links each.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

# Sec-Fetch-Dest values a 103 may preload, and the `as` each takes (fonts are always fetched in
# CORS mode, so their preload says `crossorigin` or the browser cannot use it).
PRELOADS = {"style": "as=style", "script": "as=script", "font": "as=font; crossorigin"}
MAX_PATH = 512
# Characters a path must not have to be written between `<` and `>` of a Link value.
_UNSAFE = frozenset('<>"\\ ,;') | frozenset(chr(c) for c in range(0x20)) | {"\x7f"}


def preload_link(path: str, dest: str) -> str | None:
    """The Link value preloading `path` (origin-relative) as `dest`; None if it cannot be one."""
    kind = PRELOADS.get(dest)
    if kind is None or not path.startswith("/") or len(path) > MAX_PATH:
        return None
    if path.startswith("//") or not _UNSAFE.isdisjoint(path):
        return None
    return f"<{path}>; rel=preload; {kind}"


def preconnect_link(origin: str) -> str:
    return f"<{origin}>; rel=preconnect"


@dataclass
class _Load:
    document: str
    origin: str
    started: float
    used: dict[str, None] = field(default_factory=dict)  # links, in the order first used


@dataclass(frozen=True)
class FinishedLoad:
    document: str
    used: tuple[str, ...]


class PageLoads:
    """Which requests of which client belong to which page load."""

    def __init__(self, *, window: float = 20.0, max_clients: int = 10_000) -> None:
        self.window = window
        self.max_clients = max_clients
        self._open: OrderedDict[str, _Load] = OrderedDict()  # by start, oldest first

    def document(self, client: str, url: str, origin: str, now: float) -> list[FinishedLoad]:
        """`client` starts loading `url`: the loads this ends (its previous one, and any older
        than the window or beyond the bound)."""
        ended = self._expire(now)
        previous = self._open.pop(client, None)
        if previous is not None:
            ended.append(_finished(previous))
        self._open[client] = _Load(url, origin, now)
        while len(self._open) > self.max_clients:
            ended.append(_finished(self._open.popitem(last=False)[1]))
        return ended

    def subresource(
        self,
        client: str,
        *,
        origin: str,
        path: str,
        method: str,
        dest: str | None,
        referer: str | None,
        referer_origin: str | None,
        now: float,
    ) -> None:
        """A request of `client` that is not a document request; `referer_origin` is its
        Referer's origin in the form of `origin` (scheme://host:port)."""
        load = self._open.get(client)
        if load is None or now - load.started > self.window or referer_origin != load.origin:
            return
        if origin != load.origin:
            load.used.setdefault(preconnect_link(origin), None)
        elif method == "GET" and dest is not None and referer == load.document:
            link = preload_link(path, dest)
            if link is not None:
                load.used.setdefault(link, None)

    def _expire(self, now: float) -> list[FinishedLoad]:
        ended = []
        while self._open:
            client, load = next(iter(self._open.items()))
            if now - load.started <= self.window:
                break
            del self._open[client]
            ended.append(_finished(load))
        return ended


def _finished(load: _Load) -> FinishedLoad:
    return FinishedLoad(load.document, tuple(load.used))


@dataclass
class _Stats:
    hits: int = 0
    misses: int = 0


class HintTable:
    """Per document URL, the links its loads used."""

    def __init__(self, *, max_documents: int = 4096, max_links: int = 64) -> None:
        self.max_documents = max_documents
        self.max_links = max_links
        self._documents: OrderedDict[str, dict[str, _Stats]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._documents)

    def learn(self, load: FinishedLoad, *, max_misses: int) -> None:
        links = self._documents.pop(load.document, None)
        if links is None:
            links = {}
        used = set(load.used)
        for link, missed in list(links.items()):
            if link not in used:
                missed.misses += 1
                if missed.misses >= max_misses:
                    del links[link]
        for link in load.used:
            stats = links.get(link)
            if stats is None:
                if len(links) >= self.max_links:
                    continue  # the page's known links keep their places
                stats = links[link] = _Stats()
            stats.hits += 1
            stats.misses = 0
        if not links:
            return
        self._documents[load.document] = links
        while len(self._documents) > self.max_documents:
            self._documents.popitem(last=False)

    def links(
        self, document: str, *, min_loads: int, max_preloads: int, max_preconnects: int
    ) -> list[str]:
        """The Link values to hint for a load of `document`: preloads, then preconnects."""
        known = self._documents.get(document)
        if not known:
            return []
        preloads: list[str] = []
        preconnects: list[str] = []
        for link, stats in known.items():
            if stats.hits < min_loads:
                continue
            if link.endswith("rel=preconnect"):
                if len(preconnects) < max_preconnects:
                    preconnects.append(link)
            elif len(preloads) < max_preloads:
                preloads.append(link)
        return preloads + preconnects
