"""A generated page of many small resources, for load tests that fetch it again and again.

Unlike labkit's multi-origin sites (up to 200 KB images), these are the small stylesheets,
scripts and icons of a busy page: what costs an origin and a proxy per request, not per byte.
Every byte follows from the seed. The page names its resources by root-relative URLs, so the
same files serve whatever host and port the origin (or a relay in front of it) has.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

from labkit.sites import png, render_page

# Subresource kinds, weighted like a page of its time: images outnumber stylesheets and scripts.
_KIND_WEIGHTS = {"css": 1, "js": 2, "png": 4}
_TEXT_SIZES = (500, 30_000)  # bytes, log-uniform
_PNG_SIZES = (300, 20_000)


@dataclass(frozen=True)
class Page:
    """A generated page: its path and the size of every file a load fetches (page included)."""

    path: str  # root-relative, e.g. /s1/index.html
    sizes: dict[str, int]  # root-relative path -> bytes

    @property
    def requests(self) -> int:
        return len(self.sizes)

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes.values())


def build_page(root: Path, *, resources: int = 140, seed: int = 1) -> Page:
    """Writes the page and its `resources` subresources under `root`/s<seed>/."""
    if resources < len(_KIND_WEIGHTS):
        raise ValueError(f"a page needs at least {len(_KIND_WEIGHTS)} resources, not {resources}")
    rng = random.Random(seed)
    kinds = list(_KIND_WEIGHTS) + rng.choices(
        list(_KIND_WEIGHTS), weights=list(_KIND_WEIGHTS.values()), k=resources - len(_KIND_WEIGHTS)
    )
    rng.shuffle(kinds)
    directory = f"s{seed}"
    sizes: dict[str, int] = {}
    references: list[tuple[str, str]] = []
    for index, kind in enumerate(kinds):
        path = f"/{directory}/r{index:03d}.{kind}"
        body = _generate(kind, index, rng)
        _write(root, path, body)
        sizes[path] = len(body)
        references.append((kind, path))
    page_path = f"/{directory}/index.html"
    html = render_page(references, seed, rng).encode()
    _write(root, page_path, html)
    return Page(page_path, {page_path: len(html), **sizes})


def _generate(kind: str, index: int, rng: random.Random) -> bytes:
    if kind == "png":
        side = max(1, math.isqrt(_log_uniform(rng, *_PNG_SIZES) // 3))
        return png(side, side, rng)
    size = _log_uniform(rng, *_TEXT_SIZES)
    if kind == "css":
        line = f".c{index} {{ color: #{rng.randrange(0x1000000):06x}; }}\n"
    else:
        line = f"window.__lab{index} = {rng.randrange(1_000_000)};\n"
    return (f"/* lab {kind} {index} */\n" + line * (1 + size // len(line))).encode()[:size]


def _log_uniform(rng: random.Random, low: int, high: int) -> int:
    return round(math.exp(rng.uniform(math.log(low), math.log(high))))


def _write(root: Path, path: str, body: bytes) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(body)
