"""TableStore: the learned table in a file, merged and read back. By several processes at once:
tests/system/features/preconnect/test_store.py."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from reshape.features.preconnect.assembly import Learned
from reshape.features.preconnect.navigations import NavigationOutcome, OriginUse
from reshape.features.preconnect.store import TableStore

F = "https://news.test:443"
CDN = "https://cdn.test:443"


def learned(at: float, *origins: str) -> Learned:
    return Learned(NavigationOutcome(F, {o: OriginUse(2, 1) for o in origins}, at), 3)


def test_a_missing_file_is_an_empty_table(tmp_path: Path) -> None:
    assert len(TableStore(tmp_path / "preconnect.json").load()) == 0


def test_what_is_merged_is_there_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "preconnect.json"
    TableStore(path).merge([learned(0.0, CDN)])
    table = TableStore(path).load()
    assert table.origins(F)[CDN].hits == 1
    assert json.loads(path.read_text())["version"] == 1
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left


@pytest.mark.parametrize(
    "content", [b"{not json", b'{"version": 7}', b"\xff\xfe", b"[" * 100_000, b""]
)
def test_a_corrupt_file_means_an_empty_table_and_a_warning(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "preconnect.json"
    path.write_bytes(content)
    store = TableStore(path)
    with caplog.at_level(logging.WARNING, logger="reshape.preconnect"):
        assert len(store.load()) == 0
    assert "starting empty" in caplog.text
    # The next merge replaces it with a good file.
    store.merge([learned(0.0, CDN)])
    assert CDN in TableStore(path).load().origins(F)


def test_an_unwritable_confdir_raises_oserror(tmp_path: Path) -> None:
    store = TableStore(tmp_path / "missing-dir" / "preconnect.json")
    with pytest.raises(OSError):
        store.merge([learned(0.0, CDN)])


def part(client: str, started: float, document: bool, **origins: int) -> Learned:
    uses = {f"https://{name}.test:443": OriginUse(n, 1) for name, n in origins.items()}
    return Learned(NavigationOutcome(F, uses, started + 1, client, started, document), 3)


def test_parts_wait_in_the_file_until_settled_then_are_learned_once(tmp_path: Path) -> None:
    path = tmp_path / "preconnect.json"
    first, second = TableStore(path), TableStore(path)  # two workers
    first.merge([], [part("c", 100.0, True, cdn=2)], now=101.0, settle_after=30.0)
    table = second.merge([], [part("c", 100.0, False, img=3)], now=110.0, settle_after=30.0)
    assert len(table) == 0  # not settled yet: more parts may come
    assert len(json.loads(path.read_text())["parts"]) == 2
    table = first.merge([], now=130.0, settle_after=30.0)
    stats = table.origins(F)
    assert set(stats) == {"https://cdn.test:443", "https://img.test:443"}
    assert stats["https://img.test:443"].hits == 1
    assert json.loads(path.read_text())["parts"] == []
    assert second.merge([], now=200.0, settle_after=30.0).origins(F) == stats  # learned once
