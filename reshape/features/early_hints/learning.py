"""What earlier loads of a page needed, as the Link values of a 103 for its next load (sans-IO).

A page load, as a proxy sees it (`PageLoads`): a client's document request starts it, and the
same client's later requests belong to it until the client starts another or `window` seconds
have passed. Of those requests, two kinds are worth telling the next load's browser early:

- a stylesheet, script or font of the page's own origin whose Referer is the page's URL, fetched
  with GET and answered 200 with a media type of its kind that a shared cache may store
  (`fits`): a preload (`</app.css>; rel=preload; as=style`), fetched while the HTML is on its
  way. The response decides, not only the request: a client cannot make the proxy hint to other
  users a path that is not a public static resource of its kind (a GET with side effects, a
  page, a response that sets a cookie);
- a request to another origin whose Referer is the page's origin (what a browser sends
  cross-origin under the default `strict-origin-when-cross-origin`): a preconnect
  (`<https://img.example:443>; rel=preconnect`), the tunnel and TLS ready before the page asks.

When a load ends, `HintTable` learns it for the document URL (query included): every link the
load used hits, every known link it did not use misses; `max_misses` misses in a row forget a
link. A link is hinted once it has `min_loads` hits, in the order loads first used it.

A load whose 103 preloaded something says nothing about those preloads: the browser fetches what
a 103 names whether or not the page still uses it, and the page's own use of it then never
reaches the proxy. So those links neither hit nor miss in a hinted load, and every
`verify_every`-th hinted load of a page goes without preloads: its requests show what the page
still needs, and a resource the page dropped is forgotten after `max_misses` such loads.

Why not the preconnect feature's table (reshape/features/preconnect/table.py): that one learns,
per first-party origin, which origins the proxy should open its own connections to and how many;
hints are per document URL, name resources, and go to the browser.

Memory is bounded: `max_clients` open loads (the oldest ended early) with at most `max_links`
links each, `max_documents` documents (the least recently learned forgotten) × `max_links`
links; a link is at most ~560 bytes, a document URL at most `MAX_URL`.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

# Sec-Fetch-Dest values a 103 may preload, and the `as` each takes (fonts are always fetched in
# CORS mode, so their preload says `crossorigin` or the browser cannot use it).
PRELOADS = {"style": "as=style", "script": "as=script", "font": "as=font; crossorigin"}
# The media types a response must have to be learned as what its request's destination fetched.
MEDIA_TYPES = {
    "style": frozenset({"text/css"}),
    "script": frozenset(
        {
            "text/javascript",
            "application/javascript",
            "application/x-javascript",
            "application/ecmascript",
            "text/ecmascript",
        }
    ),
    "font": frozenset(
        {
            "font/woff2",
            "font/woff",
            "font/ttf",
            "font/otf",
            "font/sfnt",
            "font/collection",
            "application/font-woff",
            "application/font-woff2",
            "application/x-font-ttf",
            "application/x-font-otf",
            "application/vnd.ms-fontobject",
        }
    ),
}
MAX_PATH = 512
MAX_URL = 2048
# What may stand between `<` and `>` of a Link value as it is: printable ASCII but these.
_EXCLUDED = frozenset('<>"\\,;')


def _writable(text: str) -> bool:
    return all("!" <= c <= "~" and c not in _EXCLUDED for c in text)


def preload_link(path: str, dest: str) -> str | None:
    """The Link value preloading `path` (origin-relative) as `dest`; None if it cannot be one."""
    kind = PRELOADS.get(dest)
    if kind is None or not path.startswith("/") or path.startswith("//"):
        return None
    if len(path) > MAX_PATH or not _writable(path):
        return None
    return f"<{path}>; rel=preload; {kind}"


def preconnect_link(origin: str) -> str | None:
    """The Link value preconnecting to `origin` (scheme://host:port); None if it cannot be one."""
    if len(origin) > MAX_PATH or not _writable(origin):
        return None
    return f"<{origin}>; rel=preconnect"


def is_preload(link: str) -> bool:
    return not link.endswith("rel=preconnect")


def fits(
    dest: str,
    status: int,
    content_type: str | None,
    cache_control: str | None,
    sets_cookie: bool,
) -> bool:
    """Whether a response is what a preload of `dest` fetches and any user may be told of: 200,
    a media type of the kind, storable by a shared cache (not `no-store` nor `private`: a
    preloaded response the browser may not keep is fetched again), no cookie set."""
    if status != 200 or content_type is None or sets_cookie:
        return False
    media_type = content_type.split(";", 1)[0].strip().lower()
    if media_type not in MEDIA_TYPES.get(dest, ()):
        return False
    directives = {d.split("=", 1)[0].strip().lower() for d in (cache_control or "").split(",")}
    return directives.isdisjoint({"no-store", "private"})


@dataclass
class _Load:
    document: str
    origin: str
    started: float
    max_misses: int
    max_links: int
    hinted: frozenset[str] = frozenset()  # the preloads its 103 named
    used: dict[str, None] = field(default_factory=dict)  # links, in the order first used

    def use(self, link: str) -> None:
        if len(self.used) < self.max_links:
            self.used.setdefault(link, None)


@dataclass(frozen=True)
class Candidate:
    """A request that may be a preload of its page load, once its response shows it is."""

    load: _Load
    link: str
    dest: str


@dataclass(frozen=True)
class FinishedLoad:
    document: str
    used: tuple[str, ...]
    max_misses: int = 2  # of the policy its document request ran under
    hinted: frozenset[str] = frozenset()


class PageLoads:
    """Which requests of which client belong to which page load."""

    def __init__(
        self, *, window: float = 20.0, max_clients: int = 10_000, max_links: int = 32
    ) -> None:
        self.window = window
        self.max_clients = max_clients
        self.max_links = max_links
        self._open: OrderedDict[str, _Load] = OrderedDict()  # by start, oldest first

    def document(
        self, client: str, url: str, origin: str, now: float, *, max_misses: int
    ) -> list[FinishedLoad]:
        """`client` starts loading `url`: the loads this ends (its previous one, and any older
        than the window or beyond the bound). A URL longer than MAX_URL starts no load."""
        ended = self._expire(now)
        previous = self._open.pop(client, None)
        if previous is not None:
            ended.append(_finished(previous))
        if len(url) <= MAX_URL:
            self._open[client] = _Load(url, origin, now, max_misses, self.max_links)
        while len(self._open) > self.max_clients:
            ended.append(_finished(self._open.popitem(last=False)[1]))
        return ended

    def hinted(self, client: str, links: list[str]) -> None:
        """The client's current load got a 103 naming `links`."""
        load = self._open.get(client)
        if load is not None:
            load.hinted = frozenset(link for link in links if is_preload(link))

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
    ) -> Candidate | None:
        """A request of `client` that is not a document request; `referer_origin` is its
        Referer's origin in the form of `origin` (scheme://host:port). A request to another
        origin counts at once; one that may be a preload is returned, for `confirm`."""
        load = self._open.get(client)
        if load is None or now - load.started > self.window or referer_origin != load.origin:
            return None
        if origin != load.origin:
            link = preconnect_link(origin)
            if link is not None:
                load.use(link)
        elif method == "GET" and dest is not None and referer == load.document:
            link = preload_link(path, dest)
            if link is not None:
                return Candidate(load, link, dest)
        return None

    @staticmethod
    def confirm(candidate: Candidate) -> None:
        """`candidate`'s response `fits`: its load used it (lost if the load has ended)."""
        candidate.load.use(candidate.link)

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
    return FinishedLoad(load.document, tuple(load.used), load.max_misses, load.hinted)


@dataclass
class _Stats:
    hits: int = 0
    misses: int = 0  # in a row


@dataclass
class _Page:
    links: dict[str, _Stats] = field(default_factory=dict)
    hinted_loads: int = 0  # loads whose 103 named a preload, for verify_every


class HintTable:
    """Per document URL, the links its loads used."""

    def __init__(self, *, max_documents: int = 1024, max_links: int = 32) -> None:
        self.max_documents = max_documents
        self.max_links = max_links
        self._pages: OrderedDict[str, _Page] = OrderedDict()

    def __len__(self) -> int:
        return len(self._pages)

    def learn(self, load: FinishedLoad) -> None:
        page = self._pages.pop(load.document, None) or _Page()
        links = page.links
        used = set(load.used)
        for link, missed in list(links.items()):
            if link not in used and link not in load.hinted:
                missed.misses += 1
                if missed.misses >= load.max_misses:
                    del links[link]
        for link in load.used:
            if link in load.hinted:
                continue  # fetched because the 103 named it: no evidence either way
            stats = links.get(link)
            if stats is None:
                if len(links) >= self.max_links:
                    continue  # the page's known links keep their places
                stats = links[link] = _Stats()
            stats.hits += 1
            stats.misses = 0
        if not links:
            return
        self._pages[load.document] = page
        while len(self._pages) > self.max_documents:
            self._pages.popitem(last=False)

    def links(
        self,
        document: str,
        *,
        min_loads: int,
        max_preloads: int,
        max_preconnects: int,
        verify_every: int,
    ) -> list[str]:
        """The Link values to hint for a load of `document`: preloads, then preconnects; no
        preloads in every `verify_every`-th load that would have had some."""
        page = self._pages.get(document)
        if page is None:
            return []
        preloads: list[str] = []
        preconnects: list[str] = []
        for link, stats in page.links.items():
            if stats.hits < min_loads:
                continue
            if not is_preload(link):
                if len(preconnects) < max_preconnects:
                    preconnects.append(link)
            elif len(preloads) < max_preloads:
                preloads.append(link)
        if preloads:
            page.hinted_loads += 1
            if page.hinted_loads % verify_every == 0:
                preloads = []
        return preloads + preconnects
