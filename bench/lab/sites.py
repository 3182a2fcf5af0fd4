"""The lab's six pages, generated from a fixed seed into the document roots of its origin hosts.

Every origin host is a distinct loopback address (`HOSTS`). A page is written for one protocol
variant at a time (`h1` or `h2`), under `/<variant>/<page>/` on each host it uses, because its HTML
and stylesheets name other hosts by absolute URL, port included. The bytes of every file follow
from the seed alone, and each page comes with the size of every body a load must receive.

- four parallel-connection pages: the HTML on `www`, all subresources on `img` (so R, the
  resources per host, is 4, 4, 4 and 12);
- `news`: ~80 resources from 13 hosts, with dependency chains HTML → CSS → font/image and
  HTML → script → XHR → image;
- `app`: a script that makes 200 small requests in five bursts, each after the previous one
  finished: map tiles (images from two tile hosts) and feed updates (XHR GETs and POSTs to its
  own origin, a hypercorn that echoes POSTs);
- `news-6`: the smaller news page of issue 17's gateway measurements, on 6 origins: the HTML,
  2 stylesheets and 3 scripts on a second host, 24 images over four more hosts, then 12 API calls
  (JSON from the page's own origin) in 3 dependent bursts of 4 — 42 requests, the page included.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

from labkit.sites import png

# Origin host name -> (loopback address, server). 127.0.0.1 is left to the proxies.
HOSTS: dict[str, tuple[str, str]] = {
    "www": ("127.0.0.2", "nginx"),
    "img": ("127.0.0.3", "nginx"),
    "static1": ("127.0.0.4", "nginx"),
    "static2": ("127.0.0.5", "nginx"),
    "cdnjs": ("127.0.0.6", "nginx"),
    "cssimg": ("127.0.0.7", "nginx"),
    "img1": ("127.0.0.8", "nginx"),
    "img2": ("127.0.0.9", "nginx"),
    "img3": ("127.0.0.10", "nginx"),
    "ads1": ("127.0.0.11", "nginx"),
    "ads2": ("127.0.0.12", "nginx"),
    "analytics": ("127.0.0.13", "nginx"),
    "social": ("127.0.0.14", "nginx"),
    "video": ("127.0.0.15", "nginx"),
    "api": ("127.0.0.16", "hypercorn"),  # answers POST /echo/… (nginx would say 405)
    "tiles-a": ("127.0.0.17", "nginx"),
    "tiles-b": ("127.0.0.18", "nginx"),
    "img4": ("127.0.0.19", "nginx"),
}
VARIANTS = ("h1", "h2")
SEED = 4
# Set by news, news-6 and app once their script-driven requests have finished.
DONE_GLOBAL = "__labDone"
# Every file's modification time, so its Last-Modified (2023-11-13): a site published before it
# is loaded, as real ones are, whose files a browser may cache for a while (heuristically, 10% of
# their age: RFC 9111 §4.2.2). Files written just now would be stale within seconds. Fixed, so
# every run serves the same headers.
PUBLISHED = 1_700_000_000 - 86_400

PARALLEL_PAGES = ("large-images", "medium-images", "tiny-css", "css-and-images")
PAGES = (*PARALLEL_PAGES, "news", "app")
GATEWAY_PAGES = ("news-6", "app")
DESCRIPTIONS = {
    "large-images": "4 images of 1.5–5 MB on one host",
    "medium-images": "the same 4 images at 180–800 KB",
    "tiny-css": "4 stylesheets of ~30 bytes on one host",
    "css-and-images": "6 stylesheets of ~30 bytes + 6 images of ~4 KB on one host",
    "news": "~80 resources from 13 hosts; HTML → CSS → font/image, HTML → script → XHR → image",
    "app": "a script making 200 small requests (tiles, XHR GET/POST) in 5 dependent bursts",
    "news-6": "HTML, 2 stylesheets + 3 scripts on a second host, 24 images on four more, then "
    "12 API calls in 3 dependent bursts: 42 requests, 6 origins",
}
_LARGE_BYTES = (1_500_000, 2_600_000, 3_700_000, 5_000_000)
_MEDIUM_BYTES = (180_000, 380_000, 590_000, 800_000)
_BURSTS = (("tiles", 48), ("feed", 20), ("tiles", 48), ("feed", 20), ("tiles", 24))


@dataclass(frozen=True)
class Page:
    """One generated page of one variant: where to load it and what a load must receive."""

    name: str
    variant: str
    url: str
    # Absolute URL -> body size in bytes, for every GET the load must make (the page included).
    sizes: dict[str, int]
    # Requests a load must make that have no file behind them (POSTs to the echo endpoint).
    posts: int = 0
    done_global: str | None = None
    hosts: tuple[str, ...] = field(default_factory=tuple)
    # Host name -> subresources on it (the page itself not counted): the R of the booster rule.
    per_host: dict[str, int] = field(default_factory=dict)

    @property
    def requests(self) -> int:
        return len(self.sizes) + self.posts

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes.values())


class _Writer:
    """Writes one page's files and records their URLs and sizes."""

    def __init__(self, roots: dict[str, Path], bases: dict[str, str], variant: str, page: str):
        self.roots, self.bases = roots, bases
        self.prefix = f"{variant}/{page}"
        self.sizes: dict[str, int] = {}
        self.hosts: list[str] = []
        self.per_host: dict[str, int] = {}

    def url(self, host: str, name: str) -> str:
        return f"{self.bases[host].rstrip('/')}/{self.prefix}/{name}"

    def write(self, host: str, name: str, body: bytes) -> str:
        path = self.roots[host] / self.prefix / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
        os.utime(path, (PUBLISHED, PUBLISHED))
        url = self.url(host, name)
        self.sizes[url] = len(body)
        if host not in self.hosts:
            self.hosts.append(host)
        self.per_host[host] = self.per_host.get(host, 0) + 1
        return url

    def page(self, name: str, variant: str, url: str, **extra: object) -> Page:
        per_host = dict(self.per_host)
        page_host = next(h for h, base in self.bases.items() if url.startswith(base.rstrip("/")))
        per_host[page_host] -= 1  # the page itself is no subresource
        return Page(
            name,
            variant,
            url,
            self.sizes,
            hosts=tuple(self.hosts),
            per_host={host: n for host, n in per_host.items() if n},
            **extra,  # type: ignore[arg-type]
        )


def hosts_for(pages: tuple[str, ...]) -> list[str]:
    """The origin hosts the given pages use, in HOSTS order."""
    used = {"www", "img"} if set(pages) & set(PARALLEL_PAGES) else set()
    if "news" in pages:
        used |= {"www", *_NEWS_HOSTS}
    if "app" in pages:
        used |= {"api", "tiles-a", "tiles-b"}
    if "news-6" in pages:
        used |= {"www", _NEWS6_STATIC, *_NEWS6_IMAGE_HOSTS}
    return [host for host in HOSTS if host in used]


def build_pages(
    roots: dict[str, Path], bases: dict[str, str], variant: str, pages: tuple[str, ...] = PAGES
) -> dict[str, Page]:
    """Writes `pages` of `variant` into the hosts' `roots`; `bases` are the URLs the browser uses
    for each host (the relays in front of the origins)."""
    built: dict[str, Page] = {}
    for name in pages:
        writer = _Writer(roots, bases, variant, name)
        rng = random.Random(f"{SEED}:{name}")
        if name in PARALLEL_PAGES:
            built[name] = writer.page(name, variant, _parallel_page(writer, name, rng))
        elif name == "news":
            url = _news_page(writer, rng)
            built[name] = writer.page(name, variant, url, done_global=DONE_GLOBAL)
        elif name == "news-6":
            url = _news6_page(writer, rng)
            built[name] = writer.page(name, variant, url, done_global=DONE_GLOBAL)
        elif name == "app":
            url, posts = _app_page(writer, rng)
            built[name] = writer.page(name, variant, url, posts=posts, done_global=DONE_GLOBAL)
        else:
            raise ValueError(f"unknown page {name!r}; pages: {', '.join(PAGES)}")
    return built


# --- the four parallel-connection pages -------------------------------------------------------


def _parallel_page(writer: _Writer, name: str, rng: random.Random) -> str:
    stylesheets: list[str] = []
    images: list[str] = []
    if name in ("large-images", "medium-images"):
        # The same four pictures at two sizes: one seed for the pixels of both pages.
        pixels = random.Random(f"{SEED}:pictures")
        sizes = _LARGE_BYTES if name == "large-images" else _MEDIUM_BYTES
        for index, size in enumerate(sizes):
            images.append(writer.write("img", f"picture-{index}.png", _png_of(size, pixels)))
    elif name == "tiny-css":
        stylesheets = [writer.write("img", f"s{i}.css", _tiny_css(i, rng)) for i in range(4)]
    else:
        stylesheets = [writer.write("img", f"s{i}.css", _tiny_css(i, rng)) for i in range(6)]
        images = [writer.write("img", f"i{i}.png", _png_of(4_000, rng)) for i in range(6)]
    lines = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>reshape lab: {name}</title>",
        '<link rel="icon" href="data:,">',
        *(f'<link rel="stylesheet" href="{url}">' for url in stylesheets),
        "</head><body>",
        f"<h1>{name}</h1>",
        f"<p>{_prose(rng, 30)}</p>",
        *(f'<img src="{url}" alt="picture {i}">' for i, url in enumerate(images)),
        "</body></html>",
        "",
    ]
    return writer.write("www", "index.html", "\n".join(lines).encode())


def _tiny_css(index: int, rng: random.Random) -> bytes:
    return f".c{index} {{ color: #{rng.randrange(0x1000000):06x}; }}\n".encode()


# --- news -------------------------------------------------------------------------------------

_NEWS_HOSTS = (
    "static1",
    "static2",
    "cdnjs",
    "cssimg",
    "img1",
    "img2",
    "img3",
    "ads1",
    "ads2",
    "analytics",
    "social",
    "video",
)
# Article images in the HTML, per image host.
_NEWS_ARTICLE_IMAGES = {"img1": 12, "img2": 10, "img3": 10, "video": 5, "social": 4, "www": 3}


def _news_page(writer: _Writer, rng: random.Random) -> str:
    # Fonts are fetched in CORS mode, and the origins send no CORS headers: same origin as the page.
    fonts = [
        writer.write("www", f"serif-{i}.woff2", rng.randbytes(_between(rng, 20, 60)))
        for i in range(4)
    ]
    backgrounds = [
        writer.write("cssimg", f"bg-{i}.png", _png_of(_between(rng, 2, 30), rng)) for i in range(3)
    ]
    families = ("LabHeadline", "LabBody", "LabByline", "LabCaption")
    main_css = _css_with(
        rng,
        _between(rng, 30, 50),
        [
            *(_font_face(family, url) for family, url in zip(families[:2], fonts[:2], strict=True)),
            f"h1, h2 {{ font-family: {families[0]}, serif; }}",
            f"p {{ font-family: {families[1]}, serif; }}",
            f'header {{ background: url("{backgrounds[0]}"); min-height: 40px; }}',
            f'footer {{ background: url("{backgrounds[1]}"); min-height: 40px; }}',
        ],
    )
    theme_css = _css_with(
        rng,
        _between(rng, 5, 10),
        [
            *(_font_face(family, url) for family, url in zip(families[2:], fonts[2:], strict=True)),
            f".byline {{ font-family: {families[2]}, sans-serif; }}",
            f"figcaption {{ font-family: {families[3]}, sans-serif; }}",
            f'aside {{ background: url("{backgrounds[2]}"); min-height: 40px; }}',
        ],
    )
    stylesheets = [
        writer.write("static1", "main.css", main_css),
        writer.write("static1", "grid.css", _css_with(rng, _between(rng, 8, 15), [])),
        writer.write("static2", "theme.css", theme_css),
    ]
    head_scripts = [
        writer.write("cdnjs", "lib.js", _js_with(rng, _between(rng, 70, 90), "")),
        writer.write("static1", "app.js", _js_with(rng, _between(rng, 60, 90), "")),
    ]
    deferred = [
        writer.write("static1", "vendor.js", _js_with(rng, _between(rng, 100, 150), "")),
        writer.write("static2", "widgets.js", _js_with(rng, _between(rng, 30, 40), "")),
    ]
    # HTML → script → XHR → images: the script fetches a JSON list (same origin as the page, so
    # no CORS) and inserts its images; the page is done when they have loaded.
    late_images = [
        writer.write(host, f"late-{i}.png", _png_of(_between(rng, 8, 60), rng))
        for i, host in enumerate(("img2", "img3") * 3)
    ]
    feed = writer.write("www", "news.json", json.dumps({"images": late_images}).encode())
    news_js = writer.write(
        "static2", "news.js", _js_with(rng, _between(rng, 15, 25), _news_script(feed))
    )
    deferred.append(news_js)
    async_scripts = [writer.write("cdnjs", "polyfill.js", _js_with(rng, _between(rng, 20, 35), ""))]
    # Third parties: each async script inserts its own images (pixels, ads, avatars).
    for host, count, low, high in (
        ("ads1", 4, 1, 25),
        ("ads2", 3, 1, 20),
        ("analytics", 1, 1, 1),
        ("social", 2, 2, 6),
    ):
        inserted = [
            writer.write(host, f"{host}-{i}.png", _png_of(_between(rng, low, high), rng))
            for i in range(count)
        ]
        async_scripts.append(
            writer.write(
                host, f"{host}.js", _js_with(rng, _between(rng, 20, 50), _insert_images(inserted))
            )
        )
    article_images = [
        writer.write(host, f"photo-{i}.png", _png_of(_between(rng, 5, 120), rng))
        for host, count in _NEWS_ARTICLE_IMAGES.items()
        for i in range(count)
    ]
    rng.shuffle(article_images)
    body: list[str] = ["<header><h1>Lab News</h1></header>", "<main>"]
    for index, url in enumerate(article_images):
        body += [
            "<article>",
            f"<h2>{_prose(rng, 6)}</h2>",
            f'<p class="byline">{_prose(rng, 4)}</p>',
            f'<figure><img src="{url}" alt="photo {index}"><figcaption>{_prose(rng, 8)}'
            "</figcaption></figure>",
            f"<p>{_prose(rng, 90)}</p>",
            "</article>",
        ]
    body += ['</main><aside id="late"></aside><footer>Lab News</footer>']
    lines = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        "<title>reshape lab: news</title>",
        '<link rel="icon" href="data:,">',
        *(f'<link rel="stylesheet" href="{url}">' for url in stylesheets),
        *(f'<script src="{url}"></script>' for url in head_scripts),
        *(f'<script src="{url}" defer></script>' for url in deferred),
        *(f'<script src="{url}" async></script>' for url in async_scripts),
        "</head><body>",
        *body,
        "</body></html>",
        "",
    ]
    return writer.write("www", "index.html", "\n".join(lines).encode())


def _news_script(feed: str) -> str:
    return f"""
(function () {{
  var started = false;
  function fail(why) {{ window.{DONE_GLOBAL} = 'news: ' + why; }}
  fetch({json.dumps(feed)}).then(function (response) {{
    if (!response.ok) throw new Error('feed answered ' + response.status);
    return response.json();
  }}).then(function (feed) {{
    var aside = document.getElementById('late');
    return Promise.all(feed.images.map(function (url) {{
      return new Promise(function (resolve, reject) {{
        var img = document.createElement('img');
        img.onload = resolve;
        img.onerror = function () {{ reject(new Error('image failed: ' + url)); }};
        img.src = url;
        aside.appendChild(img);
      }});
    }}));
  }}).then(function () {{ window.{DONE_GLOBAL} = performance.now(); }}, function (e) {{
    fail(String(e));
  }});
}})();
"""


def _insert_images(urls: list[str]) -> str:
    return f"""
(function () {{
  {json.dumps(urls)}.forEach(function (url) {{
    var img = document.createElement('img');
    img.src = url;
    img.width = 1;
    img.height = 1;
    document.body.appendChild(img);
  }});
}})();
"""


def _font_face(family: str, url: str) -> str:
    return f'@font-face {{ font-family: {family}; src: url("{url}") format("woff2"); }}'


# --- news-6 -----------------------------------------------------------------------------------

_NEWS6_STATIC = "static1"
_NEWS6_IMAGE_HOSTS = ("img1", "img2", "img3", "img4")
_NEWS6_IMAGES_PER_HOST = 6
_NEWS6_BURSTS = 3
_NEWS6_CALLS_PER_BURST = 4


def _news6_page(writer: _Writer, rng: random.Random) -> str:
    stylesheets = [
        writer.write(_NEWS6_STATIC, "main.css", _css_with(rng, _between(rng, 20, 40), [])),
        writer.write(_NEWS6_STATIC, "theme.css", _css_with(rng, _between(rng, 5, 10), [])),
    ]
    # API calls go to the page's own origin (root-relative URLs: no CORS), as a site's own API.
    bursts = [
        [
            writer.write("www", f"api/b{burst}-{call}.json", _feed_item(call, rng))
            for call in range(_NEWS6_CALLS_PER_BURST)
        ]
        for burst in range(_NEWS6_BURSTS)
    ]
    paths = [[url[url.index("/", len("https://")) :] for url in burst] for burst in bursts]
    head_script = writer.write(_NEWS6_STATIC, "lib.js", _js_with(rng, _between(rng, 60, 90), ""))
    deferred = [
        writer.write(_NEWS6_STATIC, "app.js", _js_with(rng, _between(rng, 30, 50), "")),
        writer.write(
            _NEWS6_STATIC, "feed.js", _js_with(rng, _between(rng, 5, 10), _news6_script(paths))
        ),
    ]
    images = [
        writer.write(host, f"photo-{i}.png", _png_of(_between(rng, 5, 60), rng))
        for host in _NEWS6_IMAGE_HOSTS
        for i in range(_NEWS6_IMAGES_PER_HOST)
    ]
    rng.shuffle(images)
    body = ["<header><h1>Lab News</h1></header>", "<main>"]
    for index, url in enumerate(images):
        body += [
            "<article>",
            f"<h2>{_prose(rng, 6)}</h2>",
            f'<figure><img src="{url}" alt="photo {index}"><figcaption>{_prose(rng, 8)}'
            "</figcaption></figure>",
            f"<p>{_prose(rng, 60)}</p>",
            "</article>",
        ]
    body += ['</main><ol id="feed"></ol><footer>Lab News</footer>']
    lines = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        "<title>reshape lab: news-6</title>",
        '<link rel="icon" href="data:,">',
        *(f'<link rel="stylesheet" href="{url}">' for url in stylesheets),
        f'<script src="{head_script}"></script>',
        *(f'<script src="{url}" defer></script>' for url in deferred),
        "</head><body>",
        *body,
        "</body></html>",
        "",
    ]
    return writer.write("www", "index.html", "\n".join(lines).encode())


def _news6_script(bursts: list[list[str]]) -> str:
    """Fetches each burst's JSON documents at once, a burst after the previous one answered."""
    return f"""
(function () {{
  var bursts = {json.dumps(bursts)};
  function call(url) {{
    return fetch(url).then(function (response) {{
      if (!response.ok) throw new Error(url + ' answered ' + response.status);
      return response.json();
    }}).then(function (item) {{
      var li = document.createElement('li');
      li.textContent = item.title;
      document.getElementById('feed').appendChild(li);
    }});
  }}
  bursts.reduce(function (previous, burst) {{
    return previous.then(function () {{ return Promise.all(burst.map(call)); }});
  }}, Promise.resolve()).then(function () {{
    window.{DONE_GLOBAL} = performance.now();
  }}, function (e) {{ window.{DONE_GLOBAL} = 'news-6: ' + e; }});
}})();
"""


# --- app --------------------------------------------------------------------------------------


def _app_page(writer: _Writer, rng: random.Random) -> tuple[str, int]:
    tile_count = sum(n for kind, n in _BURSTS if kind == "tiles")
    tiles = [
        writer.write(
            ("tiles-a", "tiles-b")[i % 2], f"tile-{i:03d}.png", _png_of(_between(rng, 2, 8), rng)
        )
        for i in range(tile_count)
    ]
    feed_count = sum(n for kind, n in _BURSTS if kind == "feed")
    feeds = [
        writer.write("api", f"feed-{i:03d}.json", _feed_item(i, rng)) for i in range(feed_count)
    ]
    bursts: list[dict[str, object]] = []
    tile_at = feed_at = posts_total = 0
    for kind, count in _BURSTS:
        if kind == "tiles":
            bursts.append({"tiles": tiles[tile_at : tile_at + count]})
            tile_at += count
        else:
            # Root-relative: the feed is the page's own origin, so XHR needs no CORS.
            gets = [
                url[url.index("/", len("https://")) :] for url in feeds[feed_at : feed_at + count]
            ]
            posts = [
                {
                    "url": f"/echo/{writer.prefix}/event-{feed_at + i:03d}",
                    "size": _between(rng, 0.2, 0.6),
                }
                for i in range(count)
            ]
            bursts.append({"gets": gets, "posts": posts})
            feed_at += count
            posts_total += len(posts)
    script = writer.write(
        "api", "app.js", _js_with(rng, _between(rng, 40, 60), _app_script(bursts))
    )
    style = writer.write("api", "app.css", _css_with(rng, _between(rng, 3, 6), []))
    lines = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        "<title>reshape lab: app</title>",
        '<link rel="icon" href="data:,">',
        f'<link rel="stylesheet" href="{style}">',
        f'<script src="{script}" defer></script>',
        "</head><body>",
        '<h1>Lab map</h1><div id="map"></div><ol id="feed"></ol>',
        "</body></html>",
        "",
    ]
    return writer.write("api", "index.html", "\n".join(lines).encode()), posts_total


def _app_script(bursts: list[dict[str, object]]) -> str:
    return f"""
(function () {{
  var bursts = {json.dumps(bursts)};
  function tile(url) {{
    return new Promise(function (resolve, reject) {{
      var img = new Image();
      img.onload = resolve;
      img.onerror = function () {{ reject(new Error('tile failed: ' + url)); }};
      img.src = url;
      document.getElementById('map').appendChild(img);
    }});
  }}
  function xhr(method, url, body) {{
    return new Promise(function (resolve, reject) {{
      var request = new XMLHttpRequest();
      request.open(method, url);
      request.onload = function () {{
        if (request.status !== 200) reject(new Error(method + ' ' + url + ': ' + request.status));
        else if (body !== null && request.responseText !== body) {{
          reject(new Error('POST ' + url + ': echo differs'));
        }} else resolve(request.responseText);
      }};
      request.onerror = function () {{
        reject(new Error(method + ' ' + url + ': network error'));
      }};
      if (body === null) request.send();
      else {{
        request.setRequestHeader('Content-Type', 'application/json');
        request.send(body);
      }}
    }});
  }}
  function event(post) {{
    var body = JSON.stringify({{event: post.url, pad: 'x'.repeat(post.size)}});
    return xhr('POST', post.url, body);
  }}
  function run(burst) {{
    if (burst.tiles) return Promise.all(burst.tiles.map(tile));
    return Promise.all(burst.gets.map(function (url) {{ return xhr('GET', url, null); }})
      .concat(burst.posts.map(event)));
  }}
  bursts.reduce(function (previous, burst) {{
    return previous.then(function () {{ return run(burst); }});
  }}, Promise.resolve()).then(function () {{
    window.{DONE_GLOBAL} = performance.now();
  }}, function (e) {{ window.{DONE_GLOBAL} = 'app: ' + e; }});
}})();
"""


def _feed_item(index: int, rng: random.Random) -> bytes:
    item = {"id": index, "title": _prose(rng, 8), "text": _prose(rng, _between(rng, 0.1, 0.4))}
    return json.dumps(item).encode()


# --- phases -----------------------------------------------------------------------------------

PHASES: dict[str, tuple[str, ...]] = {
    "news-6": ("css+js", "images", *(f"API {n + 1}" for n in range(_NEWS6_BURSTS))),
    "app": (
        "css+js",
        *(
            f"{kind} {sum(1 for k, _ in _BURSTS[: i + 1] if k == kind)}"
            for i, (kind, _) in enumerate(_BURSTS)
        ),
    ),
}
_NUMBERED = re.compile(r"/(tile|feed|event)-(\d+)(?:\.|$)")
_NEWS6_CALL = re.compile(r"/api/b(\d+)-\d+\.json$")


def phase_of(page: str, url: str) -> str | None:
    """Which of `PHASES[page]` a subresource of `page` belongs to (None: none, or no phases)."""
    if page == "news-6":
        if (call := _NEWS6_CALL.search(url)) is not None:
            return f"API {int(call[1]) + 1}"
        return "images" if url.endswith(".png") else "css+js"
    if page == "app":
        numbered = _NUMBERED.search(url)
        if numbered is None:
            return "css+js" if url.endswith((".css", ".js")) else None
        kind = "tiles" if numbered[1] == "tile" else "feed"
        index = int(numbered[2])
        seen = 0
        for burst, (burst_kind, count) in enumerate(_BURSTS):
            if burst_kind == kind:
                if index < seen + count:
                    return PHASES["app"][burst + 1]
                seen += count
    return None


# --- content ----------------------------------------------------------------------------------


def _between(rng: random.Random, low_k: float, high_k: float) -> int:
    """A size (or count) log-uniform between low_k and high_k thousands."""
    low, high = low_k * 1000, high_k * 1000
    return round(math.exp(rng.uniform(math.log(low), math.log(high))))


def _png_of(size: int, rng: random.Random) -> bytes:
    """A random-pixel PNG of about `size` bytes (random pixels do not compress)."""
    side = max(1, math.isqrt(size // 3))
    return png(side, side, rng)


def _css_with(rng: random.Random, size: int, rules: list[str]) -> bytes:
    lines = ["/* reshape lab stylesheet */", *rules]
    length = sum(len(line) + 1 for line in lines)
    rule = 0
    while length < size:
        text = (
            f".x{rule} {{ color: #{rng.randrange(0x1000000):06x}; "
            f"margin: {rng.randrange(20)}px {rng.randrange(20)}px; }}"
        )
        lines.append(text)
        length += len(text) + 1
        rule += 1
    return ("\n".join(lines) + "\n").encode()


def _js_with(rng: random.Random, size: int, code: str) -> bytes:
    lines = ["// reshape lab script", code.strip(), "var __labFiller = ["]
    length = sum(len(line) + 1 for line in lines)
    while length < size:
        row = "  " + ", ".join(str(rng.randrange(1_000_000)) for _ in range(12)) + ","
        lines.append(row)
        length += len(row) + 1
    lines.append("];")
    return ("\n".join(lines) + "\n").encode()


def _prose(rng: random.Random, words: int) -> str:
    vocabulary = ("origin", "proxy", "stream", "byte", "cache", "page", "frame", "socket", "load")
    return " ".join(rng.choice(vocabulary) for _ in range(words)).capitalize() + "."
