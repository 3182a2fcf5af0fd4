"""reshape/features/preconnect/addon.py: a merge in progress when the proxy stops runs to its
end, so that nothing learned before the stop is lost or undone by its late write."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from reshape.features.pool.addon import PoolRouting
from reshape.features.preconnect import addon as preconnect_addon
from reshape.features.preconnect.addon import Preconnect
from reshape.features.preconnect.navigations import NavigationOutcome, OriginUse
from reshape.features.preconnect.store import FILE_NAME, TableStore
from reshape.policy.loader import parse_policy_text
from reshape.policy.reload import PolicyHolder
from reshape.upstream.engine import Engine

POLICY = """
version: 1
default: learned
policies:
  learned:
    preconnect: {mode: learned}
"""


def _outcome(first_party: str, origin: str) -> NavigationOutcome:
    return NavigationOutcome(first_party, {origin: OriginUse(3, 2)}, ended_at=1_000.0)


async def _stop_during_a_merge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, merge_fails: bool
) -> Preconnect:
    """The proxy stops while the upkeep's merge of a's load runs in its thread (and then fails,
    with `merge_fails`); b's load is learned during that merge. Returns the stopped addon."""
    monkeypatch.setattr(preconnect_addon, "EXPIRE_SECONDS", 0.01)
    monkeypatch.setattr(preconnect_addon, "MERGE_SECONDS", 0.0)
    holder = PolicyHolder(None, parse_policy_text(POLICY, tmp_path / "policy.yaml"))
    addon = Preconnect(Engine(None), holder, PoolRouting(), tmp_path)
    started, release = threading.Event(), threading.Event()
    original = addon._merge_batch

    def slow_merge(batch: list[Any]) -> Any:
        if not started.is_set():  # the upkeep's merge, in its thread: slow when the stop comes
            started.set()
            assert release.wait(10)
            if merge_fails:
                raise RuntimeError("a bug in the merge")
        return original(batch)

    monkeypatch.setattr(addon, "_merge_batch", slow_merge)
    addon._learn([_outcome("https://a.example", "https://cdn.a.example")])
    addon.running()
    assert await asyncio.to_thread(started.wait, 10)
    addon._learn([_outcome("https://b.example", "https://cdn.b.example")])  # during the merge
    stopping = asyncio.create_task(addon.done())
    await asyncio.sleep(0.05)
    release.set()
    await asyncio.wait_for(stopping, 10)  # no exception out of done()
    return addon


async def test_a_merge_cut_off_by_the_stop_is_finished_and_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    addon = await _stop_during_a_merge(tmp_path, monkeypatch, merge_fails=False)
    # Everything learned before the stop is written when it has stopped: the merge cut off
    # (a's load) too, before the last one (b's), in the order they were learned.
    table = TableStore(tmp_path / FILE_NAME).load()
    assert set(table.origins("https://a.example")) == {"https://cdn.a.example"}
    assert set(table.origins("https://b.example")) == {"https://cdn.b.example"}
    assert set(addon.table.origins("https://a.example")) == {"https://cdn.a.example"}


async def test_a_merge_failing_at_the_stop_leaves_the_last_merge_to_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    await _stop_during_a_merge(tmp_path, monkeypatch, merge_fails=True)
    table = TableStore(tmp_path / FILE_NAME).load()
    assert set(table.origins("https://b.example")) == {"https://cdn.b.example"}
    assert "the merge running at the stop failed" in caplog.text
