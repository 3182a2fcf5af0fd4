"""PolicyHolder and change detection, without a proxy: reloads swap the file or keep the old one."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reshape.policy.loader import load_policy_file
from reshape.policy.reload import (
    ChangeDetector,
    FileSignature,
    PolicyHolder,
    file_signature,
    watch_file,
)

VALID_A = "version: 1\ndefault: a\npolicies: {a: {}}\n"
VALID_B = "version: 1\ndefault: b\npolicies: {b: {upstream: {}}}\n"
INVALID = "version: 1\ndefault: a\npolicies: {a: {upstreem: {}}}\n"


def holder_for(tmp_path: Path, text: str) -> PolicyHolder:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return PolicyHolder(path, load_policy_file(path))


def test_a_valid_new_file_replaces_the_policy_and_tells_listeners(tmp_path: Path) -> None:
    holder = holder_for(tmp_path, VALID_A)
    seen = []
    holder.on_change(lambda old, new: seen.append((old.default, new.default)))
    outcomes: list[str] = []
    holder.on_outcome(outcomes.append)
    holder.path.write_text(VALID_B)  # type: ignore[union-attr]
    result = holder.reload("test")
    assert result.ok and holder.current.default == "b" and holder.text == VALID_B
    assert seen == [("a", "b")]
    assert outcomes == ["ok"]  # what telemetry counts (reshape_policy_reloads_total)
    # A request selected under the old file still finds its (now removed) policy.
    assert holder.policy("a") is not None and holder.policy("b") is not None
    assert holder.policy("zz") is None


def test_an_invalid_file_is_refused_and_the_old_policy_stays(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    holder = holder_for(tmp_path, VALID_A)
    old = holder.current
    outcomes: list[str] = []
    holder.on_outcome(outcomes.append)
    holder.path.write_text(INVALID)  # type: ignore[union-attr]
    result = holder.reload("SIGHUP")
    assert not result.ok and "did you mean 'upstream'" in result.message
    assert holder.current is old and holder.generation == 0
    assert outcomes == ["invalid"]
    assert "refused, keeping the previous policy" in caplog.text
    assert "line 3" in caplog.text


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    holder = holder_for(tmp_path, VALID_A)
    holder.path.unlink()  # type: ignore[union-attr]
    result = holder.reload("file changed")
    assert not result.ok and "no such file" in result.message


signatures = st.none() | st.builds(
    FileSignature, st.integers(0, 3), st.integers(0, 3), st.integers(0, 3)
)


@given(st.lists(signatures, max_size=30), signatures)
def test_the_detector_fires_exactly_when_the_signature_differs_from_the_last(
    sequence: list[FileSignature | None], initial: FileSignature | None
) -> None:
    detector = ChangeDetector(initial)
    last = initial
    for signature in sequence:
        assert detector.changed(signature) == (signature != last)
        last = signature


def test_rewrite_in_place_and_replace_by_rename_both_change_the_signature(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(VALID_A)
    first = file_signature(path)
    path.write_text(VALID_A + "# more\n")  # same inode, new size
    second = file_signature(path)
    other = tmp_path / "new.yaml"
    other.write_text(VALID_A + "# more\n")  # same size, new inode
    os.replace(other, path)
    third = file_signature(path)
    assert len({first, second, third}) == 3
    assert file_signature(tmp_path / "absent") is None


def test_the_watcher_calls_back_after_a_change(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(VALID_A)
    calls: list[int] = []

    async def scenario() -> None:
        task = asyncio.create_task(watch_file(path, lambda: calls.append(1), interval=0.01))
        await asyncio.sleep(0.05)
        assert calls == []
        path.write_text(VALID_B)
        for _ in range(100):
            if calls:
                break
            await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(scenario())
    assert calls == [1]
