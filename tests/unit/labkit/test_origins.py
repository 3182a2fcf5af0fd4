from __future__ import annotations

import random
from pathlib import Path

import pytest

from labkit.origins import nginx_config, nginx_origin
from labkit.static_app import StaticFiles

BLOB = random.Random(7).randbytes(300_000)


def write_root(directory: Path) -> Path:
    """`directory` with the files the origins serve in these tests."""
    (directory / "blob.bin").write_bytes(BLOB)
    (directory / "style.css").write_text("body { color: red }\n")
    (directory / "sub").mkdir()
    (directory / "sub" / "index.html").write_text("<!doctype html><title>sub</title>\n")
    return directory


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_root(tmp_path_factory.mktemp("root"))


def test_nginx_http2_without_tls_is_refused(root: Path) -> None:
    with pytest.raises(ValueError, match="needs tls"), nginx_origin(root, http2=True):
        pass


def test_nginx_config_disables_compression_and_sets_types(root: Path, tmp_path: Path) -> None:
    config = nginx_config(root, "127.0.0.2", 8443, None, False, tmp_path)
    assert "gzip off;" in config
    assert "listen 127.0.0.2:8443;" in config
    assert "text/javascript js mjs;" in config


@pytest.mark.parametrize("url_path", ["/../secret.txt", "/sub/../../secret.txt", "/nope"])
def test_static_files_resolves_nothing_outside_root(tmp_path: Path, url_path: str) -> None:
    (tmp_path / "secret.txt").write_text("secret")
    (tmp_path / "site").mkdir()
    assert StaticFiles(tmp_path / "site").resolve(url_path) is None


def test_static_files_maps_directories_to_index(root: Path) -> None:
    assert StaticFiles(root).resolve("/sub/") == (root / "sub" / "index.html").resolve()
