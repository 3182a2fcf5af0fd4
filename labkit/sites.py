"""Deterministic generated web sites spread over several origins.

A site is one HTML page plus stylesheets, scripts and PNG images written into the origins' document
roots. Every byte follows from the seed, and the returned manifest maps each URL to the sha256 of
what the origin serves, so a page load through the proxy can be checked byte for byte.
"""

from __future__ import annotations

import hashlib
import math
import random
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

# Subresource kinds, weighted like a typical page: images outnumber stylesheets and scripts.
_KIND_WEIGHTS = {"css": 1, "js": 1, "png": 2}
_TEXT_SIZE_RANGE = (1_000, 60_000)
_PNG_SIZE_RANGE = (1_000, 200_000)


@dataclass(frozen=True)
class Site:
    """A generated site: the page to load and what every URL of it must contain."""

    page_url: str
    # Absolute URL -> sha256 hex of the bytes the origin serves; includes the page itself.
    resources: dict[str, str]


def build_multi_origin_site(
    roots: dict[str, Path],
    base_urls: dict[str, str],
    *,
    resources: int = 36,
    seed: int = 1,
) -> Site:
    """Writes a site into `roots` and returns its manifest.

    `roots` and `base_urls` are keyed by origin name; the page lives on the first origin and its
    `resources` subresources are dealt round-robin over all origins. Files go under `s<seed>/` in
    each root, so sites with different seeds can share roots.
    """
    names = list(roots)
    if not names or set(names) != set(base_urls):
        raise ValueError(
            f"roots and base_urls need the same origin names: {names} vs {list(base_urls)}"
        )
    if resources < len(_KIND_WEIGHTS):
        raise ValueError(
            f"a site needs at least {len(_KIND_WEIGHTS)} subresources, not {resources}"
        )
    rng = random.Random(seed)
    directory = f"s{seed}"
    kinds = list(_KIND_WEIGHTS) + rng.choices(
        list(_KIND_WEIGHTS), weights=list(_KIND_WEIGHTS.values()), k=resources - len(_KIND_WEIGHTS)
    )
    rng.shuffle(kinds)

    manifest: dict[str, str] = {}
    references: list[tuple[str, str]] = []
    for index, kind in enumerate(kinds):
        name = names[index % len(names)]
        relative = f"{directory}/{name}-{index:03d}.{kind}"
        body = _generate(kind, index, rng)
        url = _write(roots[name], base_urls[name], relative, body)
        manifest[url] = hashlib.sha256(body).hexdigest()
        references.append((kind, url))

    page = render_page(references, seed, rng).encode()
    page_url = _write(roots[names[0]], base_urls[names[0]], f"{directory}/index.html", page)
    return Site(page_url, {page_url: hashlib.sha256(page).hexdigest(), **manifest})


def render_page(references: list[tuple[str, str]], seed: int, rng: random.Random) -> str:
    """The HTML page that makes a browser fetch every (kind, url) in `references`."""
    stylesheets = [url for kind, url in references if kind == "css"]
    scripts = [url for kind, url in references if kind == "js"]
    images = [url for kind, url in references if kind == "png"]
    # The first script blocks the parser like a legacy head script; the rest are deferred.
    head_scripts, deferred = scripts[:1], scripts[1:]
    lines = [
        "<!doctype html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        f"<title>reshape lab site {seed}</title>",
        # Without an explicit icon Chromium asks each page's origin for /favicon.ico.
        '<link rel="icon" href="data:,">',
        *(f'<link rel="stylesheet" href="{url}">' for url in stylesheets),
        *(f'<script src="{url}"></script>' for url in head_scripts),
        *(f'<script src="{url}" defer></script>' for url in deferred),
        "</head>",
        "<body>",
        f"<h1>Lab site {seed}</h1>",
    ]
    for index, url in enumerate(images):
        lines.append(f"<p>{_prose(rng, 40)}</p>")
        lines.append(f'<img src="{url}" alt="image {index}">')
    lines += [f"<p>{_prose(rng, 120)}</p>", "</body>", "</html>", ""]
    return "\n".join(lines)


def png(width: int, height: int, rng: random.Random) -> bytes:
    """A PNG of random RGB pixels, which no compression shrinks, so size tracks width x height."""
    raw = b"".join(b"\x00" + rng.randbytes(width * 3) for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", header)
        + _png_chunk(b"IDAT", _stored_zlib(raw))
        + _png_chunk(b"IEND", b"")
    )


def _generate(kind: str, index: int, rng: random.Random) -> bytes:
    if kind == "png":
        side = max(1, math.isqrt(_log_uniform(rng, *_PNG_SIZE_RANGE) // 3))
        return png(side, side, rng)
    size = _log_uniform(rng, *_TEXT_SIZE_RANGE)
    if kind == "css":
        return _stylesheet(index, size, rng).encode()
    return _script(index, size, rng).encode()


def _stylesheet(index: int, size: int, rng: random.Random) -> str:
    rules = [f"/* lab stylesheet {index} */", f"h1 {{ letter-spacing: {index % 3}px; }}"]
    length = sum(len(rule) + 1 for rule in rules)
    rule = 0
    while length < size:
        text = (
            f".r{index}-{rule} {{ color: #{rng.randrange(0x1000000):06x}; "
            f"margin: {rng.randrange(20)}px {rng.randrange(20)}px; }}"
        )
        rules.append(text)
        length += len(text) + 1
        rule += 1
    return "\n".join(rules) + "\n"


def _script(index: int, size: int, rng: random.Random) -> str:
    opening = [
        f"// lab script {index}",
        "(function () {",
        "  var data = [",
    ]
    closing = [
        "  ];",
        "  var sum = 0;",
        "  for (var i = 0; i < data.length; i++) { sum += data[i]; }",
        f"  window.__labScripts = (window.__labScripts || []).concat([[{index}, sum]]);",
        "})();",
    ]
    rows: list[str] = []
    length = sum(len(line) + 1 for line in opening + closing)
    while length < size:
        row = "    " + ", ".join(str(rng.randrange(1_000_000)) for _ in range(12)) + ","
        rows.append(row)
        length += len(row) + 1
    return "\n".join(opening + rows + closing) + "\n"


def _prose(rng: random.Random, words: int) -> str:
    vocabulary = ("origin", "proxy", "stream", "byte", "cache", "page", "frame", "socket", "load")
    return " ".join(rng.choice(vocabulary) for _ in range(words)).capitalize() + "."


def _log_uniform(rng: random.Random, low: int, high: int) -> int:
    return round(math.exp(rng.uniform(math.log(low), math.log(high))))


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _stored_zlib(data: bytes) -> bytes:
    """A zlib stream of uncompressed deflate blocks.

    zlib.compress output may differ between zlib builds; stored blocks make the bytes (and so the
    manifest hashes) depend on the seed alone. Random pixels would not compress anyway.
    """
    out = bytearray(b"\x78\x01")
    blocks = [data[start : start + 0xFFFF] for start in range(0, len(data), 0xFFFF)] or [b""]
    for number, block in enumerate(blocks):
        final = 1 if number == len(blocks) - 1 else 0
        out += struct.pack("<BHH", final, len(block), len(block) ^ 0xFFFF) + block
    out += struct.pack(">I", zlib.adler32(data))
    return bytes(out)


def _write(root: Path, base_url: str, relative: str, body: bytes) -> str:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(body)
    return f"{base_url.rstrip('/')}/{relative}"
