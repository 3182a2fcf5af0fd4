from __future__ import annotations

import hashlib
import random
import struct
import zlib
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from labkit.sites import Site, build_multi_origin_site, png

BASE_URLS = {
    "main": "https://127.0.0.2:8443",
    "static": "https://127.0.0.3:8443/",
    "cdn": "http://127.0.0.4:8080",
}


def _build(directory: Path, **options: int) -> tuple[Site, dict[str, Path]]:
    roots = {name: directory / name for name in BASE_URLS}
    return build_multi_origin_site(roots, BASE_URLS, **options), roots


def _file_for(url: str, roots: dict[str, Path]) -> Path:
    for name, base in BASE_URLS.items():
        if url.startswith(base.rstrip("/") + "/"):
            return roots[name] / url[len(base.rstrip("/")) + 1 :]
    raise AssertionError(f"{url} is on no origin")


def test_same_seed_gives_same_bytes(tmp_path: Path) -> None:
    first, _ = _build(tmp_path / "a", seed=5)
    second, _ = _build(tmp_path / "b", seed=5)
    other, _ = _build(tmp_path / "c", seed=6)
    assert first == second
    assert set(first.resources.values()) != set(other.resources.values())


def test_manifest_hashes_what_is_on_disk(tmp_path: Path) -> None:
    site, roots = _build(tmp_path)
    for url, digest in site.resources.items():
        assert hashlib.sha256(_file_for(url, roots).read_bytes()).hexdigest() == digest


def test_default_site_spans_origins_and_kinds(tmp_path: Path) -> None:
    site, roots = _build(tmp_path)
    hosts = {urlsplit(url).netloc for url in site.resources}
    suffixes = {Path(urlsplit(url).path).suffix for url in site.resources}
    sizes = [_file_for(url, roots).stat().st_size for url in site.resources if url.endswith(".png")]
    assert len(site.resources) >= 31  # the page and at least 30 subresources
    assert len(hosts) >= 3
    assert suffixes == {".html", ".css", ".js", ".png"}
    assert site.page_url.startswith(BASE_URLS["main"])
    assert min(sizes) < 10_000 and max(sizes) > 50_000


def test_page_references_every_subresource(tmp_path: Path) -> None:
    site, roots = _build(tmp_path, resources=12, seed=3)
    page = _file_for(site.page_url, roots).read_text()
    for url in site.resources:
        if url != site.page_url:
            assert f'"{url}"' in page
    assert len(site.resources) == 13


def test_png_is_well_formed() -> None:
    image = png(20, 10, random.Random(1))
    assert image.startswith(b"\x89PNG\r\n\x1a\n")
    width, height = struct.unpack(">II", image[16:24])
    idat_length = struct.unpack(">I", image[33:37])[0]
    pixels = zlib.decompress(image[41 : 41 + idat_length])
    assert (width, height) == (20, 10)
    assert len(pixels) == 10 * (1 + 20 * 3)
    assert image.endswith(b"IEND\xaeB`\x82")


@pytest.mark.parametrize(
    ("roots", "urls"),
    [({}, {}), ({"main": Path("/x")}, {"other": "http://127.0.0.2"})],
)
def test_origin_names_must_match(roots: dict[str, Path], urls: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="origin names"):
        build_multi_origin_site(roots, urls)
