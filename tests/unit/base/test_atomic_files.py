"""reshape/base/atomic_files.py: a file appears whole with its mode, or not at all."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from reshape.base import atomic_files
from reshape.base.atomic_files import write_atomically


def test_the_file_has_its_mode_before_it_appears(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[int, bytes]] = []
    rename = os.replace

    def replace(source: str, target: Path) -> None:
        seen.append((stat.S_IMODE(os.stat(source).st_mode), Path(source).read_bytes()))
        assert Path(source).parent == target.parent  # one file system: rename is atomic
        rename(source, target)

    monkeypatch.setattr(atomic_files.os, "replace", replace)
    target = tmp_path / "key.pem"
    target.write_bytes(b"old")
    write_atomically(target, b"new secret", mode=0o600)
    assert seen == [(0o600, b"new secret")]
    assert target.read_bytes() == b"new secret"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["key.pem"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic_files.os, "fsync", fail)
    target = tmp_path / "upstream-trust.pem"
    target.write_bytes(b"old bundle")
    with pytest.raises(OSError):
        write_atomically(target, b"new bundle")
    assert target.read_bytes() == b"old bundle"
    assert [p.name for p in tmp_path.iterdir()] == ["upstream-trust.pem"]


def test_default_mode_is_world_readable(tmp_path: Path) -> None:
    write_atomically(tmp_path / "ca-cert.pem", b"cert")
    assert stat.S_IMODE((tmp_path / "ca-cert.pem").stat().st_mode) == 0o644
