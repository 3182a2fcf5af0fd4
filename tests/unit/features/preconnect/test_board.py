"""NavigationBoard: navigations announced between the workers of one proxy, in files."""

from __future__ import annotations

import os
import time
from pathlib import Path

from reshape.features.preconnect.board import NavigationBoard

F = "https://news.test:443"


def test_an_announcement_is_read_back_by_another_board_on_the_directory(tmp_path: Path) -> None:
    NavigationBoard(tmp_path / "board").publish("10.0.0.1", F, 123.5)
    other = NavigationBoard(tmp_path / "board")
    assert other.lookup("10.0.0.1") == (F, 123.5)
    assert other.lookup("10.0.0.2") is None


def test_the_latest_announcement_wins(tmp_path: Path) -> None:
    board = NavigationBoard(tmp_path)
    board.publish("c", F, 1.0)
    board.publish("c", "https://other.test:443", 2.0)
    assert board.lookup("c") == ("https://other.test:443", 2.0)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_corrupt_announcement_is_no_announcement(tmp_path: Path) -> None:
    board = NavigationBoard(tmp_path)
    board.publish("c", F, 1.0)
    [path] = tmp_path.iterdir()
    path.write_text("{broken")
    assert board.lookup("c") is None


def test_sweep_removes_old_announcements(tmp_path: Path) -> None:
    board = NavigationBoard(tmp_path)
    board.publish("old", F, 1.0)
    board.publish("new", F, 2.0)
    [old] = [
        p for p in tmp_path.iterdir() if board.lookup("old") and p.read_text().find('"old"') > 0
    ]
    past = time.time() - 100
    os.utime(old, (past, past))
    board.sweep(50)
    assert board.lookup("old") is None
    assert board.lookup("new") == (F, 2.0)


def test_an_unwritable_directory_is_a_warning_not_an_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    NavigationBoard(blocker / "board").publish("c", F, 1.0)  # no exception
    assert NavigationBoard(blocker / "board").lookup("c") is None
